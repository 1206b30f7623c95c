//! `loopbus talk` against real `serve` processes and fake peers: every row of the
//! contract's section 5 table, with its exit status and, with `--json`, its code and
//! `retryable`.
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
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

/// A caller that is allowed to call everyone, with default depth.
fn caller(root: &TestRoot, name: &str) -> PathBuf {
    root.write_config(name, &json!({"bus": {"peers": "*"}}));
    root.state_dir(name)
}

fn engine_script(name: &str) -> String {
    format!("{}/tests/engines/{name}", env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------
// Real serve processes

#[test]
fn a_talks_to_b_and_gets_the_exact_reply() {
    let root = TestRoot::new("talk-two");
    let _a = root.start("alpha", &open_config("secret-a-0123456789abcdef"));
    let b = root.start("beta", &open_config("secret-b-0123456789abcdef"));
    let a_dir = root.state_dir("alpha");

    let prompt = "hello beta: \"quotes\", tabs\t, unicode \u{1F600}\nand a second line";
    let t = talk(&a_dir, &["beta", prompt], &[], None);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    // The reply ends with a newline on a pipe too (issue 13); `--raw` adds nothing.
    assert_eq!(t.stdout(), format!("{prompt}\n"), "{}", t.describe());

    // The prompt from stdin, and the whole envelope with --json.
    let t = talk(&a_dir, &["beta", "--json"], &[], Some("from stdin"));
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    let envelope = t.envelope();
    assert_eq!(envelope["success"], true);
    assert_eq!(envelope["text"], "from stdin");
    assert_eq!(envelope["fromInstance"], "beta");
    assert_eq!(envelope["protocolVersion"], 1);
    assert!(envelope.get("errorCode").is_none());

    // $LOOPBUS_STATE_DIR names the caller when --state-dir is absent.
    let args = ["talk", "beta", "via env"];
    let out = run(
        &args,
        &[("LOOPBUS_STATE_DIR", a_dir.to_str().unwrap())],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via env\n");

    // Secrets never reach the caller's output.
    for s in [t.stdout(), t.stderr()] {
        assert!(!s.contains("secret-b") && !s.contains("secret-a"), "{s}");
    }
    drop(b);
}

#[test]
fn three_instances_talk_to_each_other_and_remote_limits_apply() {
    let root = TestRoot::new("talk-three");
    let _a = root.start("alpha", &open_config("sa-0123456789abcdef"));
    // beta only takes calls from alpha.
    let _b = root.start(
        "beta",
        &json!({"bus": {"peers": ["alpha"], "secret": "sb-0123456789abcdef"}}),
    );
    let _c = root.start(
        "gamma",
        &json!({"bus": {"peers": "*", "secret": "sc-0123456789abcdef", "maxDepth": 3}}),
    );

    // A peers list also limits whom an instance may call: beta may only call alpha.
    for (from, to) in [
        ("alpha", "beta"),
        ("beta", "alpha"),
        ("gamma", "alpha"),
        ("alpha", "gamma"),
    ] {
        let prompt = format!("{from} to {to}");
        let t = talk(&root.state_dir(from), &[to, &prompt], &[], None);
        assert_eq!(t.code(), Some(0), "{}", t.describe());
        assert_eq!(t.stdout(), format!("{prompt}\n"));
    }

    // beta refuses gamma: the peer's own peer_not_allowed, passed through.
    let t = talk(
        &root.state_dir("gamma"),
        &["beta", "hi", "--json"],
        &[],
        None,
    );
    let envelope = t.assert_failure(1, "peer_not_allowed", false);
    assert_eq!(envelope["fromInstance"], "beta");
    // beta may not call gamma: decided locally, before anything is sent.
    let t = talk(
        &root.state_dir("beta"),
        &["gamma", "hi", "--json"],
        &[],
        None,
    );
    let envelope = t.assert_failure(1, "peer_not_allowed", false);
    assert_eq!(envelope["fromInstance"], "beta");

    // The depth limit stops a chain at the target: depth 2 goes out as 3, and gamma's
    // maxDepth is 3.
    let t = talk(
        &root.state_dir("alpha"),
        &["gamma", "deep", "--json", "--depth", "2"],
        &[],
        None,
    );
    let envelope = t.assert_failure(1, "max_depth_exceeded", false);
    assert_eq!(envelope["fromInstance"], "gamma");
    // One hop less is fine.
    let t = talk(
        &root.state_dir("alpha"),
        &["gamma", "ok"],
        &[("LOOPBUS_DEPTH", "1")],
        None,
    );
    assert_eq!(t.code(), Some(0), "{}", t.describe());
}

/// Interop: `bus.kind` is what an instance reports, `bus.acceptKinds` what a caller
/// accepts, so an instance can join a mesh that expects another fingerprint.
#[test]
fn configurable_kind_joins_another_mesh() {
    let root = TestRoot::new("talk-kind");
    let _bridge = root.start(
        "bridge",
        &json!({"bus": {"peers": "*", "kind": "cc-telegram-bridge"}}),
    );
    let _custom = root.start("custom", &json!({"bus": {"peers": "*", "kind": "my-mesh"}}));
    let me = caller(&root, "me");
    // The default acceptKinds include cc-telegram-bridge, not my-mesh.
    let t = talk(&me, &["bridge", "hi"], &[], None);
    assert_eq!(
        (t.code(), t.stdout().as_str()),
        (Some(0), "hi\n"),
        "{}",
        t.describe()
    );
    let t = talk(&me, &["custom", "hi", "--json"], &[], None);
    t.assert_failure(75, "instance_unavailable", true);
    assert!(t.stderr().contains("my-mesh"), "{}", t.describe());
    root.write_config(
        "member",
        &json!({"bus": {"peers": "*", "acceptKinds": ["my-mesh"]}}),
    );
    let t = talk(&root.state_dir("member"), &["custom", "hi"], &[], None);
    assert_eq!(
        (t.code(), t.stdout().as_str()),
        (Some(0), "hi\n"),
        "{}",
        t.describe()
    );
}

/// A→B where B's engine runs `loopbus talk C` with the depth it was given.
#[test]
fn a_to_b_to_c_chain_carries_the_incremented_depth() {
    let root = TestRoot::new("talk-chain");
    let bin = common::bin();
    let relay = |to: &str, max_depth: u64| {
        json!({
            "bus": {"peers": "*", "maxDepth": max_depth},
            "engine": {"command": ["/bin/sh", engine_script("relay.sh")], "output": "text",
                       "env": {"LOOPBUS_BIN": bin, "RELAY_TO": to}}
        })
    };
    let report = json!({
        "bus": {"peers": "*"},
        "engine": {"command": ["/bin/sh", engine_script("report-depth.sh")], "output": "text"}
    });
    let _a = root.start("alpha", &open_config("sa-0123456789abcdef"));
    let _b = root.start("beta", &relay("gamma", 3));
    let _c = root.start("gamma", &report);

    // alpha (depth 0) → beta gets depth 1 → its engine's talk sends 2 → gamma sees 2.
    let t = talk(
        &root.state_dir("alpha"),
        &["beta", "pass it on", "--timeout", "60"],
        &[],
        None,
    );
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    let reply = t.stdout();
    assert!(
        reply.starts_with("beta at depth 1 relayed (exit 0): "),
        "{reply}"
    );
    let inner: Value = serde_json::from_str(reply.split_once("): ").unwrap().1).unwrap();
    assert_eq!(inner["success"], true, "{reply}");
    assert_eq!(inner["fromInstance"], "gamma");
    assert_eq!(inner["text"], "gamma saw depth 2 from beta: pass it on");

    // From depth 2, beta gets 3 and its own maxDepth (3) stops the chain before gamma.
    let t = talk(
        &root.state_dir("alpha"),
        &["beta", "again", "--depth", "1", "--timeout", "60"],
        &[],
        None,
    );
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    let reply = t.stdout();
    assert!(
        reply.starts_with("beta at depth 2 relayed (exit 1): "),
        "{reply}"
    );
    let inner: Value = serde_json::from_str(reply.split_once("): ").unwrap().1).unwrap();
    assert_eq!(inner["errorCode"], "max_depth_exceeded", "{reply}");
    assert_eq!(inner["fromInstance"], "gamma", "{reply}");
}

// ---------------------------------------------------------------------------------
// Local checks: decided before anything is sent

#[test]
fn local_checks_fail_before_anything_is_sent() {
    let root = TestRoot::new("talk-local");
    // A peer that would accept anything; it must never see a request.
    let peer = FakePeer::answering(
        "worker",
        Answer::json(200, &json!({"success": true, "text": "x"})),
    );
    register_by_hand(&root.path, "worker", peer.port, 1, "the-secret");

    // Own bus disabled, in each of the config's forms.
    for bus in [
        json!(false),
        json!(null),
        json!({"peers": []}),
        json!({"peers": false}),
    ] {
        root.write_config("off", &json!({ "bus": bus }));
        let t = talk(
            &root.state_dir("off"),
            &["worker", "hi", "--json"],
            &[],
            None,
        );
        let envelope = t.assert_failure(1, "bus_disabled", false);
        assert_eq!(
            envelope["fromInstance"], "off",
            "locally built: names the caller"
        );
    }

    // Target not among the caller's peers.
    root.write_config("picky", &json!({"bus": {"peers": ["someone-else"]}}));
    let t = talk(
        &root.state_dir("picky"),
        &["worker", "hi", "--json"],
        &[],
        None,
    );
    t.assert_failure(1, "peer_not_allowed", false);

    // Depth at the caller's maxDepth, from the flag and from the environment.
    root.write_config("deep", &json!({"bus": {"peers": "*", "maxDepth": 2}}));
    let deep = root.state_dir("deep");
    talk(
        &deep,
        &["worker", "hi", "--json", "--depth", "2"],
        &[],
        None,
    )
    .assert_failure(1, "max_depth_exceeded", false);
    talk(
        &deep,
        &["worker", "hi", "--json"],
        &[("LOOPBUS_DEPTH", "7")],
        None,
    )
    .assert_failure(1, "max_depth_exceeded", false);

    // A prompt whose serialized body is over 262,144 bytes, from stdin and as argument.
    let me = caller(&root, "me");
    let big = "x".repeat(262_144);
    talk(&me, &["worker", "--json"], &[], Some(&big)).assert_failure(1, "request_too_large", false);
    // Escaping counts: 140,000 quotes are 280,000 bytes once serialized.
    let quotes = "\"".repeat(140_000);
    talk(&me, &["worker", "--json"], &[], Some(&quotes)).assert_failure(
        1,
        "request_too_large",
        false,
    );

    assert!(peer.requests().is_empty(), "{:?}", peer.requests());

    // Just under the limit goes through (the fake peer answers success); the body
    // also carries `ext.requestId` (issue 11).
    let fits = "x".repeat(261_900);
    let t = talk(&me, &["worker", "--json"], &[], Some(&fits));
    assert_eq!(t.code(), Some(0), "{}", t.describe());
}

#[test]
fn usage_errors_exit_2() {
    let root = TestRoot::new("talk-usage");
    let me = caller(&root, "me");
    let no_config = root.state_dir("no-config");
    type Env<'a> = Vec<(&'a str, &'a str)>;
    let cases: Vec<(Vec<&str>, Env)> = vec![
        (vec!["talk"], vec![]),
        // From a shell (no state dir) `--name` is not the caller's name: `--as` is.
        (vec!["talk", "worker", "hi", "--name", "me"], vec![]),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "w",
                "--as",
                "x",
            ],
            vec![],
        ),
        (vec!["talk", "--state-dir", me.to_str().unwrap()], vec![]),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "bad name",
                "hi",
            ],
            vec![],
        ),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "w",
                "hi",
                "--depth",
                "-1",
            ],
            vec![],
        ),
        (
            vec!["talk", "--state-dir", me.to_str().unwrap(), "w", "hi"],
            vec![("LOOPBUS_DEPTH", "x")],
        ),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "w",
                "hi",
                "--timeout",
                "0",
            ],
            vec![],
        ),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "w",
                "hi",
                "--timeout",
                "1e19",
            ],
            vec![],
        ),
        (
            vec![
                "talk",
                "--state-dir",
                me.to_str().unwrap(),
                "w",
                "hi",
                "extra",
            ],
            vec![],
        ),
        (
            vec![
                "talk",
                "--state-dir",
                no_config.to_str().unwrap(),
                "w",
                "hi",
            ],
            vec![],
        ),
    ];
    for (args, env) in cases {
        let out = run(&args, &env, None);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
        assert!(!out.stderr.is_empty(), "{}", describe(&args, &out));
    }
    // An invalid config.json is a local configuration error, naming the field.
    root.write_config("broken", &json!({"bus": {"maxDepth": 0}}));
    let broken = root.state_dir("broken").display().to_string();
    let args = ["talk", "--state-dir", broken.as_str(), "w", "hi"];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bus.maxDepth"),
        "{}",
        describe(&args, &out)
    );
}

