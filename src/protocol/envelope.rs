//! `/api/talk` answers: the [`Envelope`] (v1 or legacy), its [`Failure`], serializing
//! it and parsing a peer's.

use serde_json::{Map, Value};
use std::fmt;

use super::{
    non_negative_integer, truncate_chars, ErrorCode, BASE_CAPABILITIES, MAX_ERROR_CHARS,
    PROTOCOL_VERSION,
};

/// The failure part of an envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// Human-readable message (surfaced directly by CLI paths).
    pub error: String,
    /// The stable machine-readable code.
    pub code: ErrorCode,
    /// Whether the same delegation may be tried again without operator action.
    pub retryable: bool,
}

impl Failure {
    /// A failure whose `retryable` comes from the retry table. The message is cut to
    /// 2,000 characters (`protocol::MAX_ERROR_CHARS`).
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Failure {
        let retryable = code.retryable();
        Failure {
            error: truncate_chars(error.into(), MAX_ERROR_CHARS),
            code,
            retryable,
        }
    }
}

/// What one turn cost, as an envelope reports it (`usage-report`, contract 8.3), in
/// the wire's field order.
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct UsageReport {
    /// Cost in US dollars, `None` when the engine reported tokens but no cost.
    pub cost_usd: Option<f64>,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache-read input tokens.
    pub cached_tokens: u64,
}

impl UsageReport {
    /// Reads a peer's `usage` object; `None` when it is not one (a peer's malformed
    /// usage does not cost the caller its reply).
    fn from_value(value: &Value) -> Option<UsageReport> {
        let object = value.as_object()?;
        let tokens = |field: &str| object.get(field).and_then(non_negative_integer);
        let cost_usd = match object.get("costUsd") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_f64().filter(|c| c.is_finite() && *c >= 0.0)?),
        };
        Some(UsageReport {
            cost_usd,
            input_tokens: tokens("inputTokens")?,
            output_tokens: tokens("outputTokens")?,
            cached_tokens: tokens("cachedTokens").unwrap_or(0),
        })
    }
}

/// A `/api/talk` response envelope, v1 or legacy.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Envelope {
    /// The reply text (`""` on failure).
    pub text: String,
    /// The answering instance's name (empty when a legacy peer left it out).
    pub from_instance: String,
    /// How long the answer took, in milliseconds (0 when a legacy peer left it out).
    pub duration_ms: u64,
    /// `Some(1)` for v1 envelopes, `None` for legacy ones.
    pub protocol_version: Option<u64>,
    /// The advertised capabilities: always `Some` in this build's envelopes, `None`
    /// when a legacy peer left the field out (and then it is left out again).
    pub capabilities: Option<Vec<String>>,
    /// `None` on success.
    pub failure: Option<Failure>,
    /// What the turn cost, when the request listed `usage-report` and the engine
    /// reported usage (contract 8.3).
    pub usage: Option<UsageReport>,
}

impl Envelope {
    /// A v1 success envelope from this build, listing the base capabilities; an answer
    /// to a request lists what [`Envelope::with_capabilities`] gives it.
    pub fn success(from_instance: &str, text: String, duration_ms: u64) -> Envelope {
        Envelope {
            text,
            from_instance: from_instance.to_owned(),
            duration_ms,
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: Some(BASE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
            failure: None,
            usage: None,
        }
    }

    /// The same envelope listing `capabilities`: for an answer, the base two plus
    /// those of the request's that this server implements on `/api/talk` (contract 4.1,
    /// `negotiate`).
    pub fn with_capabilities(mut self, capabilities: Vec<String>) -> Envelope {
        self.capabilities = Some(capabilities);
        self
    }

    /// The same envelope carrying `usage` (contract 8.3).
    pub fn with_usage(mut self, usage: Option<UsageReport>) -> Envelope {
        self.usage = usage;
        self
    }

    /// A v1 failure envelope from this build.
    pub fn failure(from_instance: &str, failure: Failure, duration_ms: u64) -> Envelope {
        Envelope {
            failure: Some(failure),
            ..Envelope::success(from_instance, String::new(), duration_ms)
        }
    }

    /// Whether this is a success envelope.
    pub fn is_success(&self) -> bool {
        self.failure.is_none()
    }

    /// The envelope as JSON, fields in the order `bus-protocol.md` shows them.
    pub fn to_json(&self) -> Vec<u8> {
        let wire = WireEnvelope {
            success: self.failure.is_none(),
            text: &self.text,
            from_instance: &self.from_instance,
            error: self.failure.as_ref().map(|f| f.error.as_str()),
            error_code: self.failure.as_ref().map(|f| f.code.as_str()),
            retryable: self.failure.as_ref().map(|f| f.retryable),
            duration_ms: self.duration_ms,
            protocol_version: self.protocol_version,
            capabilities: self.capabilities.as_deref(),
            usage: self.usage,
        };
        // Serializing strings, numbers and booleans into a Vec cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }
}

/// The wire form of an [`Envelope`]: borrowed fields, in protocol order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireEnvelope<'a> {
    success: bool,
    text: &'a str,
    from_instance: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retryable: Option<bool>,
    duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol_version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageReport>,
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
            ResponseError::NotJson => f.write_str("response body is not valid JSON"),
            ResponseError::NotObject => f.write_str("response body is not a JSON object"),
            ResponseError::Success => f.write_str("response has no boolean `success`"),
            ResponseError::FieldType(field) => {
                write!(f, "response field `{field}` has the wrong type")
            }
        }
    }
}

