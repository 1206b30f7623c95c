//! The engine presets (issue 21): `init --engine NAME[=PATH]` writes them, `serve`
//! names a preset CLI missing from the engine's PATH, and real turns through `serve`
//! and `talk` read each CLI's output with the preset's parser, a CLI that is not
//! logged in included, as `doctor --probe` does. The CLIs are stand-ins
//! (`tests/engines/fake_agent_cli.sh`) printing each one's documented output shape.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
use crate::common;
use common::{describe, eventually, run, Instance, TestRoot};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A bin directory holding the stand-in CLI under each preset's name, and the file
/// that sets its mode (`ok`, `logged_out`).
struct FakeClis {
    bin: PathBuf,
    mode_file: PathBuf,
}

impl FakeClis {
    fn new(root: &TestRoot) -> FakeClis {
        let bin = root.path.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engines/fake_agent_cli.sh");
        for name in ["claude", "codex", "gemini"] {
            std::os::unix::fs::symlink(&script, bin.join(name)).unwrap();
        }
        let fakes = FakeClis {
            mode_file: root.path.join("cli-mode"),
            bin,
        };
        fakes.set("ok");
        fakes
    }

    fn set(&self, mode: &str) {
        std::fs::write(&self.mode_file, mode).unwrap();
    }

    /// The engine section of `preset`, its CLI found on engine.env.PATH.
    fn engine(&self, preset: &str) -> Value {
        json!({
            "preset": preset,
            "env": {
                "PATH": format!("{}:/usr/bin:/bin", self.bin.display()),
                "FAKE_CLI_MODE_FILE": self.mode_file.display().to_string(),
            }
        })
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn init_writes_a_preset_and_the_path_of_its_cli() {
    let root = TestRoot::new("preset-init");
    let fakes = FakeClis::new(&root);
    let dir = root.path.join("coder");
    let d = dir.to_str().unwrap();
    let codex = fakes.bin.join("codex");
    let engine_arg = format!("codex={}", codex.display());
    let args = ["init", d, "--engine", &engine_arg];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("warning"));
    assert_eq!(
        read_json(&dir.join("config.json"))["engine"],
        json!({"preset": "codex",
               "command": [codex.to_str().unwrap(), "exec", "--json", "--skip-git-repo-check", "-"]})
    );
    // Issue 21: a path to claude with its arguments silently lost the JSON parser.
    let claude = format!(
        "{} -p --output-format json",
        fakes.bin.join("claude").display()
    );
    let args = ["init", d, "--force", "--engine", &claude];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let engine = &read_json(&dir.join("config.json"))["engine"];
    assert_eq!(engine["preset"], "claude", "{engine}");
    assert_eq!(engine["command"][1], "-p", "{engine}");
    assert!(engine.get("output").is_none(), "{engine}");
}

#[test]
fn a_preset_cli_missing_from_the_engine_path_is_reported_by_init_start_up_and_reload() {
    let root = TestRoot::new("preset-missing");
    let dir = root.path.join("gem");
    let args = [
        "init",
        dir.to_str().unwrap(),
        "--engine",
        "gemini",
        "--json",
    ];
    // The binary runs by its full path; a PATH without gemini.
    let out = run(&args, &[("PATH", "/nonexistent")], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["engineFound"], false, "{done}");
    let args = [
        "init",
        dir.to_str().unwrap(),
        "--force",
        "--engine",
        "gemini",
    ];
    let out = run(&args, &[("PATH", "/nonexistent")], None);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("warning: engine command `gemini` is not an executable file")
            && said.contains("engine.preset \"gemini\"")
            && said.contains("--engine gemini=PATH"),
        "{}",
        describe(&args, &out)
    );
    // The file is written all the same, and `serve` says so at start-up.
    let mut config = read_json(&dir.join("config.json"));
    config["engine"]["env"] = json!({"PATH": "/nonexistent"});
    let instance = root.start("gem", &config);
    let said = |needle: &str| eventually(WAIT, || instance.stderr().contains(needle));
    assert!(
        said("engine command `gemini` is not an executable file on the engine's PATH (engine.preset \"gemini\""),
        "{}",
        instance.describe()
    );
    // And at a reload that changes the engine.
    config["engine"]["preset"] = json!("codex");
    root.write_config("gem", &config);
    assert!(
        said("engine command `codex` is not an executable file on the engine's PATH (engine.preset \"codex\""),
        "{}",
        instance.describe()
    );
}

/// Each preset's CLI, as serve runs it for a real turn and as `doctor --probe` does:
/// the reply, the usage in `talk --json`, the session id in the audit line; then the
/// same CLI not logged in: `auth`, not retryable, exit 1, and a failed probe.
#[test]
fn each_preset_runs_real_turns_and_a_logged_out_cli_is_auth() {
    let root = TestRoot::new("preset-turns");
    let fakes = FakeClis::new(&root);
    // (preset, reply, usage, session id)
    let rows = [
        (
            "claude",
            "claude says: hello there",
            json!({"costUsd": 0.02, "inputTokens": 11, "outputTokens": 5, "cachedTokens": 3}),
            "c-0001",
        ),
        (
            "codex",
            "codex says: hello there",
            json!({"costUsd": null, "inputTokens": 21, "outputTokens": 6, "cachedTokens": 7}),
            "x-0002",
        ),
        (
            "gemini",
            "gemini says: hello there",
            json!({"costUsd": null, "inputTokens": 31, "outputTokens": 8, "cachedTokens": 2}),
            "g-0003",
        ),
    ];
    let instances: Vec<Instance> = rows
        .iter()
        .map(|(preset, ..)| {
            root.start(
                preset,
                &json!({"bus": {"peers": "*"}, "engine": fakes.engine(preset)}),
            )
        })
        .collect();
    let r = root.path.to_str().unwrap();
    for ((preset, reply, usage, session), instance) in rows.iter().zip(&instances) {
        fakes.set("ok");
        let args = ["talk", "--root", r, preset, "hello there", "--json"];
        let out = run(&args, &[], None);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
        let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(envelope["text"], *reply, "{envelope}");
        assert_eq!(envelope["usage"], *usage, "{envelope}");
        let audit = instance.state_dir.join("audit.log.jsonl");
        let logged = eventually(WAIT, || {
            std::fs::read_to_string(&audit).is_ok_and(|log| {
                log.lines().any(|l| {
                    let line: Value = serde_json::from_str(l).unwrap();
                    line["outcome"] == "success" && line["metadata"]["sessionId"] == *session
                })
            })
        });
        assert!(logged, "{preset}: {:?}", std::fs::read_to_string(&audit));
        let d = instance.state_dir.to_str().unwrap();
        let probe = |code: i32, words: &str| {
            let args = ["doctor", "--state-dir", d, "--probe"];
            let out = run(&args, &[], None);
            let said = String::from_utf8_lossy(&out.stdout);
            let line = said.lines().find(|l| l.contains("engine probe"));
            assert!(
                out.status.code() == Some(code) && line.is_some_and(|l| l.contains(words)),
                "{}",
                describe(&args, &out)
            );
        };
        probe(
            0,
            &format!(
                "ok    engine probe: the engine replied: {preset} says: Reply with the word OK."
            ),
        );

        fakes.set("logged_out");
        let args = ["talk", "--root", r, preset, "hello again", "--json"];
        let out = run(&args, &[], None);
        assert_eq!(out.status.code(), Some(1), "{}", describe(&args, &out));
        let envelope: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(envelope["errorCode"], "auth", "{envelope}");
        assert_eq!(envelope["retryable"], false, "{envelope}");
        probe(1, "fail  engine probe failed: auth (not retryable)");
    }
}
