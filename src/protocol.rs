//! The bus protocol's pure parts: request and response types, request validation,
//! error codes and the retry table. Nothing here touches a socket or a file.
//!
//! The source of truth is `bus-protocol.md`; `contract.md` pins what it leaves open.

use serde_json::{Map, Value};
use std::fmt;

/// The protocol version this build speaks and emits.
pub const PROTOCOL_VERSION: u64 = 1;

/// The capabilities this build implements, advertised on every envelope and on health.
pub const CAPABILITIES: [&str; 2] = ["structured-errors", "retryable-errors"];

/// The largest `/api/talk` request body accepted (and sent by the client), in bytes.
pub const MAX_BODY_BYTES: u64 = 262_144;

/// Longest `error` text carried in an envelope; longer messages are cut on a char
/// boundary so a chatty engine can't bloat every response.
pub const MAX_ERROR_CHARS: usize = 2_000;

/// A stable, machine-readable error code. Codes are additive: new ones may appear,
/// existing ones never change meaning. Codes this build does not know are kept as
/// [`ErrorCode::Other`] rather than folded into `unknown`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request was malformed or violated a rule.
    InvalidRequest,
    /// The request body was larger than [`MAX_BODY_BYTES`] (or the head too large).
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
    /// A code this build does not know, kept exactly as received.
    Other(String),
}

/// Every code this build knows, in the order `bus-protocol.md` lists them, then ours.
pub const KNOWN_CODES: [ErrorCode; 22] = [
    ErrorCode::InvalidRequest,
    ErrorCode::RequestTooLarge,
    ErrorCode::BusDisabled,
    ErrorCode::AuthFailed,
    ErrorCode::PeerNotAllowed,
    ErrorCode::MaxDepthExceeded,
    ErrorCode::InvalidHandlerResponse,
    ErrorCode::InternalError,
    ErrorCode::InstanceUnavailable,
    ErrorCode::InvalidResponse,
    ErrorCode::Timeout,
    ErrorCode::BudgetExhausted,
    ErrorCode::Auth,
    ErrorCode::WritePermission,
    ErrorCode::TelegramConflict,
    ErrorCode::TelegramDelivery,
    ErrorCode::EngineCli,
    ErrorCode::FileWorkflow,
    ErrorCode::WorkflowState,
    ErrorCode::SessionState,
    ErrorCode::Unknown,
    ErrorCode::ServerBusy,
];

impl ErrorCode {
    /// The wire string of this code.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::BusDisabled => "bus_disabled",
            ErrorCode::AuthFailed => "auth_failed",
            ErrorCode::PeerNotAllowed => "peer_not_allowed",
            ErrorCode::MaxDepthExceeded => "max_depth_exceeded",
            ErrorCode::InvalidHandlerResponse => "invalid_handler_response",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::InstanceUnavailable => "instance_unavailable",
            ErrorCode::InvalidResponse => "invalid_response",
            ErrorCode::Timeout => "timeout",
            ErrorCode::BudgetExhausted => "budget_exhausted",
            ErrorCode::Auth => "auth",
            ErrorCode::WritePermission => "write_permission",
            ErrorCode::TelegramConflict => "telegram_conflict",
            ErrorCode::TelegramDelivery => "telegram_delivery",
            ErrorCode::EngineCli => "engine_cli",
            ErrorCode::FileWorkflow => "file_workflow",
            ErrorCode::WorkflowState => "workflow_state",
            ErrorCode::SessionState => "session_state",
            ErrorCode::Unknown => "unknown",
            ErrorCode::ServerBusy => "server_busy",
            ErrorCode::Other(code) => code,
        }
    }

    /// The code for a wire string; strings this build does not know are kept as
    /// [`ErrorCode::Other`].
    pub fn from_wire(code: &str) -> ErrorCode {
        KNOWN_CODES
            .iter()
            .find(|known| known.as_str() == code)
            .cloned()
            .unwrap_or_else(|| ErrorCode::Other(code.to_owned()))
    }

    /// The retry table: can the caller reasonably try the same delegation again
    /// without local operator action? Codes this build does not know are treated
    /// like `unknown` (retryable).
    pub fn retryable(&self) -> bool {
        match self {
            ErrorCode::InvalidRequest
            | ErrorCode::RequestTooLarge
            | ErrorCode::BusDisabled
            | ErrorCode::AuthFailed
            | ErrorCode::PeerNotAllowed
            | ErrorCode::MaxDepthExceeded
            | ErrorCode::BudgetExhausted
            | ErrorCode::Auth
            | ErrorCode::WritePermission
            | ErrorCode::FileWorkflow
            | ErrorCode::WorkflowState
            | ErrorCode::SessionState => false,
            ErrorCode::InvalidHandlerResponse
            | ErrorCode::InternalError
            | ErrorCode::InstanceUnavailable
            | ErrorCode::InvalidResponse
            | ErrorCode::Timeout
            | ErrorCode::TelegramConflict
            | ErrorCode::TelegramDelivery
            | ErrorCode::EngineCli
            | ErrorCode::Unknown
            | ErrorCode::ServerBusy
            | ErrorCode::Other(_) => true,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated `/api/talk` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TalkRequest {
    /// The calling instance's name (non-empty).
    pub from_instance: String,
    /// The delegated prompt body.
    pub prompt: String,
    /// The delegation depth, already incremented by the caller.
    pub depth: u64,
}

/// Why a request body was refused. Messages name the field and the rule, and never
/// echo the input back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The body is not valid UTF-8.
    NotUtf8,
    /// The body is not valid JSON.
    NotJson,
    /// The body is JSON but not an object.
    NotObject,
    /// `fromInstance` is missing, not a string, or empty.
    FromInstance,
    /// `prompt` is missing or not a string.
    Prompt,
    /// `depth` is missing or not a non-negative integer.
    Depth,
    /// `protocolVersion` is present and not 1.
    ProtocolVersion,
    /// `capabilities` is present and not an array of strings.
    Capabilities,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestError::NotUtf8 => "request body is not valid UTF-8",
            RequestError::NotJson => "request body is not valid JSON",
            RequestError::NotObject => "request body must be a JSON object",
            RequestError::FromInstance => "`fromInstance` must be a non-empty string",
            RequestError::Prompt => "`prompt` must be a string",
            RequestError::Depth => "`depth` must be a non-negative integer",
            RequestError::ProtocolVersion => "`protocolVersion` must be 1 when present",
            RequestError::Capabilities => "`capabilities` must be an array of strings when present",
        })
    }
}

