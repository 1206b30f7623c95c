//! A peer's answers as the client reads them: a `/api/talk` envelope (v1 or legacy) and
//! a health answer. Nothing here runs before a caller's secret is checked: it is the
//! client's side, read after the pre-auth surface.

use serde_json::{Map, Value};
use std::fmt;

use super::{
    legacy_failure_code, non_negative_integer, Envelope, ErrorCode, Failure, Health, TurnLoad,
    UsageReport,
};

impl Envelope {
    /// Whether this is a success envelope.
    pub fn is_success(&self) -> bool {
        self.failure.is_none()
    }
}

impl Health {
    /// Whether `status` is [`Health::OK`].
    pub fn is_ok(&self) -> bool {
        self.status == Health::OK
    }
}

/// Why a peer's answer is not an envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseError {
    /// Not UTF-8 JSON.
    NotJson,
    /// JSON, but not an object.
    NotObject,
    /// `success` is missing or not a boolean.
    Success,
    /// A field has the wrong type.
    FieldType(&'static str),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotJson => f.write_str("response body is not valid JSON"),
            Self::NotObject => f.write_str("response body is not a JSON object"),
            Self::Success => f.write_str("response has no boolean `success`"),
            Self::FieldType(field) => write!(f, "response field `{field}` has the wrong type"),
        }
    }
}

impl std::error::Error for ResponseError {}

/// The JSON object `body` holds.
fn object(body: &[u8]) -> Result<Map<String, Value>, ResponseError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ResponseError::NotObject),
        Err(_) => Err(ResponseError::NotJson),
    }
}

/// `field` read by `read`; absent or null is `None`, anything `read` refuses an error.
fn optional<T>(
    object: &Map<String, Value>,
    field: &'static str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>, ResponseError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v).map(Some).ok_or(ResponseError::FieldType(field)),
    }
}

/// A JSON string as a `String`.
fn string(value: &Value) -> Option<String> {
    value.as_str().map(str::to_owned)
}

/// The strings of a JSON array, other items left out.
fn strings(value: &Value) -> Option<Vec<String>> {
    Some(value.as_array()?.iter().filter_map(string).collect())
}

/// Parses a peer's `/api/talk` answer that came with HTTP 200; see `parse_answer`.
///
/// # Errors
/// As `parse_answer`.
pub fn parse_response(body: &[u8]) -> Result<Envelope, ResponseError> {
    parse_answer(200, body)
}

/// Parses a peer's `/api/talk` answer that came with HTTP `status`: a v1 envelope, a
/// legacy success without `protocolVersion`, or a legacy failure with only
/// `success: false` and `error`.
///
/// A failure without `errorCode` (a legacy peer) takes its code from `status` and its
/// text (`legacy_failure_code`, contract 4); one without
/// `retryable` takes it from the retry table; codes this build does not know are kept
/// as they are.
///
/// # Errors
/// The body is not a JSON object with a boolean `success`, or a known field has the
/// wrong type.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Envelope, ResponseError> {
    let object = object(body)?;
    let success = object
        .get("success")
        .and_then(Value::as_bool)
        .ok_or(ResponseError::Success)?;
    // Fields are read, and refused, in this order.
    Ok(Envelope {
        text: optional(&object, "text", string)?.unwrap_or_default(),
        from_instance: optional(&object, "fromInstance", string)?.unwrap_or_default(),
        duration_ms: optional(&object, "durationMs", non_negative_integer)?.unwrap_or(0),
        protocol_version: optional(&object, "protocolVersion", non_negative_integer)?,
        capabilities: optional(&object, "capabilities", strings)?,
        failure: (!success).then(|| failure(status, &object)).transpose()?,
        usage: object.get("usage").and_then(usage),
    })
}

/// The failure of a `success: false` answer that came with HTTP `status`.
fn failure(status: u16, object: &Map<String, Value>) -> Result<Failure, ResponseError> {
    let given = optional(object, "error", string)?;
    let code = match optional(object, "errorCode", string)? {
        Some(code) => ErrorCode::from_wire(&code),
        None => legacy_failure_code(status, given.as_deref().unwrap_or("")),
    };
    let retryable = optional(object, "retryable", Value::as_bool)?;
    let error = given.unwrap_or_else(|| format!("peer reported a failure ({code})"));
    let mut failure = Failure::new(code, error);
    failure.retryable = retryable.unwrap_or(failure.retryable);
    Ok(failure)
}

