//! `/api/talk` requests: the typed [`TalkRequest`], its validation (contract section 3,
//! check 7) and the client's encoding.

use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

use super::ext::{parse_ext, ExtError, RequestExt};
use super::{non_negative_integer, PROTOCOL_VERSION};

/// Longest `fromInstance` accepted, in bytes (contract section 3, check 7).
pub const MAX_FROM_INSTANCE_BYTES: usize = 1024;

/// A validated `/api/talk` request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TalkRequest {
    /// The calling instance's name: non-empty, at most 1,024 bytes
    /// (`MAX_FROM_INSTANCE_BYTES`), without control characters.
    pub from_instance: String,
    /// The delegated prompt body.
    pub prompt: String,
    /// The delegation depth, already incremented by the caller.
    pub depth: u64,
    /// The capabilities the request listed (unknown strings kept; empty when absent).
    pub capabilities: Vec<String>,
    /// What the request carries under `ext` that this build reads.
    pub ext: RequestExt,
}

impl TalkRequest {
    /// A request without capabilities or `ext`.
    pub fn new(from_instance: impl Into<String>, prompt: impl Into<String>, depth: u64) -> Self {
        TalkRequest {
            from_instance: from_instance.into(),
            prompt: prompt.into(),
            depth,
            capabilities: Vec::new(),
            ext: RequestExt::default(),
        }
    }

    /// Whether the request listed `capability`.
    pub fn lists(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// Why a request body was refused. Messages name the field and the rule, and never
/// echo the input back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The body is not valid UTF-8.
    NotUtf8,
    /// The body is not valid JSON.
    NotJson,
    /// The body is JSON but not an object.
    NotObject,
    /// `fromInstance` is missing, not a string, or empty.
    FromInstance,
    /// `fromInstance` holds a control character (C0 U+0000-U+001F, DEL U+007F or C1
    /// U+0080-U+009F), which would garble a log line, a terminal or an engine's
    /// environment.
    FromInstanceControl,
    /// `fromInstance` is longer than 1,024 bytes (`MAX_FROM_INSTANCE_BYTES`).
    FromInstanceTooLong,
    /// `prompt` is missing or not a string.
    Prompt,
    /// `depth` is missing or not a non-negative integer (in its text: `1e-400` is not
    /// one, though it reads as 0).
    Depth,
    /// `protocolVersion` is present and not 1.
    ProtocolVersion,
    /// `capabilities` is present and not an array of strings.
    Capabilities,
    /// `ext` is present and not an object, or one of its fields has the wrong form.
    Ext(ExtError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotUtf8 => "request body is not valid UTF-8",
            Self::NotJson => "request body is not valid JSON",
            Self::NotObject => "request body must be a JSON object",
            Self::FromInstance => "`fromInstance` must be a non-empty string",
            Self::FromInstanceControl => "`fromInstance` must not contain a control character",
            Self::FromInstanceTooLong => "`fromInstance` must be at most 1024 bytes",
            Self::Prompt => "`prompt` must be a string",
            Self::Depth => "`depth` must be a non-negative integer",
            Self::ProtocolVersion => "`protocolVersion` must be 1 when present",
            Self::Capabilities => "`capabilities` must be an array of strings when present",
            Self::Ext(ExtError::NotObject) => "`ext` must be an object when present",
            Self::Ext(ExtError::RequestId) => {
                "`ext.requestId` must be 16 to 64 characters of A-Z, a-z, 0-9, '_' and '-'"
            }
            Self::Ext(ExtError::Cancel) => {
                "`ext.cancel` must be a boolean, and true only with `ext.requestId`"
            }
            Self::Ext(ExtError::TraceId) => {
                "`ext.traceId` must be 32 lowercase hex digits, not all zeros"
            }
            Self::Ext(ExtError::ParentRequestId) => {
                "`ext.parentRequestId` must be 16 to 64 characters of A-Z, a-z, 0-9, '_' and '-'"
            }
        })
    }
}

impl std::error::Error for RequestError {}

