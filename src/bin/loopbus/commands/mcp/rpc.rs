//! JSON-RPC 2.0 as MCP uses it, and the lifecycle of each protocol revision this
//! server speaks. Pure: bytes or values in, values out.
//!
//! - Messages (all revisions): a request has a string or integer `id` (never null), a
//!   `method` and an object `params`; a notification has no `id` and gets no answer.
//!   Batches (JSON arrays) are refused: 2025-06-18 removed them.
//! - `2025-06-18` and `2025-11-25` ("legacy"): `initialize` picks the revision for the
//!   rest of the process (the client's when we speak it, else our newest legacy one);
//!   before it only `ping` is served. `notifications/initialized` follows.
//! - `2026-07-28` ("modern"): no handshake. Each request names its revision in
//!   `_meta["io.modelcontextprotocol/protocolVersion"]` and its capabilities in
//!   `_meta["io.modelcontextprotocol/clientCapabilities"]` (missing: -32602); a
//!   revision we do not speak is -32022 with the ones we do. `server/discover` tells
//!   them; `ping` is gone; every result carries `resultType: "complete"` and our
//!   identity in `_meta`.
//!
//! A client may probe with `server/discover` and fall back to `initialize`: both eras
//! are served by one process, each request by the one it opens with.

use serde_json::{json, Map, Value};

/// Invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a JSON-RPC request.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method (in the request's revision).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Bad parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// The server failed (a call panicked).
pub const INTERNAL_ERROR: i64 = -32603;
/// 2026-07-28: the request's protocol version is not one we speak.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The `_meta` key naming a request's revision (2026-07-28).
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` key of a request's client capabilities (2026-07-28).
pub const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
/// The `_meta` key of a result's server identity (2026-07-28).
pub const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A protocol revision this server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revision {
    /// `2025-06-18`: initialize lifecycle, structured tool output.
    V2025_06_18,
    /// `2025-11-25`: as 2025-06-18; argument errors are tool errors.
    V2025_11_25,
    /// `2026-07-28`: stateless, version in each request's `_meta`.
    V2026_07_28,
}

/// Every revision we speak, newest first.
pub const REVISIONS: [Revision; 3] = [
    Revision::V2026_07_28,
    Revision::V2025_11_25,
    Revision::V2025_06_18,
];

impl Revision {
    /// The revision's date string.
    pub fn as_str(self) -> &'static str {
        match self {
            Revision::V2025_06_18 => "2025-06-18",
            Revision::V2025_11_25 => "2025-11-25",
            Revision::V2026_07_28 => "2026-07-28",
        }
    }

    fn parse(text: &str) -> Option<Revision> {
        REVISIONS.into_iter().find(|r| r.as_str() == text)
    }

    /// Whether the revision has no handshake (2026-07-28 and later).
    pub fn is_modern(self) -> bool {
        self == Revision::V2026_07_28
    }
}

/// An error answer: code, message, optional data, and the request id it answers
/// (`Null` when none could be read).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The request's id, or `Null`.
    pub id: Value,
    /// The JSON-RPC code.
    pub code: i64,
    /// What was wrong.
    pub message: String,
    /// Extra data (the supported versions of -32022).
    pub data: Option<Value>,
}

impl RpcError {
    /// An error answering `id`.
    pub fn new(id: &Value, code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            id: id.clone(),
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The error message as sent.
    pub fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        json!({"jsonrpc": "2.0", "id": self.id, "error": error})
    }
}

/// One message from the client.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// A request, to be answered.
    Request {
        /// Its id: a string or an integer.
        id: Value,
        /// The method.
        method: String,
        /// The params (empty when absent).
        params: Map<String, Value>,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
        /// The params (empty when absent).
        params: Map<String, Value>,
    },
    /// A response: we send no requests, so there is nothing to match it with.
    Response,
}

/// Parses one line.
///
/// # Errors
/// Not JSON (-32700); a batch, not an object, no `"jsonrpc": "2.0"`, a bad `id` or
/// `method` (-32600); a request's `params` not an object (-32602).
pub fn parse(bytes: &[u8]) -> Result<Incoming, RpcError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| RpcError::new(&Value::Null, PARSE_ERROR, format!("not JSON: {e}")))?;
    let invalid = |id: &Value, what: &str| RpcError::new(id, INVALID_REQUEST, what);
    let mut message = match value {
        Value::Object(message) => message,
        Value::Array(_) => return Err(invalid(&Value::Null, "batches are not supported")),
        _ => return Err(invalid(&Value::Null, "a message must be a JSON object")),
    };
    let id = match message.remove("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id),
        Some(id @ Value::Number(_)) if id.is_i64() || id.is_u64() => Some(id),
        Some(_) => return Err(invalid(&Value::Null, "`id` must be a string or an integer")),
    };
    let answer_id = id.clone().unwrap_or(Value::Null);
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(&answer_id, "`jsonrpc` must be \"2.0\""));
    }
    let method = match message.remove("method") {
        Some(Value::String(method)) => method,
        None if id.is_some()
            && (message.contains_key("result") || message.contains_key("error")) =>
        {
            return Ok(Incoming::Response)
        }
        _ => return Err(invalid(&answer_id, "`method` must be a string")),
    };
    let params = match message.remove("params") {
        None => Map::new(),
        Some(Value::Object(params)) => params,
        // A notification is never answered, even one whose params we cannot use.
        Some(_) if id.is_none() => Map::new(),
        Some(_) => {
            return Err(RpcError::new(
                &answer_id,
                INVALID_PARAMS,
                "`params` must be an object",
            ))
        }
    };
    Ok(match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    })
}

/// The methods this server answers, in some revision.
const METHODS: [&str; 5] = [
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
];

/// What the process knows of its client's era.
#[derive(Debug, Default)]
pub struct Session {
    /// The legacy revision `initialize` picked, once it came.
    pub legacy: Option<Revision>,
}

/// How to serve one request.
#[derive(Debug, PartialEq)]
pub enum Route {
    /// `initialize`: the revision picked; answer with [`initialize_result`].
    Initialize(Revision),
    /// `ping` (legacy revisions, also before `initialize`): an empty result.
    Ping,
    /// `server/discover` (2026-07-28): answer with [`discover_result`].
    Discover,
    /// `tools/list` or `tools/call`, in this revision.
    Tools(Revision),
}

/// Decides how to serve a request, in this order: unknown method (-32601), the
/// request's revision (-32022, -32602), the method in that revision (-32601).
/// `initialize` updates `session`.
///
/// # Errors
/// As above; `initialize` without a string `protocolVersion` (-32602).
pub fn route(
    session: &mut Session,
    id: &Value,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Route, RpcError> {
    if !METHODS.contains(&method) {
        return Err(RpcError::new(
            id,
            METHOD_NOT_FOUND,
            format!("unknown method `{method}`"),
        ));
    }
    let bad_params = |message: &str| RpcError::new(id, INVALID_PARAMS, message);
    if method == "initialize" {
        // 2025-06-18, 2025-11-25: the client's revision when we speak it, else our
        // newest legacy one (a client that can't speak it disconnects).
        let asked = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_params("`initialize` needs a string `protocolVersion`"))?;
        let revision = Revision::parse(asked)
            .filter(|r| !r.is_modern())
            .unwrap_or(Revision::V2025_11_25);
        session.legacy = Some(revision);
        return Ok(Route::Initialize(revision));
    }
    let meta = params.get("_meta").and_then(Value::as_object);
    let revision = match meta.and_then(|m| m.get(VERSION_KEY)) {
        Some(asked) => {
            let asked = asked
                .as_str()
                .ok_or_else(|| bad_params("`_meta` protocolVersion must be a string"))?;
            match (Revision::parse(asked), session.legacy) {
                (Some(r), _) if r.is_modern() => {
                    if !meta.is_some_and(|m| m.get(CAPABILITIES_KEY).is_some_and(Value::is_object))
                    {
                        return Err(bad_params(
                            "a 2026-07-28 request needs `_meta[\"io.modelcontextprotocol/clientCapabilities\"]`, an object",
                        ));
                    }
                    Some(r)
                }
                // A legacy client naming the revision it initialized.
                (Some(r), Some(legacy)) if r == legacy => Some(r),
                _ => return Err(unsupported(id, asked)),
            }
        }
        None => session.legacy,
    };
    match (method, revision) {
        ("ping", None) => Ok(Route::Ping),
        ("ping", Some(r)) if !r.is_modern() => Ok(Route::Ping),
        ("server/discover", Some(r)) if r.is_modern() => Ok(Route::Discover),
        ("tools/list" | "tools/call", Some(r)) => Ok(Route::Tools(r)),
        (_, None) => Err(bad_params(
            "no protocol version: send `initialize` first (2025-06-18, 2025-11-25), or name \
             the revision in `_meta[\"io.modelcontextprotocol/protocolVersion\"]` (2026-07-28)",
        )),
        (_, Some(r)) => Err(RpcError::new(
            id,
            METHOD_NOT_FOUND,
            format!("`{method}` is not part of protocol revision {}", r.as_str()),
        )),
    }
}

