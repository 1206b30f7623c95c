//! The answers the server writes: envelopes and refusals as HTTP responses, the health
//! body, a finished turn's envelope as each waiting request negotiated it, and the
//! audit line of every talk outcome.

use super::{Bus, Refusal};
use crate::audit;
use crate::engine::TurnResult;
use crate::http::{ConnId, Head, Response};
use crate::protocol::{
    self, proof, Envelope, ErrorCode, Failure, Health, TalkRequest, TurnLoad, UsageReport,
    USAGE_REPORT,
};
use std::time::Instant;

/// What the audit line of one talk outcome knows about the request.
#[derive(Debug, Clone, Default)]
pub(super) struct TalkMeta {
    pub(super) from_instance: Option<String>,
    pub(super) depth: Option<u64>,
    pub(super) prompt_chars: Option<usize>,
    pub(super) request_id: Option<String>,
}

impl TalkMeta {
    /// `from alice, depth 1, prompt 12 chars` for a log line, leaving out what is not
    /// known (a request refused before its body was read). `fromInstance` holds no
    /// control character (the body check refuses one), so it is written as it is.
    pub(super) fn describe(&self) -> String {
        let mut parts = vec![match &self.from_instance {
            Some(from) => format!("from {from}"),
            None => "caller unknown".to_owned(),
        }];
        if let Some(depth) = self.depth {
            parts.push(format!("depth {depth}"));
        }
        if let Some(chars) = self.prompt_chars {
            parts.push(format!("prompt {chars} chars"));
        }
        parts.join(", ")
    }

    /// The audit line of this request: the one way a [`audit::Record`] is made.
    pub(super) fn audit_record<'a>(
        &'a self,
        outcome: &'a str,
        detail: &'a str,
        duration_ms: u64,
        error_code: Option<&'a str>,
        status: Option<u16>,
    ) -> audit::Record<'a> {
        audit::Record {
            outcome,
            detail,
            from_instance: self.from_instance.as_deref(),
            depth: self.depth,
            duration_ms,
            error_code,
            prompt_chars: self.prompt_chars,
            status,
            request_id: self.request_id.as_deref(),
        }
    }
}

/// A connection waiting for a turn's envelope, and what its own request negotiated:
/// every waiter's envelope is the turn's, with its own request's capabilities, and
/// `usage` only if its request listed `usage-report` (contract 4.1, 8.3).
#[derive(Debug, Clone)]
pub(super) struct Waiter {
    pub(super) conn: ConnId,
    capabilities: Vec<String>,
    wants_usage: bool,
}

impl Waiter {
    pub(super) fn new(conn: ConnId, request: &TalkRequest) -> Waiter {
        Waiter {
            conn,
            capabilities: protocol::negotiate(&request.capabilities),
            wants_usage: request.lists(USAGE_REPORT),
        }
    }

    /// The turn's `envelope` as this waiter's request negotiated it.
    pub(super) fn answer(&self, envelope: &Envelope) -> Response {
        self.clone().into_answer(envelope.clone())
    }

    /// [`Waiter::answer`], for the one waiter of an envelope made for it alone.
    pub(super) fn into_answer(self, envelope: Envelope) -> Response {
        let usage = envelope.usage.filter(|_| self.wants_usage);
        let envelope = envelope
            .with_capabilities(self.capabilities)
            .with_usage(usage);
        Bus::json(200, envelope.to_json())
    }
}

impl Bus {
    /// A turn's envelope, before each waiter's negotiation: the result, the usage the
    /// engine reported, the time since its first request.
    pub(super) fn envelope(
        &self,
        result: TurnResult,
        usage: Option<UsageReport>,
        received_at: Instant,
    ) -> Envelope {
        let took = elapsed_ms(received_at);
        match result {
            TurnResult::Reply(text) => Envelope::success(&self.name, text, took),
            TurnResult::Failed(failure) => Envelope::failure(&self.name, failure, took),
        }
        .with_usage(usage)
    }

