//! config.json (contract section 2): edits take effect without a restart, a bad edit
//! keeps the last good config and is logged, and a bad config or address at startup is
//! a clear one-line error with a non-zero exit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// How long an edit may take to show. The contract says within a second; this is a
/// liveness bound with room for a loaded machine.
const RELOAD_BOUND: Duration = Duration::from_secs(3);

fn talk_from(w: &Instance, from: &str, depth: u64) -> HttpResponse {
    Req::talk(w)
        .json(&json!({"fromInstance": from, "prompt": "p", "depth": depth}))
        .send(w.port)
}

/// Polls until a talk from `from` at `depth` answers `status`.
fn becomes(w: &Instance, from: &str, depth: u64, status: u16) -> bool {
    eventually(RELOAD_BOUND, || talk_from(w, from, depth).status == status)
}

fn bus(fields: Value) -> Value {
    let mut bus = json!({"peers": "*", "maxDepth": 3, "secret": "reload-secret-0123456789abcdef"});
    for (k, v) in fields.as_object().unwrap() {
        bus[k] = v.clone();
    }
    json!({ "bus": bus })
}

/// Runs `check` on every case at once, each on its own thread with its own instance.
/// The server looks at config.json every 500 ms, so each edit waits for the next look;
/// edits in a row on one instance would add those waits up.
fn each_at_once<T: Send>(cases: Vec<T>, check: impl Fn(T) + Sync) {
    std::thread::scope(|scope| {
        for case in cases {
            let check = &check;
            scope.spawn(move || check(case));
        }
    });
}

#[test]
fn peers_edit_takes_effect_without_restart() {
    // (peers before, peers after, a caller, its status before and after the edit)
    let cases = vec![
        (json!("*"), json!(["alice"]), "mallory", 200, 403),
        (
            json!(["alice"]),
            json!(["alice", "mallory"]),
            "mallory",
            403,
            200,
        ),
        (json!(["alice"]), json!(true), "anyone", 403, 200),
    ];
    each_at_once(
        cases,
        |(before, after, from, status_before, status_after)| {
            let context = format!("peers {before} -> {after}");
            let root = TestRoot::new("reload-peers");
            let mut w = root.start("worker", &bus(json!({ "peers": before })));
            let pid = w.pid();
            let assert_answer = |status: u16, context: &str| {
                let r = talk_from(&w, from, 0);
                if status == 403 {
                    assert_failure(&r, "worker", 403, "peer_not_allowed", context);
                } else {
                    assert_success(&r, "worker", "p", context);
                }
            };
            assert_answer(status_before, &format!("{context}: before"));
            w.write_config(&bus(json!({ "peers": after })));
            assert!(becomes(&w, from, 0, status_after), "{context}: not applied");
            assert_answer(status_after, &context);
            // alice is allowed before and after every one of these edits.
            assert_success(&talk_from(&w, "alice", 0), "worker", "p", &context);
            assert_eq!(w.health()["pid"], u64::from(pid), "{context}: no restart");
            w.assert_alive(&context);
        },
    );
}

#[test]
fn max_depth_edit_takes_effect_without_restart() {
    // (bus before, bus after, the depth refused after, the depth below it)
    let cases = vec![
        (bus(json!({"maxDepth": 3})), bus(json!({"maxDepth": 2})), 2),
        (bus(json!({"maxDepth": 3})), bus(json!({"maxDepth": 6})), 6),
        // Removing the field restores the default of 3.
        (
            bus(json!({"maxDepth": 6})),
            json!({"bus": {"peers": "*", "secret": "reload-secret-0123456789abcdef"}}),
            3,
        ),
    ];
    each_at_once(cases, |(before, after, refused)| {
        let context = format!("{before} -> {after}");
        let root = TestRoot::new("reload-depth");
        let w = root.start("worker", &before);
        let max_before = before["bus"]["maxDepth"].as_u64().unwrap();
        assert_eq!(
            talk_from(&w, "alice", max_before - 1).status,
            200,
            "{context}"
        );
        assert_eq!(talk_from(&w, "alice", max_before).status, 429, "{context}");

        w.write_config(&after);
        if refused < max_before {
            assert!(becomes(&w, "alice", refused, 429), "{context}: not applied");
        } else {
            assert!(
                becomes(&w, "alice", refused - 1, 200),
                "{context}: not applied"
            );
        }
        assert_failure(
            &talk_from(&w, "alice", refused),
            "worker",
            429,
            "max_depth_exceeded",
            &context,
        );
        assert_eq!(talk_from(&w, "alice", refused - 1).status, 200, "{context}");
    });
}

