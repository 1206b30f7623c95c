//! The delegation tree (contract 8.4), end to end: real instances whose engines
//! delegate onwards with `loopbus talk`, then `loopbus trace` reading the tree back
//! from their audit logs: who delegated to whom, outcomes, subtree costs, never a
//! prompt; an engine that passes on only `TRACEPARENT` joins the same trace; bad
//! audit lines are skipped and counted; a malformed trace variable is ignored.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// A trace id the tests hand `loopbus talk` through the environment.
const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// A string in every prompt, which no trace output may show.
const MARKER: &str = "PROMPT-MARKER-5e1f0c";

/// An instance whose engine relays its prompt to `to` (space-separated) and costs
/// `cost`; `only_traceparent` makes it pass on `TRACEPARENT` alone.
fn relay(to: &str, cost: &str, only_traceparent: bool) -> Value {
    let script = format!(
        "{}/tests/engines/trace_relay.sh",
        env!("CARGO_MANIFEST_DIR")
    );
    let only = if only_traceparent { "1" } else { "0" };
    json!({
        "bus": {"peers": "*", "maxDepth": 5},
        "engine": {"command": ["/bin/sh", script], "output": "json",
            "env": {"RELAY_TO": to, "COST": cost, "ONLY_TRACEPARENT": only, "LOOPBUS_BIN": bin()}},
    })
}

/// A leaf whose JSON engine costs $0.40 a turn.
fn leaf() -> Value {
    let script = format!("{}/tests/engines/json_cost.sh", env!("CARGO_MANIFEST_DIR"));
    json!({"bus": {"peers": "*", "maxDepth": 5},
        "engine": {"command": ["/bin/sh", script], "output": "json"}})
}

fn root_arg(root: &TestRoot) -> String {
    root.path.display().to_string()
}

/// `loopbus trace ARGS --root ROOT`: its output, checked to say nothing of a prompt.
fn trace(root: &TestRoot, args: &[&str]) -> std::process::Output {
    let root = root_arg(root);
    let mut all = vec!["trace"];
    all.extend(args);
    all.extend(["--root", root.as_str()]);
    let out = run(&all, &[], None);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !printed.contains(MARKER),
        "a prompt in trace output: {printed}"
    );
    out
}

/// `loopbus trace ID --json` once it shows `turns` turns: an instance's audit writer
/// writes a line a moment after the answer went out.
fn trace_of(root: &TestRoot, id: &str, turns: usize) -> Value {
    let mut tree = Value::Null;
    let shown = eventually(std::time::Duration::from_secs(10), || {
        let out = trace(root, &[id, "--json"]);
        tree = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        tree["turns"].as_array().map(Vec::len) == Some(turns)
    });
    assert!(shown, "trace {id} never showed {turns} turns: {tree}");
    tree
}

/// (level, from -> instance, outcome, error code, own cost, subtree cost) per turn.
fn shape(trace: &Value) -> Vec<(u64, String, String, Value, Value, Value)> {
    trace["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["level"].as_u64().unwrap(),
                format!(
                    "{} -> {}",
                    t["fromInstance"].as_str().unwrap(),
                    t["instance"].as_str().unwrap()
                ),
                t["outcome"].as_str().unwrap().to_owned(),
                t["errorCode"].clone(),
                t["own"]["costUsd"].clone(),
                t["subtree"]["costUsd"].clone(),
            )
        })
        .collect()
}

/// Rounds the costs of a shape to cents, so sums of floats compare.
fn cents(v: &Value) -> Value {
    v.as_f64()
        .map_or(Value::Null, |c| json!((c * 100.0).round() as i64))
}

