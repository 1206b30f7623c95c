//! What a request carries under `ext` (contract 4.1): the request id that makes a
//! delegation idempotent (8.2), the cancel flag (8.1), and the trace context that links
//! the turns of one tree of delegations (8.4).

use serde_json::{Map, Value};
use std::fmt;

/// Shortest request id accepted (contract 8.2).
pub const MIN_REQUEST_ID_LEN: usize = 16;
/// Longest request id accepted (contract 8.2).
pub const MAX_REQUEST_ID_LEN: usize = 64;
/// Length of a trace id: 32 lowercase hex digits (contract 8.4).
pub const TRACE_ID_LEN: usize = 32;

/// A request id: 16 to 64 characters of `[A-Za-z0-9_-]` (contract 8.2). Our client
/// sends 32 lowercase hex digits, 128 random bits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct RequestId(String);

/// A string that is not a request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidRequestId;

impl fmt::Display for InvalidRequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a request id is {MIN_REQUEST_ID_LEN} to {MAX_REQUEST_ID_LEN} characters of A-Z, a-z, 0-9, '_' and '-'"
        )
    }
}

impl std::error::Error for InvalidRequestId {}

impl RequestId {
    /// Checks the form of `id`.
    ///
    /// # Errors
    /// [`InvalidRequestId`] when it is too short, too long or holds another character.
    pub fn new(id: impl Into<String>) -> Result<RequestId, InvalidRequestId> {
        let id = id.into();
        let form = id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        let form = form && (MIN_REQUEST_ID_LEN..=MAX_REQUEST_ID_LEN).contains(&id.len());
        form.then_some(RequestId(id)).ok_or(InvalidRequestId)
    }
}

string_type!(RequestId);

/// A trace id: 32 lowercase hex digits, not all zeros (the W3C trace-id form, contract
/// 8.4). It names one tree of delegations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct TraceId(String);

/// A string that is not a trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidTraceId;

impl fmt::Display for InvalidTraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a trace id is {TRACE_ID_LEN} lowercase hex digits, not all zeros"
        )
    }
}

impl std::error::Error for InvalidTraceId {}

impl TraceId {
    /// Checks the form of `id`.
    ///
    /// # Errors
    /// [`InvalidTraceId`] when it is not 32 lowercase hex digits, or all zeros.
    pub fn new(id: impl Into<String>) -> Result<TraceId, InvalidTraceId> {
        let id = id.into();
        let form = is_lower_hex(&id, TRACE_ID_LEN) && not_all_zeros(&id);
        form.then_some(TraceId(id)).ok_or(InvalidTraceId)
    }
}

string_type!(TraceId);

/// The engine's environment variable that names its turn's trace (contract 8.4).
pub const TRACE_ID_VAR: &str = "LOOPBUS_TRACE_ID";
/// The engine's environment variable that names its turn's request id (contract 8.4).
pub const REQUEST_ID_VAR: &str = "LOOPBUS_REQUEST_ID";
/// The W3C trace context in the environment, the OpenTelemetry convention (8.4).
pub const TRACEPARENT_VAR: &str = "TRACEPARENT";
/// Length of a W3C parent (span) id in `TRACEPARENT`: 16 lowercase hex digits.
pub const SPAN_ID_LEN: usize = 16;

/// `TRACEPARENT`'s value for `trace_id` and a span id of [`SPAN_ID_LEN`] lowercase hex
/// digits: `00-<traceId>-<spanId>-01` (version 0, sampled).
pub fn format_traceparent(trace_id: &TraceId, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// The trace id of a W3C `traceparent` value: `<version>-<traceId>-<spanId>-<flags>`,
/// two lowercase hex digits of version (not `ff`; version `00` has exactly these four
/// fields, a later one may add more), a trace id and a span id not all zeros, two hex
/// digits of flags. `None` for anything else.
pub fn parse_traceparent(value: &str) -> Option<TraceId> {
    let fields: Vec<&str> = value.split('-').collect();
    let [version, trace_id, span_id, flags, more @ ..] = fields.as_slice() else {
        return None;
    };
    let form = is_lower_hex(version, 2)
        && *version != "ff"
        && (*version != "00" || more.is_empty())
        && is_lower_hex(span_id, SPAN_ID_LEN)
        && not_all_zeros(span_id)
        && is_lower_hex(flags, 2);
    form.then(|| TraceId::new(*trace_id).ok()).flatten()
}

/// Whether `s` is `len` lowercase hex digits.
fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `s` holds a digit other than `0` (the W3C rule for trace and span ids).
fn not_all_zeros(s: &str) -> bool {
    s.bytes().any(|b| b != b'0')
}

/// The `ext` fields of a request that this build reads. It serializes as the client
/// sends it: `cancel` only when true, the others only when set, in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestExt {
    /// `ext.cancel: true`: cancel the turn of `request_id` (contract 8.1).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
    /// `ext.requestId`: the delegation's id, the same across its retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// `ext.traceId`: the tree of delegations this one belongs to (contract 8.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<TraceId>,
    /// `ext.parentRequestId`: the request id of the turn that made this delegation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<RequestId>,
}