impl std::error::Error for RequestError {}

/// Reads a JSON number as a non-negative integer: `1` and `1.0` count, `1.5`, `-1`
/// and `"1"` do not. Values past `u64::MAX` saturate (they are still integers).
fn non_negative_integer(value: &Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let f = value.as_f64()?;
    // `as_i64` catches negative integers; a float must be finite, whole and >= 0.
    if value.is_i64() || !f.is_finite() || f < 0.0 || f.fract() != 0.0 {
        return None;
    }
    // Saturating float-to-int conversion is what `as` does; the value is whole.
    Some(f as u64)
}

/// Validates a `/api/talk` request body (contract section 3, check 7).
///
/// Unknown fields and unknown capability strings are ignored so newer clients can
/// talk to this server.
///
/// # Errors
/// The first rule the body breaks, checked in field order: encoding, JSON, object,
/// `fromInstance`, `prompt`, `depth`, `protocolVersion`, `capabilities`.
pub fn parse_talk_request(body: &[u8]) -> Result<TalkRequest, RequestError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestError::NotUtf8)?;
    let value: Value = serde_json::from_str(text).map_err(|_| RequestError::NotJson)?;
    let Value::Object(mut object) = value else {
        return Err(RequestError::NotObject);
    };
    let from_instance = match object.remove("fromInstance") {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => return Err(RequestError::FromInstance),
    };
    let prompt = match object.remove("prompt") {
        Some(Value::String(s)) => s,
        _ => return Err(RequestError::Prompt),
    };
    let depth = object
        .get("depth")
        .and_then(non_negative_integer)
        .ok_or(RequestError::Depth)?;
    if let Some(version) = object.get("protocolVersion") {
        if non_negative_integer(version) != Some(PROTOCOL_VERSION) {
            return Err(RequestError::ProtocolVersion);
        }
    }
    if let Some(capabilities) = object.get("capabilities") {
        let all_strings = capabilities
            .as_array()
            .is_some_and(|items| items.iter().all(Value::is_string));
        if !all_strings {
            return Err(RequestError::Capabilities);
        }
    }
    Ok(TalkRequest {
        from_instance,
        prompt,
        depth,
    })
}