/// Validates a `/api/talk` request body (contract section 3, check 7).
///
/// Unknown fields and unknown capability strings are ignored so newer clients can
/// talk to this server.
///
/// # Errors
/// The first rule the body breaks, checked in field order: encoding, JSON, object,
/// `fromInstance`, `prompt`, `depth`, `protocolVersion`, `capabilities`, `ext`.
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
    if from_instance.chars().any(char::is_control) {
        return Err(RequestError::FromInstanceControl);
    }
    if from_instance.len() > MAX_FROM_INSTANCE_BYTES {
        return Err(RequestError::FromInstanceTooLong);
    }
    let prompt = match object.remove("prompt") {
        Some(Value::String(s)) => s,
        _ => return Err(RequestError::Prompt),
    };
    // A whole `f64` may be a rounded fraction (`1e-400` reads as 0): then the text
    // decides. Plain integers are exact and need no second look.
    let exact =
        |v: &&Value| v.is_u64() || top_level_text(text, "depth").is_some_and(is_integer_text);
    let depth = object
        .get("depth")
        .filter(exact)
        .and_then(non_negative_integer)
        .ok_or(RequestError::Depth)?;
    if let Some(version) = object.get("protocolVersion") {
        if non_negative_integer(version) != Some(PROTOCOL_VERSION) {
            return Err(RequestError::ProtocolVersion);
        }
    }
    Ok(TalkRequest {
        from_instance,
        prompt,
        depth,
        capabilities: match object.remove("capabilities") {
            None => Vec::new(),
            Some(v) => serde_json::from_value(v).map_err(|_| RequestError::Capabilities)?,
        },
        ext: parse_ext(object.get("ext")).map_err(RequestError::Ext)?,
    })
}

/// The raw text of the top-level field `key` of `text`, a JSON object serde_json
/// has already accepted (the last one when the key repeats, as `Value` keeps it).
fn top_level_text<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    fields.get(key).map(|raw| raw.get())
}

/// Whether `text`, a JSON number serde_json has already accepted, denotes an integer
/// exactly: `1.0`, `1e3`, `10e-1`, `-0.0` and `0e-999` do; `1.5`, `1e-400` and
/// `1.0000000000000000001` do not (an `f64` rounds them to whole numbers). It does
/// when every digit after the decimal point, once the exponent has moved it, is zero.
fn is_integer_text(text: &str) -> bool {
    let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
    let unsigned = mantissa.trim_start_matches('-');
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    // An exponent past i64 saturates: far beyond any digit count a body can hold.
    let negative = exponent.starts_with('-');
    let exponent = exponent
        .parse()
        .unwrap_or(if negative { i64::MIN } else { i64::MAX });
    let point = i64::try_from(whole.len()).map_or(i64::MAX, |n| n.saturating_add(exponent));
    let point = usize::try_from(point).unwrap_or(0);
    let digits = format!("{whole}{fraction}");
    digits.bytes().skip(point).all(|b| b == b'0')
}

/// Serializes a v1 request listing the base capabilities; see
/// `encode_talk_request_with`.
pub fn encode_talk_request(request: &TalkRequest) -> Vec<u8> {
    encode_talk_request_with(request, &super::negotiate(&[]))
}

