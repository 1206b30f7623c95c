//! The answers the server writes: envelopes and refusals as HTTP responses, a turn's
//! envelope as each waiting request negotiated it, the health body, and the audit line
//! of every talk outcome.

use super::turn_table::Ended;
use super::{Bus, Refusal};
use crate::audit;
use crate::http::{ConnId, Control, Head, Response};
use crate::protocol::{proof, Envelope, ErrorCode, Failure, Health, TalkRequest, TurnLoad};
use std::time::Instant;

/// What the audit line of one talk outcome knows about the request.
#[derive(Debug, Clone)]
pub(super) struct TalkMeta {
    /// When its head arrived: its answer's duration counts from here.
    pub(super) received_at: Instant,
    pub(super) from_instance: Option<String>,
    pub(super) depth: Option<u64>,
    pub(super) prompt_chars: Option<usize>,
    pub(super) request_id: Option<String>,
}

impl TalkMeta {
    /// A request refused before its body was read.
    pub(super) fn at(received_at: Instant) -> TalkMeta {
        TalkMeta {
            received_at,
            from_instance: None,
            depth: None,
            prompt_chars: None,
            request_id: None,
        }
    }

    /// A request whose body was read.
    pub(super) fn of(request: &TalkRequest, received_at: Instant) -> TalkMeta {
        TalkMeta {
            received_at,
            from_instance: Some(request.from_instance.clone()),
            depth: Some(request.depth),
            prompt_chars: Some(request.prompt.chars().count()),
            request_id: request.ext.request_id.as_ref().map(|id| id.to_string()),
        }
    }

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
}

/// A JSON response with the headers every answer carries.
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

impl Bus {
    pub(super) fn refusal_response(&self, refusal: &Refusal, received_at: Instant) -> Response {
        let (status, code) = refusal.status_and_code();
        let envelope = Envelope::failure(
            &self.name,
            Failure::new(code, refusal.message(self.name.as_str())),
            elapsed_ms(received_at),
        );
        let mut response = json(status, envelope.to_json());
        if let Refusal::MethodNotAllowed(allow) = refusal {
            response.headers.push(("Allow", (*allow).to_owned()));
        }
        if matches!(refusal, Refusal::Http(_)) {
            response.close = true;
        }
        response
    }

    /// Answers a talk with a refusal and records the outcome.
    pub(super) fn refuse_talk(&mut self, refusal: &Refusal, meta: &TalkMeta) -> Response {
        let (status, code) = refusal.status_and_code();
        log::debug!("talk refused: {status} {code} ({})", meta.describe());
        let message = refusal.message(self.name.as_str());
        self.audit(meta, "refused", &message, Some(code.as_str()), Some(status));
        self.refusal_response(refusal, meta.received_at)
    }

    /// Writes a turn's answer to each of its waiters and records it: its envelope
    /// (audited once, unless its hang-up was), or a refusal each.
    pub(super) fn answer(&mut self, ended: Ended<ConnId>, control: &mut Control) {
        let envelope = match &ended.answer {
            Ok(envelope) => envelope,
            Err(refusal) => {
                for waiter in &ended.waiters {
                    control.respond(waiter.conn, self.refuse_talk(refusal, &ended.meta));
                }
                return;
            }
        };
        if !ended.abandoned {
            let (outcome, detail, code) = match (&envelope.failure, ended.cancelled) {
                (None, _) => ("success", "ok", None),
                (Some(f), Some(why)) => ("cancelled", why, Some(f.code.as_str())),
                (Some(f), None) => ("failure", audit_detail(f), Some(f.code.as_str())),
            };
            log::debug!(
                "talk answered: {outcome}{} ({}, {} ms)",
                code.map(|c| format!(" {c}")).unwrap_or_default(),
                ended.meta.describe(),
                envelope.duration_ms
            );
            if let (Some(failure), None) = (&envelope.failure, ended.cancelled) {
                // The person running the instance sees its failures (never the prompt).
                log::info!("{}", failed_turn_line(failure, &ended.meta));
            }
            let status = (!ended.waiters.is_empty()).then_some(200);
            self.audit(&ended.meta, outcome, detail, code, status);
        }
        for waiter in &ended.waiters {
            control.respond(waiter.conn, json(200, waiter.negotiate(envelope).to_json()));
        }
    }

    /// Records one talk outcome in the audit log; `status` is `None` when nobody was
    /// answered.
    pub(super) fn audit(
        &mut self,
        meta: &TalkMeta,
        outcome: &str,
        detail: &str,
        error_code: Option<&str>,
        status: Option<u16>,
    ) {
        self.audit.record(&audit::Record {
            outcome,
            detail,
            from_instance: meta.from_instance.as_deref(),
            depth: meta.depth,
            duration_ms: elapsed_ms(meta.received_at),
            error_code,
            prompt_chars: meta.prompt_chars,
            status,
            request_id: meta.request_id.as_deref(),
        });
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
        json(200, body.to_json())
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

/// Most characters of a failed turn's message in its log line.
const MAX_LOGGED_FAILURE_CHARS: usize = 200;

/// The info line of a failed turn: its code, who asked, and the first line of its
/// message, cut to [`MAX_LOGGED_FAILURE_CHARS`] (the logger escapes it: it may quote
/// the engine).
fn failed_turn_line(failure: &Failure, meta: &TalkMeta) -> String {
    let first: String = failure
        .error
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(MAX_LOGGED_FAILURE_CHARS)
        .collect();
    format!(
        "turn failed: {} ({}): {first}",
        failure.code,
        meta.describe()
    )
}

pub(super) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
