//! `loopbus doctor`, `loopbus usage` and `loopbus audit` (issue 13): what a new user
//! runs to find out why an instance does not answer, what it spent, and what it was
//! asked.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use crate::common;

use common::{describe, eventually, run, Instance, TestRoot};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A secret no check calls weak.
const GOOD_SECRET: &str = "6f1c0e0d9a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5";
/// How long a test waits for something to show.
const WAIT: Duration = Duration::from_secs(20);

/// PATH with the directory of the binary under test first, as after an install.
fn path_with_loopbus() -> String {
    let dir = Path::new(common::bin())
        .parent()
        .unwrap()
        .display()
        .to_string();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

fn doctor(state_dir: &Path) -> (Output, Vec<String>) {
    let dir = state_dir.display().to_string();
    let args = ["doctor", "--state-dir", &dir];
    let path = path_with_loopbus();
    let output = run(&args, &[("PATH", &path)], None);
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (output, lines)
}

/// The lines of `lines` that start with `level`, as one text for messages.
fn with_level<'a>(lines: &'a [String], level: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| l.starts_with(&format!("{level} ")))
        .collect()
}

#[test]
fn doctor_on_a_healthy_running_instance_is_all_ok() {
    let root = TestRoot::new("doctor-ok");
    let mut config = common::open_config(GOOD_SECRET);
    config["engine"] = json!({"command": ["sh", "-c", "cat"], "cwd": "/"});
    let instance = root.start("worker", &config);
    let (output, lines) = doctor(&instance.state_dir);
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(lines.len() >= 10, "{shown}");
    assert!(lines.iter().all(|l| l.starts_with("ok    ")), "{shown}");
    assert!(
        lines.iter().any(|l| l.contains(&format!(
            "worker answers on its registered port {}",
            instance.port
        ))),
        "{shown}"
    );
}

#[test]
fn doctor_on_a_stopped_instance_says_its_port_does_not_answer_and_how_to_start_it() {
    let root = TestRoot::new("doctor-stopped");
    let mut instance = root.start("worker", &common::open_config(GOOD_SECRET));
    let port = instance.port;
    // Killed without a chance to deregister: the entry stays, nothing answers.
    common::signal(instance.pid(), "KILL");
    instance.wait(WAIT);
    let (output, lines) = doctor(&instance.state_dir);
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let fails = with_level(&lines, "fail");
    assert!(
        fails.iter().any(
            |l| l.contains(&format!("registered port {port} does not answer"))
                && l.contains(&format!(
                    "loopbus serve --state-dir {}",
                    instance.state_dir.display()
                ))
        ),
        "{shown}"
    );
    // Stopped cleanly (deregistered), it is not registered at all.
    drop(instance);
    let registry = root.path.join(".bus-registry.json");
    std::fs::remove_file(&registry).unwrap();
    let (output, lines) = doctor(&root.state_dir("worker"));
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("worker is not registered") && l.contains("loopbus serve")),
        "{shown}"
    );
}

#[test]
fn doctor_names_a_typoed_config_key() {
    let root = TestRoot::new("doctor-typo");
    root.write_config(
        "worker",
        &json!({"bus": {"peer": "*", "secret": GOOD_SECRET}}),
    );
    let (output, lines) = doctor(&root.state_dir("worker"));
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("unknown key bus.peer; did you mean bus.peers?")),
        "{shown}"
    );
}

#[test]
fn doctor_names_a_missing_engine_binary_and_a_missing_cwd() {
    let root = TestRoot::new("doctor-engine");
    let mut config = common::open_config(GOOD_SECRET);
    config["engine"] = json!({"command": ["loopbus-no-such-engine"]});
    root.write_config("worker", &config);
    let (output, lines) = doctor(&root.state_dir("worker"));
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("engine command `loopbus-no-such-engine`")),
        "{shown}"
    );
    config["engine"] = json!({"command": ["sh"], "cwd": "/nonexistent/loopbus-cwd"});
    root.write_config("worker", &config);
    let (_, lines) = doctor(&root.state_dir("worker"));
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("engine.cwd /nonexistent/loopbus-cwd")),
        "{lines:?}"
    );
}

