//! The contract's check table (section 3) over real loopback HTTP, one row per case:
//! status, `errorCode`, `retryable`, `fromInstance`, `protocolVersion`, `capabilities`
//! and the response headers of every answer. Also the check order, legacy and
//! forward-compatible requests, 404/405, and health.
//!
//! Check 10 (`server_busy`) needs turns that take time; it is covered with the engine.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};

/// What a row expects.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// 200 and a success envelope echoing this prompt.
    Echo(&'static str),
    /// A v1 failure envelope with this status and code.
    Fail(u16, &'static str),
}

/// Sends every row on its own connection and checks its answer.
fn run_rows(instance: &Instance, rows: Vec<(&str, Req, Want)>) {
    for (name, req, want) in rows {
        let r = req.send(instance.port);
        match want {
            Want::Echo(text) => assert_success(&r, &instance.name, text, name),
            Want::Fail(status, code) => assert_failure(&r, &instance.name, status, code, name),
        }
    }
}

/// A talk body from `from` at `depth`, v1.
fn body(from: &str, prompt: &str, depth: u64) -> Value {
    json!({"fromInstance": from, "prompt": prompt, "depth": depth,
           "protocolVersion": 1, "capabilities": CAPABILITIES})
}

/// The instance most rows run against: peers alice and bob, maxDepth 3, a known secret.
fn table_instance(root: &TestRoot) -> Instance {
    root.start(
        "worker",
        &json!({"bus": {"peers": ["alice", "bob"], "maxDepth": 3, "secret": "table-secret-0123456789abcdef"}}),
    )
}

#[test]
fn check_1_host_origin_referer() {
    let root = TestRoot::new("check1");
    let w = table_instance(&root);
    let port = w.port;
    let t = || Req::talk(&w);
    let h = || Req::health(&w);
    let other_port = port.wrapping_add(1).max(1).to_string();
    #[rustfmt::skip]
    let rows = vec![
        ("wrong host", t().set("Host", "example.com"), Want::Fail(403, "auth_failed")),
        ("wrong host, our port", t().set("Host", &format!("example.com:{port}")), Want::Fail(403, "auth_failed")),
        ("missing host", t().without("Host"), Want::Fail(403, "auth_failed")),
        ("host without port", t().set("Host", "127.0.0.1"), Want::Fail(403, "auth_failed")),
        ("host with another port", t().set("Host", &format!("127.0.0.1:{other_port}")), Want::Fail(403, "auth_failed")),
        ("localhost with another port", t().set("Host", &format!("localhost:{other_port}")), Want::Fail(403, "auth_failed")),
        ("host with a suffix", t().set("Host", &format!("127.0.0.1:{port}.evil.com")), Want::Fail(403, "auth_failed")),
        ("two host headers", t().header("Host", "evil.com"), Want::Fail(403, "auth_failed")),
        ("origin present", t().header("Origin", "http://evil.example"), Want::Fail(403, "auth_failed")),
        ("origin null", t().header("Origin", "null"), Want::Fail(403, "auth_failed")),
        ("origin of the instance itself", t().header("Origin", &format!("http://127.0.0.1:{port}")), Want::Fail(403, "auth_failed")),
        ("referer present", t().header("Referer", "http://evil.example/page"), Want::Fail(403, "auth_failed")),
        ("health wrong host", h().set("Host", "evil.example"), Want::Fail(403, "auth_failed")),
        ("health missing host", h().without("Host"), Want::Fail(403, "auth_failed")),
        ("health host with another port", h().set("Host", &format!("localhost:{other_port}")), Want::Fail(403, "auth_failed")),
        ("host 127.0.0.1:PORT", t(), Want::Echo("hi")),
        ("host localhost:PORT", t().set("Host", &format!("localhost:{port}")), Want::Echo("hi")),
        ("host [::1]:PORT", t().set("Host", &format!("[::1]:{port}")), Want::Echo("hi")),
    ];
    run_rows(&w, rows);
    // The good Host forms also pass on health.
    for host in [format!("localhost:{port}"), format!("[::1]:{port}")] {
        let r = h().set("Host", &host).send(port);
        assert_eq!(r.status, 200, "health with Host {host}: {r:?}");
    }
}

#[test]
fn check_2_browser_content_types() {
    let root = TestRoot::new("check2");
    let w = table_instance(&root);
    let t = || Req::talk(&w);
    #[rustfmt::skip]
    let rows = vec![
        ("text/plain", t().set("Content-Type", "text/plain"), Want::Fail(415, "invalid_request")),
        ("text/plain; charset=utf-8", t().set("Content-Type", "text/plain; charset=utf-8"), Want::Fail(415, "invalid_request")),
        ("Text/Plain (case)", t().set("Content-Type", "Text/Plain"), Want::Fail(415, "invalid_request")),
        ("form-urlencoded", t().set("Content-Type", "application/x-www-form-urlencoded"), Want::Fail(415, "invalid_request")),
        ("form-urlencoded; charset=utf-8", t().set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"), Want::Fail(415, "invalid_request")),
        ("multipart/form-data", t().set("Content-Type", "multipart/form-data; boundary=x"), Want::Fail(415, "invalid_request")),
        ("multipart/form-data; charset=utf-8", t().set("Content-Type", "multipart/form-data; charset=utf-8"), Want::Fail(415, "invalid_request")),
        ("a form type after json", t().header("Content-Type", "text/plain"), Want::Fail(415, "invalid_request")),
        ("application/json", t(), Want::Echo("hi")),
        ("application/json; charset=utf-8", t().set("Content-Type", "application/json; charset=utf-8"), Want::Echo("hi")),
        ("absent", t().without("Content-Type"), Want::Echo("hi")),
    ];
    run_rows(&w, rows);
}

#[test]
fn check_3_framing() {
    let root = TestRoot::new("check3");
    let w = table_instance(&root);
    let t = || Req::talk(&w);
    let good = body("alice", "hi", 0).to_string();
    let len = good.len().to_string();
    let chunked = format!("{:x}\r\n{good}\r\n0\r\n\r\n", good.len());
    #[rustfmt::skip]
    let rows = vec![
        ("transfer-encoding chunked", t().without("Content-Length").header("Transfer-Encoding", "chunked").body(chunked.clone()).without("Content-Length"), Want::Fail(400, "invalid_request")),
        ("transfer-encoding with content-length", t().header("Transfer-Encoding", "chunked"), Want::Fail(400, "invalid_request")),
        ("transfer-encoding identity", t().header("Transfer-Encoding", "identity"), Want::Fail(400, "invalid_request")),
        ("missing content-length", t().without("Content-Length"), Want::Fail(411, "invalid_request")),
        ("content-length abc", t().set("Content-Length", "abc"), Want::Fail(400, "invalid_request")),
        ("content-length -1", t().set("Content-Length", "-1"), Want::Fail(400, "invalid_request")),
        ("content-length +5", t().set("Content-Length", "+5"), Want::Fail(400, "invalid_request")),
        ("content-length 1e3", t().set("Content-Length", "1e3"), Want::Fail(400, "invalid_request")),
        ("content-length 0x10", t().set("Content-Length", "0x10"), Want::Fail(400, "invalid_request")),
        ("content-length empty", t().set("Content-Length", ""), Want::Fail(400, "invalid_request")),
        ("content-length list", t().set("Content-Length", &format!("{len}, {len}")), Want::Fail(400, "invalid_request")),
        ("two different content-lengths", t().set("Content-Length", &len).header("Content-Length", "5"), Want::Fail(400, "invalid_request")),
        ("two equal content-lengths", t().set("Content-Length", &len).header("Content-Length", &len), Want::Echo("hi")),
    ];
    run_rows(&w, rows);
}

#[test]
fn check_4_body_size() {
    let root = TestRoot::new("check4");
    let w = table_instance(&root);
    // One byte over: refused from the head alone, before any body byte is sent.
    let over = (MAX_BODY + 1).to_string();
    let r = Req::talk(&w)
        .body(Vec::new())
        .set("Content-Length", &over)
        .send(w.port);
    assert_failure(&r, "worker", 413, "request_too_large", "262145 head only");
    let r = Req::talk(&w)
        .body(Vec::new())
        .set("Content-Length", "99999999999999999999999")
        .send(w.port);
    assert_failure(
        &r,
        "worker",
        413,
        "request_too_large",
        "absurd length head only",
    );

    // Exactly the limit is accepted: a valid body of 262,144 bytes.
    let skeleton = body("alice", "", 0).to_string();
    let prompt = "p".repeat(MAX_BODY - skeleton.len());
    let exact = body("alice", &prompt, 0).to_string();
    assert_eq!(exact.len(), MAX_BODY);
    let r = Req::talk(&w).body(exact).send(w.port);
    assert_success(&r, "worker", &prompt, "262144 exactly");

    // One over with the whole body sent anyway: still 413, and readable by the client.
    let big = body("alice", &format!("{prompt}p"), 0).to_string();
    assert_eq!(big.len(), MAX_BODY + 1);
    let r = Req::talk(&w).body(big).send(w.port);
    assert_failure(&r, "worker", 413, "request_too_large", "262145 with body");
}

#[test]
fn check_5_bus_disabled() {
    let root = TestRoot::new("check5");
    let cases = [
        ("off", json!({"bus": false})),
        (
            "nopeers",
            json!({"bus": {"peers": [], "secret": "s5-0123456789abcdef"}}),
        ),
        (
            "peersfalse",
            json!({"bus": {"peers": false, "secret": "s5-0123456789abcdef"}}),
        ),
        ("missing", json!({})),
    ];
    for (name, config) in cases {
        let w = root.start(name, &config);
        let t = || Req::talk(&w);
        #[rustfmt::skip]
        let rows = vec![
            ("authorized talk", t(), Want::Fail(403, "bus_disabled")),
            // Check 5 comes before check 6: no secret needed to learn the bus is off.
            ("unauthorized talk", t().without("Authorization"), Want::Fail(403, "bus_disabled")),
            // ... and after checks 1-4.
            ("bad host", t().set("Host", "evil.example"), Want::Fail(403, "auth_failed")),
            ("too large", t().set("Content-Length", "262145").body(Vec::new()).set("Content-Length", "262145"), Want::Fail(413, "request_too_large")),
        ];
        run_rows(&w, rows);
        assert_eq!(
            w.health()["instance"],
            name,
            "health answers with the bus off"
        );
    }
}

#[test]
fn check_6_authorization() {
    let root = TestRoot::new("check6");
    let w = table_instance(&root);
    let t = || Req::talk(&w);
    #[rustfmt::skip]
    let rows = vec![
        ("missing authorization", t().without("Authorization"), Want::Fail(401, "auth_failed")),
        ("wrong secret", t().set("Authorization", "Bearer wrong-secret"), Want::Fail(401, "auth_failed")),
        ("lowercase bearer", t().set("Authorization", "bearer table-secret-0123456789abcdef"), Want::Fail(401, "auth_failed")),
        ("BEARER", t().set("Authorization", "BEARER table-secret-0123456789abcdef"), Want::Fail(401, "auth_failed")),
        ("no scheme", t().set("Authorization", "table-secret-0123456789abcdef"), Want::Fail(401, "auth_failed")),
        ("basic scheme", t().set("Authorization", "Basic dGFibGUtc2VjcmV0"), Want::Fail(401, "auth_failed")),
        ("two spaces", t().set("Authorization", "Bearer  table-secret-0123456789abcdef"), Want::Fail(401, "auth_failed")),
        ("secret prefix", t().set("Authorization", "Bearer table-secret-0123456789abcde"), Want::Fail(401, "auth_failed")),
        ("secret suffix", t().set("Authorization", "Bearer table-secret-0123456789abcdefX"), Want::Fail(401, "auth_failed")),
        ("empty bearer", t().set("Authorization", "Bearer "), Want::Fail(401, "auth_failed")),
        ("two authorization headers", t().header("Authorization", "Bearer wrong"), Want::Fail(401, "auth_failed")),
        // The body of an unauthorized request is never parsed: 401, not 400.
        ("unauthorized, body not json", t().without("Authorization").body("this is not json"), Want::Fail(401, "auth_failed")),
        ("unauthorized, body not an object", t().set("Authorization", "Bearer nope").body("[1,2]"), Want::Fail(401, "auth_failed")),
        ("unauthorized, bad depth", t().without("Authorization").json(&json!({"fromInstance": "alice", "prompt": "x", "depth": -1})), Want::Fail(401, "auth_failed")),
        ("unauthorized, peer not allowed", t().without("Authorization").json(&body("mallory", "x", 0)), Want::Fail(401, "auth_failed")),
        ("authorized", t(), Want::Echo("hi")),
    ];
    run_rows(&w, rows);
}

#[test]
fn check_6_unauthorized_body_is_never_read() {
    // An unauthorized head announcing a body that never comes is answered at once.
    let root = TestRoot::new("check6b");
    let w = table_instance(&root);
    let r = Req::talk(&w)
        .without("Authorization")
        .body(Vec::new())
        .set("Content-Length", "100")
        .send(w.port);
    assert_failure(
        &r,
        "worker",
        401,
        "auth_failed",
        "head only, body never sent",
    );
}

#[test]
fn check_7_body_validation() {
    let root = TestRoot::new("check7");
    let w = table_instance(&root);
    let t = |b: Value| Req::talk(&w).json(&b);
    let raw = |b: &[u8]| Req::talk(&w).body(b.to_vec());
    let bad = Want::Fail(400, "invalid_request");
    #[rustfmt::skip]
    let rows = vec![
        ("not json", raw(b"hello"), bad),
        ("empty body", raw(b""), bad),
        ("truncated json", raw(br#"{"fromInstance": "alice""#), bad),
        ("not utf-8", raw(b"{\"fromInstance\": \"al\xffice\", \"prompt\": \"x\", \"depth\": 0}"), bad),
        ("array", t(json!([1, 2, 3])), bad),
        ("nested arrays, 200,000 deep", raw(&[b'['; 200_000]), bad),
        ("nested objects, 50,000 deep", raw("{\"a\":".repeat(50_000).as_bytes()), bad),
        ("nested inside a field", raw(format!("{{\"fromInstance\":\"alice\",\"prompt\":\"x\",\"depth\":0,\"x\":{}}}", "[".repeat(10_000)).as_bytes()), bad),
        ("string", t(json!("hello")), bad),
        ("null", t(Value::Null), bad),
        ("number", t(json!(1)), bad),
        ("fromInstance missing", t(json!({"prompt": "x", "depth": 0})), bad),
        ("fromInstance empty", t(json!({"fromInstance": "", "prompt": "x", "depth": 0})), bad),
        ("fromInstance number", t(json!({"fromInstance": 7, "prompt": "x", "depth": 0})), bad),
        ("fromInstance null", t(json!({"fromInstance": null, "prompt": "x", "depth": 0})), bad),
        ("fromInstance array", t(json!({"fromInstance": ["alice"], "prompt": "x", "depth": 0})), bad),
        ("fromInstance C0 control", t(json!({"fromInstance": "al\u{1b}ice", "prompt": "x", "depth": 0})), bad),
        ("fromInstance DEL", t(json!({"fromInstance": "alice\u{7f}", "prompt": "x", "depth": 0})), bad),
        // Regression: C1 controls (U+0080-U+009F; U+009B is a one-byte CSI) were accepted.
        ("bug: fromInstance C1 control accepted", t(json!({"fromInstance": "\u{9b}2Jalice", "prompt": "x", "depth": 0})), bad),
        ("bug: fromInstance U+0080 accepted", t(json!({"fromInstance": "alice\u{80}", "prompt": "x", "depth": 0})), bad),
        ("prompt missing", t(json!({"fromInstance": "alice", "depth": 0})), bad),
        ("prompt number", t(json!({"fromInstance": "alice", "prompt": 5, "depth": 0})), bad),
        ("prompt null", t(json!({"fromInstance": "alice", "prompt": null, "depth": 0})), bad),
        ("prompt object", t(json!({"fromInstance": "alice", "prompt": {"text": "x"}, "depth": 0})), bad),
        ("depth missing", t(json!({"fromInstance": "alice", "prompt": "x"})), bad),
        ("depth 1.5", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 1.5})), bad),
        ("depth -1", t(json!({"fromInstance": "alice", "prompt": "x", "depth": -1})), bad),
        ("depth \"1\"", t(json!({"fromInstance": "alice", "prompt": "x", "depth": "1"})), bad),
        ("depth null", t(json!({"fromInstance": "alice", "prompt": "x", "depth": null})), bad),
        ("depth true", t(json!({"fromInstance": "alice", "prompt": "x", "depth": true})), bad),
        ("depth 1.0 accepted", raw(br#"{"fromInstance": "alice", "prompt": "x", "depth": 1.0}"#), Want::Echo("x")),
        ("depth 0 accepted", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0})), Want::Echo("x")),
        ("protocolVersion 2", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "protocolVersion": 2})), bad),
        ("protocolVersion 0", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "protocolVersion": 0})), bad),
        ("ext.traceId all zeros", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "ext": {"traceId": "0".repeat(32)}})), bad),
        ("ext.traceId upper case", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "ext": {"traceId": "AB".repeat(16)}})), bad),
        ("protocolVersion \"1\"", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "protocolVersion": "1"})), bad),
        ("protocolVersion null", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "protocolVersion": null})), bad),
        ("capabilities string", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": "structured-errors"})), bad),
        ("capabilities numbers", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": [1, 2]})), bad),
        ("capabilities mixed", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": ["structured-errors", 1]})), bad),
        ("capabilities object", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": {}})), bad),
        ("capabilities null", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": null})), bad),
        ("capabilities empty accepted", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 0, "capabilities": []})), Want::Echo("x")),
        // Check 7 comes before checks 8 and 9.
        ("bad body from a stranger", t(json!({"fromInstance": "mallory", "prompt": 1, "depth": 0})), bad),
        ("bad version at max depth", t(json!({"fromInstance": "alice", "prompt": "x", "depth": 9, "protocolVersion": 2})), bad),
    ];
    run_rows(&w, rows);
}