/// Serializes a v1 request as the client sends it (`depth` as given: the caller
/// increments it before calling).
pub fn encode_talk_request(request: &TalkRequest) -> Vec<u8> {
    let mut object = Map::new();
    object.insert(
        "fromInstance".into(),
        Value::String(request.from_instance.clone()),
    );
    object.insert("prompt".into(), Value::String(request.prompt.clone()));
    object.insert("depth".into(), Value::from(request.depth));
    object.insert("protocolVersion".into(), Value::from(PROTOCOL_VERSION));
    object.insert("capabilities".into(), capabilities_value());
    Value::Object(object).to_string().into_bytes()
}

fn capabilities_value() -> Value {
    Value::Array(
        CAPABILITIES
            .iter()
            .map(|c| Value::String((*c).to_owned()))
            .collect(),
    )
}

/// The failure part of an envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// [`MAX_ERROR_CHARS`].
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Failure {
        let retryable = code.retryable();
        Failure {
            error: truncate_chars(error.into(), MAX_ERROR_CHARS),
            code,
            retryable,
        }
    }
}

/// Cuts `s` to at most `max` characters, on a char boundary.
pub fn truncate_chars(mut s: String, max: usize) -> String {
    if let Some((index, _)) = s.char_indices().nth(max) {
        s.truncate(index);
    }
    s
}

/// A `/api/talk` response envelope, v1 or legacy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The reply text (`""` on failure).
    pub text: String,
    /// The answering instance's name (empty when a legacy peer left it out).
    pub from_instance: String,
    /// How long the answer took, in milliseconds (0 when a legacy peer left it out).
    pub duration_ms: u64,
    /// `Some(1)` for v1 envelopes, `None` for legacy ones.
    pub protocol_version: Option<u64>,
    /// The peer's advertised capabilities.
    pub capabilities: Vec<String>,
    /// `None` on success.
    pub failure: Option<Failure>,
}

impl Envelope {
    /// A v1 success envelope from this build.
    pub fn success(from_instance: &str, text: String, duration_ms: u64) -> Envelope {
        Envelope {
            text,
            from_instance: from_instance.to_owned(),
            duration_ms,
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
            failure: None,
        }
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
            capabilities: &self.capabilities,
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
    capabilities: &'a [String],
}

/// Why a peer's answer is not an envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Parses a peer's `/api/talk` answer: a v1 envelope, a legacy success without
/// `protocolVersion`, or a legacy failure with only `success: false` and `error`.
///
/// A failure without `errorCode` is `unknown`; one without `retryable` takes it from
/// the retry table; codes this build does not know are kept as they are.
///
/// # Errors
/// The body is not a JSON object with a boolean `success`, or a known field has the
/// wrong type.
pub fn parse_response(body: &[u8]) -> Result<Envelope, ResponseError> {
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
    let duration_ms = match object.get("durationMs") {
        None | Some(Value::Null) => 0,
        Some(v) => non_negative_integer(v).ok_or(ResponseError::FieldType("durationMs"))?,
    };
    let protocol_version = match object.get("protocolVersion") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(non_negative_integer(v).ok_or(ResponseError::FieldType("protocolVersion"))?)
        }
    };
    let capabilities = match object.get("capabilities") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| item.as_str().map(str::to_owned))
            .collect(),
        Some(_) => return Err(ResponseError::FieldType("capabilities")),
    };
    let failure = if success {
        None
    } else {
        let code = optional_string(&object, "errorCode")?
            .map(|c| ErrorCode::from_wire(&c))
            .unwrap_or(ErrorCode::Unknown);
        let retryable = match object.get("retryable") {
            None | Some(Value::Null) => code.retryable(),
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ResponseError::FieldType("retryable")),
        };
        let error = optional_string(&object, "error")?
            .unwrap_or_else(|| format!("peer reported a failure ({code})"));
        Some(Failure {
            error: truncate_chars(error, MAX_ERROR_CHARS),
            code,
            retryable,
        })
    };
    Ok(Envelope {
        text,
        from_instance,
        duration_ms,
        protocol_version,
        capabilities,
        failure,
    })
}

/// What `GET /api/health` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// The instance's fingerprint (`bus.kind`).
    pub kind: String,
    /// The instance's name.
    pub instance: String,
    /// `"ok"` when the instance is serving.
    pub status: String,
    /// The serving process's id.
    pub pid: u32,
}

