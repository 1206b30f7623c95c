//! A delegation's lifetime seen from the client (issue 11): its request id, its
//! retries, its cancel on SIGINT/SIGTERM and on the final timeout, the usage it
//! reports, and the capabilities it lists, against stand-in peers written here: tiny
//! HTTP servers that record every request and answer as each test scripts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use crate::client_support;
use crate::common;

use client_support::*;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BASE: [&str; 2] = ["structured-errors", "retryable-errors"];
const IDEMPOTENT: &str = "idempotent-requests";
const CANCEL: &str = "cancel-on-hangup";
const USAGE: &str = "usage-report";
/// How long a test waits for a condition (a request seen, a process gone).
const BOUND: Duration = Duration::from_secs(10);

/// A health answer for `instance` of `kind` listing `capabilities`.
fn health(instance: &str, kind: &str, capabilities: &[&str]) -> Answer {
    Answer::json(
        200,
        &json!({"kind": kind, "instance": instance, "status": "ok", "pid": 1,
                "protocolVersion": 1, "capabilities": capabilities}),
    )
}

fn success(text: &str) -> Answer {
    Answer::json(
        200,
        &json!({"success": true, "text": text, "fromInstance": "worker", "durationMs": 3,
                "protocolVersion": 1, "capabilities": BASE}),
    )
}

fn failure(status: u16, code: &str, retryable: bool) -> Answer {
    Answer::json(
        status,
        &json!({"success": false, "text": "", "error": format!("scripted {code}"),
                "errorCode": code, "retryable": retryable, "fromInstance": "worker",
                "durationMs": 1, "protocolVersion": 1, "capabilities": BASE}),
    )
}

/// A caller `me` allowed to call everyone, and a stand-in `worker` registered by hand
/// whose health lists `capabilities` and whose talks `talk` answers (given the
/// request's body and how many talks came before it).
struct Setup {
    root: TestRoot,
    me: PathBuf,
    peer: FakePeer,
}

fn setup(
    label: &str,
    capabilities: &'static [&'static str],
    talk: impl Fn(&Value, usize) -> Answer + Send + Sync + 'static,
) -> Setup {
    let root = TestRoot::new(label);
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let me = root.state_dir("me");
    let talks = AtomicUsize::new(0);
    let peer = FakePeer::start(move |request| {
        if request.path == "/api/health" {
            health("worker", "loopbus", capabilities)
        } else {
            talk(&request.json(), talks.fetch_add(1, Ordering::SeqCst))
        }
    });
    register_by_hand(
        &root.path,
        "worker",
        peer.port,
        std::process::id(),
        "worker-secret",
    );
    Setup { root, me, peer }
}

impl Setup {
    /// The bodies of every `/api/talk` the peer received, in order.
    fn talks(&self) -> Vec<Value> {
        self.peer
            .requests()
            .into_iter()
            .filter(|r| r.path == "/api/talk")
            .map(|r| r.json())
            .collect()
    }

