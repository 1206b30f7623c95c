//! The answers the server writes before any turn: refusals as HTTP responses, the
//! health body, and the audit line of every talk outcome. A turn's answer is `talk.rs`'s.

use super::{Bus, Refusal};
use crate::audit;
use crate::http::{Head, Response};
use crate::protocol::{
    proof, Envelope, Failure, Health, RequestExt, RequestId, TalkRequest, UsageReport,
};
use std::time::Instant;

/// What the audit line of one talk outcome knows about the request.
#[derive(Debug, Clone)]
pub(super) struct TalkMeta {
    /// When its head arrived: its answer's duration counts from here.
    pub(super) received_at: Instant,
    pub(super) from_instance: Option<String>,
    pub(super) depth: Option<u64>,
    pub(super) prompt_chars: Option<usize>,
    /// The request's `ext`, with the request and trace ids the server made for its
    /// turn where it had none.
    pub(super) ext: RequestExt,
    /// The engine's session id, once its turn reported one.
    pub(super) session_id: Option<String>,
}

impl TalkMeta {
    /// `request`, whose head arrived at `received_at`; `None` if it was refused before
    /// its body was read.
    pub(super) fn of(request: Option<&TalkRequest>, received_at: Instant) -> TalkMeta {
        TalkMeta {
            received_at,
            from_instance: request.map(|r| r.from_instance.clone()),
            depth: request.map(|r| r.depth),
            prompt_chars: request.map(|r| r.prompt.chars().count()),
            ext: request.map(|r| r.ext.clone()).unwrap_or_default(),
            session_id: None,
        }
    }

    /// `from alice, depth 1, prompt 12 chars` for a log line, leaving out what is not
    /// known (a request refused before its body was read). `fromInstance` holds no
    /// control character (the body check refuses one), so it is written as it is.
    pub(super) fn describe(&self) -> String {
        let from = self.from_instance.as_ref();
        let mut parts = vec![from.map_or("caller unknown".to_owned(), |f| format!("from {f}"))];
        parts.extend(self.depth.map(|depth| format!("depth {depth}")));
        parts.extend(self.prompt_chars.map(|n| format!("prompt {n} chars")));
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
    /// Answers with a refusal; one of a talk (`is_talk`) is a talk outcome, audited.
    pub(super) fn refuse(&mut self, refusal: &Refusal, meta: &TalkMeta, is_talk: bool) -> Response {
        let (status, code) = refusal.status_and_code();
        let message = refusal.message(self.name.as_str());
        if is_talk {
            log::debug!("talk refused: {status} {code} ({})", meta.describe());
            let (code, status) = (Some(code.as_str()), Some(status));
            self.audit(meta, "refused", &message, code, status, None);
        }
        let took = elapsed_ms(meta.received_at, Instant::now());
        let envelope = Envelope::failure(&self.name, Failure::new(code, message), took);
        let mut response = json(status, envelope.to_json());
        if let Refusal::MethodNotAllowed(allow) = refusal {
            response.headers.push(("Allow", (*allow).to_owned()));
        }
        response.close = matches!(refusal, Refusal::Http(_));
        response
    }

    /// Records one talk outcome in the audit log; `status` is `None` when nobody was
    /// answered; `usage` is the turn's, when its engine reported one.
    pub(super) fn audit(
        &mut self,
        meta: &TalkMeta,
        outcome: &str,
        detail: &str,
        error_code: Option<&str>,
        status: Option<u16>,
        usage: Option<UsageReport>,
    ) {
        let known = usage.map(|_| ());
        let usage = usage.unwrap_or_default();
        let id = |id: &Option<RequestId>| id.as_ref().map(ToString::to_string);
        let metadata = audit::AuditMetadata {
            from_instance: meta.from_instance.clone(),
            depth: meta.depth,
            duration_ms: elapsed_ms(meta.received_at, Instant::now()),
            error_code: error_code.map(str::to_owned),
            prompt_chars: meta.prompt_chars,
            status,
            request_id: id(&meta.ext.request_id),
            trace_id: meta.ext.trace_id.clone(),
            parent_request_id: id(&meta.ext.parent_request_id),
            cost_usd: usage.cost_usd,
            input_tokens: known.map(|()| usage.input_tokens),
            output_tokens: known.map(|()| usage.output_tokens),
            cached_tokens: known.map(|()| usage.cached_tokens),
            session_id: meta.session_id.clone(),
        };
        self.audit.record(outcome, detail, &metadata);
    }

    /// The health answer, with a `proof` of the request's `X-Loopbus-Nonce` when it
    /// carries a well-formed one (contract 6.1).
    pub(super) fn health(&self, head: &Head) -> Response {
        let status = self.stopping_since.map_or(Health::OK, |_| Health::STOPPING);
        let mut body = Health::new(&self.config.bus.kind, &self.name, status, self.pid);
        body.turns = Some(self.pool.load());
        body.bus_enabled = Some(self.config.bus.enabled);
        // One nonce header exactly: two would leave open which one was answered.
        let mut nonces = head.header_values(crate::http::NONCE_HEADER);
        let nonce = nonces.next();
        if let Some(nonce) = nonce.filter(|n| nonces.next().is_none() && proof::is_valid_nonce(n)) {
            // A valid nonce is ASCII hex, so this conversion is lossless.
            let nonce = String::from_utf8_lossy(nonce);
            let (name, ip, port) = (self.name.as_str(), self.addr.ip(), self.addr.port());
            let message = proof::proof_message(name, ip, port, &nonce);
            body.proof = Some(self.secret.proof(&message));
        }
        json(200, body.to_json())
    }
}

/// Milliseconds from `since` to `now`, for a `durationMs`.
pub(super) fn elapsed_ms(since: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX)
}