    pub(super) fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![
                ("Content-Type", "application/json".to_owned()),
                ("Cache-Control", "no-store".to_owned()),
                ("X-Content-Type-Options", "nosniff".to_owned()),
            ],
            body,
            close: false,
        }
    }

    pub(super) fn envelope_response(status: u16, envelope: &Envelope) -> Response {
        Bus::json(status, envelope.to_json())
    }

    pub(super) fn refusal_response(&self, refusal: &Refusal, received_at: Instant) -> Response {
        let (status, code) = refusal.status_and_code();
        let envelope = Envelope::failure(
            &self.name,
            Failure::new(code, refusal.message(self.name.as_str())),
            elapsed_ms(received_at),
        );
        let mut response = Bus::envelope_response(status, &envelope);
        if let Refusal::MethodNotAllowed(allow) = refusal {
            response.headers.push(("Allow", (*allow).to_owned()));
        }
        if matches!(refusal, Refusal::Http(_)) {
            response.close = true;
        }
        response
    }

    /// Answers a talk with a refusal and records the outcome.
    pub(super) fn refuse_talk(
        &mut self,
        refusal: &Refusal,
        received_at: Instant,
        meta: &TalkMeta,
    ) -> Response {
        let (status, code) = refusal.status_and_code();
        log::debug!("talk refused: {status} {code} ({})", meta.describe());
        let message = refusal.message(self.name.as_str());
        let duration_ms = elapsed_ms(received_at);
        self.audit.record(&meta.audit_record(
            "refused",
            &message,
            duration_ms,
            Some(code.as_str()),
            Some(status),
        ));
        self.refusal_response(refusal, received_at)
    }

    /// Records a turn's answer in the audit log; `cancelled` says why it was, `status`
    /// is `None` when nobody was left to answer.
    pub(super) fn audit_answer(
        &mut self,
        meta: &TalkMeta,
        envelope: &Envelope,
        cancelled: Option<&str>,
        status: Option<u16>,
    ) {
        let (outcome, detail, code) = match (&envelope.failure, cancelled) {
            (None, _) => ("success", "ok", None),
            (Some(f), Some(why)) => ("cancelled", why, Some(f.code.as_str())),
            (Some(f), None) => ("failure", audit_detail(f), Some(f.code.as_str())),
        };
        log::debug!(
            "talk answered: {outcome}{} ({}, {} ms)",
            code.map(|c| format!(" {c}")).unwrap_or_default(),
            meta.describe(),
            envelope.duration_ms
        );
        self.audit
            .record(&meta.audit_record(outcome, detail, envelope.duration_ms, code, status));
    }

    /// The health answer, with a `proof` of the request's `X-Loopbus-Nonce` when it
    /// carries a well-formed one (contract 6.1).
    pub(super) fn health(&self, head: &Head) -> Response {
        let load = self.pool.load();
        let status = if self.stopping_since.is_some() {
            Health::STOPPING
        } else {
            Health::OK
        };
        let turns = TurnLoad {
            running: load.running,
            queued: load.queued,
            max: load.max,
        };
        let mut body = Health::new(&self.config.bus.kind, &self.name, status, self.pid)
            .with_turns(turns)
            .with_bus_enabled(self.config.bus.enabled);
        // One nonce header exactly: two would leave open which one was answered.
        let mut nonces = head.header_values(crate::http::NONCE_HEADER);
        if let (Some(nonce), None) = (nonces.next(), nonces.next()) {
            if proof::is_valid_nonce(nonce) {
                // A valid nonce is ASCII hex, so this conversion is lossless.
                let nonce = String::from_utf8_lossy(nonce);
                let message =
                    proof::proof_message(self.name.as_str(), self.host, self.port, &nonce);
                body = body.with_proof(self.secret.proof(&message));
            }
        }
        Bus::json(200, body.to_json())
    }
}

/// What the audit log says of a failed turn. Messages built from the engine's own
/// output may quote the prompt, so only the code is kept for those; the messages this
/// crate writes itself and that carry nothing of the engine's (budget, timeout, usage
/// file) are kept whole.
fn audit_detail(failure: &Failure) -> &str {
    match failure.code {
        ErrorCode::BudgetExhausted | ErrorCode::Timeout | ErrorCode::InternalError => {
            &failure.error
        }
        _ => "the engine failed; its output is not logged here",
    }
}

pub(super) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