#[test]
fn disabling_and_enabling_the_bus_without_restart() {
    let disabled = vec![
        json!({"bus": false}),
        json!({"bus": null}),
        json!({}),
        json!({"bus": "yes"}),
        bus(json!({"peers": []})),
        bus(json!({"peers": false})),
    ];
    each_at_once(disabled, |config| {
        let root = TestRoot::new("reload-bus");
        let w = root.start("worker", &bus(json!({})));
        assert_eq!(talk_from(&w, "alice", 0).status, 200, "before {config}");
        w.write_config(&config);
        assert!(becomes(&w, "alice", 0, 403), "not disabled by {config}");
        assert_failure(
            &talk_from(&w, "alice", 0),
            "worker",
            403,
            "bus_disabled",
            &config.to_string(),
        );
        assert_eq!(w.health()["status"], "ok", "health while disabled");
        // Enabled again; `"bus": true` has no secret: the one in force stays.
        w.write_config(&json!({"bus": true}));
        assert!(
            becomes(&w, "alice", 0, 200),
            "not re-enabled after {config}"
        );
    });
}

#[test]
fn secret_and_port_are_fixed_for_the_process_lifetime() {
    let root = TestRoot::new("reload-secret");
    let w = root.start("worker", &bus(json!({})));
    assert_eq!(w.secret, "reload-secret-0123456789abcdef");
    // Change the secret and the port, plus maxDepth so we can see the reload happen.
    w.write_config(&bus(
        json!({"secret": "new-secret-0123456789abcdef", "port": 1, "maxDepth": 1}),
    ));
    assert!(becomes(&w, "alice", 1, 429), "edit not applied");
    assert_eq!(
        talk_from(&w, "alice", 0).status,
        200,
        "old secret still works"
    );
    let r = Req::talk(&w)
        .set("Authorization", "Bearer new-secret-0123456789abcdef")
        .send(w.port);
    assert_failure(
        &r,
        "worker",
        401,
        "auth_failed",
        "new secret before restart",
    );
    assert_eq!(
        root.registry()["instances"]["worker"]["secret"],
        "reload-secret-0123456789abcdef"
    );
}

/// One bad edit of config.json: what is written (`None`: the file is deleted), and what
/// the log line about it names.
type BadEdit = (&'static str, Option<Vec<u8>>, &'static str);

