//! docs/troubleshooting.md quotes what the binary really prints: each
//! mistake is made here for real, and the message it gets must appear in that section
//! (with the temp root written as `/home/me/.loopbus` and ports as 7701). When a
//! message changes, this fails and names the line to quote instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{open_config, run, Instance, Req, TestRoot};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// docs/troubleshooting.md, normalized.
fn section() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/troubleshooting.md");
    normalize(&std::fs::read_to_string(page).unwrap(), None)
}

/// `text` with the variable parts of a message made fixed: `root` (a temp channel
/// root) as `/home/me/.loopbus`, every loopback port as 7701, and log timestamps
/// dropped.
fn normalize(text: &str, root: Option<&Path>) -> String {
    let mut text = text.to_owned();
    if let Some(root) = root {
        text = text.replace(root.to_str().unwrap(), "/home/me/.loopbus");
    }
    let mut out = String::new();
    for line in text.lines() {
        // "2026-12-01T10:36:47.241Z WARN  ..." -> "WARN  ..."
        let line = match line.split_once("Z ") {
            Some((stamp, rest)) if stamp.len() == 23 && stamp.starts_with("20") => rest,
            _ => line,
        };
        let mut rest = line;
        while let Some(at) = rest.find("127.0.0.1:") {
            let after = &rest[at + "127.0.0.1:".len()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            out.push_str(&rest[..at]);
            out.push_str(if digits > 0 {
                "127.0.0.1:7701"
            } else {
                "127.0.0.1:"
            });
            rest = &after[digits..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// Checks that docs/troubleshooting.md quotes `what` (normalized against `root`).
fn assert_quoted(section: &str, root: Option<&Path>, what: &str, situation: &str) {
    let quoted = normalize(what, root);
    let quoted = quoted.trim_end();
    assert!(
        section.contains(quoted),
        "docs/troubleshooting.md ({situation}) should quote what the binary prints:\n{quoted}"
    );
}

/// The first line of a command's stderr.
fn first_stderr_line(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

/// The line of an instance's log that contains `needle`, waited for.
fn log_line(instance: &Instance, needle: &str) -> String {
    assert!(
        instance.wait_for_log(needle, Duration::from_secs(10)),
        "no log line with {needle:?}\n{}",
        instance.describe()
    );
    instance
        .stderr()
        .lines()
        .find(|l| l.contains(needle))
        .unwrap()
        .to_owned()
}

fn talk(root: &TestRoot, caller: &str, target: &str) -> std::process::Output {
    let state_dir = root.state_dir(caller);
    run(
        &[
            "talk",
            "--state-dir",
            state_dir.to_str().unwrap(),
            target,
            "hi",
        ],
        &[],
        None,
    )
}

#[test]
fn troubleshooting_quotes_what_talk_prints() {
    let section = section();
    let root = TestRoot::new("trouble-talk");
    root.write_config("reviewer", &json!({"bus": true}));

    let output = talk(&root, "reviewer", "worker");
    assert_eq!(output.status.code(), Some(75));
    assert_quoted(
        &section,
        Some(&root.path),
        &first_stderr_line(&output),
        "talk before serve",
    );

    let mut worker = root.start("worker", &json!({"bus": {"peers": ["alice"]}}));
    let output = talk(&root, "reviewer", "worker");
    assert_quoted(
        &section,
        None,
        &first_stderr_line(&output),
        "caller not in peers",
    );

    root.write_config("picky", &json!({"bus": {"peers": ["alice"]}}));
    let output = talk(&root, "picky", "worker");
    let line = first_stderr_line(&output);
    assert_quoted(&section, None, &line, "target not in the caller's peers");

    common::signal(worker.pid(), "KILL");
    worker.wait(Duration::from_secs(10));
    let output = talk(&root, "reviewer", "worker");
    assert_eq!(output.status.code(), Some(75));
    assert_quoted(&section, None, &first_stderr_line(&output), "a stale entry");

    // From a plain shell, under the default root (~/.loopbus), nothing registered.
    let home = TestRoot::new("trouble-home");
    let home_dir = home.path.to_str().unwrap();
    let output = run(&["talk", "worker", "hi"], &[("HOME", home_dir)], None);
    assert_quoted(
        &section,
        Some(&home.path.join(".loopbus")),
        &first_stderr_line(&output),
        "talk before serve, from a shell",
    );
}

#[test]
fn troubleshooting_quotes_what_a_misconfigured_instance_says() {
    let section = section();
    let root = TestRoot::new("trouble-config");
    root.write_config("reviewer", &json!({"bus": true}));

    let disabled = root.start("worker", &json!({"bus": false}));
    let warning = log_line(&disabled, "the bus is disabled by");
    assert_quoted(&section, Some(&root.path), &warning, "bus disabled, serve");
    let output = talk(&root, "reviewer", "worker");
    assert_quoted(
        &section,
        None,
        &first_stderr_line(&output),
        "bus disabled, talk",
    );
    let own = talk(&root, "worker", "reviewer");
    let line = first_stderr_line(&own);
    let message = line.split(": ").nth(2).unwrap().split(" [").next().unwrap();
    assert_quoted(&section, None, message, "the caller's own bus disabled");
    drop(disabled);

    let empty = root.path.join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    // An engine found on no PATH: serve's own PATH (which the engine inherits) is empty.
    root.write_config(
        "worker",
        &json!({"bus": true, "engine": {"command": ["claude"]}}),
    );
    let no_engine =
        Instance::spawn_with_env(&root, "worker", &[], &[("PATH", empty.to_str().unwrap())]);
    let warning = log_line(&no_engine, "is not an executable file");
    assert_quoted(
        &section,
        Some(&root.path),
        &warning,
        "engine missing, serve",
    );
    let output = talk(&root, "reviewer", "worker");
    assert_quoted(
        &section,
        None,
        &first_stderr_line(&output),
        "engine missing, talk",
    );
    drop(no_engine);

    let costly = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engines/cost_060.sh");
    let engine = json!({"command": [costly.to_str().unwrap()], "output": "json"});
    let _budget = root.start(
        "worker",
        &json!({"bus": true, "budgetUsd": 0.5, "engine": engine}),
    );
    assert!(talk(&root, "reviewer", "worker").status.success());
    let output = talk(&root, "reviewer", "worker");
    assert_quoted(&section, None, &first_stderr_line(&output), "budget spent");
}

#[test]
fn troubleshooting_quotes_what_serve_refuses() {
    let section = section();
    let root = TestRoot::new("trouble-serve");
    let serve = |name: &str, extra: &[&str]| {
        let state_dir = root.state_dir(name);
        let mut args = vec!["serve", "--state-dir", state_dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let output = run(&args, &[], None);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{}",
            common::describe(&args, &output)
        );
        first_stderr_line(&output)
    };

    root.write_config("worker", &json!({"bus": {"peer": "*"}}));
    assert_quoted(&section, Some(&root.path), &serve("worker", &[]), "a typo");
    root.write_config("worker", &json!({"bus": true, "budgetUSD": 1}));
    assert!(section.contains("did you mean budgetUsd?"));
    assert!(serve("worker", &[]).contains("did you mean budgetUsd?"));
    std::fs::write(
        root.state_dir("worker").join("config.json"),
        "{\"bus\": true,\n}",
    )
    .unwrap();
    let line = serve("worker", &[]);
    let message = line.split("config.json: ").nth(1).unwrap();
    assert_quoted(&section, None, message, "config not JSON");

    root.write_config("worker", &json!({"bus": true}));
    assert_quoted(
        &section,
        None,
        &serve("worker", &["--bind", "0.0.0.0"]),
        "non-loopback bind",
    );

    let worker = root.start("worker", &open_config("s3cret-for-troubleshooting"));
    root.write_config("other", &json!({"bus": true}));
    let port = worker.port.to_string();
    // The holder's pid and the registry's path vary: the quote is checked up to them.
    let in_use = serve("other", &["--port", &port]);
    assert!(in_use.contains(" (pid "), "{in_use}");
    assert_quoted(
        &section,
        None,
        in_use.split(" (pid ").next().unwrap(),
        "port in use",
    );
    let line = serve("worker", &[]);
    let message = line
        .split(" for ")
        .next()
        .unwrap()
        .trim_start_matches("loopbus: ");
    assert_quoted(&section, None, message, "a second serve");

    let form = Req::talk(&worker).set("Content-Type", "application/x-www-form-urlencoded");
    let answer = form.send(worker.port);
    assert_eq!(answer.status, 415);
    assert!(section.contains("HTTP/1.1 415 Unsupported Media Type"));
    let body = String::from_utf8_lossy(&answer.body);
    let quoted = body.split(",\"durationMs\"").next().unwrap();
    assert_quoted(
        &section,
        None,
        quoted,
        "curl -d without a JSON content type",
    );

    let wrong = Req::talk(&worker).set("Authorization", "Bearer not-the-secret");
    let answer = wrong.send(worker.port);
    assert_eq!(answer.status, 401);
    assert!(section.contains("HTTP/1.1 401 Unauthorized"));
    let body = String::from_utf8_lossy(&answer.body);
    let quoted = body.split(",\"durationMs\"").next().unwrap();
    assert_quoted(&section, None, quoted, "a wrong secret");

    // The usual /tmp: root's, mode 1777. Elsewhere the message differs; skip it there.
    let tmp = std::fs::metadata("/tmp").unwrap();
    if std::os::unix::fs::MetadataExt::mode(&tmp) & 0o7777 == 0o1777
        && std::os::unix::fs::MetadataExt::uid(&tmp) == 0
    {
        let state_dir = format!("/tmp/loopbus-trouble-{}", std::process::id());
        let args = ["serve", "--state-dir", state_dir.as_str()];
        let output = run(&args, &[], None);
        assert_eq!(output.status.code(), Some(2));
        assert_quoted(
            &section,
            None,
            &first_stderr_line(&output),
            "a state directory in /tmp",
        );
    }
}