// ---------------------------------------------------------------------------------
// Discovery failures: instance_unavailable, and the secret is never sent

#[test]
fn target_not_registered() {
    let root = TestRoot::new("talk-unregistered");
    let me = caller(&root, "me");
    talk(&me, &["nobody", "hi", "--json"], &[], None).assert_failure(
        75,
        "instance_unavailable",
        true,
    );
    // With a registry that has other instances in it, too.
    register_by_hand(&root.path, "someone", closed_port(), 1, "s");
    talk(&me, &["nobody", "hi", "--json"], &[], None).assert_failure(
        75,
        "instance_unavailable",
        true,
    );
}

#[test]
fn registered_but_dead() {
    let root = TestRoot::new("talk-dead");
    let me = caller(&root, "me");
    let mut b = root.start("beta", &open_config("sb-0123456789abcdef"));
    // SIGKILL: no chance to deregister, so the entry stays, stale.
    let mut child = b.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(root.registry()["instances"]["beta"]["port"], b.port);
    let t = talk(&me, &["beta", "hi", "--json"], &[], None);
    t.assert_failure(75, "instance_unavailable", true);
}

#[test]
fn port_held_by_a_listener_that_never_answers() {
    let root = TestRoot::new("talk-silent");
    let me = caller(&root, "me");
    // The kernel completes the handshake; nobody ever reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    register_by_hand(
        &root.path,
        "beta",
        silent.local_addr().unwrap().port(),
        1,
        "sb",
    );
    // The probe's bound decides it, not the talk timeout: the failure is the health
    // check's, before anything else is sent. Run once: a probe timeout is the point.
    let t = talk_once(&me, &["beta", "hi", "--json", "--timeout", "30"], &[], None);
    t.assert_failure(75, "instance_unavailable", true);
    assert!(t.stderr().contains(PROBE_TIMED_OUT), "{}", t.describe());
}