/// Serializes a v1 request as the client sends it (`depth` as given: the caller
/// increments it before calling), listing `capabilities` (the negotiated ones,
/// `negotiate`) and `request.ext` when it has anything to say. It carries only fields
/// the original's strict parser accepts (contract 4.1).
pub fn encode_talk_request_with(request: &TalkRequest, capabilities: &[String]) -> Vec<u8> {
    /// The request on the wire, its fields in name order as the encoder has always
    /// written them.
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire<'a> {
        capabilities: &'a [String],
        depth: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        ext: Option<&'a RequestExt>,
        from_instance: &'a str,
        prompt: &'a str,
        protocol_version: u64,
    }
    let wire = Wire {
        capabilities,
        depth: request.depth,
        ext: Some(&request.ext).filter(|ext| **ext != RequestExt::default()),
        from_instance: &request.from_instance,
        prompt: &request.prompt,
        protocol_version: PROTOCOL_VERSION,
    };
    // Strings, integers and booleans always serialize.
    serde_json::to_vec(&wire).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::BASE_CAPABILITIES;

    /// The top-level fields a request may carry (contract 4.1): the original rejects
    /// any other, so extension data goes only inside `ext`.
    const REQUEST_FIELDS: [&str; 6] = [
        "fromInstance",
        "prompt",
        "depth",
        "protocolVersion",
        "capabilities",
        "ext",
    ];

    /// The bytes on the wire, field order included, as the encoder has always
    /// written them.
    #[test]
    fn encoded_request_bytes() {
        let mut request = TalkRequest::new("a\u{1}", "p\"", 2);
        let caps = ["x".to_owned()];
        let plain = encode_talk_request_with(&request, &caps);
        let want = r#"{"capabilities":["x"],"depth":2,"fromInstance":"a\u0001","prompt":"p\"","protocolVersion":1}"#;
        assert_eq!(String::from_utf8(plain).unwrap(), want);
        request.ext = RequestExt {
            request_id: Some(crate::protocol::RequestId::new("r".repeat(16)).unwrap()),
            cancel: true,
            ..RequestExt::default()
        };
        let with_ext = String::from_utf8(encode_talk_request_with(&request, &caps)).unwrap();
        let ext = format!(
            r#""ext":{{"cancel":true,"requestId":"{}"}},"#,
            "r".repeat(16)
        );
        assert_eq!(
            with_ext,
            want.replace(r#""fromInstance""#, &format!("{ext}\"fromInstance\""))
        );
    }

    /// Every request the client encodes passes the original's strict schema: only the
    /// six fields, only base capability strings (contract 4.1).
    #[test]
    fn bug_requests_carry_only_fields_the_original_accepts() {
        let mut request = TalkRequest::new("a", "p", 1);
        // The original's health lists the base two; it may still get a request id,
        // which lives inside `ext`, an object of anything.
        request.ext.request_id = Some(super::super::RequestId::new("01".repeat(16)).unwrap());
        let original: Vec<String> = BASE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        for body in [
            encode_talk_request(&request),
            encode_talk_request_with(&request, &super::super::negotiate(&original)),
        ] {
            let v: Value = serde_json::from_slice(&body).unwrap();
            let object = v.as_object().unwrap();
            assert!(object.keys().all(|k| REQUEST_FIELDS.contains(&k.as_str())));
            assert_eq!(v["capabilities"], serde_json::json!(BASE_CAPABILITIES));
        }
    }

    #[test]
    fn request_validation_table() {
        use RequestError::*;
        let ok = |from: &str, prompt: &str, depth: u64| Ok(TalkRequest::new(from, prompt, depth));
        let cases: Vec<(&[u8], Result<TalkRequest, RequestError>)> = vec![
            (br#"{"fromInstance":"a","prompt":"hi","depth":0}"#, ok("a", "hi", 0)),
            (br#"{"fromInstance":"a","prompt":"","depth":1,"protocolVersion":1}"#, ok("a", "", 1)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1.0}"#, ok("a", "p", 1)),
            (br#"{"fromInstance":"a","prompt":"p","depth":2,"protocolVersion":1.0}"#, ok("a", "p", 2)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"capabilities":["x","structured-errors"]}"#, Ok(TalkRequest { capabilities: vec!["x".into(), "structured-errors".into()], ..TalkRequest::new("a", "p", 0) })),
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
            (br#"{"fromInstance":"a\u0000","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"\u001f","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"a\u007fb","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"a\nb","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"a\tb","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            // Regression (bug_from_instance_accepted_c1_controls): C1 is refused like C0.
            (br#"{"fromInstance":"a\u0080","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"\u009b31m","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"a\u009fb","prompt":"p","depth":0}"#, Err(FromInstanceControl)),
            (br#"{"fromInstance":"\u00a0 \u00e9 \u2028 ok","prompt":"p","depth":0}"#, ok("\u{a0} \u{e9} \u{2028} ok", "p", 0)),
            (br#"{"fromInstance":"a","depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":5,"depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":null,"depth":0}"#, Err(Prompt)),
            (br#"{"fromInstance":"a","prompt":"p"}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1.5}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1e-19}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1e-400}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":-1e-400}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1.0000000000000000001}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"depth":1e-400}"#, Err(Depth)),
            (br#"{"fromInstance":"a","prompt":"p","depth":1e-400,"depth":0}"#, ok("a", "p", 0)),
            (br#"{"fromInstance":"a","prompt":"p","depth":10e-1}"#, ok("a", "p", 1)),
            (br#"{"fromInstance":"a","prompt":"p","dep\u0074h":2.0}"#, ok("a", "p", 2)),
            (br#"{"fromInstance":"a","prompt":"p","depth":0e-400}"#, ok("a", "p", 0)),
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
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"ext":[]}"#, Err(Ext(ExtError::NotObject))),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"ext":{"requestId":"x"}}"#, Err(Ext(ExtError::RequestId))),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"ext":{"cancel":true}}"#, Err(Ext(ExtError::Cancel))),
            (br#"{"fromInstance":"a","prompt":"p","depth":0,"ext":{"anything":[1]}}"#, ok("a", "p", 0)),
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

    /// `fromInstance` is checked for length in bytes, at the limit and one past it.
    #[test]
    fn bug_from_instance_had_no_length_limit() {
        let body = |from: &str| {
            let mut object = serde_json::Map::new();
            object.insert("fromInstance".into(), Value::String(from.to_owned()));
            object.insert("prompt".into(), Value::String("p".into()));
            object.insert("depth".into(), Value::from(0));
            Value::Object(object).to_string().into_bytes()
        };
        let at_limit = "a".repeat(MAX_FROM_INSTANCE_BYTES);
        assert_eq!(
            parse_talk_request(&body(&at_limit)).unwrap().from_instance,
            at_limit
        );
        let over = "a".repeat(MAX_FROM_INSTANCE_BYTES + 1);
        assert_eq!(
            parse_talk_request(&body(&over)),
            Err(RequestError::FromInstanceTooLong)
        );
        // 342 three-byte chars: 1,026 bytes, though only 342 chars.
        let wide = "\u{20ac}".repeat(342);
        assert_eq!(
            parse_talk_request(&body(&wide)),
            Err(RequestError::FromInstanceTooLong)
        );
        assert!(RequestError::FromInstanceTooLong
            .to_string()
            .contains(&MAX_FROM_INSTANCE_BYTES.to_string()));
    }

    /// serde_json reads `1e-400` as 0.0, which passed as depth 0; its text is not an
    /// integer, like `1e-19`'s.
    #[test]
    fn bug_depth_1e_minus_400_passed_as_depth_0() {
        for depth in ["1e-400", "1e-19", "5e-324", "0.0000000000000000000000001"] {
            let body = format!(r#"{{"fromInstance":"a","prompt":"p","depth":{depth}}}"#);
            assert_eq!(
                parse_talk_request(body.as_bytes()),
                Err(RequestError::Depth),
                "{depth}"
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
    fn encoded_request_is_valid_v1() {
        let mut req = TalkRequest::new("a", "p", 2);
        req.ext.request_id = Some(super::super::RequestId::new("09".repeat(16)).unwrap());
        let body = encode_talk_request(&req);
        req.capabilities = BASE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        assert_eq!(parse_talk_request(&body).unwrap(), req);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["protocolVersion"], 1);
    }

    #[test]
    fn integer_text_table() {
        let cases = [
            ("0", true),
            ("1", true),
            ("-0", true),
            ("-0.0", true),
            ("1.0", true),
            ("1.000", true),
            ("1e3", true),
            ("1E+3", true),
            ("10e-1", true),
            ("0.1e1", true),
            ("1.5e1", true),
            ("0e-400", true),
            ("0.000e-99999999999999999999999", true),
            ("1e300", true),
            ("1e99999999999999999999999", true),
            ("18446744073709551616", true),
            ("-5", true),
            ("1.5", false),
            ("1e-1", false),
            ("1e-19", false),
            ("1e-400", false),
            ("-1e-400", false),
            ("1.0000000000000000001", false),
            ("123456789012345678901e-1", false),
            ("1e-99999999999999999999999", false),
        ];
        for (text, want) in cases {
            assert_eq!(is_integer_text(text), want, "{text}");
        }
        // Only a number serde_json accepted reaches it; these never do.
        for text in ["", "-", "1.", ".5", "1e", "1e+", "\"1\"", "true"] {
            let value = serde_json::from_str::<Value>(text);
            assert!(value.map_or(true, |v| !v.is_number()), "{text}");
        }
    }

    #[test]
    fn top_level_text_table() {
        let cases = [
            (r#"{"depth":1}"#, Some("1")),
            (r#" { "depth" : 1e-400 , "x": 2 } "#, Some("1e-400")),
            (r#"{"a":{"depth":9},"depth":2}"#, Some("2")),
            (
                r#"{"a":[{"depth":9}, "]}", "\"depth\""],"depth":3}"#,
                Some("3"),
            ),
            (r#"{"depth":1,"depth":1.5}"#, Some("1.5")),
            (r#"{"dep\u0074h":4}"#, Some("4")),
            (r#"{"de\"pth":4}"#, None),
            (r#"{"x\\":5,"depth":"s,}"}"#, Some(r#""s,}""#)),
            (r#"{"depth":[1,2]}"#, Some("[1,2]")),
            (r#"{"depth":null}"#, Some("null")),
            (r#"{}"#, None),
            (r#"{"x":1}"#, None),
            (r#"[{"depth":1}]"#, None),
            ("1", None),
        ];
        for (text, want) in cases {
            assert_eq!(top_level_text(text, "depth"), want, "{text}");
        }
    }
}