impl std::error::Error for ResponseError {}

fn optional_string(
    object: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<String>, ResponseError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ResponseError::FieldType(field)),
    }
}

/// `field` as a non-negative integer; absent or null is `None`.
fn optional_integer(
    object: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<u64>, ResponseError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => non_negative_integer(v)
            .map(Some)
            .ok_or(ResponseError::FieldType(field)),
    }
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
    let value: Value = serde_json::from_slice(body).map_err(|_| ResponseError::NotJson)?;
    let Value::Object(object) = value else {
        return Err(ResponseError::NotObject);
    };
    let success = object
        .get("success")
        .and_then(Value::as_bool)
        .ok_or(ResponseError::Success)?;
    let text = optional_string(&object, "text")?.unwrap_or_default();
    let from_instance = optional_string(&object, "fromInstance")?.unwrap_or_default();
    let duration_ms = optional_integer(&object, "durationMs")?.unwrap_or(0);
    let protocol_version = optional_integer(&object, "protocolVersion")?;
    let capabilities = match object.get("capabilities") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect(),
        ),
        Some(_) => return Err(ResponseError::FieldType("capabilities")),
    };
    let failure = if success {
        None
    } else {
        let given = optional_string(&object, "error")?;
        let code = match optional_string(&object, "errorCode")? {
            Some(code) => ErrorCode::from_wire(&code),
            None => super::legacy_failure_code(status, given.as_deref().unwrap_or("")),
        };
        let retryable = match object.get("retryable") {
            None | Some(Value::Null) => code.retryable(),
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ResponseError::FieldType("retryable")),
        };
        let error = given.unwrap_or_else(|| format!("peer reported a failure ({code})"));
        Some(Failure {
            error: truncate_chars(error, MAX_ERROR_CHARS),
            code,
            retryable,
        })
    };
    let usage = object.get("usage").and_then(UsageReport::from_value);
    Ok(Envelope {
        text,
        from_instance,
        duration_ms,
        protocol_version,
        capabilities,
        failure,
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_json_shapes() {
        let ok = Envelope::success("worker", "done".into(), 241);
        let v: Value = serde_json::from_slice(&ok.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success":true,"text":"done","fromInstance":"worker","durationMs":241,
                "protocolVersion":1,"capabilities":["structured-errors","retryable-errors"]})
        );
        let failure = Failure::new(
            ErrorCode::BudgetExhausted,
            "Budget exhausted: $1.2000 used of $1.00.",
        );
        let bad = Envelope::failure("worker", failure, 12);
        let v: Value = serde_json::from_slice(&bad.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"success":false,"text":"","fromInstance":"worker",
                "error":"Budget exhausted: $1.2000 used of $1.00.","errorCode":"budget_exhausted",
                "retryable":false,"durationMs":12,"protocolVersion":1,
                "capabilities":["structured-errors","retryable-errors"]})
        );
    }

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
    fn long_errors_are_cut_on_char_boundaries() {
        let f = Failure::new(ErrorCode::EngineCli, "é".repeat(MAX_ERROR_CHARS + 10));
        assert_eq!(f.error.chars().count(), MAX_ERROR_CHARS);
    }
}