/// Why `ext` was refused (contract 3, check 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtError {
    /// `ext` is not an object.
    NotObject,
    /// `ext.requestId` is not a request id.
    RequestId,
    /// `ext.cancel` is not a boolean, or is true without a request id.
    Cancel,
    /// `ext.traceId` is not 32 lowercase hex digits, or is all zeros.
    TraceId,
    /// `ext.parentRequestId` is not a request id.
    ParentRequestId,
}

/// Reads `ext` (absent is the default: no id, no cancel).
///
/// # Errors
/// The first field of the wrong form, in the order of [`ExtError`].
pub fn parse_ext(ext: Option<&Value>) -> Result<RequestExt, ExtError> {
    let ext = match ext {
        None => return Ok(RequestExt::default()),
        Some(Value::Object(ext)) => ext,
        Some(_) => return Err(ExtError::NotObject),
    };
    let request_id = id(ext, "requestId", RequestId::new, ExtError::RequestId)?;
    let cancel = match ext.get("cancel") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) if request_id.is_some() => true,
        Some(_) => return Err(ExtError::Cancel),
    };
    Ok(RequestExt {
        cancel,
        request_id,
        trace_id: id(ext, "traceId", TraceId::new, ExtError::TraceId)?,
        parent_request_id: id(
            ext,
            "parentRequestId",
            RequestId::new,
            ExtError::ParentRequestId,
        )?,
    })
}

