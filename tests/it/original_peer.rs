//! Mixed deployments (issue 12): loopbus beside the original TypeScript bus.
//!
//! The stand-in below is written here from the facts the issue lists about the
//! original (nothing of its code): a peer server of kind `cc-telegram-bridge` with its
//! strict request schema, its legacy and v1 failure shapes and its 404s, and the
//! original client's strict check of a response envelope.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The original's kind, as its health answers it.
const ORIGINAL_KIND: &str = "cc-telegram-bridge";
/// How long one exchange with the stand-in may take before a test gives up on it.
const EXCHANGE_BOUND: Duration = Duration::from_secs(10);

/// The stand-in's client logic: why the original's client would reject this response
/// envelope, if it would. Extra top-level fields are allowed (it passes them through).
fn original_rejects_response(envelope: &Value) -> Option<String> {
    let Some(object) = envelope.as_object() else {
        return Some("not an object".into());
    };
    let Some(success) = object.get("success").and_then(Value::as_bool) else {
        return Some("no boolean success".into());
    };
    let string = |field: &str| object.get(field).is_some_and(Value::is_string);
    if success && !string("text") {
        return Some("a success without text".into());
    }
    if !success && !string("error") {
        return Some("a failure without error".into());
    }
    for field in ["fromInstance", "errorCode"] {
        if object.get(field).is_some_and(|v| !v.is_string()) {
            return Some(format!("{field} is not a string"));
        }
    }
    if object.get("retryable").is_some_and(|v| !v.is_boolean()) {
        return Some("retryable is not a boolean".into());
    }
    if object.get("durationMs").is_some_and(|v| !v.is_number()) {
        return Some("durationMs is not a number".into());
    }
    if object
        .get("protocolVersion")
        .is_some_and(|v| v.as_u64() != Some(1))
    {
        return Some("protocolVersion is not 1".into());
    }
    capabilities_problem(object.get("capabilities"))
}