/// `serve` ran with any fixed secret, the README's own sample `"optional"` and `"a"`
/// included, so another local user could guess it; `doctor` failed those already. One
/// rule now refuses both: `serve` exits 2 naming the field and the rule.
#[test]
fn bug_serve_accepted_the_readmes_sample_secret_and_a_one_character_one() {
    let root = TestRoot::new("serve-weak-secret");
    for (secret, rule) in [
        ("optional", "is a sample value from the documentation"),
        ("a", "has only 1 characters (at least 16 wanted)"),
    ] {
        root.write_config("worker", &common::open_config(secret));
        let dir = root.state_dir("worker").display().to_string();
        let args = ["serve", "--port", "0", "--state-dir", &dir];
        let output = run(&args, &[], None);
        let shown = describe(&args, &output);
        assert_eq!(output.status.code(), Some(2), "{shown}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("bus.secret") && stderr.contains(rule),
            "{shown}"
        );
        assert!(!stderr.contains(&format!("\"{secret}\"")), "{shown}");
        assert!(
            root.registry()["instances"].get("worker").is_none(),
            "{shown}"
        );
        let (output, lines) = doctor(&root.state_dir("worker"));
        let shown = describe(&["doctor"], &output);
        assert_eq!(output.status.code(), Some(1), "{shown}");
        assert!(
            with_level(&lines, "fail")
                .iter()
                .any(|l| l.contains("bus.secret") && l.contains(rule)),
            "{shown}"
        );
    }
}

#[test]
fn doctor_fails_on_the_readme_sample_secret() {
    let root = TestRoot::new("doctor-secret");
    root.write_config("worker", &common::open_config("optional"));
    let (output, lines) = doctor(&root.state_dir("worker"));
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("bus.secret") && l.contains("sample")),
        "{shown}"
    );
    // Never echoed.
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("optional"),
        "{shown}"
    );
}

#[test]
fn doctor_warns_of_stale_entries_and_fails_on_a_shared_port() {
    let root = TestRoot::new("doctor-registry");
    let instance = root.start("worker", &common::open_config(GOOD_SECRET));
    // A second entry on the same port, of a process that is gone.
    let mut registry = root.registry();
    registry["instances"]["ghost"] = json!({
        "port": instance.port, "pid": 999_999_999u32, "secret": "x-0123456789abcdef",
        "updatedAt": "2026-01-01T00:00:00.000Z"
    });
    common::write_file_atomic(
        &root.path.join(".bus-registry.json"),
        registry.to_string().as_bytes(),
    );
    let (output, lines) = doctor(&instance.state_dir);
    let shown = describe(&["doctor"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(
        with_level(&lines, "warn")
            .iter()
            .any(|l| l.contains("registry entry ghost") && l.contains("stale")),
        "{shown}"
    );
    assert!(
        with_level(&lines, "fail")
            .iter()
            .any(|l| l.contains("ghost")
                && l.contains("worker")
                && l.contains(&format!("port {}", instance.port))),
        "{shown}"
    );
}

/// An engine that reports a cost of $0.10 a turn.
fn dime_engine() -> Value {
    json!({
        "command": ["sh", "-c",
            "cat >/dev/null; printf '{\"result\":\"ok\",\"total_cost_usd\":0.1,\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}'"],
        "output": "json"
    })
}

#[test]
fn usage_shows_and_stores_twelve_dimes_as_1_20_not_1_2000000000000002() {
    let root = TestRoot::new("usage-dimes");
    let mut config = common::open_config(GOOD_SECRET);
    config["engine"] = dime_engine();
    config["budgetUsd"] = json!(5);
    let instance = root.start("worker", &config);
    for i in 0..12 {
        let r = instance.talk("caller", &format!("turn {i}"), 0);
        assert_eq!(r.status, 200, "{:?}\n{}", r.json(), instance.describe());
    }
    let stored = std::fs::read_to_string(instance.state_dir.join("usage.json")).unwrap();
    assert!(stored.contains("\"totalCostUsd\": 1.2,"), "{stored}");

    let dir = instance.state_dir.display().to_string();
    let args = ["usage", "--state-dir", &dir];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    let text = String::from_utf8_lossy(&output.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("worker"))
        .expect(&shown);
    for cell in ["12", "36", "24", "$1.2000", "$5.00", "$3.8000"] {
        assert!(row.split_whitespace().any(|c| c == cell), "{cell}: {shown}");
    }
    assert!(!text.contains("00000000"), "{shown}");

    // Every instance under the root, as JSON.
    let root_dir = root.path.display().to_string();
    let args = ["usage", "--root", &root_dir, "--json"];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    let v: Value = serde_json::from_slice(&output.stdout).expect(&shown);
    let worker = &v["instances"][0];
    assert_eq!(worker["name"], "worker", "{shown}");
    assert_eq!(worker["costUsd"], json!(1.2), "{shown}");
    assert_eq!(worker["leftUsd"], json!(3.8), "{shown}");
    assert_eq!(worker["requests"], 12, "{shown}");
}

/// Writes an audit log by hand: an old line, a corrupt one, a recent one.
fn write_log(state_dir: &Path) {
    std::fs::create_dir_all(state_dir).unwrap();
    let line = |at: &str, outcome: &str, code: Value| {
        json!({"timestamp": at, "type": "talk", "instanceName": "w", "outcome": outcome,
            "detail": format!("{outcome} detail"), "metadata": {"fromInstance": "caller",
            "depth": 1, "durationMs": 7, "errorCode": code, "promptChars": 3, "status": 200}})
        .to_string()
    };
    let now = loopbus::now_iso8601();
    let text = format!(
        "{}\n{{torn\n{}\n",
        line("2020-01-01T00:00:00.000Z", "refused", json!("auth_failed")),
        line(&now, "success", Value::Null)
    );
    std::fs::write(state_dir.join("audit.log.jsonl"), text).unwrap();
}

#[test]
fn audit_shows_a_table_json_lines_and_since_and_a_corrupt_line_as_such() {
    let root = TestRoot::new("audit-table");
    let state_dir = root.state_dir("w");
    write_log(&state_dir);
    let dir = state_dir.display().to_string();

    let args = ["audit", "--state-dir", &dir];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{shown}");
    assert!(
        lines[0].starts_with("TIME") && lines[0].contains("ERROR CODE"),
        "{shown}"
    );
    assert!(
        lines[1].contains("refused")
            && lines[1].contains("caller")
            && lines[1].contains("7ms")
            && lines[1].contains("auth_failed"),
        "{shown}"
    );
    assert!(
        lines[2].contains("corrupt") && lines[2].contains("line 2"),
        "{shown}"
    );
    assert!(lines[3].contains("success"), "{shown}");

    let args = ["audit", "--state-dir", &dir, "--since", "1h"];
    let output = run(&args, &[], None);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("refused"), "{}", describe(&args, &output));
    assert!(text.contains("success"), "{}", describe(&args, &output));

    let args = ["audit", "--state-dir", &dir, "--json"];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    let parsed: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect(&shown))
        .collect();
    assert_eq!(parsed.len(), 2, "{shown}");
    assert_eq!(parsed[0]["metadata"]["errorCode"], "auth_failed", "{shown}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("line 2"),
        "{shown}"
    );

    let args = ["audit", "--state-dir", &dir, "--since", "soon"];
    assert_eq!(run(&args, &[], None).status.code(), Some(2));
}

