//! The bus protocol's pure parts: request and response types, request validation,
//! instance names, the health answer, error codes and the retry table. Nothing here
//! touches a socket or a file, and nothing here imports another module of this crate.
//!
//! The source of truth is `bus-protocol.md`; `contract.md` pins what it leaves open.

use serde_json::Value;

/// `as_str` and a `Display` that writes the string, for a validated string type
/// (`InstanceName`, `RequestId`, `TraceId`: a newtype of `String` its constructor
/// checks).
macro_rules! string_type {
    ($name:ident) => {
        impl $name {
            /// The string, as checked (and as sent).
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

mod classify;
mod codes;
mod envelope;
mod ext;
mod health;
mod name;
pub mod proof;
mod request;
mod response;

pub use classify::{classify, legacy_failure_code};
pub use codes::ErrorCode;
pub use envelope::{Envelope, Failure, UsageReport};
pub use ext::{
    format_traceparent, parse_traceparent, ExtError, InvalidRequestId, InvalidTraceId, RequestExt,
    RequestId, TraceId, MAX_REQUEST_ID_LEN, MIN_REQUEST_ID_LEN, REQUEST_ID_VAR, SPAN_ID_LEN,
    TRACEPARENT_VAR, TRACE_ID_LEN, TRACE_ID_VAR,
};
pub use health::{Health, TurnLoad};
pub use name::{InstanceName, InvalidInstanceName, MAX_INSTANCE_NAME_LEN};
pub use request::{
    encode_talk_request, encode_talk_request_with, parse_talk_request, RequestError, TalkRequest,
    MAX_FROM_INSTANCE_BYTES,
};
pub use response::{parse_answer, parse_health, parse_response, ResponseError};

/// The protocol version this build speaks and emits.
pub const PROTOCOL_VERSION: u64 = 1;

/// The base capabilities (contract 4.1): the only ones requests and envelopes list,
/// since the original implementation rejects any other string there.
pub const BASE_CAPABILITIES: [&str; 2] = ["structured-errors", "retryable-errors"];

/// `ext.requestId` deduplicates retries (contract 8.2).
pub const IDEMPOTENT_REQUESTS: &str = "idempotent-requests";
/// A hang-up or a cancel request cancels the turn (contract 8.1).
pub const CANCEL_ON_HANGUP: &str = "cancel-on-hangup";
/// Envelopes carry the turn's `usage` (contract 8.3).
pub const USAGE_REPORT: &str = "usage-report";
/// Requests carry `ext.traceId` and `ext.parentRequestId` (contract 8.4).
pub const TRACE_CONTEXT: &str = "trace-context";

/// Every capability this build implements, as health lists them (contract 4.1): the
/// base two, the `/api/talk` extensions, and `secret-proof` (6.1), which lives on
/// health alone.
pub const CAPABILITIES: [&str; 7] = [
    "structured-errors",
    "retryable-errors",
    IDEMPOTENT_REQUESTS,
    CANCEL_ON_HANGUP,
    USAGE_REPORT,
    TRACE_CONTEXT,
    SECRET_PROOF,
];

/// The capabilities of one exchange (contract 4.1): the base two plus those of
/// `listed` (the target's health, for a request; the request's, for an envelope) that
/// this build implements on `/api/talk` itself, in [`CAPABILITIES`]' order.
/// `secret-proof` is not one: it is about health alone, so a request never lists it,
/// nor an envelope.
pub fn negotiate(listed: &[String]) -> Vec<String> {
    let talk = |c: &&str| {
        BASE_CAPABILITIES.contains(c) || (*c != SECRET_PROOF && listed.iter().any(|l| l == c))
    };
    CAPABILITIES
        .into_iter()
        .filter(talk)
        .map(str::to_owned)
        .collect()
}

/// The capability of a server that answers the health proof (contract 6.1).
pub const SECRET_PROOF: &str = "secret-proof";

/// The largest `/api/talk` request body accepted (and sent by the client), in bytes.
pub const MAX_BODY_BYTES: u64 = 262_144;

/// Longest `error` text carried in an envelope; longer messages are cut on a char
/// boundary so a chatty engine can't bloat every response.
pub const MAX_ERROR_CHARS: usize = 2_000;

/// Reads a JSON number as a non-negative integer: `1` and `1.0` count, `1.5`, `-1`
/// and `"1"` do not. Values past `u64::MAX` saturate (they are still integers).
///
/// The one reading of "a non-negative integer" for every JSON document this crate
/// parses: requests, envelopes, health answers, the registry and `config.json`. It
/// sees the parsed value, in which serde_json has rounded fractions and exponents
/// (`1e-400` is 0.0); a request's `depth` is also checked in its text.
pub fn non_negative_integer(value: &Value) -> Option<u64> {
    // `is_i64` catches negative integers; a float must be finite, whole and >= 0, and
    // then the saturating float-to-int conversion `as` does is what is meant.
    let whole = |f: &f64| !value.is_i64() && f.is_finite() && *f >= 0.0 && f.fract() == 0.0;
    value
        .as_u64()
        .or_else(|| value.as_f64().filter(whole).map(|f| f as u64))
}

/// Cuts `s` to at most `max` characters, on a char boundary.
pub fn truncate_chars(mut s: String, max: usize) -> String {
    if let Some((index, _)) = s.char_indices().nth(max) {
        s.truncate(index);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopbus health lists `secret-proof`; a request that echoed it would be
    /// rejected by the original's strict parser (contract 4.1).
    #[test]
    fn bug_negotiation_never_lists_a_health_only_capability() {
        let health: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        let all = [
            "structured-errors",
            "retryable-errors",
            IDEMPOTENT_REQUESTS,
            CANCEL_ON_HANGUP,
            USAGE_REPORT,
            TRACE_CONTEXT,
        ];
        assert_eq!(negotiate(&health), all);
        assert!(!negotiate(&health).iter().any(|c| c == SECRET_PROOF));
        assert_eq!(negotiate(&[]), BASE_CAPABILITIES);
        // Only what was listed, in this build's order; unknown strings are dropped.
        let odd = vec![
            "x".to_owned(),
            USAGE_REPORT.to_owned(),
            "secret-proof".to_owned(),
        ];
        assert_eq!(
            negotiate(&odd),
            ["structured-errors", "retryable-errors", USAGE_REPORT]
        );
    }

    /// A tiny deterministic generator, so these runs repeat exactly.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Random and mutated inputs never panic any parser.
    #[test]
    fn non_negative_integer_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("0", Some(0)),
            ("1", Some(1)),
            ("1.0", Some(1)),
            ("-0.0", Some(0)),
            ("1e3", Some(1000)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", Some(u64::MAX)),
            ("1e300", Some(u64::MAX)),
            ("1.5", None),
            ("-1", None),
            ("-1.0", None),
            ("\"1\"", None),
            ("null", None),
            ("true", None),
            ("[1]", None),
        ];
        for (json, want) in cases {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(non_negative_integer(&value), *want, "{json}");
        }
    }

    #[test]
    fn parsers_survive_random_input() {
        let seeds: [&[u8]; 3] = [
            br#"{"fromInstance":"a","prompt":"p","depth":1,"protocolVersion":1,"capabilities":["x"]}"#,
            br#"{"success":false,"error":"e","errorCode":"timeout","retryable":true,"durationMs":3}"#,
            br#"{"kind":"loopbus","instance":"a","status":"ok","pid":1}"#,
        ];
        let alphabet = b"{}[]\":,0123456789.-+eE truefalsn\\u\xff";
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..20_000 {
            let mut input = seeds[round % seeds.len()].to_vec();
            let edits = 1 + xorshift(&mut state) % 8;
            for _ in 0..edits {
                let r = xorshift(&mut state);
                let at = (r as usize >> 8) % (input.len() + 1);
                let byte = alphabet[(r as usize) % alphabet.len()];
                match r % 3 {
                    0 if at < input.len() => input[at] = byte,
                    1 => input.insert(at, byte),
                    _ if at < input.len() => {
                        input.remove(at);
                    }
                    _ => {}
                }
            }
            let _ = parse_talk_request(&input);
            let _ = parse_response(&input);
            let _ = parse_health(&input);
        }
        // Deep nesting is refused, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert_eq!(
            parse_talk_request(deep.as_bytes()),
            Err(RequestError::NotJson)
        );
    }
}