#[test]
fn impostor_answering_health_with_another_name_never_gets_the_secret() {
    let root = TestRoot::new("talk-impostor");
    let me = caller(&root, "me");
    let impostor = FakePeer::answering(
        "mallory",
        Answer::json(200, &json!({"success": true, "text": "gotcha"})),
    );
    register_by_hand(&root.path, "beta", impostor.port, 1, "beta-secret");
    let t = talk(&me, &["beta", "hi", "--json"], &[], None);
    t.assert_failure(75, "instance_unavailable", true);
    let seen = impostor.requests();
    assert!(!seen.is_empty(), "the impostor was never probed");
    for request in &seen {
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("GET", "/api/health")
        );
        assert!(request.header("authorization").is_none(), "{request:?}");
        assert!(!format!("{request:?}").contains("beta-secret"));
    }

    // Same for a peer of a kind the caller does not accept.
    let other_kind = FakePeer::start(|r| {
        if r.path == "/api/health" {
            Answer::json(
                200,
                &json!({"kind": "something-else", "instance": "gamma", "status": "ok", "pid": 1}),
            )
        } else {
            Answer::json(200, &json!({"success": true, "text": "x"}))
        }
    });
    register_by_hand(&root.path, "gamma", other_kind.port, 1, "gamma-secret");
    talk(&me, &["gamma", "hi", "--json"], &[], None).assert_failure(
        75,
        "instance_unavailable",
        true,
    );
    assert!(other_kind
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
    // ...unless the caller's acceptKinds lists it.
    root.write_config(
        "open-minded",
        &json!({"bus": {"peers": "*", "acceptKinds": ["something-else"]}}),
    );
    let t = talk(&root.state_dir("open-minded"), &["gamma", "hi"], &[], None);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
}