/// -32022: `asked` is not a revision we speak; `data` lists those we do.
fn unsupported(id: &Value, asked: &str) -> RpcError {
    RpcError {
        data: Some(json!({
            "supported": REVISIONS.map(Revision::as_str),
            "requested": asked,
        })),
        ..RpcError::new(
            id,
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
        )
    }
}

/// Our name and version, as `serverInfo`.
pub fn server_info() -> Value {
    json!({"name": "loopbus", "title": "loopbus", "version": env!("CARGO_PKG_VERSION")})
}

/// What the model reads about this server (`instructions`).
pub const INSTRUCTIONS: &str = "loopbus delegates prompts to other local AI-agent \
instances. `list_instances` shows who is there; `talk`, `fan`, `chain` and `verify` \
delegate. A call waits at most `waitSecs` (default 45): unfinished work comes back as \
a `handle`; call `result` with it to wait again or page through a long answer \
(`nextOffset`), and `cancel` to stop it.";

/// How long a client may keep `tools/list` and `server/discover` answers (2026-07-28
/// `ttlMs`): the tools never change while the process runs.
pub const LIST_TTL_MS: u64 = 60 * 60 * 1000;

/// The `initialize` result for `revision`.
pub fn initialize_result(revision: Revision) -> Value {
    json!({
        "protocolVersion": revision.as_str(),
        "capabilities": {"tools": {}},
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
    })
}

/// The `server/discover` result (2026-07-28, before [`complete`]).
pub fn discover_result() -> Value {
    json!({
        "supportedVersions": REVISIONS.map(Revision::as_str),
        "capabilities": {"tools": {}},
        "instructions": INSTRUCTIONS,
        "ttlMs": LIST_TTL_MS,
        "cacheScope": "public",
    })
}