/// Parses a health answer, ignoring fields this build does not know.
///
/// # Errors
/// The body is not a JSON object with string `kind`, `instance` and `status`.
pub fn parse_health(body: &[u8]) -> Result<Health, ResponseError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| ResponseError::NotJson)?;
    let Value::Object(object) = value else {
        return Err(ResponseError::NotObject);
    };
    let field = |name: &'static str| -> Result<String, ResponseError> {
        optional_string(&object, name)?.ok_or(ResponseError::FieldType(name))
    };
    let pid = object
        .get("pid")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(0);
    Ok(Health {
        kind: field("kind")?,
        instance: field("instance")?,
        status: field("status")?,
        pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_validation_table() {
        use RequestError::*;
        let ok = |from: &str, prompt: &str, depth: u64| {
            Ok(TalkRequest {
                from_instance: from.into(),
                prompt: prompt.into(),
                depth,
            })
        };
        let cases: Vec<(&[u8], Result<TalkRequest, RequestError>)> = vec![
            (br#"{"fromInstance":"a","prompt":"hi","depth":0}"#, ok("a", "hi", 0)),
            (br#"{"fromInstance":"a","prompt":"","depth":1,"protocolVersion":1}"#, ok("a", "", 1)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1.0}"#, ok("a", "p", 1)),
            (br#"{"fromInstance":"a","prompt":"p","depth":2,"protocolVersion":1.0}"#, ok("a", "p", 2)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":["x","structured-errors"]}"#, ok("a", "p", 0)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":[]}"#, ok("a", "p", 0)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"newField":{"x":1}}"#, ok("a", "p", 0)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1e300}"#, ok("a", "p", u64::MAX)),
            (br#"{"fromInstance":"a","prompt":"p","depth":99999999999999999999999}"#, ok("a", "p", u64::MAX)),
            (b"\xff\xfe", Err(NotUtf8)),
            (b"", Err(NotJson)),
            (b"{", Err(NotJson)),
            (b"[]", Err(NotObject)),
            (b"\"x\"", Err(NotObject)),
            (b"null", Err(NotObject)),
            (br#"{"prompt":"p","depth":0}"#, Err(FromInstance)),
            (br#"{"fromInstance":"","prompt":"p","depth":0}"#, Err(FromInstance)),
            (br#"{"fromInstance":7,"prompt":"p","depth":0}"#, Err(FromInstance)),
            (br#"{"fromInstance":null,"prompt":"p","depth":0}"#, Err(FromInstance)),
            (br#"{"fromInstance":"a","depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":5,"depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":null,"depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":"p"}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1.5}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":-1}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":"1"}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":null}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":true}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"protocolVersion":2}"#, Err(ProtocolVersion)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"protocolVersion":"1"}"#, Err(ProtocolVersion)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"protocolVersion":null}"#, Err(ProtocolVersion)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":"x"}"#, Err(Capabilities)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":[1]}"#, Err(Capabilities)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":null}"#, Err(Capabilities)),
        ];
        for (body, want) in cases {
            assert_eq!(
                parse_talk_request(body),
                want,
                "body {:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn request_errors_never_echo_input() {
        let secret_like = br#"{"fromInstance":"a","prompt":"p","depth":"TOPSECRET"}"#;
        let err = parse_talk_request(secret_like).unwrap_err();
        assert!(!err.to_string().contains("TOPSECRET"));
    }

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
        for code in KNOWN_CODES {
            let s = code.as_str();
            assert!(not_retryable.contains(&s) ^ retryable.contains(&s), "{s}");
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_kept() {
        for code in KNOWN_CODES {
            assert_eq!(ErrorCode::from_wire(code.as_str()), code);
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

    #[test]
    fn envelope_round_trips_through_parser() {
        let env = Envelope::failure("w", Failure::new(ErrorCode::ServerBusy, "busy"), 5);
        assert_eq!(parse_response(&env.to_json()).unwrap(), env);
        let env = Envelope::success("w", "text \"quoted\" \u{1F600}".into(), 5);
        assert_eq!(parse_response(&env.to_json()).unwrap(), env);
    }

    #[test]
    fn encoded_request_is_valid_v1() {
        let req = TalkRequest {
            from_instance: "a".into(),
            prompt: "p".into(),
            depth: 2,
        };
        let body = encode_talk_request(&req);
        assert_eq!(parse_talk_request(&body).unwrap(), req);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["protocolVersion"], 1);
    }

    #[test]
    fn long_errors_are_cut_on_char_boundaries() {
        let f = Failure::new(ErrorCode::EngineCli, "é".repeat(MAX_ERROR_CHARS + 10));
        assert_eq!(f.error.chars().count(), MAX_ERROR_CHARS);
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
        assert!(parse_health(br#"{"kind":"loopbus","status":"ok"}"#).is_err());
    }
}