#[test]
fn a_nested_delegation_and_a_fan_show_as_one_tree_with_subtree_costs() {
    let root = TestRoot::new("trace-tree");
    let failing = json!({"bus": {"peers": "*", "maxDepth": 5},
        "engine": {"command": ["sh", "-c", "cat > /dev/null; echo boom >&2; exit 1"]}});
    let _c = root.start("c", &leaf());
    let _d = root.start("d", &failing);
    let _b = root.start("b", &relay("c", "0.02", false));
    let a = root.start("a", &relay("b d", "0.01", false));

    let prompt = format!("plan the release {MARKER}");
    let root_path = root_arg(&root);
    let args = ["talk", "a", &prompt, "--root", &root_path, "--json", "-v"];
    let out = run(&args, &[("LOOPBUS_TRACE_ID", T)], None);
    assert!(out.status.success(), "{}", describe(&args, &out));
    let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(envelope["traceId"], T, "{envelope}");
    assert_eq!(envelope["success"], true, "{envelope}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("trace {T}")), "{stderr}");

    let tree = trace_of(&root, T, 4);
    let got: Vec<_> = shape(&tree)
        .into_iter()
        .map(|(level, hop, outcome, code, own, sub)| {
            (level, hop, outcome, code, cents(&own), cents(&sub))
        })
        .collect();
    let row = |level, hop: &str, outcome: &str, code: Value, own: Value, sub: Value| {
        (level, hop.to_owned(), outcome.to_owned(), code, own, sub)
    };
    assert_eq!(
        got,
        vec![
            row(
                0,
                "operator -> a",
                "success",
                Value::Null,
                json!(1),
                json!(43)
            ),
            row(1, "a -> b", "success", Value::Null, json!(2), json!(42)),
            row(2, "b -> c", "success", Value::Null, json!(40), json!(40)),
            row(
                1,
                "a -> d",
                "failure",
                json!("engine_cli"),
                Value::Null,
                Value::Null
            ),
        ],
        "{tree}"
    );
    let turns = tree["turns"].as_array().unwrap();
    // Each delegation has its own request id; each child names its parent's.
    assert_eq!(turns[1]["parentRequestId"], turns[0]["requestId"]);
    assert_eq!(turns[2]["parentRequestId"], turns[1]["requestId"]);
    assert_eq!(turns[3]["parentRequestId"], turns[0]["requestId"]);
    assert_ne!(turns[1]["requestId"], turns[3]["requestId"]);
    assert_eq!(tree["total"]["turns"], 4);
    assert_eq!(tree["total"]["inputTokens"], 10 + 10 + 100);
    assert_eq!(tree["skippedLines"], 0);

    // The text view: indented by level, caller -> instance, outcome and code.
    let out = trace(&root, &[T]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("trace {T}: 4 turns, $0.4300")),
        "{text}"
    );
    assert!(lines[1].starts_with("operator -> a  success  "), "{text}");
    assert!(
        lines[1].ends_with("[subtree: 4 turns, $0.4300, 120 in / 24 out tokens]"),
        "{text}"
    );
    assert!(lines[2].starts_with("  a -> b  success  "), "{text}");
    assert!(lines[3].starts_with("    b -> c  success  "), "{text}");
    assert!(
        lines[3].contains("$0.4000, 100 in / 20 out tokens"),
        "{text}"
    );
    assert!(
        lines[4].starts_with("  a -> d  failure engine_cli  "),
        "{text}"
    );
    assert!(lines[4].contains("cost unknown"), "{text}");
    assert_eq!(lines.len(), 5, "{text}");

    // --last: the newest trace the operator started is this one.
    let out = trace(&root, &["--last", "--json"]);
    let last: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(last["traceId"], T);
    // b started none; a malformed id is a usage error; an unknown one exit 1.
    assert_eq!(
        trace(&root, &["--last", "--as", "b"]).status.code(),
        Some(1)
    );
    assert_eq!(trace(&root, &["4BF92F"]).status.code(), Some(2));
    let unknown = trace(&root, &[&"1".repeat(32)]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no turn of trace"));
    drop(a);
}

#[test]
fn an_engine_that_reads_only_traceparent_joins_the_same_tree() {
    let root = TestRoot::new("trace-parent");
    let _c = root.start("c", &leaf());
    let _p = root.start("p", &relay("c", "0.05", true));
    let root_path = root_arg(&root);
    let prompt = format!("only traceparent {MARKER}");
    let args = ["talk", "p", &prompt, "--root", &root_path];
    let traceparent = format!("00-{T}-00f067aa0ba902b7-01");
    let out = run(&args, &[("TRACEPARENT", &traceparent)], None);
    assert!(out.status.success(), "{}", describe(&args, &out));

    let tree = trace_of(&root, T, 2);
    let hops: Vec<_> = shape(&tree).into_iter().map(|s| (s.0, s.1, s.2)).collect();
    // c's turn has the trace but no parent request id: it hangs under p's turn, which
    // was running when it started.
    assert_eq!(
        hops,
        [
            (0, "operator -> p".to_owned(), "success".to_owned()),
            (1, "p -> c".to_owned(), "success".to_owned()),
        ],
        "{tree}"
    );
    assert_eq!(cents(&tree["total"]["costUsd"]), json!(45));
}

/// Writes `lines` as the audit log of instance `name` under `root`.
fn write_log(root: &Path, name: &str, file: &str, lines: &[String]) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), lines.concat()).unwrap();
}