/// The result message answering `id`: in 2026-07-28 with `resultType: "complete"`
/// and our identity in `_meta`.
pub fn complete(id: &Value, revision: Option<Revision>, mut result: Value) -> Value {
    if revision.is_some_and(Revision::is_modern) {
        result["resultType"] = json!("complete");
        result["_meta"] = json!({ SERVER_INFO_KEY: server_info() });
    }
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &[u8]) -> (i64, Value) {
        let e = parse(bytes).unwrap_err();
        (e.code, e.id)
    }

    #[test]
    fn malformed_messages_get_their_codes() {
        let cases: [(&[u8], i64, Value); 11] = [
            (b"{", PARSE_ERROR, Value::Null),
            (b"\xff", PARSE_ERROR, Value::Null),
            (b"[]", INVALID_REQUEST, Value::Null),
            (
                br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (b"42", INVALID_REQUEST, Value::Null),
            (br#"{"id":1,"method":"ping"}"#, INVALID_REQUEST, json!(1)),
            (
                br#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#,
                INVALID_REQUEST,
                json!("a"),
            ),
            (
                br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                br#"{"jsonrpc":"2.0","id":2,"method":7}"#,
                INVALID_REQUEST,
                json!(2),
            ),
            (
                br#"{"jsonrpc":"2.0","id":3,"method":"ping","params":[]}"#,
                INVALID_PARAMS,
                json!(3),
            ),
        ];
        for (bytes, want, id) in cases {
            assert_eq!(
                code(bytes),
                (want, id),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let request = parse(br#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#).unwrap();
        assert_eq!(
            request,
            Incoming::Request {
                id: json!("x"),
                method: "ping".into(),
                params: Map::new()
            }
        );
        let note = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(note, Incoming::Notification { .. }));
        let response = parse(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap();
        assert_eq!(response, Incoming::Response);
    }

    #[test]
    fn a_notification_whose_params_are_not_an_object_is_not_answered() {
        let note = parse(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":[1]}"#);
        assert_eq!(
            note,
            Ok(Incoming::Notification {
                method: "notifications/cancelled".into(),
                params: Map::new()
            })
        );
    }

    fn params(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn modern(version: &str) -> Map<String, Value> {
        params(json!({"_meta": {VERSION_KEY: version, CAPABILITIES_KEY: {}}}))
    }

    #[test]
    fn each_revision_routes_its_own_methods() {
        let id = json!(1);
        let mut fresh = Session::default();
        let r = |s: &mut Session, m: &str, p: &Map<String, Value>| {
            route(s, &id, m, p).map_err(|e| e.code)
        };
        let none = Map::new();
        // Before initialize: ping only, unless the request is modern.
        assert_eq!(r(&mut fresh, "ping", &none), Ok(Route::Ping));
        assert_eq!(r(&mut fresh, "tools/list", &none), Err(INVALID_PARAMS));
        assert_eq!(r(&mut fresh, "nope", &none), Err(METHOD_NOT_FOUND));
        let m = modern("2026-07-28");
        assert_eq!(r(&mut fresh, "server/discover", &m), Ok(Route::Discover));
        assert_eq!(
            r(&mut fresh, "tools/list", &m),
            Ok(Route::Tools(Revision::V2026_07_28))
        );
        assert_eq!(r(&mut fresh, "ping", &m), Err(METHOD_NOT_FOUND));
        assert_eq!(r(&mut fresh, "initialize", &none), Err(INVALID_PARAMS));
        let no_caps = params(json!({"_meta": {VERSION_KEY: "2026-07-28"}}));
        assert_eq!(r(&mut fresh, "tools/list", &no_caps), Err(INVALID_PARAMS));
        let old = modern("2024-11-05");
        assert_eq!(
            r(&mut fresh, "tools/list", &old),
            Err(UNSUPPORTED_PROTOCOL_VERSION)
        );
        let e = route(&mut fresh, &id, "server/discover", &old).unwrap_err();
        assert_eq!(e.data.unwrap()["supported"][0], "2026-07-28");

        // Discover first, then initialize: both work; the legacy one sticks.
        for (asked, picked) in [
            ("2025-06-18", Revision::V2025_06_18),
            ("2025-11-25", Revision::V2025_11_25),
            ("2026-07-28", Revision::V2025_11_25),
            ("2099-01-01", Revision::V2025_11_25),
        ] {
            let mut session = Session::default();
            let init = params(json!({"protocolVersion": asked, "capabilities": {}}));
            assert_eq!(
                r(&mut session, "initialize", &init),
                Ok(Route::Initialize(picked))
            );
            assert_eq!(
                r(&mut session, "tools/call", &none),
                Ok(Route::Tools(picked))
            );
            assert_eq!(r(&mut session, "ping", &none), Ok(Route::Ping));
            assert_eq!(
                r(&mut session, "server/discover", &none),
                Err(METHOD_NOT_FOUND)
            );
            // Modern requests are still served as such.
            assert_eq!(r(&mut session, "server/discover", &m), Ok(Route::Discover));
        }
    }

    #[test]
    fn modern_results_say_they_are_complete() {
        let legacy = complete(&json!(1), Some(Revision::V2025_11_25), json!({}));
        assert_eq!(legacy, json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        let modern = complete(&json!(1), Some(Revision::V2026_07_28), json!({}));
        assert_eq!(modern["result"]["resultType"], "complete");
        assert_eq!(
            modern["result"]["_meta"][SERVER_INFO_KEY]["name"],
            "loopbus"
        );
    }
}
