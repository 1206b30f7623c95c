//! Refusals: every way a request is turned down before a turn answers it, with the
//! one table that gives each its HTTP status and wire error code.

use crate::http::{HttpError, LengthError};
use crate::protocol::{ErrorCode, RequestError, MAX_BODY_BYTES};

/// Why a request was refused (or failed) before a turn produced an envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `Host` is missing, repeated or not one of the loopback forms with our port.
    BadHost,
    /// An `Origin` or `Referer` header is present (a browser sent this).
    BrowserOrigin,
    /// `Content-Type` is a browser form type.
    BrowserContentType,
    /// No usable `Content-Length` (check 3): missing (411), not all digits, repeated
    /// with different values, or beside a `Transfer-Encoding` (400); the HTTP layer's
    /// one framing rule (`http::headers`) says which.
    Length(LengthError),
    /// The declared body is larger than [`MAX_BODY_BYTES`].
    TooLarge,
    /// The bus is disabled in config.json.
    BusDisabled,
    /// `Authorization` is not exactly `Bearer <secret>`.
    Unauthorized,
    /// The body failed validation.
    Body(RequestError),
    /// `fromInstance` is not in `peers`.
    PeerNotAllowed,
    /// `depth >= maxDepth`.
    DepthExceeded {
        /// The request's depth.
        depth: u64,
        /// The configured limit.
        max: u64,
    },
    /// `ext.requestId` was used before for a different prompt or depth (contract 8.2).
    RequestIdReused,
    /// A cancel request names a request id with no turn (contract 8.1).
    UnknownRequestId,
    /// The turn queue is full.
    Busy,
    /// The instance is shutting down.
    ShuttingDown,
    /// The turn handler panicked.
    HandlerPanicked,
    /// The turn did not answer within its engine's timeout plus
    /// [`WAITER_GRACE`](super::turn_table::WAITER_GRACE): a bug lost it.
    TurnOverdue,
    /// Unknown path.
    NotFound,
    /// Known path, wrong method; the field is the `Allow` value.
    MethodNotAllowed(&'static str),
    /// A failure the HTTP layer answers itself.
    Http(HttpError),
}

impl Refusal {
    /// The one table of status codes and wire codes.
    pub fn status_and_code(&self) -> (u16, ErrorCode) {
        match self {
            Refusal::BadHost | Refusal::BrowserOrigin => (403, ErrorCode::AuthFailed),
            Refusal::BrowserContentType => (415, ErrorCode::InvalidRequest),
            Refusal::Length(LengthError::Missing) => (411, ErrorCode::InvalidRequest),
            Refusal::Length(_) => (400, ErrorCode::InvalidRequest),
            Refusal::TooLarge => (413, ErrorCode::RequestTooLarge),
            Refusal::BusDisabled => (403, ErrorCode::BusDisabled),
            Refusal::Unauthorized => (401, ErrorCode::AuthFailed),
            Refusal::Body(_) | Refusal::RequestIdReused | Refusal::UnknownRequestId => {
                (400, ErrorCode::InvalidRequest)
            }
            Refusal::PeerNotAllowed => (403, ErrorCode::PeerNotAllowed),
            Refusal::DepthExceeded { .. } => (429, ErrorCode::MaxDepthExceeded),
            Refusal::Busy | Refusal::ShuttingDown => (503, ErrorCode::ServerBusy),
            Refusal::HandlerPanicked | Refusal::TurnOverdue => (500, ErrorCode::InternalError),
            Refusal::NotFound => (404, ErrorCode::InvalidRequest),
            Refusal::MethodNotAllowed(_) => (405, ErrorCode::InvalidRequest),
            Refusal::Http(HttpError::MalformedHead) => (400, ErrorCode::InvalidRequest),
            Refusal::Http(HttpError::HeadTooLarge | HttpError::TooManyHeaders) => {
                (431, ErrorCode::RequestTooLarge)
            }
            Refusal::Http(HttpError::BodyTimeout) => (408, ErrorCode::Timeout),
            Refusal::Http(HttpError::Overloaded) => (503, ErrorCode::ServerBusy),
        }
    }