/// The id in `ext[key]`, read by `new`; absent is `None`, anything else `error`.
fn id<T, E>(
    ext: &Map<String, Value>,
    key: &str,
    new: fn(String) -> Result<T, E>,
    error: ExtError,
) -> Result<Option<T>, ExtError> {
    let read = |v: &Value| new(v.as_str()?.to_owned()).ok();
    ext.get(key).map(|v| read(v).ok_or(error)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_id_form() {
        assert!(RequestId::new("a".repeat(16)).is_ok());
        assert!(RequestId::new("A-z_0".repeat(12) + "abcd").is_ok());
        assert!(RequestId::new("a".repeat(64)).is_ok());
        for bad in [
            "a".repeat(15),
            "a".repeat(65),
            "a".repeat(15) + " ",
            "é".repeat(16),
        ] {
            assert_eq!(RequestId::new(bad.clone()), Err(InvalidRequestId), "{bad}");
        }
        let id = RequestId::new("ab".repeat(16)).unwrap();
        assert_eq!(id.as_str(), "ab".repeat(16));
        assert!(RequestId::new(id.as_str()).is_ok());
    }

    #[test]
    fn trace_id_form() {
        assert!(TraceId::new("0".repeat(31) + "1").is_ok());
        assert_eq!(
            TraceId::new("af".repeat(16)).unwrap().as_str(),
            "af".repeat(16)
        );
        for bad in [
            "0".repeat(32),
            "A".repeat(32),
            "a".repeat(31),
            "a".repeat(33),
            "g".repeat(32),
            String::new(),
        ] {
            assert_eq!(TraceId::new(bad.clone()), Err(InvalidTraceId), "{bad}");
        }
    }

    #[test]
    fn traceparent_table() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let cases = [
            (format!("00-{t}-00f067aa0ba902b7-01"), true),
            (format!("00-{t}-00f067aa0ba902b7-00"), true),
            (format!("01-{t}-00f067aa0ba902b7-01-future"), true),
            (format!("00-{t}-00f067aa0ba902b7-01-extra"), false),
            (format!("ff-{t}-00f067aa0ba902b7-01"), false),
            (format!("00-{t}-0000000000000000-01"), false),
            (format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)), false),
            (
                format!("00-{}-00f067aa0ba902b7-01", t.to_uppercase()),
                false,
            ),
            (format!("00-{t}-00F067AA0BA902B7-01"), false),
            (format!("00-{t}-00f067aa0ba902b7"), false),
            (format!("0-{t}-00f067aa0ba902b7-01"), false),
            (format!("00-{t}-00f067aa0ba902b7-1"), false),
            (format!(" 00-{t}-00f067aa0ba902b7-01"), false),
            (String::new(), false),
        ];
        for (value, ok) in cases {
            let want = ok.then(|| TraceId::new(t).unwrap());
            assert_eq!(parse_traceparent(&value), want, "{value}");
        }
        let id = TraceId::new(t).unwrap();
        let made = format_traceparent(&id, "00f067aa0ba902b7");
        assert_eq!(made, format!("00-{t}-00f067aa0ba902b7-01"));
        assert_eq!(parse_traceparent(&made), Some(id));
    }

    #[test]
    fn ext_table() {
        let id = "0123456789abcdef0123456789abcdef";
        let ok = |cancel| {
            Ok(RequestExt {
                request_id: Some(RequestId::new(id).unwrap()),
                cancel,
                ..RequestExt::default()
            })
        };
        let cases = [
            (json!({}), Ok(RequestExt::default())),
            (json!({"other": [1, 2]}), Ok(RequestExt::default())),
            (json!({"requestId": id}), ok(false)),
            (json!({"requestId": id, "cancel": false}), ok(false)),
            (json!({"requestId": id, "cancel": true}), ok(true)),
            (
                json!({"requestId": id, "traceId": id, "parentRequestId": "p".repeat(16)}),
                Ok(RequestExt {
                    request_id: Some(RequestId::new(id).unwrap()),
                    trace_id: Some(TraceId::new(id).unwrap()),
                    parent_request_id: Some(RequestId::new("p".repeat(16)).unwrap()),
                    cancel: false,
                }),
            ),
            (json!([]), Err(ExtError::NotObject)),
            (json!("x"), Err(ExtError::NotObject)),
            (json!({"requestId": 5}), Err(ExtError::RequestId)),
            (json!({"requestId": "short"}), Err(ExtError::RequestId)),
            (json!({"cancel": true}), Err(ExtError::Cancel)),
            (
                json!({"requestId": id, "cancel": "yes"}),
                Err(ExtError::Cancel),
            ),
            (
                json!({"traceId": id.to_uppercase()}),
                Err(ExtError::TraceId),
            ),
            (json!({"traceId": "ab"}), Err(ExtError::TraceId)),
            (json!({"traceId": "0".repeat(32)}), Err(ExtError::TraceId)),
            (json!({"traceId": 7}), Err(ExtError::TraceId)),
            (
                json!({"parentRequestId": 7}),
                Err(ExtError::ParentRequestId),
            ),
            (
                json!({"parentRequestId": "x"}),
                Err(ExtError::ParentRequestId),
            ),
        ];
        for (ext, want) in cases {
            assert_eq!(parse_ext(Some(&ext)), want, "{ext}");
        }
        assert_eq!(parse_ext(None), Ok(RequestExt::default()));
    }

    #[test]
    fn encoded_ext_reads_back() {
        let empty = serde_json::to_value(RequestExt::default()).unwrap();
        assert_eq!(empty, json!({}));
        let ext = RequestExt {
            request_id: Some(RequestId::new("07".repeat(16)).unwrap()),
            cancel: true,
            trace_id: Some(TraceId::new("0a".repeat(16)).unwrap()),
            parent_request_id: Some(RequestId::new("p".repeat(16)).unwrap()),
        };
        let text = serde_json::to_string(&ext).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"cancel":true,"requestId":"{}","traceId":"{}","parentRequestId":"{}"}}"#,
                "07".repeat(16),
                "0a".repeat(16),
                "p".repeat(16)
            )
        );
        let value = serde_json::from_str(&text).unwrap();
        assert_eq!(parse_ext(Some(&value)), Ok(ext));
    }
}