/// How the stand-in answers a talk that passed its checks.
#[derive(Clone)]
enum Answer {
    /// A current release's success envelope.
    Success,
    /// A pre-v1 release's success: no `protocolVersion`, no `capabilities`.
    LegacySuccess,
    /// A pre-v1 failure `{success:false, error}` with this status.
    Legacy(u16, &'static str),
    /// A v1 failure with this status, code and flag.
    V1(u16, &'static str, bool),
}

/// A stand-in for the original's peer server, on 127.0.0.1, one connection at a time.
struct StandIn {
    name: String,
    port: u16,
    secret: String,
    answer: Arc<Mutex<Answer>>,
    /// Every `/api/talk` body it received.
    received: Arc<Mutex<Vec<Value>>>,
    /// Every reason its strict request schema found to reject one.
    rejected: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl StandIn {
    fn start(name: &str, secret: &str) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(Mutex::new(Answer::Success));
        let received = Arc::new(Mutex::new(Vec::new()));
        let rejected = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let server = Server {
            name: name.to_owned(),
            secret: secret.to_owned(),
            answer: Arc::clone(&answer),
            received: Arc::clone(&received),
            rejected: Arc::clone(&rejected),
        };
        let stopping = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    server.serve(stream);
                }
            }
        });
        StandIn {
            name: name.to_owned(),
            port,
            secret: secret.to_owned(),
            answer,
            received,
            rejected,
            stop,
            thread: Some(thread),
        }
    }

    fn answer_with(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    /// Writes the registry entry the original writes for itself: `{port, pid, secret,
    /// updatedAt}` (no proof, no host), with `secret` as given.
    fn register_by_hand(&self, root: &TestRoot, secret: &str) {
        let registry = json!({"instances": {self.name.clone(): {
            "port": self.port, "pid": std::process::id(), "secret": secret,
            "updatedAt": "2026-12-01T09:00:00.000Z"
        }}});
        write_file_atomic(
            &root.path.join(".bus-registry.json"),
            registry.to_string().as_bytes(),
        );
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The stand-in's server side.
struct Server {
    name: String,
    secret: String,
    answer: Arc<Mutex<Answer>>,
    received: Arc<Mutex<Vec<Value>>>,
    rejected: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Answers one request on `stream` and closes it.
    fn serve(&self, mut stream: TcpStream) {
        stream.set_read_timeout(Some(EXCHANGE_BOUND)).unwrap();
        let Some((method, path, headers, body)) = read_request(&mut stream) else {
            return;
        };
        let (status, body) = match (method.as_str(), path.as_str()) {
            ("GET", "/api/health") => (
                200,
                json!({"kind": ORIGINAL_KIND, "instance": self.name, "status": "ok",
                       "pid": std::process::id(), "protocolVersion": 1,
                       "capabilities": ORIGINAL_CAPABILITIES}),
            ),
            ("POST", "/api/talk") => self.talk(&headers, &body),
            _ => (404, json!({"error": "Not found"})),
        };
        let body = body.to_string();
        let _ = write!(
            stream,
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }

    fn talk(&self, headers: &[(String, String)], body: &[u8]) -> (u16, Value) {
        let authorized = headers.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("authorization")
                && *value == format!("Bearer {}", self.secret)
        });
        if !authorized {
            return (401, json!({"success": false, "error": "Unauthorized"}));
        }
        let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.received.lock().unwrap().push(parsed.clone());
        if let Some(why) = original_rejects_request(&parsed) {
            self.rejected.lock().unwrap().push(why);
            return (
                400,
                json!({"success": false, "error": "Invalid request body"}),
            );
        }
        let answer = self.answer.lock().unwrap().clone();
        match answer {
            Answer::Success => (
                200,
                json!({"success": true, "text": format!("ok: {}", parsed["prompt"].as_str().unwrap_or("")),
                       "fromInstance": self.name, "durationMs": 5, "protocolVersion": 1,
                       "capabilities": ORIGINAL_CAPABILITIES}),
            ),
            Answer::LegacySuccess => (
                200,
                json!({"success": true, "text": "legacy ok", "fromInstance": self.name, "durationMs": 5}),
            ),
            Answer::Legacy(status, error) => (status, json!({"success": false, "error": error})),
            Answer::V1(status, code, retryable) => (
                status,
                json!({"success": false, "text": "", "fromInstance": self.name, "error": "v1 failure",
                       "errorCode": code, "retryable": retryable, "durationMs": 1,
                       "protocolVersion": 1, "capabilities": ORIGINAL_CAPABILITIES}),
            ),
        }
    }
}

type Request = (String, String, Vec<(String, String)>, Vec<u8>);

/// Reads one HTTP/1.1 request: method, path, headers and a `Content-Length` body.
fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = bytes[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Some((method, path, headers, body))
}

/// Runs `loopbus talk --json` as `caller` (of `root`) to `target`.
fn talk_json(root: &TestRoot, target: &str, prompt: &str) -> (Option<i32>, Value, String) {
    let state_dir = root.state_dir("caller");
    let state_dir = state_dir.to_str().unwrap();
    let args = [
        "talk",
        "--state-dir",
        state_dir,
        target,
        prompt,
        "--json",
        "--timeout",
        "10",
    ];
    let output = run(&args, &[], None);
    let stdout: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("{}", describe(&args, &output)));
    (
        output.status.code(),
        stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Regression: a legacy peer's failures all came back `unknown` and retryable, so a
/// wrong secret (401) made callers retry forever; and `talk --json` printed a legacy
/// answer with our protocolVersion and capabilities. Every request loopbus sent must
/// pass the original's strict schema.
#[test]
fn bug_legacy_failures_lost_their_meaning() {
    let root = TestRoot::new("original-peer");
    root.write_config("caller", &json!({"bus": {"peers": "*"}}));
    let peer = StandIn::start("orig", "the-secret");
    peer.register_by_hand(&root, &peer.secret);

    // Success, from a current release and from a pre-v1 one.
    let (code, out, err) = talk_json(&root, "orig", "hello");
    assert_eq!(code, Some(0), "{out} {err}");
    assert_eq!(out["text"], "ok: hello");
    assert_eq!(out["protocolVersion"], 1);
    peer.answer_with(Answer::LegacySuccess);
    let (code, out, err) = talk_json(&root, "orig", "hello");
    assert_eq!(code, Some(0), "{out} {err}");
    assert_eq!(out["text"], "legacy ok");
    assert!(
        out.get("protocolVersion").is_none() && out.get("capabilities").is_none(),
        "the peer's own answer, not ours: {out}"
    );

    // (answer, code, exit status)
    let cases = [
        (
            Answer::Legacy(400, "Invalid request body"),
            "invalid_request",
            1,
        ),
        (
            Answer::Legacy(403, "Peer not allowed"),
            "peer_not_allowed",
            1,
        ),
        (
            Answer::Legacy(413, "Request too large"),
            "request_too_large",
            1,
        ),
        (
            Answer::Legacy(429, "Max depth exceeded"),
            "max_depth_exceeded",
            1,
        ),
        (Answer::Legacy(500, "handler threw"), "internal_error", 75),
        (Answer::Legacy(503, "busy"), "server_busy", 75),
        (
            Answer::Legacy(200, "Invalid API key · Please run /login"),
            "auth",
            1,
        ),
        (Answer::Legacy(200, "the engine fell over"), "unknown", 75),
        (
            Answer::V1(200, "budget_exhausted", false),
            "budget_exhausted",
            1,
        ),
        (Answer::V1(503, "server_busy", true), "server_busy", 75),
    ];
    for (answer, want_code, want_exit) in cases {
        peer.answer_with(answer);
        let (exit, out, err) = talk_json(&root, "orig", "hello");
        assert_eq!(
            (out["errorCode"].as_str(), exit),
            (Some(want_code), Some(want_exit)),
            "{out} {err}"
        );
        assert_eq!(out["retryable"], want_exit == 75, "{out}");
        assert!(err.contains(want_code), "{err}");
    }

    // A wrong secret: the stand-in answers a legacy 401. Not retryable: exit 1.
    peer.answer_with(Answer::Success);
    peer.register_by_hand(&root, "a-wrong-secret");
    let (exit, out, err) = talk_json(&root, "orig", "hello");
    assert_eq!(exit, Some(1), "{out} {err}");
    assert_eq!(out["errorCode"], "auth_failed");
    assert_eq!(out["retryable"], false);
    assert!(out.get("protocolVersion").is_none(), "{out}");

    let received = peer.received.lock().unwrap().len();
    assert!(received >= 12, "the stand-in saw {received} talks");
    let rejected = peer.rejected.lock().unwrap().clone();
    assert!(
        rejected.is_empty(),
        "the original would reject: {rejected:?}"
    );
}

/// Regression: `talk --retries` retried the peer's own `timeout` envelope against the
/// original (no `idempotent-requests`): its engine had run until stopped, and each
/// retry ran the turn again.
#[test]
fn bug_talk_retries_reran_a_turn_the_peer_answered_timeout() {
    let root = TestRoot::new("original-timeout");
    root.write_config("caller", &json!({"bus": {"peers": "*"}}));
    let peer = StandIn::start("orig", "the-secret");
    peer.register_by_hand(&root, &peer.secret);
    peer.answer_with(Answer::V1(200, "timeout", true));
    let state_dir = root.state_dir("caller");
    let args = [
        "talk",
        "--state-dir",
        state_dir.to_str().unwrap(),
        "orig",
        "a turn with side effects",
        "--retries",
        "3",
        "--json",
    ];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    assert_eq!(output.status.code(), Some(75), "{shown}");
    let envelope: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(envelope["errorCode"], "timeout", "{shown}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not retried") && stderr.contains("idempotent-requests"),
        "{shown}"
    );
    assert_eq!(peer.received.lock().unwrap().len(), 1, "{shown}");
    assert!(peer.rejected.lock().unwrap().is_empty());
}

/// Trace context (contract 8.4) goes only to a peer whose health listed
/// `trace-context`: the original gets no trace id, even from a caller inside a trace.
#[test]
fn the_original_gets_no_trace_context() {
    let root = TestRoot::new("original-trace");
    root.write_config("caller", &json!({"bus": {"peers": "*"}}));
    let peer = StandIn::start("orig", "the-secret");
    peer.register_by_hand(&root, &peer.secret);
    let state_dir = root.state_dir("caller");
    let args = [
        "talk",
        "--state-dir",
        state_dir.to_str().unwrap(),
        "orig",
        "hi",
        "--json",
    ];
    let trace = [
        ("LOOPBUS_TRACE_ID", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("LOOPBUS_REQUEST_ID", "0123456789abcdef"),
    ];
    let output = run(&args, &trace, None);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        describe(&args, &output)
    );
    let received = peer.received.lock().unwrap();
    assert_eq!(received.len(), 1);
    let ext = &received[0]["ext"];
    assert!(ext["requestId"].is_string(), "{ext}");
    assert!(
        ext.get("traceId").is_none() && ext.get("parentRequestId").is_none(),
        "{ext}"
    );
}

/// The stand-in itself: its strict schema rejects what the original rejects, with a
/// legacy 400, and it answers unknown paths with the original's 404.
#[test]
fn the_stand_in_is_as_strict_as_the_original() {
    let peer = StandIn::start("orig", "s");
    let talk = |body: &Value| {
        let body = body.to_string();
        request(
            peer.port,
            &format!(
                "POST /api/talk HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let ok = json!({"fromInstance": "a", "prompt": "p", "depth": 1, "protocolVersion": 1,
                    "capabilities": ORIGINAL_CAPABILITIES, "ext": {"anything": [1]}});
    assert_eq!(talk(&ok).status, 200);
    for bad in [
        json!({"fromInstance": "a", "prompt": "p", "depth": 1, "traceparent": "x"}),
        json!({"fromInstance": "a", "prompt": "p", "depth": 1, "capabilities": ["secret-proof"]}),
        json!({"fromInstance": "a", "prompt": "p", "depth": 1, "ext": 5}),
    ] {
        let r = talk(&bad);
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.json().get("errorCode").is_none());
    }
    let r = request(peer.port, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!((r.status, r.json()), (404, json!({"error": "Not found"})));
    assert!(
        original_rejects_response(&json!({"success": true, "text": "t",
        "capabilities": ["usage-report"]}))
        .is_some()
    );
    assert!(
        original_rejects_response(&json!({"success": true, "text": "t", "usage": {}})).is_none()
    );
}

/// Regression: an instance of kind `cc-telegram-bridge` must be one the original's
/// client accepts and whose every envelope passes its strict response schema; before
/// contract 4.1's negotiation, a request or envelope could list capabilities it
/// rejects.
#[test]
fn bug_the_original_could_not_use_a_loopbus_instance() {
    let root = TestRoot::new("original-client");
    let gate = root.path.join("gate");
    let calls = root.path.join("calls");
    let engine = json!({
        "command": ["/bin/sh", format!("{}/tests/engines/gate.sh", env!("CARGO_MANIFEST_DIR"))],
        "env": {"GATE": gate.to_str().unwrap(), "CALLS_FILE": calls.to_str().unwrap()}
    });
    let instance = root.start(
        "lb",
        &json!({"bus": {"peers": ["c"], "secret": "lb-secret-0123456789abcdef", "kind": ORIGINAL_KIND,
                        "maxDepth": 3, "maxConcurrentTurns": 1, "maxQueuedTurns": 0},
                "engine": engine}),
    );

    // Discovery as the original does it: 127.0.0.1, kind and instance.
    let health = instance.health();
    assert_eq!(health["kind"], ORIGINAL_KIND);
    assert_eq!(health["instance"], "lb");
    assert_eq!(health["status"], "ok");

    let strict = |r: &HttpResponse, status: u16, context: &str| {
        assert_eq!(r.status, status, "{context}: {r:?}");
        let envelope = r.json();
        if let Some(why) = original_rejects_response(&envelope) {
            panic!("{context}: the original rejects {envelope}: {why}");
        }
        envelope
    };
    let talk = |from: &str, depth: u64| {
        json!({"fromInstance": from, "prompt": "p", "depth": depth, "protocolVersion": 1,
               "capabilities": ORIGINAL_CAPABILITIES})
    };

    // A turn held at the gate, so the next talk is busy.
    let held = instance.spawn_talk("first");
    assert!(
        eventually(EXCHANGE_BOUND, || calls.exists()),
        "{}",
        instance.describe()
    );
    let busy = strict(&instance.talk_body(&talk("c", 1)), 503, "busy");
    assert_eq!(busy["errorCode"], "server_busy");
    std::fs::write(&gate, b"").unwrap();
    let first = held.join().unwrap();
    let success = strict(&first, 200, "success");
    assert_eq!(success["success"], true);
    strict(
        &instance.talk_body(&talk("c", 1)),
        200,
        "success with base capabilities",
    );

    // Refusals.
    let post = |secret: &str, body: &str| {
        request(
            instance.port,
            &format!(
                "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                instance.host(),
                body.len()
            ),
        )
    };
    strict(
        &post("lb-secret-0123456789abcdef", r#"{"fromInstance":"c"}"#),
        400,
        "invalid",
    );
    strict(
        &post("wrong", &talk("c", 1).to_string()),
        401,
        "wrong secret",
    );
    strict(&instance.talk_body(&talk("x", 1)), 403, "peer not allowed");
    strict(&instance.talk_body(&talk("c", 99)), 429, "max depth");
    let big = json!({"fromInstance": "c", "prompt": "x".repeat(MAX_BODY + 1), "depth": 1});
    strict(
        &post("lb-secret-0123456789abcdef", &big.to_string()),
        413,
        "too large",
    );
    let get_talk = request(
        instance.port,
        &format!(
            "GET /api/talk HTTP/1.1\r\nHost: {}\r\n\r\n",
            instance.host()
        ),
    );
    strict(&get_talk, 405, "method");
    let unknown = request(
        instance.port,
        &format!("GET /nope HTTP/1.1\r\nHost: {}\r\n\r\n", instance.host()),
    );
    strict(&unknown, 404, "unknown path");
}

/// Regression: `init` had no way to give an instance the original's kind.
#[test]
fn bug_init_had_no_kind() {
    let root = TestRoot::new("init-kind");
    let dir = root.state_dir("tg");
    let args = ["init", dir.to_str().unwrap(), "--kind", ORIGINAL_KIND];
    let output = run(&args, &[], None);
    assert!(output.status.success(), "{}", describe(&args, &output));
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["bus"]["kind"], ORIGINAL_KIND);
    assert_eq!(
        config["bus"]["acceptKinds"],
        json!(["loopbus", ORIGINAL_KIND])
    );
    let empty = run(
        &["init", dir.to_str().unwrap(), "--force", "--kind", ""],
        &[],
        None,
    );
    assert_eq!(empty.status.code(), Some(2));
}