#[test]
fn check_8_and_9_peers_and_depth() {
    let root = TestRoot::new("check89");
    let w = table_instance(&root);
    let t = |from: &str, depth: u64| Req::talk(&w).json(&body(from, "delegated", depth));
    #[rustfmt::skip]
    let rows = vec![
        ("caller not in peers", t("mallory", 0), Want::Fail(403, "peer_not_allowed")),
        ("peer names are case-sensitive", t("Alice", 0), Want::Fail(403, "peer_not_allowed")),
        ("peer name prefix", t("alic", 0), Want::Fail(403, "peer_not_allowed")),
        // Check 8 comes before check 9.
        ("stranger at max depth", t("mallory", 3), Want::Fail(403, "peer_not_allowed")),
        ("alice allowed", t("alice", 0), Want::Echo("delegated")),
        ("bob allowed", t("bob", 2), Want::Echo("delegated")),
        ("depth == maxDepth", t("alice", 3), Want::Fail(429, "max_depth_exceeded")),
        ("depth > maxDepth", t("bob", 4), Want::Fail(429, "max_depth_exceeded")),
        ("huge depth", Req::talk(&w).body(r#"{"fromInstance":"alice","prompt":"x","depth":1e300}"#), Want::Fail(429, "max_depth_exceeded")),
        ("depth past u64", Req::talk(&w).body(r#"{"fromInstance":"alice","prompt":"x","depth":18446744073709551616}"#), Want::Fail(429, "max_depth_exceeded")),
    ];
    run_rows(&w, rows);
}

#[test]
fn check_order_first_failing_check_wins() {
    let root = TestRoot::new("order");
    let w = table_instance(&root);
    let t = || Req::talk(&w);
    #[rustfmt::skip]
    let rows = vec![
        ("1 before 2", t().header("Origin", "http://x").set("Content-Type", "text/plain"), Want::Fail(403, "auth_failed")),
        ("1 before 3", t().set("Host", "x").without("Content-Length"), Want::Fail(403, "auth_failed")),
        ("2 before 3", t().set("Content-Type", "text/plain").header("Transfer-Encoding", "chunked"), Want::Fail(415, "invalid_request")),
        ("3 before 4", t().body(Vec::new()).set("Content-Length", "262145").header("Content-Length", "1"), Want::Fail(400, "invalid_request")),
        ("4 before 6", t().without("Authorization").body(Vec::new()).set("Content-Length", "262145"), Want::Fail(413, "request_too_large")),
        ("3 before 6", t().without("Authorization").without("Content-Length"), Want::Fail(411, "invalid_request")),
        ("6 before 7", t().without("Authorization").body("{"), Want::Fail(401, "auth_failed")),
        ("8 before 9", t().json(&body("mallory", "x", 99)), Want::Fail(403, "peer_not_allowed")),
    ];
    run_rows(&w, rows);
}

#[test]
fn legacy_and_forward_compatible_requests() {
    let root = TestRoot::new("compat");
    let w = table_instance(&root);
    let t = |b: Value| Req::talk(&w).json(&b);
    #[rustfmt::skip]
    let rows = vec![
        ("legacy: no protocolVersion, no capabilities", t(json!({"fromInstance": "alice", "prompt": "old", "depth": 0})), Want::Echo("old")),
        ("legacy with only protocolVersion", t(json!({"fromInstance": "alice", "prompt": "v", "depth": 1, "protocolVersion": 1})), Want::Echo("v")),
        ("unknown fields", t(json!({"fromInstance": "alice", "prompt": "new", "depth": 0, "protocolVersion": 1,
            "capabilities": CAPABILITIES, "traceId": "abc", "priority": {"level": 3}, "attachments": [1, 2]})), Want::Echo("new")),
        ("unknown capabilities", t(json!({"fromInstance": "alice", "prompt": "caps", "depth": 0, "protocolVersion": 1,
            "capabilities": ["structured-errors", "streaming", "future-thing-v9"]})), Want::Echo("caps")),
        ("empty prompt", t(json!({"fromInstance": "alice", "prompt": "", "depth": 0})), Want::Echo("")),
        ("unicode prompt", t(json!({"fromInstance": "alice", "prompt": "héllo wörld ✓ \u{1F600}\n\t\"q\"", "depth": 0})), Want::Echo("héllo wörld ✓ \u{1F600}\n\t\"q\"")),
    ];
    run_rows(&w, rows);
}

#[test]
fn not_found_and_method_not_allowed() {
    let root = TestRoot::new("routes");
    let w = table_instance(&root);
    let port = w.port;
    let host = w.host();
    let req = |method: &str, path: &str| Req::new(method, path).header("Host", &host);
    #[rustfmt::skip]
    let rows: Vec<(&str, Req, u16, Option<&str>)> = vec![
        ("GET unknown path", req("GET", "/nope"), 404, None),
        ("GET /", req("GET", "/"), 404, None),
        ("POST unknown path", req("POST", "/api/talks").body("{}"), 404, None),
        ("trailing slash", req("POST", "/api/talk/").body("{}"), 404, None),
        ("GET /api/talk", req("GET", "/api/talk"), 405, Some("POST")),
        ("PUT /api/talk", req("PUT", "/api/talk").body("{}"), 405, Some("POST")),
        ("DELETE /api/talk", req("DELETE", "/api/talk"), 405, Some("POST")),
        ("OPTIONS /api/talk (preflight)", req("OPTIONS", "/api/talk")
            .header("Access-Control-Request-Method", "POST"), 405, Some("POST")),
        ("POST /api/health", req("POST", "/api/health").body("{}"), 405, Some("GET, HEAD")),
        ("PUT /api/health", req("PUT", "/api/health").body(""), 405, Some("GET, HEAD")),
    ];
    for (name, req, status, allow) in rows {
        let r = req.send(port);
        let code = "invalid_request";
        assert_failure(&r, "worker", status, code, name);
        match allow {
            Some(allow) => assert_eq!(r.header("allow"), Some(allow), "{name}: Allow: {r:?}"),
            None => assert_eq!(r.header("allow"), None, "{name}: Allow: {r:?}"),
        }
    }
}

#[test]
fn health_answer() {
    let root = TestRoot::new("health");
    let w = table_instance(&root);
    let r = Req::health(&w).send(w.port);
    assert_eq!(r.status, 200, "{r:?}");
    assert_standard_headers(&r, "health");
    let v = r.json();
    assert_eq!(v["kind"], "loopbus", "{v}");
    assert_eq!(v["instance"], "worker", "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["pid"], u64::from(w.pid()), "{v}");
    assert_eq!(v["protocolVersion"], 1, "{v}");
    // Health lists every capability this build implements (contract 4.1): envelopes'
    // base two, the talk extensions (8.1-8.4) and `secret-proof` (6.1).
    assert_eq!(
        v["capabilities"],
        json!([
            "structured-errors",
            "retryable-errors",
            "idempotent-requests",
            "cancel-on-hangup",
            "usage-report",
            "trace-context",
            "secret-proof"
        ]),
        "{v}"
    );
    // A query string does not change the path.
    let r = Req::new("GET", "/api/health?probe=1")
        .header("Host", &w.host())
        .send(w.port);
    assert_eq!(r.status, 200, "{r:?}");
    // A configured kind is reported.
    let root = TestRoot::new("health-kind");
    let k = root.start(
        "kinded",
        &json!({"bus": {"peers": "*", "kind": "cc-telegram-bridge"}}),
    );
    assert_eq!(k.health()["kind"], "cc-telegram-bridge");
}
