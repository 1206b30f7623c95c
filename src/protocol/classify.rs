//! The engine classification rules (contract section 8): which phrase in a failure's
//! text gives which code. Pure, and here in the protocol so that the engine (its own
//! failures) and the client (a legacy peer's 200 failure, contract 4) share one table.

use super::ErrorCode;

/// The classification rules, in the order they are tried: the first rule with a
/// phrase found in the engine's output (case-insensitive) gives the code. Output that
/// matches no rule is `engine_cli` for a failed exit and `unknown` for an engine that
/// reported an error itself.
pub const CLASSIFICATION_RULES: [(ErrorCode, &[&str]); 3] = [
    (
        ErrorCode::Auth,
        &[
            "not logged in",
            "unauthorized",
            "invalid api key",
            "invalid x-api-key",
            "authentication failed",
            "authentication_error",
            "please run /login",
            "401 unauthorized",
            "status 401",
            "status code 401",
            "http 401",
            "error 401",
            "(401)",
        ],
    ),
    (
        ErrorCode::WritePermission,
        &[
            "read-only",
            "read only file system",
            "permission denied",
            "operation not permitted",
            "eacces",
            "not allowed to write",
        ],
    ),
    (
        ErrorCode::SessionState,
        &[
            "no conversation found",
            "no such session",
            "session not found",
        ],
    ),
];

/// The code of the first rule that matches `text`, if any.
pub fn classify(text: &str) -> Option<ErrorCode> {
    let lower = text.to_lowercase();
    CLASSIFICATION_RULES
        .iter()
        .find(|(_, phrases)| phrases.iter().any(|p| lower.contains(p)))
        .map(|(code, _)| code.clone())
}

/// The code of a legacy failure: one without `errorCode` (contract 4). It comes from
/// the HTTP status: 400 `invalid_request`, 401 `auth_failed`, 403 `peer_not_allowed`,
/// 413 `request_too_large`, 429 `max_depth_exceeded`, 500 `internal_error`, 503
/// `server_busy`; a 200 failure is classified from its `error` text by
/// [`CLASSIFICATION_RULES`]; anything else is `unknown`.
pub fn legacy_failure_code(status: u16, error: &str) -> ErrorCode {
    match status {
        400 => ErrorCode::InvalidRequest,
        401 => ErrorCode::AuthFailed,
        403 => ErrorCode::PeerNotAllowed,
        413 => ErrorCode::RequestTooLarge,
        429 => ErrorCode::MaxDepthExceeded,
        500 => ErrorCode::InternalError,
        503 => ErrorCode::ServerBusy,
        200 => classify(error).unwrap_or(ErrorCode::Unknown),
        _ => ErrorCode::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_failure_code_table() {
        // A bare number would match inside a longer one: phrases carry words or marks.
        let phrases = CLASSIFICATION_RULES.iter().flat_map(|(_, p)| p.iter());
        assert!(phrases
            .clone()
            .all(|p| !p.bytes().all(|b| b.is_ascii_digit())));
        let cases = [
            (400, "bad body", "invalid_request"),
            (401, "Unauthorized", "auth_failed"),
            (403, "Bus is disabled", "peer_not_allowed"),
            (413, "too large", "request_too_large"),
            (429, "Max depth", "max_depth_exceeded"),
            (500, "handler threw", "internal_error"),
            (503, "busy", "server_busy"),
            (200, "Invalid API key · Please run /login", "auth"),
            (
                200,
                "EACCES: permission denied, open 'x'",
                "write_permission",
            ),
            (
                200,
                "No conversation found with session ID x",
                "session_state",
            ),
            (200, "something went wrong", "unknown"),
            (404, "Not found", "unknown"),
            (502, "bad gateway", "unknown"),
        ];
        for (status, text, want) in cases {
            assert_eq!(
                legacy_failure_code(status, text).as_str(),
                want,
                "{status} {text}"
            );
        }
    }
}