/// Reads a peer's `usage` object; `None` when it is not one (a peer's malformed usage
/// does not cost the caller its reply).
fn usage(value: &Value) -> Option<UsageReport> {
    let object = value.as_object()?;
    let tokens = |field: &str| object.get(field).and_then(non_negative_integer);
    let cost = |v: &Value| v.as_f64().filter(|c| c.is_finite() && *c >= 0.0);
    Some(UsageReport {
        cost_usd: optional(object, "costUsd", cost).ok()?,
        input_tokens: tokens("inputTokens")?,
        output_tokens: tokens("outputTokens")?,
        cached_tokens: tokens("cachedTokens").unwrap_or(0),
    })
}

/// A JSON non-negative integer that fits in `T`.
fn integer<T: TryFrom<u64>>(value: &Value) -> Option<T> {
    non_negative_integer(value).and_then(|n| T::try_from(n).ok())
}

/// Parses a health answer, ignoring fields this build does not know. Only `kind`,
/// `instance` and `status` are required; `pid`, `protocolVersion`, `capabilities`,
/// `turns`, `busEnabled` and `proof` are read when they have the right shape and left out
/// otherwise.
///
/// # Errors
/// The body is not a JSON object with string `kind`, `instance` and `status`.
pub fn parse_health(body: &[u8]) -> Result<Health, ResponseError> {
    let object = object(body)?;
    let field = |name| {
        object
            .get(name)
            .and_then(string)
            .ok_or(ResponseError::FieldType(name))
    };
    Ok(Health {
        kind: field("kind")?,
        instance: field("instance")?,
        status: field("status")?,
        pid: object.get("pid").and_then(integer).unwrap_or(0),
        protocol_version: object.get("protocolVersion").and_then(non_negative_integer),
        capabilities: object
            .get("capabilities")
            .and_then(strings)
            .unwrap_or_default(),
        turns: object.get("turns").and_then(|turns| {
            Some(TurnLoad {
                running: turns.get("running").and_then(integer)?,
                queued: turns.get("queued").and_then(integer)?,
                max: turns.get("max").and_then(integer)?,
            })
        }),
        bus_enabled: object.get("busEnabled").and_then(Value::as_bool),
        proof: object.get("proof").and_then(string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_parsing_table() {
        // (body, success, code, retryable, protocol_version)
        type Row = (
            &'static [u8],
            bool,
            Option<&'static str>,
            Option<bool>,
            Option<u64>,
        );
        let cases: &[Row] = &[
            (br#"{"success":true,"text":"hi","fromInstance":"w","durationMs":3,"protocolVersion":1,"capabilities":[]}"#, true, None, None, Some(1)),
            (br#"{"success":false,"error":"Invalid API key"}"#, false, Some("auth"), Some(false), None),
            (br#"{"success":true,"text":"legacy"}"#, true, None, None, None),
            (br#"{"success":false,"error":"boom"}"#, false, Some("unknown"), Some(true), None),
            (br#"{"success":false,"error":"x","errorCode":"budget_exhausted"}"#, false, Some("budget_exhausted"), Some(false), None),
            (br#"{"success":false,"error":"x","errorCode":"new_thing","retryable":false,"protocolVersion":1}"#, false, Some("new_thing"), Some(false), Some(1)),
            (br#"{"success":false,"error":"x","errorCode":"timeout","retryable":false}"#, false, Some("timeout"), Some(false), None),
        ];
        for (body, success, code, retryable, version) in cases {
            let env = parse_response(body).unwrap();
            assert_eq!(env.is_success(), *success);
            assert_eq!(env.failure.as_ref().map(|f| f.code.as_str()), *code);
            assert_eq!(env.failure.as_ref().map(|f| f.retryable), *retryable);
            assert_eq!(env.protocol_version, *version);
        }
        let errors: &[(&[u8], ResponseError)] = &[
            (b"not json", ResponseError::NotJson),
            (b"[1]", ResponseError::NotObject),
            (br#"{"text":"no success"}"#, ResponseError::Success),
            (br#"{"success":"true"}"#, ResponseError::Success),
            (
                br#"{"success":true,"text":5}"#,
                ResponseError::FieldType("text"),
            ),
            (
                br#"{"success":false,"error":"e","retryable":"yes"}"#,
                ResponseError::FieldType("retryable"),
            ),
        ];
        for (body, want) in errors {
            assert_eq!(parse_response(body).unwrap_err(), *want);
        }
    }
    /// A legacy peer's wrong-secret 401 was `unknown` and retryable, so callers retried
    /// a failure only an operator can fix, forever.
    #[test]
    fn bug_a_legacy_401_was_a_retryable_unknown() {
        let body = br#"{"success":false,"error":"Unauthorized"}"#;
        let cases = [
            (400, "invalid_request", false),
            (401, "auth_failed", false),
            (403, "peer_not_allowed", false),
            (413, "request_too_large", false),
            (429, "max_depth_exceeded", false),
            (500, "internal_error", true),
            (503, "server_busy", true),
            (200, "auth", false),
        ];
        for (status, code, retryable) in cases {
            let env = parse_answer(status, body).unwrap();
            let failure = env.failure.unwrap();
            assert_eq!(
                (failure.code.as_str(), failure.retryable),
                (code, retryable),
                "{status}"
            );
            assert_eq!(env.capabilities, None);
            assert_eq!(env.protocol_version, None);
        }
        let plain = parse_answer(200, br#"{"success":false,"error":"boom"}"#).unwrap();
        assert_eq!(plain.failure.unwrap().code, ErrorCode::Unknown);
        // A v1 failure keeps its own code whatever the status.
        let v1 = br#"{"success":false,"error":"x","errorCode":"timeout","retryable":true}"#;
        assert_eq!(
            parse_answer(401, v1).unwrap().failure.unwrap().code,
            ErrorCode::Timeout
        );
        // A legacy envelope prints without the fields it did not have.
        let legacy = parse_answer(200, br#"{"success":true,"text":"hi"}"#).unwrap();
        let v: Value = serde_json::from_slice(&legacy.to_json()).unwrap();
        assert!(
            v.get("capabilities").is_none() && v.get("protocolVersion").is_none(),
            "{v}"
        );
    }
    #[test]
    fn envelope_round_trips_through_parser() {
        let env = Envelope::failure("w", Failure::new(ErrorCode::ServerBusy, "busy"), 5);
        assert_eq!(parse_response(&env.to_json()).unwrap(), env);
        let env = Envelope::success("w", "text \"quoted\" \u{1F600}".into(), 5);
        assert_eq!(parse_response(&env.to_json()).unwrap(), env);
    }
    #[test]
    fn health_parsing() {
        let h =
            parse_health(br#"{"kind":"loopbus","instance":"a","status":"ok","pid":7,"extra":1}"#)
                .unwrap();
        assert_eq!(
            (
                h.kind.as_str(),
                h.instance.as_str(),
                h.status.as_str(),
                h.pid
            ),
            ("loopbus", "a", "ok", 7)
        );
        assert_eq!(
            (h.protocol_version, h.turns, h.bus_enabled),
            (None, None, None)
        );
        assert!(h.capabilities.is_empty());
        assert!(parse_health(br#"{"kind":"loopbus","status":"ok"}"#).is_err());
        assert!(parse_health(br#"{"kind":"loopbus","instance":null,"status":"ok"}"#).is_err());
        // Fields of the wrong shape are left out, not refused.
        let odd = parse_health(
            br#"{"kind":"k","instance":"a","status":"ok","pid":-1,"protocolVersion":"1","capabilities":7,"turns":{"running":1},"busEnabled":"no"}"#,
        )
        .unwrap();
        assert_eq!(
            (odd.pid, odd.protocol_version, odd.turns, odd.bus_enabled),
            (0, None, None, None)
        );
        for (json, want) in [("true", Some(true)), ("false", Some(false)), ("0", None)] {
            let body =
                format!(r#"{{"kind":"k","instance":"a","status":"ok","busEnabled":{json}}}"#);
            assert_eq!(
                parse_health(body.as_bytes()).unwrap().bus_enabled,
                want,
                "{json}"
            );
        }
    }
    #[test]
    fn the_server_body_keeps_its_field_order_and_round_trips() {
        let mut health = Health::new("loopbus", "w", Health::OK, 42);
        health.turns = Some(TurnLoad {
            running: 1,
            queued: 2,
            max: 4,
        });
        assert_eq!(
            String::from_utf8(health.to_json()).unwrap(),
            r#"{"kind":"loopbus","instance":"w","status":"ok","pid":42,"protocolVersion":1,"capabilities":["structured-errors","retryable-errors","idempotent-requests","cancel-on-hangup","usage-report","trace-context","secret-proof"],"turns":{"running":1,"queued":2,"max":4}}"#
        );
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        health.bus_enabled = Some(false);
        assert_eq!(
            String::from_utf8(health.to_json()).unwrap(),
            r#"{"kind":"loopbus","instance":"w","status":"ok","pid":42,"protocolVersion":1,"capabilities":["structured-errors","retryable-errors","idempotent-requests","cancel-on-hangup","usage-report","trace-context","secret-proof"],"turns":{"running":1,"queued":2,"max":4},"busEnabled":false}"#
        );
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        health.proof = Some("ab".to_owned());
        assert!(String::from_utf8(health.to_json())
            .unwrap()
            .ends_with(r#""busEnabled":false,"proof":"ab"}"#));
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        assert!(health.is_ok());
        assert!(!Health::new("loopbus", "w", Health::STOPPING, 1).is_ok());
    }
}
