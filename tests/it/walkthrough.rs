//! The README's getting-started walk-through, pasted as a script into a fresh shell
//! with an empty `HOME` (issue 19): it must work with no flags beyond those it shows,
//! and print what the README says it prints.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The first `sh` block of the README's "## Getting started" section.
fn walkthrough() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Getting started"))
        .expect("a Getting started section in README.md");
    let block = section
        .split("```sh\n")
        .nth(1)
        .expect("a sh block in Getting started");
    block.split("\n```").next().unwrap().to_owned()
}

#[test]
fn the_readme_walkthrough_works_pasted_into_a_fresh_shell() {
    let home = TestRoot::new("walkthrough");
    let script = walkthrough();
    // `loopbus` on PATH, as `make install` puts it; nothing else of ours in the env.
    let bin_dir = PathBuf::from(bin()).parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .env("HOME", &home.path)
        .env("PATH", path)
        .current_dir(&home.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = format!("script:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{shown}");
    // What the README says each step prints.
    assert!(
        stdout.contains("planner passes on: hello\n"),
        "the delegation\n{shown}"
    );
    assert!(
        stderr.contains("loopbus: cancel request to slow: cancelled\nloopbus: talk to slow: interrupted by SIGINT; the turn was cancelled [cancelled]"),
        "the cancel\n{shown}"
    );
    for name in ["worker", "slow", "planner"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(name) && l.contains(" yes ")),
            "{name} listed alive\n{shown}"
        );
    }
    let audit = stdout
        .lines()
        .find(|l| l.contains("success") && l.contains("planner"))
        .unwrap_or_else(|| panic!("the audit line\n{shown}"));
    assert!(audit.split_whitespace().nth(3) == Some("2"), "{audit}");
    // `kill` stopped all three, and each deregistered.
    let registry = home.path.join(".loopbus/.bus-registry.json");
    let deregistered = eventually(std::time::Duration::from_secs(20), || {
        std::fs::read(&registry)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|r| r["instances"].as_object().is_some_and(|m| m.is_empty()))
    });
    assert!(deregistered, "{shown}");
}