// ---------------------------------------------------------------------------------
// Answers from fake peers

#[test]
fn request_shape_bearer_secret_and_incremented_depth() {
    let root = TestRoot::new("talk-shape");
    let me = caller(&root, "me");
    let peer = FakePeer::answering(
        "worker",
        Answer::json(200, &json!({"success": true, "text": "legacy ok"})),
    );
    register_by_hand(&root.path, "worker", peer.port, 1, "worker-secret");
    let t = talk(
        &me,
        &["worker", "the prompt", "--depth", "1", "--json"],
        &[],
        None,
    );
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    let envelope = t.envelope();
    // A legacy success (no fromInstance, no protocolVersion) keeps the peer's own
    // protocolVersion and capabilities, absent ones absent (issue 12); the name is the
    // target's, whom the probe found on that port.
    assert_eq!(envelope["text"], "legacy ok");
    assert_eq!(envelope["fromInstance"], "worker");
    assert!(envelope.get("protocolVersion").is_none(), "{envelope}");
    assert!(envelope.get("capabilities").is_none(), "{envelope}");

    let talks: Vec<Seen> = peer
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/talk")
        .collect();
    assert_eq!(talks.len(), 1, "{talks:?}");
    let request = &talks[0];
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.header("authorization"),
        Some("Bearer worker-secret")
    );
    assert_eq!(
        request.header("host"),
        Some(format!("127.0.0.1:{}", peer.port).as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    // Every delegation carries a request id: 32 lowercase hex digits (issue 11).
    let mut body = request.json();
    let id = body["ext"]["requestId"].as_str().unwrap().to_owned();
    assert!(
        id.len() == 32
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id}"
    );
    body.as_object_mut().unwrap().remove("ext");
    assert_eq!(
        body,
        json!({"fromInstance": "me", "prompt": "the prompt", "depth": 2, "protocolVersion": 1,
               "capabilities": ["structured-errors", "retryable-errors"]})
    );
}

