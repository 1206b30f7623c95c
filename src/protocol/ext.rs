//! What a request carries under `ext` (contract 4.1): the request id that makes a
//! delegation idempotent (8.2), the cancel flag (8.1), and the trace fields whose form
//! is checked though trace context is not built yet (8.4).

use serde_json::Value;
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
        if form && (MIN_REQUEST_ID_LEN..=MAX_REQUEST_ID_LEN).contains(&id.len()) {
            Ok(RequestId(id))
        } else {
            Err(InvalidRequestId)
        }
    }

    /// The id as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The `ext` fields of a request that this build reads. It serializes as the client
/// sends it: `cancel` only when true, `requestId` only when set, in that order.
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
    /// `ext.traceId` is not 32 lowercase hex digits.
    TraceId,
    /// `ext.parentRequestId` is not a request id.
    ParentRequestId,
}

/// Reads `ext` (absent is the default: no id, no cancel).
///
/// # Errors
/// The first field of the wrong form, in the order of [`ExtError`].
pub fn parse_ext(ext: Option<&Value>) -> Result<RequestExt, ExtError> {
    let Some(ext) = ext else {
        return Ok(RequestExt::default());
    };
    let Value::Object(ext) = ext else {
        return Err(ExtError::NotObject);
    };
    let request_id = match ext.get("requestId") {
        None => None,
        Some(Value::String(id)) => {
            Some(RequestId::new(id.as_str()).map_err(|_| ExtError::RequestId)?)
        }
        Some(_) => return Err(ExtError::RequestId),
    };
    let cancel = match ext.get("cancel") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) if request_id.is_some() => true,
        Some(_) => return Err(ExtError::Cancel),
    };
    match ext.get("traceId") {
        None => {}
        Some(Value::String(id)) if is_trace_id(id) => {}
        Some(_) => return Err(ExtError::TraceId),
    }
    match ext.get("parentRequestId") {
        None => {}
        Some(Value::String(id)) if RequestId::new(id.as_str()).is_ok() => {}
        Some(_) => return Err(ExtError::ParentRequestId),
    }
    Ok(RequestExt { request_id, cancel })
}

/// Whether `id` is 32 lowercase hex digits.
fn is_trace_id(id: &str) -> bool {
    id.len() == TRACE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
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
    fn ext_table() {
        let id = "0123456789abcdef0123456789abcdef";
        let ok = |cancel| {
            Ok(RequestExt {
                request_id: Some(RequestId::new(id).unwrap()),
                cancel,
            })
        };
        let cases = [
            (json!({}), Ok(RequestExt::default())),
            (json!({"other": [1, 2]}), Ok(RequestExt::default())),
            (json!({"requestId": id}), ok(false)),
            (json!({"requestId": id, "cancel": false}), ok(false)),
            (json!({"requestId": id, "cancel": true}), ok(true)),
            (
                json!({"requestId": id, "traceId": id, "parentRequestId": id}),
                ok(false),
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
        };
        let text = serde_json::to_string(&ext).unwrap();
        assert_eq!(
            text,
            format!(r#"{{"cancel":true,"requestId":"{}"}}"#, "07".repeat(16))
        );
        let value = serde_json::from_str(&text).unwrap();
        assert_eq!(parse_ext(Some(&value)), Ok(ext));
    }
}
