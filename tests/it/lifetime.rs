//! A turn's lifetime on the server (contract 8.1-8.3, 4.1), over real HTTP: cancel
//! requests, hang-ups with and without a request id, retries that attach or get the
//! stored envelope, the store's rules, usage in envelopes and capability negotiation.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Generous bound for what should happen at once.
const BOUND: Duration = Duration::from_secs(10);

const ID: &str = "0123456789abcdef0123456789abcdef";

fn script(name: &str) -> String {
    format!("{}/tests/engines/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// An instance whose engine (`gate.sh`) counts its runs and waits for the gate.
struct Gated {
    root: TestRoot,
    instance: Instance,
    gate: PathBuf,
    calls: PathBuf,
}

impl Gated {
    fn start(label: &str, bus: Value) -> Gated {
        let root = TestRoot::new(label);
        let gate = root.path.join("gate");
        let calls = root.path.join("calls");
        let mut config = json!({
            "bus": {"peers": "*", "secret": "s-0123456789abcdef"},
            "engine": {
                "command": ["sh", script("gate.sh")],
                "env": {"GATE": gate.to_str().unwrap(), "CALLS_FILE": calls.to_str().unwrap()},
            },
        });
        for (key, value) in bus.as_object().unwrap() {
            config["bus"][key] = value.clone();
        }
        let instance = root.start("worker", &config);
        Gated {
            root,
            instance,
            gate,
            calls,
        }
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(&self.calls).map_or(0, |s| s.lines().count())
    }

    fn wait_runs(&self, n: usize) {
        assert!(
            eventually(BOUND, || self.runs() >= n),
            "the engine did not start {n} time(s)\n{}",
            self.instance.describe()
        );
    }

    fn open(&self) {
        std::fs::write(&self.gate, b"").unwrap();
    }

    /// Whether the instance has no engine process left.
    fn engines_gone(&self) -> bool {
        eventually(BOUND, || children(self.instance.pid()).is_empty())
    }

    fn audit(&self) -> Vec<Value> {
        let path = self.root.state_dir("worker").join("audit.log.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits for an audit line with `outcome`; returns it.
    fn audited(&self, outcome: &str) -> Value {
        let mut found = None;
        eventually(BOUND, || {
            found = self.audit().into_iter().find(|l| l["outcome"] == outcome);
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no {outcome:?} audit line in {:?}", self.audit()))
    }
}

/// A v1 request body.
fn body(prompt: &str, ext: Option<Value>, capabilities: &[&str]) -> Value {
    let mut body = json!({
        "fromInstance": "c", "prompt": prompt, "depth": 0, "protocolVersion": 1,
        "capabilities": capabilities,
    });
    if let Some(ext) = ext {
        body["ext"] = ext;
    }
    body
}

fn with_id(prompt: &str) -> Value {
    body(prompt, Some(json!({"requestId": ID})), &CAPABILITIES)
}

fn cancel_of(id: &str) -> Value {
    body(
        "",
        Some(json!({"requestId": id, "cancel": true})),
        &CAPABILITIES,
    )
}

fn raw(instance: &Instance, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        instance.host(),
        instance.secret,
        body.len()
    )
    .into_bytes()
}

/// Sends `body` on a connection of its own, from another thread.
fn send(instance: &Instance, body: &Value) -> JoinHandle<HttpResponse> {
    let port = instance.port;
    let bytes = raw(instance, body);
    thread::spawn(move || request_bytes(port, &bytes))
}

/// Sends `body` and keeps the connection open, unanswered, for the test to drop.
fn open_talk(instance: &Instance, body: &Value) -> TcpStream {
    let mut stream = connect(instance.port);
    stream.write_all(&raw(instance, body)).unwrap();
    stream
}

fn assert_cancelled(r: &HttpResponse, context: &str) {
    let v = r.json();
    assert_eq!(r.status, 200, "{context}: {r:?}");
    assert_eq!(v["success"], false, "{context}: {v}");
    assert_eq!(v["errorCode"], "cancelled", "{context}: {v}");
    assert_eq!(v["retryable"], false, "{context}: {v}");
}

#[test]
fn a_cancel_request_kills_the_engine_and_both_connections_get_cancelled() {
    let w = Gated::start("cancel-request", json!({}));
    let turn = send(&w.instance, &with_id("long job"));
    w.wait_runs(1);
    let cancel = w.instance.talk_body(&cancel_of(ID));
    assert_cancelled(&cancel, "the cancel request");
    let turn = turn.join().unwrap();
    assert_cancelled(&turn, "the turn's own connection");
    assert_eq!(turn.body, cancel.body, "one envelope for both");
    assert!(w.engines_gone(), "the engine outlived its cancel");
    let line = w.audited("cancelled");
    assert_eq!(line["metadata"]["errorCode"], "cancelled", "{line}");
    assert_eq!(line["metadata"]["requestId"], ID, "{line}");
    assert_eq!(w.audited("cancel")["metadata"]["requestId"], ID);
    // A later cancel, or a retry, gets the stored envelope; nothing runs again.
    assert_eq!(w.instance.talk_body(&cancel_of(ID)).body, cancel.body);
    assert_eq!(w.instance.talk_body(&with_id("long job")).body, cancel.body);
    assert_eq!(w.runs(), 1);
}

#[test]
fn a_cancel_for_an_unknown_request_id_is_invalid_request() {
    let w = Gated::start("cancel-unknown", json!({}));
    let r = w.instance.talk_body(&cancel_of(ID));
    assert_failure(&r, "worker", 400, "invalid_request", "cancel of nothing");
    // `cancel` without a request id, or not a boolean, is a malformed request.
    let r = w
        .instance
        .talk_body(&body("", Some(json!({"cancel": true})), &CAPABILITIES));
    assert_failure(&r, "worker", 400, "invalid_request", "cancel without id");
    let r = w.instance.talk_body(&body(
        "p",
        Some(json!({"requestId": "short"})),
        &CAPABILITIES,
    ));
    assert_failure(&r, "worker", 400, "invalid_request", "bad id");
    assert_eq!(w.runs(), 0);
}

#[test]
fn a_caller_that_hangs_up_without_a_request_id_cancels_its_turn() {
    let w = Gated::start("hangup", json!({}));
    let stream = open_talk(&w.instance, &body("p", None, &CAPABILITIES));
    w.wait_runs(1);
    drop(stream);
    assert!(w.engines_gone(), "the engine outlived its caller");
    let line = w.audited("cancelled");
    assert_eq!(line["detail"], "the caller hung up", "{line}");
    assert!(
        line["metadata"]["status"].is_null(),
        "nobody was answered: {line}"
    );
    // The instance goes on serving.
    w.open();
    assert_eq!(
        w.instance.talk("c", "next", 0).json()["text"],
        "gated: next"
    );
}

#[test]
fn a_retry_after_a_hang_up_attaches_and_the_engine_runs_once() {
    let w = Gated::start("reattach", json!({}));
    let stream = open_talk(&w.instance, &with_id("p"));
    w.wait_runs(1);
    drop(stream);
    // Kept for `reattachSecs` (15 s by default): the retry finds it running.
    let retry = send(&w.instance, &with_id("p"));
    w.audited("attached");
    w.open();
    let r = retry.join().unwrap();
    assert_eq!(r.json()["text"], "gated: p", "{r:?}");
    assert_eq!(w.runs(), 1, "the retry ran the engine again");
}

#[test]
fn a_kept_turn_whose_caller_never_comes_back_is_cancelled() {
    let w = Gated::start("reattach-expires", json!({"reattachSecs": 1}));
    let stream = open_talk(&w.instance, &with_id("p"));
    w.wait_runs(1);
    drop(stream);
    assert!(w.engines_gone(), "the kept turn was never cancelled");
    let line = w.audited("cancelled");
    assert!(
        line["detail"].as_str().unwrap().contains("reattachSecs"),
        "{line}"
    );
}

#[test]
fn with_cancel_on_hangup_off_a_hung_up_turn_runs_to_its_end() {
    let w = Gated::start("no-cancel", json!({"cancelOnHangup": false}));
    let stream = open_talk(&w.instance, &body("p", None, &CAPABILITIES));
    w.wait_runs(1);
    drop(stream);
    w.audited("abandoned");
    assert!(
        !children(w.instance.pid()).is_empty(),
        "the engine was killed"
    );
    w.open();
    assert!(w.engines_gone());
    assert!(!w.audit().iter().any(|l| l["outcome"] == "cancelled"));
}

#[test]
fn the_same_request_id_twice_at_once_then_again_runs_the_engine_once() {
    let w = Gated::start("dedupe", json!({}));
    let first = send(&w.instance, &with_id("p"));
    w.wait_runs(1);
    let second = send(&w.instance, &with_id("p"));
    w.audited("attached");
    w.open();
    let first = first.join().unwrap();
    let second = second.join().unwrap();
    let third = w.instance.talk_body(&with_id("p"));
    assert_eq!(first.json()["text"], "gated: p", "{first:?}");
    assert_eq!(first.body, second.body, "attached: the same envelope");
    assert_eq!(first.body, third.body, "stored: the same envelope");
    assert_eq!(w.runs(), 1);
    w.audited("duplicate");
    // The same id for another prompt is refused, and runs nothing.
    let other = w.instance.talk_body(&with_id("another prompt"));
    assert_failure(&other, "worker", 400, "invalid_request", "reused id");
    // Another caller's same id is its own request.
    let mut theirs = with_id("p");
    theirs["fromInstance"] = json!("someone-else");
    assert_eq!(w.instance.talk_body(&theirs).json()["text"], "gated: p");
    assert_eq!(w.runs(), 2);
}

#[test]
fn a_retryable_failure_is_not_stored_and_one_that_is_not_retryable_is() {
    let root = TestRoot::new("store-rules");
    let calls = root.path.join("calls");
    let fails = |name: &str, command: &str| {
        let config = json!({
            "bus": {"peers": "*", "secret": "s-0123456789abcdef"},
            "engine": {"command": ["sh", "-c", command], "env": {"CALLS_FILE": calls.to_str().unwrap()}},
        });
        root.start(name, &config)
    };
    let count = || std::fs::read_to_string(&calls).map_or(0, |s| s.lines().count());
    // exit 1: `engine_cli`, retryable: a retry with the same id runs again.
    let flaky = fails("flaky", "echo call >> \"$CALLS_FILE\"; exit 1");
    for _ in 0..2 {
        let v = flaky.talk_body(&with_id("p")).json();
        assert_eq!(
            (v["errorCode"].as_str(), v["retryable"].as_bool()),
            (Some("engine_cli"), Some(true)),
            "{v}"
        );
    }
    assert_eq!(count(), 2);
    // Not logged in: `auth`, not retryable: stored.
    let login = fails(
        "login",
        "echo call >> \"$CALLS_FILE\"; echo 'Error: not logged in' >&2; exit 1",
    );
    let first = login.talk_body(&with_id("p"));
    assert_eq!(first.json()["errorCode"], "auth", "{first:?}");
    assert_eq!(login.talk_body(&with_id("p")).body, first.body);
    assert_eq!(count(), 3);
}

#[test]
fn negotiation_lists_the_base_two_plus_what_the_request_asked_for() {
    let root = TestRoot::new("negotiate");
    let config = json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": {"command": ["sh", script("json_cost.sh")], "output": "json"}});
    let w = root.start("worker", &config);
    // Only the base capabilities: exactly the base two, and no usage.
    let v = w.talk_body(&body("p", None, &CAPABILITIES)).json();
    assert_eq!(v["capabilities"], json!(CAPABILITIES), "{v}");
    assert!(v.get("usage").is_none(), "{v}");
    // No capabilities at all (a legacy caller): the base two.
    let v = w.talk("c", "p", 0).json();
    assert_eq!(v["capabilities"], json!(CAPABILITIES), "{v}");
    // Extensions this build implements are echoed; unknown ones and `secret-proof`
    // (health only) are not.
    let asked = [
        "structured-errors",
        "retryable-errors",
        "usage-report",
        "x-future",
        "secret-proof",
        "cancel-on-hangup",
    ];
    let v = w.talk_body(&body("p", None, &asked)).json();
    assert_eq!(
        v["capabilities"],
        json!([
            "structured-errors",
            "retryable-errors",
            "cancel-on-hangup",
            "usage-report"
        ]),
        "{v}"
    );
    // `usage-report`: the turn's own usage.
    assert_eq!(
        v["usage"],
        json!({"costUsd": 0.4, "inputTokens": 100, "outputTokens": 20, "cachedTokens": 7}),
        "{v}"
    );
    // Health lists all of them.
    let health = w.health();
    for capability in [
        "idempotent-requests",
        "cancel-on-hangup",
        "usage-report",
        "secret-proof",
    ] {
        assert!(
            health["capabilities"]
                .as_array()
                .unwrap()
                .contains(&json!(capability)),
            "{health}"
        );
    }
}

/// A text engine reports no usage: its envelope carried `usage` of zeros, and `talk`
/// printed "$0.0000, 0 in / 0 out tokens".
#[test]
fn a_text_engine_reports_no_usage_even_when_asked() {
    let root = TestRoot::new("text-usage");
    let config = json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": {"command": ["cat"]}});
    let w = root.start("worker", &config);
    let v = w
        .talk_body(&body(
            "p",
            None,
            &["structured-errors", "retryable-errors", "usage-report"],
        ))
        .json();
    assert_eq!(v["text"], "p", "{v}");
    assert!(v.get("usage").is_none(), "{v}");
}

/// Usage is what the engine reported: a JSON engine that reported tokens but no cost
/// got `costUsd: 0.0` (contract 8.3: null), one that reported nothing got zeros.
#[test]
fn usage_in_an_envelope_is_only_what_the_engine_reported() {
    let root = TestRoot::new("reported-usage");
    let asked = ["structured-errors", "retryable-errors", "usage-report"];
    let engine = |name: &str, output: &str| {
        let command = format!("cat > /dev/null; printf '%s' '{output}'");
        let config = json!({
            "bus": {"peers": "*", "secret": "s-0123456789abcdef"},
            "engine": {"command": ["sh", "-c", command], "output": "json"},
        });
        root.start(name, &config)
    };
    let tokens_only = engine(
        "tokens",
        r#"{"result":"r","usage":{"input_tokens":9,"output_tokens":3}}"#,
    );
    let v = tokens_only.talk_body(&body("p", None, &asked)).json();
    assert_eq!(
        v["usage"],
        json!({"costUsd": null, "inputTokens": 9, "outputTokens": 3, "cachedTokens": 0}),
        "{v}"
    );
    let silent = engine("silent", r#"{"result":"r"}"#);
    let v = silent.talk_body(&body("p", None, &asked)).json();
    assert_eq!(v["text"], "r", "{v}");
    assert!(v.get("usage").is_none(), "{v}");
}

/// A duplicate or a cancel request got the envelope negotiated for the turn's first
/// request (its capabilities, its `usage`), not for its own (contract 4.1, 8.3).
#[test]
fn each_waiter_gets_the_turns_envelope_as_its_own_request_negotiated() {
    let root = TestRoot::new("per-waiter");
    let config = json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": {"command": ["sh", script("json_cost.sh")], "output": "json"}});
    let w = root.start("worker", &config);
    let all = [
        "structured-errors",
        "retryable-errors",
        "idempotent-requests",
        "cancel-on-hangup",
        "usage-report",
    ];
    let with = |caps: &[&str]| body("p", Some(json!({"requestId": ID})), caps);
    let first = w.talk_body(&with(&all)).json();
    assert_eq!(first["capabilities"], json!(all), "{first}");
    assert_eq!(first["usage"]["costUsd"], 0.4, "{first}");
    // The stored envelope, for a retry that lists only the base two.
    let base = w.talk_body(&with(&CAPABILITIES)).json();
    assert_eq!(base["capabilities"], json!(CAPABILITIES), "{base}");
    assert!(base.get("usage").is_none(), "{base}");
    assert_eq!(base["text"], first["text"]);
    assert_eq!(
        base["durationMs"], first["durationMs"],
        "the same turn's envelope"
    );
}

/// `loopbus talk --retries 2` against a real instance whose engine fails once with a
/// retryable code (`engine_cli`), then succeeds: success, and the engine ran twice
/// (a retryable failure is not stored, so the retry with the same id runs again).
#[test]
fn talk_retries_an_engine_that_fails_once_and_succeeds_with_two_runs() {
    let root = TestRoot::new("retry-engine");
    let calls = root.path.join("calls");
    let script =
        "n=$(wc -l < \"$CALLS_FILE\" 2>/dev/null || echo 0); echo call >> \"$CALLS_FILE\"; \
                  if [ \"$n\" -eq 0 ]; then echo 'transient trouble' >&2; exit 1; fi; cat";
    let config = json!({
        "bus": {"peers": "*", "secret": "s-retry-0123456789abcdef"},
        "engine": {"command": ["sh", "-c", script], "env": {"CALLS_FILE": calls.to_str().unwrap()}},
    });
    let _worker = root.start("worker", &config);
    let me = root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let state_dir = me.parent().unwrap().to_str().unwrap().to_owned();
    let out = run(
        &[
            "talk",
            "--state-dir",
            &state_dir,
            "--retries",
            "2",
            "worker",
            "hello",
        ],
        &[("RUST_LOG", "info")],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(std::fs::read_to_string(&calls).unwrap().lines().count(), 2);
    assert!(stderr.contains("retry 1"), "the retry is logged: {stderr}");
}

/// Regression: a cancel that worked was reported as unconfirmed. The server answers a
/// cancel once the engine is gone, and an engine that ignores SIGTERM goes only at
/// SIGKILL, the kill grace (3 s) later; `talk` stopped waiting for that answer after
/// 1.5 s and said "had not confirmed it".
#[test]
fn bug_a_cancel_of_an_engine_ignoring_sigterm_was_reported_unconfirmed() {
    use std::process::{Command, Stdio};
    let root = TestRoot::new("cancel-stubborn");
    let ready = root.path.join("ready");
    let config = json!({
        "bus": {"peers": "*", "secret": "s-stubborn-0123456789abcdef"},
        "engine": {
            "command": ["sh", "-c", "trap '' TERM; cat > /dev/null; : > \"$READY\"; sleep 60"],
            "env": {"READY": ready.to_str().unwrap()},
        },
    });
    let _worker = root.start("worker", &config);
    let me = root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let talk = Command::new(bin())
        .args(["talk", "--state-dir"])
        .arg(me.parent().unwrap())
        .args(["worker", "a turn to cancel"])
        .env_remove("LOOPBUS_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(BOUND, || ready.exists()),
        "the engine never started"
    );
    send_signal(talk.id(), rustix::process::Signal::INT);
    let out = talk.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted by SIGINT; the turn was cancelled"),
        "{stderr}"
    );
    assert!(!stderr.contains("had not confirmed"), "{stderr}");
}