    /// `loopbus talk worker PROMPT ARGS...` as `me`, spawned, stdout and stderr piped.
    fn spawn_talk(&self, prompt: &str, args: &[&str]) -> Child {
        Command::new(bin())
            .arg("talk")
            .arg("--state-dir")
            .arg(&self.me)
            .arg("worker")
            .arg(prompt)
            .args(args)
            .env_remove("LOOPBUS_STATE_DIR")
            .env_remove("LOOPBUS_DEPTH")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Waits for `child` to exit; its status code and stderr.
fn finish(child: Child) -> (Option<i32>, String, String) {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(output) = rx.recv_timeout(BOUND) else {
        let _ = try_signal(pid, rustix::process::Signal::KILL);
        panic!("loopbus talk (pid {pid}) did not exit within {BOUND:?}");
    };
    let output = output.unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The `ext.requestId` of a talk body, checked to be 32 lowercase hex digits.
fn request_id(body: &Value) -> String {
    let id = body["ext"]["requestId"].as_str().unwrap_or("").to_owned();
    assert!(
        id.len() == 32
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "not a 128-bit hex request id: {body}"
    );
    id
}

fn is_cancel(body: &Value) -> bool {
    body["ext"]["cancel"] == true
}

/// Answers a cancel request with the `cancelled` failure, and hangs on any other talk.
fn hang_but_answer_cancels(body: &Value, _: usize) -> Answer {
    if is_cancel(body) {
        failure(200, "cancelled", false)
    } else {
        Answer::Hang
    }
}

/// Asserts that the last talk is the cancel of the first: same `fromInstance`, same
/// request id, same depth, an empty prompt.
fn assert_cancel_of(talks: &[Value]) {
    let (first, last) = (&talks[0], talks.last().unwrap());
    assert!(is_cancel(last), "{talks:?}");
    assert_eq!(request_id(last), request_id(first), "{talks:?}");
    assert_eq!(last["fromInstance"], first["fromInstance"]);
    assert_eq!(last["depth"], first["depth"]);
    assert_eq!(last["prompt"], "");
}

#[test]
fn retries_2_against_a_peer_failing_once_retryable_succeed_with_one_request_id() {
    let s = setup("life-retry", &[BASE[0], BASE[1], IDEMPOTENT], |_, n| {
        if n == 0 {
            failure(503, "server_busy", true)
        } else {
            success("done")
        }
    });
    let (code, stdout, stderr) = finish(s.spawn_talk("hi", &["--retries", "2"]));
    assert_eq!((code, stdout.as_str()), (Some(0), "done\n"), "{stderr}");
    let talks = s.talks();
    assert_eq!(talks.len(), 2, "{talks:?}");
    assert_eq!(request_id(&talks[0]), request_id(&talks[1]));
    // Each retry is logged at info with its attempt number and reason.
    assert!(stderr.contains("retry 1 of 2"), "{stderr}");
    assert!(stderr.contains("server_busy"), "{stderr}");
    // The request lists the base two plus what the health listed, nothing else.
    assert_eq!(
        talks[0]["capabilities"],
        json!([BASE[0], BASE[1], IDEMPOTENT])
    );
}

/// Regression: `talk --retries` logged each retry with the peer's `error`,
/// `fromInstance` and `errorCode` raw, so a peer's escape sequences reached the
/// caller's terminal through stderr.
#[test]
fn bug_the_retry_line_showed_the_peers_text_raw() {
    let s = setup("life-retry-raw", &[BASE[0], BASE[1], IDEMPOTENT], |_, n| {
        if n == 0 {
            Answer::json(
                503,
                &json!({"success": false, "text": "", "error": "busy\u{1b}]52;c;aGk=\u{7}",
                        "errorCode": "server_busy\u{9b}2J", "retryable": true,
                        "fromInstance": "w\u{9b}orker\u{1b}[2J", "durationMs": 1,
                        "protocolVersion": 1, "capabilities": BASE}),
            )
        } else {
            success("done")
        }
    });
    let (code, stdout, stderr) = finish(s.spawn_talk("hi", &["--retries", "1"]));
    assert_eq!((code, stdout.as_str()), (Some(0), "done\n"), "{stderr}");
    assert!(stderr.contains("retry 1 of 1"), "{stderr}");
    assert!(
        stderr.contains(r"busy\u001b]52;c;aGk=\u0007") && stderr.contains(r"server_busy\u009b2J"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(['\u{1b}', '\u{7}', '\u{9b}']),
        "{stderr:?}"
    );
}

#[test]
fn without_retries_a_retryable_failure_is_tried_once() {
    let s = setup("life-noretry", &[BASE[0], BASE[1], IDEMPOTENT], |_, _| {
        failure(503, "server_busy", true)
    });
    let (code, _, stderr) = finish(s.spawn_talk("hi", &[]));
    assert_eq!(code, Some(75), "{stderr}");
    assert_eq!(s.talks().len(), 1);
    // Retries stop at their number, and a failure that is not retryable at once.
    let s = setup(
        "life-retry-limit",
        &[BASE[0], BASE[1], IDEMPOTENT],
        |_, n| {
            if n < 2 {
                failure(503, "server_busy", true)
            } else {
                failure(200, "auth", false)
            }
        },
    );
    let (code, _, stderr) = finish(s.spawn_talk("hi", &["--retries", "5"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(s.talks().len(), 3, "{stderr}");
}

#[test]
fn a_timeout_is_not_retried_against_a_peer_without_idempotent_requests() {
    let s = setup("life-no-dedupe", &BASE, |_, _| Answer::Hang);
    let (code, stdout, stderr) =
        finish(s.spawn_talk("hi", &["--timeout", "0.3", "--retries", "3", "--json"]));
    assert_eq!(code, Some(75), "{stderr}");
    let envelope: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(envelope["errorCode"], "timeout");
    assert!(stderr.contains("not retried"), "{stderr}");
    assert!(stderr.contains("idempotent-requests"), "{stderr}");
    // One request, and no cancel: the peer does not advertise cancel-on-hangup.
    let talks = s.talks();
    assert_eq!(talks.len(), 1, "{talks:?}");
    assert_eq!(talks[0]["capabilities"], json!(BASE));
}

#[test]
fn a_timeout_is_retried_with_the_same_id_then_cancelled_when_the_peer_dedupes() {
    let s = setup(
        "life-dedupe",
        &[BASE[0], BASE[1], IDEMPOTENT, CANCEL],
        hang_but_answer_cancels,
    );
    let (code, _, stderr) = finish(s.spawn_talk("hi", &["--timeout", "0.3", "--retries", "1"]));
    assert_eq!(code, Some(75), "{stderr}");
    let talks = s.talks();
    assert_eq!(talks.len(), 3, "{talks:?}");
    assert!(!is_cancel(&talks[0]) && !is_cancel(&talks[1]), "{talks:?}");
    assert_eq!(request_id(&talks[0]), request_id(&talks[1]));
    assert_eq!(talks[1]["prompt"], "hi");
    // Given up for good: the turn is cancelled.
    assert_cancel_of(&talks);
    assert_eq!(
        talks[0]["capabilities"],
        json!([BASE[0], BASE[1], IDEMPOTENT, CANCEL])
    );
}

/// Runs a talk that hangs, sends it `signal` once the peer has its request, and
/// returns its exit code and stderr.
fn interrupted(s: &Setup, signal: rustix::process::Signal) -> (Option<i32>, String, String) {
    let child = s.spawn_talk("a long turn", &["--json"]);
    assert!(
        eventually(BOUND, || !s.talks().is_empty()),
        "the peer never got the request"
    );
    send_signal(child.id(), signal);
    finish(child)
}

#[test]
fn sigterm_to_talk_sends_a_cancel_and_exits_143() {
    let s = setup(
        "life-sigterm",
        &[BASE[0], BASE[1], IDEMPOTENT, CANCEL],
        hang_but_answer_cancels,
    );
    let (code, stdout, stderr) = interrupted(&s, rustix::process::Signal::TERM);
    assert_eq!(code, Some(143), "{stderr}");
    let talks = s.talks();
    assert_eq!(talks.len(), 2, "{talks:?}");
    assert_cancel_of(&talks);
    assert!(
        stderr.contains("interrupted by SIGTERM; the turn was cancelled"),
        "{stderr}"
    );
    let envelope: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(envelope["errorCode"], "cancelled", "{stdout}");
    assert_eq!(envelope["retryable"], false, "{stdout}");
}

#[test]
fn sigint_to_talk_sends_a_cancel_and_exits_130() {
    let s = setup(
        "life-sigint",
        &[BASE[0], BASE[1], CANCEL],
        hang_but_answer_cancels,
    );
    let (code, _, stderr) = interrupted(&s, rustix::process::Signal::INT);
    assert_eq!(code, Some(130), "{stderr}");
    assert_cancel_of(&s.talks());
}

/// A closed terminal (SIGHUP) used to kill `talk` without a cancel: its turn ran on for
/// the peer's `reattachSecs`.
#[test]
fn bug_sighup_killed_talk_without_cancelling_its_turn() {
    let s = setup(
        "life-sighup",
        &[BASE[0], BASE[1], IDEMPOTENT, CANCEL],
        hang_but_answer_cancels,
    );
    let (code, _, stderr) = interrupted(&s, rustix::process::Signal::HUP);
    assert_eq!(code, Some(129), "{stderr}");
    assert_cancel_of(&s.talks());
    assert!(stderr.contains("interrupted by SIGHUP"), "{stderr}");
}

#[test]
fn sigint_to_talk_against_a_peer_without_cancel_on_hangup_just_closes() {
    let s = setup(
        "life-sigint-old",
        &[BASE[0], BASE[1], IDEMPOTENT],
        |_, _| Answer::Hang,
    );
    let (code, _, stderr) = interrupted(&s, rustix::process::Signal::INT);
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(s.talks().len(), 1, "{:?}", s.talks());
    assert!(
        stderr.contains("does not advertise cancel-on-hangup"),
        "{stderr}"
    );
}

#[test]
fn talk_json_prints_the_usage_the_peer_reported() {
    let s = setup("life-usage", &[BASE[0], BASE[1], USAGE], |_, _| {
        Answer::json(
            200,
            &json!({"success": true, "text": "ok", "fromInstance": "worker", "durationMs": 3200,
                    "protocolVersion": 1, "capabilities": [BASE[0], BASE[1], USAGE],
                    "usage": {"costUsd": 0.0123, "inputTokens": 1200, "outputTokens": 340,
                              "cachedTokens": 7}}),
        )
    });
    let (code, stdout, stderr) = finish(s.spawn_talk("hi", &["--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let envelope: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        envelope["usage"],
        json!({"costUsd": 0.0123, "inputTokens": 1200, "outputTokens": 340, "cachedTokens": 7}),
        "{stdout}"
    );
    assert_eq!(
        s.talks()[0]["capabilities"],
        json!([BASE[0], BASE[1], USAGE])
    );
    // stderr is no terminal here: no cost line.
    assert!(!stderr.contains("$0.0123"), "{stderr}");
}

// ---------------------------------------------------------------------------------
// The library: request ids it is given, and its cancel

fn options(s: &Setup, prompt: &str) -> loopbus::DelegateOptions {
    let config = loopbus::load_config(&s.me.join("config.json")).unwrap();
    loopbus::DelegateOptions::new(
        &s.root.path,
        "me".parse().unwrap(),
        config.bus,
        "worker".parse().unwrap(),
        prompt,
    )
}

#[test]
fn the_library_sends_the_request_id_it_is_given_and_cancels_by_it() {
    let s = setup(
        "life-library",
        &[BASE[0], BASE[1], IDEMPOTENT, CANCEL],
        hang_but_answer_cancels,
    );
    let id = loopbus::new_request_id().unwrap();
    let long = options(&s, "long")
        .with_request_id(id.clone())
        .with_timeout(Duration::from_millis(1500));
    let running = long.clone();
    let started = Instant::now();
    let turn = std::thread::spawn(move || loopbus::delegate(&running));
    assert!(eventually(BOUND, || !s.talks().is_empty()));
    match loopbus::cancel(&long).unwrap() {
        loopbus::CancelOutcome::Answered(envelope) => {
            assert_eq!(envelope.failure.unwrap().code.as_str(), "cancelled")
        }
        other => panic!("{other:?}"),
    }
    let talks = s.talks();
    assert_eq!(request_id(&talks[0]), id.as_str());
    assert_cancel_of(&talks);
    // The delegation itself ends at its timeout here (a stand-in does not cancel).
    let outcome = turn.join().unwrap();
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(started.elapsed() < BOUND);

    // Without an id there is nothing to name; to a peer without cancel-on-hangup
    // nothing is sent.
    let none = options_without_id(&s);
    assert_eq!(
        loopbus::cancel(&none).unwrap(),
        loopbus::CancelOutcome::NoRequestId
    );
    let old = setup("life-library-old", &BASE, |_, _| success("x"));
    let to_old = options(&old, "p").with_request_id(id);
    assert_eq!(
        loopbus::cancel(&to_old).unwrap(),
        loopbus::CancelOutcome::NotSupported
    );
    assert!(old.talks().is_empty());
}

fn options_without_id(s: &Setup) -> loopbus::DelegateOptions {
    options(s, "p")
}

#[test]
fn each_library_delegation_gets_a_fresh_request_id_unless_given_one() {
    let s = setup("life-ids", &[BASE[0], BASE[1], IDEMPOTENT], |_, _| {
        success("ok")
    });
    let plain = options(&s, "p");
    loopbus::delegate(&plain).unwrap();
    loopbus::delegate(&plain).unwrap();
    let given = plain.with_request_id(loopbus::RequestId::new("caller-chosen-id-0001").unwrap());
    loopbus::delegate(&given).unwrap();
    let talks = s.talks();
    assert_eq!(talks.len(), 3);
    assert_ne!(request_id(&talks[0]), request_id(&talks[1]));
    assert_eq!(talks[2]["ext"]["requestId"], "caller-chosen-id-0001");
}

#[test]
fn the_strict_stand_in_accepts_every_request_our_client_sends() {
    let root = TestRoot::new("life-strict");
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let me = root.state_dir("me");
    let rejected = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let peer = {
        let (rejected, script) = (Arc::clone(&rejected), Arc::clone(&script));
        FakePeer::start(move |request| {
            if request.path == "/api/health" {
                return health("original", "cc-telegram-bridge", &ORIGINAL_CAPABILITIES);
            }
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            if let Some(why) = original_rejects_request(&body) {
                rejected.lock().unwrap().push(why);
                return Answer::json(
                    400,
                    &json!({"success": false, "error": "Invalid request body"}),
                );
            }
            let mut script = script.lock().unwrap();
            if script.is_empty() {
                Answer::Hang
            } else {
                script.remove(0)
            }
        })
    };
    register_by_hand(
        &root.path,
        "original",
        peer.port,
        std::process::id(),
        "o-secret",
    );
    let set_script = |answers: Vec<Answer>| *script.lock().unwrap() = answers;
    let run = |args: &[&str]| talk(&me, args, &[], None);

    // A plain talk.
    set_script(vec![success("one")]);
    let t = run(&["original", "hi"]);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    // With retries: a retryable failure, then a success.
    set_script(vec![failure(503, "server_busy", true), success("two")]);
    let t = run(&["original", "hi", "--retries", "2"]);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    // A final timeout: not retried (no idempotent-requests), no cancel sent.
    set_script(vec![]);
    let t = run(&["original", "hi", "--timeout", "0.3", "--retries", "2"]);
    assert_eq!(t.code(), Some(75), "{}", t.describe());
    // SIGTERM while waiting: no cancel request (no cancel-on-hangup), exit 143.
    let child = Command::new(bin())
        .args([
            "talk",
            "--state-dir",
            me.to_str().unwrap(),
            "original",
            "hang",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen_before = peer
        .requests()
        .iter()
        .filter(|r| r.path == "/api/talk")
        .count();
    assert!(eventually(BOUND, || {
        peer.requests()
            .iter()
            .filter(|r| r.path == "/api/talk")
            .count()
            > seen_before
    }));
    send_signal(child.id(), rustix::process::Signal::TERM);
    let (code, _, stderr) = finish(child);
    assert_eq!(code, Some(143), "{stderr}");

    let talks: Vec<Value> = peer
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/talk")
        .map(|r| r.json())
        .collect();
    assert_eq!(talks.len(), 5, "{talks:?}");
    assert!(talks.iter().all(|t| !is_cancel(t)), "{talks:?}");
    assert!(
        rejected.lock().unwrap().is_empty(),
        "{:?}",
        rejected.lock().unwrap()
    );
}

// ---------------------------------------------------------------------------------
// Each delegation is proven on its own connection: a restarted instance is proven
// anew, and nothing goes out on a connection an earlier delegation used.

#[test]
fn a_restarted_instance_is_proven_anew() {
    let root = TestRoot::new("life-kept-restart");
    let mut worker = root.start("worker", &open_config("first-secret-0123456789abcdef"));
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let config = loopbus::load_config(&root.state_dir("me").join("config.json")).unwrap();
    let ask = |prompt: &str| {
        loopbus::delegate(&loopbus::DelegateOptions::new(
            &root.path,
            "me".parse().unwrap(),
            config.bus.clone(),
            "worker".parse().unwrap(),
            prompt,
        ))
    };
    assert_eq!(ask("one").unwrap().text, "one");
    assert_eq!(ask("two").unwrap().text, "two");
    worker.terminate(BOUND);
    let _again = root.start("worker", &open_config("second-secret-0123456789abcdef"));
    assert_eq!(ask("three").unwrap().text, "three");
}

/// One request a [`closing_peer`] read: the connection's number and the talk body.
type Seen = (usize, Value);

/// A keep-alive peer without proof that answers a health and a talk on each
/// connection, and closes the connection on its next request without an answer.
fn closing_peer() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for (number, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let record = Arc::clone(&record);
            std::thread::spawn(move || {
                let mut buffer = Vec::new();
                for request in 0.. {
                    let Some((path, body)) = read_one(&mut stream, &mut buffer) else {
                        return;
                    };
                    if path == "/api/talk" {
                        let body: Value = serde_json::from_slice(&body).unwrap();
                        record.lock().unwrap().push((number, body));
                    }
                    let answer = match request {
                        0 => json!({"kind": "loopbus", "instance": "worker", "status": "ok",
                                    "pid": 1, "protocolVersion": 1,
                                    "capabilities": [BASE[0], BASE[1], IDEMPOTENT]}),
                        1 => json!({"success": true, "text": "answered", "fromInstance": "worker",
                                    "durationMs": 1, "protocolVersion": 1, "capabilities": BASE}),
                        _ => return,
                    };
                    let answer = answer.to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        answer.len()
                    );
                    if stream
                        .write_all(format!("{head}{answer}").as_bytes())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    fn read_one(
        stream: &mut std::net::TcpStream,
        buffer: &mut Vec<u8>,
    ) -> Option<(String, Vec<u8>)> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                let path = head.split(' ').nth(1)?.to_owned();
                let length: usize = head
                    .lines()
                    .filter_map(|line| line.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, value)| value.trim().parse().unwrap());
                if buffer.len() >= end + 4 + length {
                    let body = buffer[end + 4..end + 4 + length].to_vec();
                    buffer.drain(..end + 4 + length);
                    return Some((path, body));
                }
            }
            let n = stream.read(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
    }
    (port, seen)
}

#[test]
fn each_delegation_is_proven_and_sent_on_a_fresh_connection() {
    let root = TestRoot::new("life-fresh-connection");
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let (port, seen) = closing_peer();
    register_by_hand(&root.path, "worker", port, std::process::id(), "w-secret");
    let config = loopbus::load_config(&root.state_dir("me").join("config.json")).unwrap();
    let options = loopbus::DelegateOptions::new(
        &root.path,
        "me".parse().unwrap(),
        config.bus,
        "worker".parse().unwrap(),
        "p",
    );
    assert_eq!(loopbus::delegate(&options).unwrap().text, "answered");
    assert_eq!(loopbus::delegate(&options).unwrap().text, "answered");
    let seen = seen.lock().unwrap().clone();
    // Each talk went out on the connection its own probe came on: 0, then 1.
    let connections: Vec<usize> = seen.iter().map(|(c, _)| *c).collect();
    assert_eq!(connections, [0, 1], "{seen:?}");
    assert_ne!(request_id(&seen[0].1), request_id(&seen[1].1));
}