#[test]
fn invalid_edits_keep_the_last_good_config_and_are_logged() {
    let bad = |config: Value| Some(config.to_string().into_bytes());
    let edits: Vec<BadEdit> = vec![
        (
            "maxDepth a string",
            bad(bus(json!({"peers": "*", "maxDepth": "three"}))),
            "bus.maxDepth",
        ),
        (
            "maxDepth zero",
            bad(bus(json!({"peers": "*", "maxDepth": 0}))),
            "bus.maxDepth",
        ),
        (
            "peers a bare name",
            bad(bus(json!({"peers": "mallory"}))),
            "bus.peers",
        ),
        (
            "peers with a number",
            bad(bus(json!({"peers": ["alice", 5]}))),
            "bus.peers[1]",
        ),
        (
            "budget negative",
            bad(json!({"bus": {"peers": "*"}, "budgetUsd": -1})),
            "budgetUsd",
        ),
        (
            "truncated JSON",
            Some(br#"{"bus": {"peers": "*""#.to_vec()),
            "config.json",
        ),
        ("not an object", Some(b"[]".to_vec()), "config.json"),
        // A deleted config.json is logged and changes nothing either.
        ("deleted", None, "config.json"),
    ];
    // Two bad edits in a row on each instance, then a good one.
    let mut runs: Vec<Vec<BadEdit>> = Vec::new();
    let mut edits = edits.into_iter();
    while let Some(first) = edits.next() {
        runs.push([Some(first), edits.next()].into_iter().flatten().collect());
    }
    each_at_once(runs, |run| {
        let root = TestRoot::new("reload-invalid");
        let mut w = root.start("worker", &bus(json!({"peers": ["alice"], "maxDepth": 2})));
        let config_path = w.state_dir.join("config.json");
        for (context, bytes, field) in run {
            let before = w.stderr().len();
            match bytes {
                Some(bytes) => write_file_atomic(&config_path, &bytes),
                None => std::fs::remove_file(&config_path).unwrap(),
            }
            let logged = eventually(RELOAD_BOUND, || {
                let stderr = w.stderr();
                stderr[before..]
                    .lines()
                    .any(|l| l.contains("config.json") && l.contains(field))
            });
            assert!(
                logged,
                "{context}: no log line naming config.json and {field}\n{}",
                w.describe()
            );
            // The last good config is still in force: peers [alice], maxDepth 2.
            let r = talk_from(&w, "mallory", 0);
            assert_failure(&r, "worker", 403, "peer_not_allowed", context);
            assert_eq!(talk_from(&w, "alice", 1).status, 200, "{context}");
            assert_eq!(talk_from(&w, "alice", 2).status, 429, "{context}");
        }
        // A valid edit after all that applies.
        w.write_config(&bus(json!({"peers": "*", "maxDepth": 4})));
        assert!(becomes(&w, "mallory", 3, 200), "valid edit not applied");
        w.assert_alive("after invalid edits");
    });
}

/// Runs `serve` expecting a startup failure: non-zero exit, one line on stderr
/// containing each of `needles`, and no registry entry.
fn assert_startup_error(root: &TestRoot, args: &[&str], needles: &[&str]) {
    let output = run(args, &[("RUST_LOG", "info")], None);
    let context = describe(args, &output);
    assert!(!output.status.success(), "{context}");
    assert_eq!(output.status.code(), Some(2), "{context}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {context}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} missing: {context}");
    }
    assert!(
        root.registry()["instances"].get("bad").is_none(),
        "registered anyway: {context}"
    );
}