#[test]
fn peer_answers_map_to_their_rows() {
    let root = TestRoot::new("talk-answers");
    let me = caller(&root, "me");
    // (answer, exit, code, retryable, error text kept)
    let rows: Vec<(Answer, i32, &str, bool, Option<&str>)> = vec![
        (
            Answer::Respond(200, b"<html>not json</html>".to_vec()),
            75,
            "invalid_response",
            true,
            None,
        ),
        (
            Answer::json(200, &json!({"text": "no success field"})),
            75,
            "invalid_response",
            true,
            None,
        ),
        (
            Answer::json(200, &json!({"success": false, "error": "legacy boom"})),
            75,
            "unknown",
            true,
            Some("legacy boom"),
        ),
        (
            Answer::json(
                200,
                &json!({"success": false, "text": "", "fromInstance": "worker",
                "error": "Budget exhausted: $1.2000 used of $1.00.", "errorCode": "budget_exhausted",
                "retryable": false, "durationMs": 12, "protocolVersion": 1,
                "capabilities": ["structured-errors", "retryable-errors"]}),
            ),
            1,
            "budget_exhausted",
            false,
            Some("Budget exhausted: $1.2000 used of $1.00."),
        ),
        // A code this build does not know is kept as it is, with the peer's flag...
        (
            Answer::json(
                200,
                &json!({"success": false, "error": "slow down", "errorCode": "rate_limited", "retryable": false}),
            ),
            1,
            "rate_limited",
            false,
            Some("slow down"),
        ),
        // ...or the table's default for unknown codes (retryable) when it has none.
        (
            Answer::json(
                200,
                &json!({"success": false, "error": "hmm", "errorCode": "brand_new"}),
            ),
            75,
            "brand_new",
            true,
            Some("hmm"),
        ),
        // Refusals come with 4xx/5xx statuses and are passed through.
        (
            Answer::json(
                401,
                &json!({"success": false, "text": "", "fromInstance": "worker", "error": "missing or wrong bearer secret",
            "errorCode": "auth_failed", "retryable": false, "durationMs": 0, "protocolVersion": 1, "capabilities": []}),
            ),
            1,
            "auth_failed",
            false,
            None,
        ),
        (
            Answer::json(
                503,
                &json!({"success": false, "error": "busy", "errorCode": "server_busy", "retryable": true}),
            ),
            75,
            "server_busy",
            true,
            None,
        ),
    ];
    for (answer, exit, code, retryable, error) in rows {
        let peer = FakePeer::answering("worker", answer);
        register_by_hand(&root.path, "worker", peer.port, 1, "s");
        let t = talk(&me, &["worker", "hi", "--json"], &[], None);
        let envelope = t.assert_failure(exit, code, retryable);
        if let Some(error) = error {
            assert_eq!(envelope["error"], error, "{}", t.describe());
            assert_eq!(envelope["fromInstance"], "worker", "{}", t.describe());
        }
        // Without --json: nothing on stdout, the code on stderr, the same exit status.
        let t = talk(&me, &["worker", "hi"], &[], None);
        assert_eq!(t.code(), Some(exit), "{}", t.describe());
        assert_eq!(t.stdout(), "", "{}", t.describe());
        assert!(t.stderr().contains(code), "{}", t.describe());
    }
}

