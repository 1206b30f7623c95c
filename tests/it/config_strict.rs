//! config.json fails closed (contract section 2, issue 9): an unknown key is an error
//! naming it and the key meant (exit 2 at startup; at a reload the last good config
//! stays), a disabled bus is visible (a warning, `busEnabled: false` in health, marked
//! in `list`), and a `fromInstance` with a NUL byte is refused (section 3, check 7).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a config edit may take to be noticed: the contract says within a second;
/// this is a liveness bound with room for a loaded machine.
const RELOAD_BOUND: Duration = Duration::from_secs(5);

/// How long a `serve` refusing its config may take to exit.
const EXIT_BOUND: Duration = Duration::from_secs(10);

/// The three typos of the attack review, each a whole config.json, with the words its
/// error must contain.
fn typos() -> [(Value, &'static str); 3] {
    [
        (
            json!({"bus": {"peer": ["a"]}}),
            "unknown key bus.peer; did you mean bus.peers?",
        ),
        (
            json!({"bus": true, "budgetUSD": 1}),
            "unknown key budgetUSD; did you mean budgetUsd?",
        ),
        (
            json!({"bus": {"maxdepth": 1}}),
            "unknown key bus.maxdepth; did you mean bus.maxDepth?",
        ),
    ]
}

/// Runs `loopbus serve` for `name` and waits for it to exit; a serve still running
/// after [`EXIT_BOUND`] (it accepted the config) is killed and fails the test.
fn serve_until_exit(root: &TestRoot, name: &str) -> Output {
    let args = [
        "serve",
        "--state-dir",
        &root.state_dir(name).display().to_string(),
    ];
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("LOOPBUS_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EXIT_BOUND;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "serve accepted the config and kept running\n{}",
                describe(&args, &output)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn bug_a_typo_in_a_key_opened_the_instance_at_startup() {
    let root = TestRoot::new("strict-start");
    for (i, (config, words)) in typos().into_iter().enumerate() {
        let name = format!("typo{i}");
        let path = root.write_config(&name, &config);
        let output = serve_until_exit(&root, &name);
        let context = format!("{config}\n{}", describe(&["serve"], &output));
        assert_eq!(output.status.code(), Some(2), "{context}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(words), "{context}");
        assert!(
            stderr.contains(&path.display().to_string()),
            "names the file: {context}"
        );
        assert!(
            root.registry()["instances"][&name].is_null(),
            "never registered: {context}"
        );
    }
}

#[test]
fn bug_a_repeated_key_let_the_last_value_open_the_instance() {
    let root = TestRoot::new("strict-dup");
    for (i, text) in [
        r#"{"bus":{"peers":["a"],"peers":"*"}}"#,
        r#"{"bus":{"peers":[]},"bus":{"peers":"*"}}"#,
        r#"{"bus":{"peers":"*","maxDepth":1,"maxDepth":100}}"#,
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("dup{i}");
        // Written by hand: a JSON value can't hold a key twice.
        let path = root.write_config(&name, &json!({}));
        std::fs::write(&path, text).unwrap();
        let output = serve_until_exit(&root, &name);
        let context = format!("{text}\n{}", describe(&["serve"], &output));
        assert_eq!(output.status.code(), Some(2), "{context}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("appears twice"),
            "{context}"
        );
        assert!(root.registry()["instances"][&name].is_null(), "{context}");
    }
}

/// A talk from `from` at `depth`, answered with the envelope's error code (`"ok"` for a
/// success).
fn outcome(w: &Instance, from: &str, depth: u64) -> String {
    let r = Req::talk(w)
        .json(&json!({"fromInstance": from, "prompt": "p", "depth": depth}))
        .send(w.port);
    let v = r.json();
    match v["errorCode"].as_str() {
        Some(code) => code.to_owned(),
        None if v["success"] == true => "ok".to_owned(),
        None => format!("unexpected answer {r:?}"),
    }
}

#[test]
fn bug_a_typo_in_a_key_at_a_reload_replaced_the_good_config() {
    let root = TestRoot::new("strict-reload");
    let good = json!({
        "bus": {"peers": ["alice"], "maxDepth": 2, "secret": "strict-secret-0123456789abcdef"},
        "budgetUsd": 0
    });
    let w = root.start("worker", &good);
    // Each limit of the good config holds: peers, then maxDepth, then the budget.
    assert_eq!(outcome(&w, "mallory", 0), "peer_not_allowed");
    assert_eq!(outcome(&w, "alice", 2), "max_depth_exceeded");
    assert_eq!(outcome(&w, "alice", 0), "budget_exhausted");

    // (the good config with one typo, the log words, a talk, what it must still get)
    let mut peer = good.clone();
    peer["bus"]["peer"] = peer["bus"]["peers"].take();
    peer["bus"].as_object_mut().unwrap().remove("peers");
    let mut depth = good.clone();
    depth["bus"].as_object_mut().unwrap().remove("maxDepth");
    depth["bus"]["maxdepth"] = json!(2);
    let mut budget = good.clone();
    budget.as_object_mut().unwrap().remove("budgetUsd");
    budget["budgetUSD"] = json!(0);
    let cases = [
        (
            peer,
            "unknown key bus.peer; did you mean bus.peers?; keeping the last good config",
            ("mallory", 0),
            "peer_not_allowed",
        ),
        (
            depth,
            "unknown key bus.maxdepth; did you mean bus.maxDepth?; keeping the last good config",
            ("alice", 2),
            "max_depth_exceeded",
        ),
        (
            budget,
            "unknown key budgetUSD; did you mean budgetUsd?; keeping the last good config",
            ("alice", 0),
            "budget_exhausted",
        ),
    ];
    for (config, words, (from, depth), still) in cases {
        w.write_config(&config);
        assert!(
            w.wait_for_log(words, RELOAD_BOUND),
            "no warning for {config}\nstderr:\n{}",
            w.stderr()
        );
        // The warning is written when the edit is read: the good config is still in
        // force now.
        assert_eq!(outcome(&w, from, depth), still, "after {config}");
    }

    // A correct edit is still applied, so the checks above did see reloads happen.
    let mut wider = good.clone();
    wider["bus"]["peers"] = json!(["alice", "mallory"]);
    w.write_config(&wider);
    assert!(
        eventually(RELOAD_BOUND, || outcome(&w, "mallory", 0)
            == "budget_exhausted"),
        "a valid edit was not applied\nstderr:\n{}",
        w.stderr()
    );
}

/// `loopbus list --root` of `root`: the text table and the `--json` answer.
fn list(root: &TestRoot) -> (String, Value) {
    let root_arg = root.path.display().to_string();
    let text_args = ["list", "--root", &root_arg];
    let text = run(&text_args, &[], None);
    assert!(text.status.success(), "{}", describe(&text_args, &text));
    let json_args = ["list", "--root", &root_arg, "--json"];
    let json = run(&json_args, &[], None);
    assert!(json.status.success(), "{}", describe(&json_args, &json));
    (
        String::from_utf8(text.stdout).unwrap(),
        serde_json::from_slice(&json.stdout).unwrap(),
    )
}

/// The `list` row (text) and entry (`--json`) of `name`.
fn listed(root: &TestRoot, name: &str) -> (String, Value) {
    let (text, json) = list(root);
    let row = text
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not listed:\n{text}"))
        .to_owned();
    let entry = json["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {json}"))
        .clone();
    (row, entry)
}

const DISABLED_WARNING: &str = "the bus is disabled by";

#[test]
fn bug_a_disabled_bus_looked_healthy() {
    let root = TestRoot::new("strict-disabled");
    let configs = [
        ("empty", json!({})),
        ("notobject", json!({"bus": "yes"})),
        (
            "nopeers",
            json!({"bus": {"peers": [], "secret": "s-0123456789abcdef"}}),
        ),
    ];
    for (name, config) in configs {
        let w = root.start(name, &config);
        assert!(
            w.wait_for_log(DISABLED_WARNING, RELOAD_BOUND),
            "{config}: no warning at startup\nstderr:\n{}",
            w.stderr()
        );
        let health = w.health();
        assert_eq!(health["status"], "ok", "{config}: {health}");
        assert_eq!(health["busEnabled"], false, "{config}: {health}");
        let (row, entry) = listed(&root, name);
        assert!(row.contains("bus disabled"), "{config}: {row}");
        assert_eq!(entry["alive"], true, "{config}: {entry}");
        assert_eq!(entry["busEnabled"], false, "{config}: {entry}");
        assert_failure(
            &Req::talk(&w).send(w.port),
            name,
            403,
            "bus_disabled",
            &config.to_string(),
        );
    }
}

#[test]
fn bug_a_reload_that_disabled_the_bus_was_silent() {
    let root = TestRoot::new("strict-disable-reload");
    let w = root.start("worker", &open_config("strict-secret-0123456789abcdef"));
    let health = w.health();
    assert_eq!(health["busEnabled"], true, "{health}");
    let (row, entry) = listed(&root, "worker");
    assert!(!row.contains("bus disabled"), "{row}");
    assert_eq!(entry["busEnabled"], true, "{entry}");
    assert!(!w.stderr().contains(DISABLED_WARNING), "{}", w.stderr());

    w.write_config(&json!({"bus": {"peers": [], "secret": "strict-secret-0123456789abcdef"}}));
    assert!(
        w.wait_for_log(DISABLED_WARNING, RELOAD_BOUND),
        "no warning at the reload\nstderr:\n{}",
        w.stderr()
    );
    let health = w.health();
    assert_eq!(
        (&health["status"], &health["busEnabled"]),
        (&json!("ok"), &json!(false)),
        "{health}"
    );
    assert_eq!(listed(&root, "worker").1["busEnabled"], false);

    w.write_config(&open_config("strict-secret-0123456789abcdef"));
    assert!(
        eventually(RELOAD_BOUND, || w.health()["busEnabled"] == true),
        "re-enabling not shown"
    );
}

#[test]
fn bug_a_nul_in_from_instance_was_accepted() {
    let root = TestRoot::new("strict-from");
    let w = root.start("worker", &open_config("strict-secret-0123456789abcdef"));
    // Raw JSON text: `\u0000` is the escape a JSON client would send for a NUL byte.
    let bodies = [
        r#"{"fromInstance":"ali\u0000ce","prompt":"p","depth":0}"#,
        r#"{"fromInstance":"alice","prompt":"p","depth":1e-400}"#,
    ];
    for body in bodies {
        let r = Req::talk(&w).body(body).send(w.port);
        assert_failure(&r, "worker", 400, "invalid_request", body);
        assert_eq!(r.json()["retryable"], false, "{body}");
    }
    let long = json!({"fromInstance": "a".repeat(1025), "prompt": "p", "depth": 0});
    assert_failure(
        &Req::talk(&w).json(&long).send(w.port),
        "worker",
        400,
        "invalid_request",
        "1025-byte fromInstance",
    );
    // The same requests without the flaw are served.
    let fine = r#"{"fromInstance":"alice","prompt":"p","depth":1.0}"#;
    assert_success(&Req::talk(&w).body(fine).send(w.port), "worker", "p", fine);
}