#[test]
fn audit_to_a_closed_stdout_exits_quietly() {
    let root = TestRoot::new("audit-closed");
    let state_dir = root.state_dir("w");
    write_log(&state_dir);
    // Enough lines that the pipe's buffer fills after its reader has gone.
    let one = std::fs::read_to_string(state_dir.join("audit.log.jsonl")).unwrap();
    std::fs::write(state_dir.join("audit.log.jsonl"), one.repeat(2_000)).unwrap();
    let mut child = Command::new(common::bin())
        .args(["audit", "--state-dir"])
        .arg(&state_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    drop(stdout); // as `| head -1` does
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(first.starts_with("TIME"), "{first}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn audit_follow_prints_a_new_talk_as_it_happens() {
    let root = TestRoot::new("audit-follow");
    let instance = root.start("worker", &common::open_config(GOOD_SECRET));
    let r = instance.talk("before", "hi", 0);
    assert_eq!(r.status, 200);
    let mut follow = Command::new(common::bin())
        .args(["audit", "--follow", "--state-dir"])
        .arg(&instance.state_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines_in, lines) = mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_in.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |needle: &str, seen: &mut Vec<String>| {
        eventually(WAIT, || {
            while let Ok(line) = lines.try_recv() {
                seen.push(line);
            }
            seen.iter().any(|l| l.contains(needle))
        })
    };
    // The backlog first, then the new talk, from a caller named to be found.
    assert!(wait_for("before", &mut seen), "{seen:?}");
    let r = instance.talk("follow-me", "hi", 0);
    assert_eq!(r.status, 200);
    assert!(
        wait_for("follow-me", &mut seen),
        "{seen:?}\n{}",
        instance.describe()
    );
    let _ = follow.kill();
    let _ = follow.wait();
    drop::<Instance>(instance);
}

/// `audit` and `usage` of a mistyped state directory printed "no audit log yet" and
/// an empty row, and exited 0.
#[test]
fn audit_and_usage_of_a_directory_that_is_no_state_directory_are_errors() {
    let root = TestRoot::new("not-a-state-dir");
    let missing = root.path.join("typo");
    let missing = missing.to_str().unwrap();
    for command in ["audit", "usage"] {
        let out = run(&[command, "--state-dir", missing], &[], None);
        assert_eq!(out.status.code(), Some(2), "{command}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no such state directory"),
            "{command}: {stderr}"
        );
    }
}