#[test]
fn startup_with_a_missing_or_invalid_config_is_a_clear_error() {
    let root = TestRoot::new("startup");
    let dir = root.state_dir("bad");
    let dir_s = dir.to_str().unwrap().to_owned();
    let config = dir.join("config.json");
    let config_s = config.to_str().unwrap().to_owned();
    let args = ["serve", "--state-dir", dir_s.as_str()];

    std::fs::create_dir_all(&dir).unwrap();
    assert_startup_error(&root, &args, &[&config_s]);

    #[rustfmt::skip]
    let cases: Vec<(&str, &str)> = vec![
        (r#"{"bus": {"peers": "*", "maxDepth": 0}}"#, "bus.maxDepth"),
        (r#"{"bus": {"peers": "*", "maxDepth": 1.5}}"#, "bus.maxDepth"),
        (r#"{"bus": {"peers": "*", "port": 70000}}"#, "bus.port"),
        (r#"{"bus": {"peers": "alice"}}"#, "bus.peers"),
        (r#"{"bus": {"peers": ["alice", ""]}}"#, "bus.peers[1]"),
        (r#"{"bus": {"peers": "*", "secret": 42}}"#, "bus.secret"),
        (r#"{"bus": {"peers": "*", "maxConcurrentTurns": 0}}"#, "bus.maxConcurrentTurns"),
        (r#"{"bus": {"peers": "*"}, "budgetUsd": "1"}"#, "budgetUsd"),
        (r#"{"bus": {"peers": "*"}, "engine": {"command": []}}"#, "engine.command"),
        (r#"{"bus": {"peers": "*""#, "JSON"),
        ("", "JSON"),
        ("[1, 2]", "object"),
    ];
    for (content, field) in cases {
        write_file_atomic(&config, content.as_bytes());
        assert_startup_error(&root, &args, &[&config_s, field]);
    }
    // The secret never shows up in a config error.
    write_file_atomic(
        &config,
        br#"{"bus": {"peers": "*", "secret": "TOPSECRET-VALUE-0123456789abcdef", "maxDepth": -1}}"#,
    );
    let output = run(&args, &[], None);
    assert!(!String::from_utf8_lossy(&output.stderr).contains("TOPSECRET-VALUE"));
}

#[test]
fn non_loopback_bind_is_refused() {
    let root = TestRoot::new("bind");
    root.write_config("bad", &open_config("s-0123456789abcdef"));
    let dir = root.state_dir("bad");
    let dir = dir.to_str().unwrap();
    for addr in ["0.0.0.0", "::", "192.0.2.1", "10.0.0.1", "127.0.0.2"] {
        assert_startup_error(
            &root,
            &["serve", "--state-dir", dir, "--bind", addr],
            &["loopback"],
        );
    }
    assert_startup_error(
        &root,
        &["serve", "--state-dir", dir, "--bind", "not-an-ip"],
        &["--bind"],
    );
}

#[test]
fn port_already_in_use_is_a_clear_error() {
    let root = TestRoot::new("inuse");
    let first = root.start("first", &open_config("s-0123456789abcdef"));
    let port = first.port.to_string();
    root.write_config("bad", &open_config("s-0123456789abcdef"));
    let dir = root.state_dir("bad");
    assert_startup_error(
        &root,
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--port",
            &port,
        ],
        &[&port, "in use"],
    );
    // The same through bus.port in config.json.
    root.write_config(
        "bad",
        &json!({"bus": {"peers": "*", "port": first.port, "secret": "s-0123456789abcdef"}}),
    );
    assert_startup_error(
        &root,
        &["serve", "--state-dir", dir.to_str().unwrap()],
        &[&port, "in use"],
    );
    // The first instance is untouched.
    assert_eq!(first.health()["instance"], "first");
}

/// A reload that changed `bus.maxConcurrentTurns` or `bus.maxQueuedTurns` logged
/// "changed" and changed nothing (the pool is sized at start): it says they take effect
/// at the next start, as port and secret do, and the "reloaded" line does not claim them.
#[test]
fn bug_a_reload_said_the_pool_sizes_changed_and_changed_nothing() {
    let root = TestRoot::new("reload-pool");
    let w = root.start("worker", &bus(json!({})));
    let max_before = w.health()["turns"]["max"].clone();
    w.write_config(&bus(
        json!({"maxConcurrentTurns": 2, "maxQueuedTurns": 3, "maxDepth": 2}),
    ));
    assert!(
        w.wait_for_log("reloaded: ", RELOAD_BOUND),
        "{}",
        w.describe()
    );
    let log = w.stderr();
    assert!(
        log.contains(
            "bus.maxConcurrentTurns and bus.maxQueuedTurns edited; that takes effect at the \
             next start"
        ),
        "{log}"
    );
    let reloaded = log.lines().find(|l| l.contains("reloaded: ")).unwrap();
    assert!(reloaded.contains("changed bus.maxDepth"), "{reloaded}");
    assert!(!reloaded.contains("Turns"), "{reloaded}");
    assert_eq!(
        w.health()["turns"]["max"],
        max_before,
        "the pool is unchanged"
    );
}