fn audit_line(instance: &str, from: &str, id: &str, parent: Option<&str>) -> String {
    let mut metadata = json!({"fromInstance": from, "durationMs": 5, "requestId": id,
        "traceId": T, "costUsd": 0.1, "inputTokens": 1, "outputTokens": 1, "cachedTokens": 0});
    if let Some(parent) = parent {
        metadata["parentRequestId"] = json!(parent);
    }
    let line = json!({"timestamp": "2026-01-01T00:00:00.100Z", "type": "talk",
        "instanceName": instance, "outcome": "success", "detail": "ok", "metadata": metadata});
    format!("{line}\n")
}

#[test]
fn torn_foreign_and_oversized_audit_lines_are_skipped_and_counted() {
    let root = TestRoot::new("trace-junk");
    let ra = "a".repeat(32);
    let good_a = audit_line("a", "operator", &ra, None);
    let good_b = audit_line("b", "a", &"b".repeat(32), Some(&ra));
    let torn = good_b[..good_b.len() / 2].to_owned() + "\n";
    let foreign = format!("{}\n", json!({"event": "other program", "traceId": T}));
    let oversized = format!("{}\n", "x".repeat(loopbus::MAX_AUDIT_LINE_BYTES + 1));
    let escape = audit_line("b", "a\u{1b}]0;owned\u{7}", &"c".repeat(32), Some(&ra));
    write_log(
        &root.path,
        "a",
        "audit.log.jsonl",
        &[good_a, torn, "not json\n".into()],
    );
    write_log(&root.path, "b", "audit.log.jsonl.1", &[foreign, oversized]);
    write_log(&root.path, "b", "audit.log.jsonl", &[good_b, escape]);

    let out = trace(&root, &[T]);
    assert!(out.status.success(), "{}", describe(&[T], &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped 4 line(s)"), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(text.contains(r"a\u001b]0;owned\u0007 -> b"), "{text}");
    assert_eq!(text.lines().count(), 4, "{text}");
    let out = trace(&root, &[T, "--json"]);
    let tree: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tree["skippedLines"], 4);
    assert_eq!(tree["turns"].as_array().unwrap().len(), 3);
}

