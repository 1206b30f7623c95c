//! The stable error codes of the bus and the retry table that says which of them a
//! caller may retry.

use std::fmt;
use ErrorCode::*;

/// A stable, machine-readable error code. Codes are additive: new ones may appear,
/// existing ones never change meaning. Codes this build does not know are kept as
/// [`ErrorCode::Other`] rather than folded into `unknown`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request was malformed or violated a rule.
    InvalidRequest,
    /// The request body was larger than [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES) (or the head too large).
    RequestTooLarge,
    /// The bus is disabled in the instance's config.
    BusDisabled,
    /// The bearer secret or the request's origin was refused.
    AuthFailed,
    /// The caller is not in the instance's `peers`.
    PeerNotAllowed,
    /// The delegation depth reached `maxDepth`.
    MaxDepthExceeded,
    /// The turn handler returned something that is not a valid result.
    InvalidHandlerResponse,
    /// An unexpected failure inside the instance.
    InternalError,
    /// The target instance is not registered or not answering.
    InstanceUnavailable,
    /// The target answered with something that is not an envelope.
    InvalidResponse,
    /// Something took too long.
    Timeout,
    /// The target instance itself is over its budget.
    BudgetExhausted,
    /// The target's engine could not authenticate with its provider.
    Auth,
    /// The target's engine was refused a write.
    WritePermission,
    /// Telegram reported a conflict (kept for interop with the bridge).
    TelegramConflict,
    /// Telegram delivery failed (kept for interop with the bridge).
    TelegramDelivery,
    /// The engine command failed.
    EngineCli,
    /// A file-based workflow failed.
    FileWorkflow,
    /// A workflow is in a state that does not allow the request.
    WorkflowState,
    /// The engine's session state does not allow the request.
    SessionState,
    /// A failure nobody classified.
    Unknown,
    /// The instance's turn queue is full (loopbus addition, retryable).
    ServerBusy,
    /// The caller cancelled the turn (loopbus addition, contract 8.1; not retryable).
    Cancelled,
    /// A code this build does not know, kept exactly as received.
    Other(String),
}

/// Every code this build knows, in the order `bus-protocol.md` lists them, then ours:
/// its wire string, and the retry table (whether a caller can reasonably try the same
/// delegation again without local operator action).
pub const KNOWN_CODES: [(ErrorCode, &str, bool); 23] = [
    (InvalidRequest, "invalid_request", false),
    (RequestTooLarge, "request_too_large", false),
    (BusDisabled, "bus_disabled", false),
    (AuthFailed, "auth_failed", false),
    (PeerNotAllowed, "peer_not_allowed", false),
    (MaxDepthExceeded, "max_depth_exceeded", false),
    (InvalidHandlerResponse, "invalid_handler_response", true),
    (InternalError, "internal_error", true),
    (InstanceUnavailable, "instance_unavailable", true),
    (InvalidResponse, "invalid_response", true),
    (Timeout, "timeout", true),
    (BudgetExhausted, "budget_exhausted", false),
    (Auth, "auth", false),
    (WritePermission, "write_permission", false),
    (TelegramConflict, "telegram_conflict", true),
    (TelegramDelivery, "telegram_delivery", true),
    (EngineCli, "engine_cli", true),
    (FileWorkflow, "file_workflow", false),
    (WorkflowState, "workflow_state", false),
    (SessionState, "session_state", false),
    (Unknown, "unknown", true),
    (ServerBusy, "server_busy", true),
    (Cancelled, "cancelled", false),
];

impl ErrorCode {
    /// The row of [`KNOWN_CODES`] for this code; `None` for [`ErrorCode::Other`].
    fn known(&self) -> Option<&'static (ErrorCode, &'static str, bool)> {
        KNOWN_CODES.iter().find(|(code, _, _)| code == self)
    }

    /// The wire string of this code.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::Other(code) => code,
            // Every variant but `Other` has a row in the table: "unknown" is not reached.
            known => known.known().map_or("unknown", |(_, wire, _)| wire),
        }
    }

    /// The code for a wire string; strings this build does not know are kept as
    /// [`ErrorCode::Other`].
    pub fn from_wire(code: &str) -> ErrorCode {
        let known = KNOWN_CODES.iter().find(|(_, wire, _)| *wire == code);
        known.map_or_else(|| ErrorCode::Other(code.to_owned()), |row| row.0.clone())
    }

    /// The retry table: can the caller reasonably try the same delegation again
    /// without local operator action? Codes this build does not know are treated like
    /// `unknown` (retryable).
    pub fn retryable(&self) -> bool {
        self.known().is_none_or(|(_, _, retryable)| *retryable)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_table() {
        let not_retryable = [
            "invalid_request",
            "request_too_large",
            "bus_disabled",
            "auth_failed",
            "peer_not_allowed",
            "max_depth_exceeded",
            "budget_exhausted",
            "auth",
            "write_permission",
            "file_workflow",
            "workflow_state",
            "session_state",
            "cancelled",
        ];
        let retryable = [
            "invalid_handler_response",
            "internal_error",
            "instance_unavailable",
            "invalid_response",
            "timeout",
            "telegram_conflict",
            "telegram_delivery",
            "engine_cli",
            "unknown",
            "server_busy",
            "some_future_code",
        ];
        for code in not_retryable {
            assert!(!ErrorCode::from_wire(code).retryable(), "{code}");
        }
        for code in retryable {
            assert!(ErrorCode::from_wire(code).retryable(), "{code}");
        }
        // Every known code is in exactly one of the two lists.
        for (code, _, _) in KNOWN_CODES {
            let s = code.as_str();
            assert!(not_retryable.contains(&s) ^ retryable.contains(&s), "{s}");
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_kept() {
        for (code, wire, _) in KNOWN_CODES {
            assert_eq!(code.as_str(), wire);
            assert_eq!(ErrorCode::from_wire(wire), code);
        }
        assert_eq!(
            ErrorCode::from_wire("rate_limited"),
            ErrorCode::Other("rate_limited".into())
        );
        assert_eq!(
            ErrorCode::from_wire("rate_limited").as_str(),
            "rate_limited"
        );
    }
}