    /// The human-readable `error` text, naming `instance` (the one refusing) where it
    /// speaks of it: a caller reads it beside its own local refusals. Never echoes what
    /// the peer sent.
    pub fn message(&self, instance: &str) -> String {
        match self {
            Refusal::BadHost => "Host must be 127.0.0.1:PORT, localhost:PORT or [::1]:PORT".into(),
            Refusal::BrowserOrigin => {
                "requests carrying Origin or Referer (browsers) are refused".into()
            }
            Refusal::BrowserContentType => {
                "Content-Type must be application/json (or absent)".into()
            }
            Refusal::Length(LengthError::TransferEncoding) => {
                "Transfer-Encoding is not supported: send Content-Length".into()
            }
            Refusal::Length(LengthError::Missing) => "Content-Length is required".into(),
            Refusal::Length(LengthError::Invalid) => "Content-Length must be all digits".into(),
            Refusal::Length(LengthError::Conflict) => {
                "Content-Length is repeated with different values".into()
            }
            Refusal::TooLarge => format!("request body is larger than {MAX_BODY_BYTES} bytes"),
            Refusal::BusDisabled => format!("the bus is disabled on {instance}"),
            Refusal::Unauthorized => "missing or wrong bearer secret".into(),
            Refusal::Body(e) => e.to_string(),
            Refusal::PeerNotAllowed => format!("the caller is not among {instance}'s peers"),
            Refusal::DepthExceeded { depth, max } => {
                format!("depth {depth} reaches {instance}'s maxDepth of {max}")
            }
            Refusal::RequestIdReused => {
                "`ext.requestId` was used before for a different prompt or depth".into()
            }
            Refusal::UnknownRequestId => format!(
                "{instance} has no turn with this `ext.requestId` to cancel (finished turns are kept 10 minutes)"
            ),
            Refusal::Busy => format!("{instance}'s turn queue is full; try again shortly"),
            Refusal::ShuttingDown => format!("{instance} is shutting down"),
            Refusal::HandlerPanicked => "the turn handler failed unexpectedly".into(),
            Refusal::TurnOverdue => format!(
                "{instance} lost track of this turn: no answer within engine.timeoutSecs plus {} s",
                super::turn_table::WAITER_GRACE.as_secs()
            ),
            Refusal::NotFound => "no such endpoint; use POST /api/talk or GET /api/health".into(),
            Refusal::MethodNotAllowed(allow) => format!("method not allowed; use {allow}"),
            Refusal::Http(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let cases = [
            (Refusal::BadHost, 403, "auth_failed"),
            (Refusal::BrowserOrigin, 403, "auth_failed"),
            (Refusal::BrowserContentType, 415, "invalid_request"),
            (
                Refusal::Length(LengthError::TransferEncoding),
                400,
                "invalid_request",
            ),
            (
                Refusal::Length(LengthError::Missing),
                411,
                "invalid_request",
            ),
            (
                Refusal::Length(LengthError::Invalid),
                400,
                "invalid_request",
            ),
            (
                Refusal::Length(LengthError::Conflict),
                400,
                "invalid_request",
            ),
            (Refusal::TooLarge, 413, "request_too_large"),
            (Refusal::BusDisabled, 403, "bus_disabled"),
            (Refusal::Unauthorized, 401, "auth_failed"),
            (Refusal::Body(RequestError::Depth), 400, "invalid_request"),
            (Refusal::PeerNotAllowed, 403, "peer_not_allowed"),
            (
                Refusal::DepthExceeded { depth: 3, max: 3 },
                429,
                "max_depth_exceeded",
            ),
            (Refusal::Busy, 503, "server_busy"),
            (Refusal::HandlerPanicked, 500, "internal_error"),
            (Refusal::TurnOverdue, 500, "internal_error"),
            (Refusal::NotFound, 404, "invalid_request"),
            (Refusal::MethodNotAllowed("GET"), 405, "invalid_request"),
            (
                Refusal::Http(HttpError::HeadTooLarge),
                431,
                "request_too_large",
            ),
            (Refusal::Http(HttpError::BodyTimeout), 408, "timeout"),
            (Refusal::Http(HttpError::Overloaded), 503, "server_busy"),
        ];
        for (refusal, status, code) in cases {
            let (s, c) = refusal.status_and_code();
            assert_eq!((s, c.as_str()), (status, code), "{refusal:?}");
        }
    }

    /// A refusal from a peer read the same as the caller's own ("this instance").
    #[test]
    fn refusals_name_the_instance_refusing() {
        for refusal in [
            Refusal::BusDisabled,
            Refusal::PeerNotAllowed,
            Refusal::DepthExceeded { depth: 3, max: 3 },
            Refusal::ShuttingDown,
            Refusal::Busy,
        ] {
            let message = refusal.message("worker");
            assert!(message.contains("worker"), "{message}");
            assert!(!message.contains("this instance"), "{message}");
        }
    }
}