#[test]
fn a_malformed_trace_variable_is_ignored_with_a_warning() {
    let root = TestRoot::new("trace-env");
    let _w = root.start("w", &open_config("s-trace-env-0123456789abcdef"));
    let root_path = root_arg(&root);
    let args = ["talk", "w", "hello", "--root", &root_path, "--json"];
    let bad = "\u{1b}[31mnot-a-trace";
    let out = run(
        &args,
        &[("LOOPBUS_TRACE_ID", bad), ("LOOPBUS_REQUEST_ID", "x")],
        None,
    );
    assert!(out.status.success(), "{}", describe(&args, &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ignoring LOOPBUS_TRACE_ID"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains("not-a-trace"),
        "{stderr}"
    );
    let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fresh = envelope["traceId"].as_str().unwrap();
    assert!(loopbus::TraceId::new(fresh).is_ok(), "{envelope}");
    // The instance audited the fresh trace, and `trace` finds it.
    let tree = trace_of(&root, fresh, 1);
    assert_eq!(tree["turns"][0]["instance"], "w");
    assert_eq!(tree["turns"][0]["parentRequestId"], Value::Null);
}

#[test]
fn the_engine_gets_its_turns_trace_and_a_request_without_one_gets_a_new_trace() {
    let root = TestRoot::new("trace-engine-env");
    let show = r#"cat > /dev/null; printf '%s|%s|%s' "$LOOPBUS_TRACE_ID" "$LOOPBUS_REQUEST_ID" "$TRACEPARENT""#;
    let w = root.start(
        "w",
        &json!({"bus": {"peers": "*", "secret": "s-trace-env-0123456789abcdef"},
            "engine": {"command": ["sh", "-c", show]}}),
    );
    let hex = |s: &str, len| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let env_of = |reply: &Value| -> Vec<String> {
        reply["text"]
            .as_str()
            .unwrap()
            .split('|')
            .map(str::to_owned)
            .collect()
    };
    // With the caller's trace: the engine gets it, this turn's request id, and a
    // TRACEPARENT of the same trace with a fresh span id.
    let id = "r".repeat(20);
    let reply = w
        .talk_body(
            &json!({"fromInstance": "alice", "prompt": MARKER, "depth": 1,
            "ext": {"requestId": id, "traceId": T, "parentRequestId": "p".repeat(16)}}),
        )
        .json();
    let env = env_of(&reply);
    assert_eq!(
        (env[0].as_str(), env[1].as_str()),
        (T, id.as_str()),
        "{reply}"
    );
    let parts: Vec<&str> = env[2].split('-').collect();
    assert_eq!((parts[0], parts[1], parts[3]), ("00", T, "01"), "{reply}");
    assert!(hex(parts[2], 16) && parts[2] != "0".repeat(16), "{reply}");
    // A legacy request (no ext): the server starts a trace and makes a request id.
    let reply = w.talk("alice", MARKER, 1).json();
    let env = env_of(&reply);
    assert!(
        hex(&env[0], 32) && hex(&env[1], 32) && env[0] != T,
        "{reply}"
    );
    assert!(env[2].starts_with(&format!("00-{}-", env[0])), "{reply}");
    // Both turns are audited with those ids, the first under its parent.
    let fresh = trace_of(&root, &env[0], 1);
    assert_eq!(fresh["turns"][0]["requestId"], env[1].as_str());
    let given = trace_of(&root, T, 1);
    assert_eq!(given["turns"][0]["requestId"], id.as_str());
    assert_eq!(given["turns"][0]["parentRequestId"], "p".repeat(16));
    assert_eq!(given["turns"][0]["depth"], 1);
}

/// The issue's tree: `a` fans out to `b` and `d` (`loopbus fan`), and `b`'s engine
/// delegates on to `c`: two roots from `a`, the subtree under `b`, one trace.
#[test]
fn a_fan_from_a_and_a_nested_delegation_under_it_are_one_tree() {
    let root = TestRoot::new("trace-fan");
    let failing = json!({"bus": {"peers": "*", "maxDepth": 5},
        "engine": {"command": ["sh", "-c", "cat > /dev/null; echo boom >&2; exit 1"]}});
    let _c = root.start("c", &leaf());
    let _d = root.start("d", &failing);
    let _b = root.start("b", &relay("c", "0.02", false));
    let root_path = root_arg(&root);
    let prompt = format!("fan out {MARKER}");
    let args = [
        "fan", &prompt, "--to", "b,d", "--as", "a", "--root", &root_path, "--json",
    ];
    let out = run(&args, &[("LOOPBUS_TRACE_ID", T)], None);
    // d's engine_cli failure is retryable: every failure retryable is 75.
    assert_eq!(out.status.code(), Some(75), "{}", describe(&args, &out));
    let fan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fan["traceId"], T, "{fan}");

    let tree = trace_of(&root, T, 3);
    let got: Vec<_> = shape(&tree)
        .into_iter()
        .map(|(level, hop, outcome, code, _, sub)| (level, hop, outcome, code, cents(&sub)))
        .collect();
    // The fan's two roots start at the same moment, in either order: compare each
    // root with its subtree, sorted by root.
    let mut groups: Vec<Vec<_>> = Vec::new();
    for node in got {
        match groups.last_mut() {
            Some(group) if node.0 > 0 => group.push(node),
            _ => groups.push(vec![node]),
        }
    }
    groups.sort_by(|a, b| a[0].1.cmp(&b[0].1));
    assert_eq!(
        groups.concat(),
        vec![
            (
                0,
                "a -> b".to_owned(),
                "success".to_owned(),
                Value::Null,
                json!(42)
            ),
            (
                1,
                "b -> c".to_owned(),
                "success".to_owned(),
                Value::Null,
                json!(40)
            ),
            (
                0,
                "a -> d".to_owned(),
                "failure".to_owned(),
                json!("engine_cli"),
                Value::Null
            ),
        ],
        "{tree}"
    );
    assert_eq!(cents(&tree["total"]["costUsd"]), json!(42));
    // The fan's two delegations: distinct request ids, neither with a parent.
    let roots: Vec<_> = tree["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["level"] == 0)
        .collect();
    assert_eq!(roots.len(), 2, "{tree}");
    assert_ne!(roots[0]["requestId"], roots[1]["requestId"]);
    assert!(
        roots.iter().all(|t| t["parentRequestId"].is_null()),
        "{tree}"
    );
    let last: Value =
        serde_json::from_slice(&trace(&root, &["--last", "--as", "a", "--json"]).stdout).unwrap();
    assert_eq!(last["traceId"], T);
}

/// Regression: `trace --last` right after a `talk` showed the trace before it (and
/// `trace ID` found no turn): the instance's audit writer writes a line a moment
/// after the answer went out, and `trace` read the logs at once.
#[test]
fn bug_trace_last_right_after_a_talk_showed_the_previous_trace() {
    let root = TestRoot::new("trace-last-at-once");
    let _w = root.start("w", &open_config("s-trace-last-0123456789abcdef"));
    let root_path = root_arg(&root);
    // Each round failed about half the time before the fix.
    for round in 0..4 {
        let args = ["talk", "w", "hello", "--root", &root_path, "--json"];
        let out = run(&args, &[], None);
        assert!(out.status.success(), "{}", describe(&args, &out));
        let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
        let out = trace(&root, &["--last", "--json"]);
        let tree: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(
            tree["traceId"], envelope["traceId"],
            "round {round}: {tree}"
        );
    }
}