#[test]
fn peer_that_never_answers_times_out() {
    let root = TestRoot::new("talk-timeout");
    let me = caller(&root, "me");
    let peer = FakePeer::answering("worker", Answer::Hang);
    register_by_hand(&root.path, "worker", peer.port, 1, "s");
    let t = talk(
        &me,
        &["worker", "hi", "--json", "--timeout", "1"],
        &[],
        None,
    );
    t.assert_failure(75, "timeout", true);
    assert!(t.took >= Duration::from_secs(1), "{:?}", t.took);
    assert!(t.took < Duration::from_secs(15), "{:?}", t.took);
    // The request did reach the peer: the time ran out waiting for its answer.
    assert!(peer.requests().iter().any(|r| r.path == "/api/talk"));
}

#[test]
fn every_command_has_help_with_an_example() {
    for command in [
        "talk", "health", "list", "serve", "init", "fan", "chain", "verify",
    ] {
        let args = [command, "--help"];
        let out = run(&args, &[], None);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Example"), "{}", describe(&args, &out));
        assert!(
            text.contains(&format!("loopbus {command}")),
            "{}",
            describe(&args, &out)
        );
    }
    let out = run(&["--help"], &[], None);
    let text = String::from_utf8_lossy(&out.stdout);
    for command in ["talk", "health", "list", "fan", "chain", "verify"] {
        assert!(text.contains(command), "{text}");
    }
}
