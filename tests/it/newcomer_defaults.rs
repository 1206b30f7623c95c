//! The second newcomer (issue 19): a default channel root (`$LOOPBUS_ROOT`, else
//! `~/.loopbus`), talking from a plain shell as the operator, and the stumbles, each
//! pinned by a test. Every command runs with `HOME` and `LOOPBUS_ROOT` pointed at temp
//! directories, never at the real `~/.loopbus`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for something that should happen at once.
const WAIT: Duration = Duration::from_secs(20);

/// A temp `HOME`, with `~/.loopbus` as the channel root the commands default to.
struct Home {
    dir: TestRoot,
}

impl Home {
    fn new(label: &str) -> Home {
        Home {
            dir: TestRoot::new(label),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path.join(".loopbus")
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![("HOME".to_owned(), self.dir.path.display().to_string())]
    }

    /// `loopbus ARGS` with this home and no other loopbus variable.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run(args, &env, stdin)
    }

    /// `loopbus serve NAME` in the background, once registered under `~/.loopbus`.
    fn serve(&self, name: &str) -> Served {
        let log = self.dir.path.join(format!("{name}.stderr"));
        let child = Command::new(bin())
            .args(["serve", name])
            .env("HOME", &self.dir.path)
            .env_remove("LOOPBUS_ROOT")
            .env_remove("LOOPBUS_STATE_DIR")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let served = Served { child, log };
        let registry = loopbus::registry_path(&self.root());
        let registered = eventually(WAIT, || {
            std::fs::read(&registry)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|r| {
                    r["instances"][name]["pid"].as_u64() == Some(u64::from(served.child.id()))
                })
        });
        assert!(
            registered,
            "serve {name} did not register\n{}",
            served.log()
        );
        served
    }
}

/// A `loopbus serve` started by [`Home::serve`]; killed on drop.
struct Served {
    child: Child,
    log: PathBuf,
}

impl Served {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(POLL_INTERVAL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(args: &[&str], out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", describe(args, out));
    text(&out.stdout)
}

fn mode(path: &Path) -> u32 {
    file_mode(path) & 0o777
}

#[test]
fn the_default_root_needs_no_flags_from_init_to_audit() {
    let home = Home::new("default-root");
    let args = ["init", "worker"];
    let said = ok(&args, &home.run(&args, None));
    let dir = home.root().join("worker");
    assert!(dir.join("config.json").is_file(), "{said}");
    assert_eq!(mode(&home.root()), 0o700);
    assert_eq!(mode(&dir), 0o700);
    assert!(
        said.contains("start it with: loopbus serve worker"),
        "{said}"
    );

    let _worker = home.serve("worker");
    let health = ok(
        &["health", "worker"],
        &home.run(&["health", "worker"], None),
    );
    assert_eq!(
        serde_json::from_str::<Value>(&health).unwrap()["instance"],
        "worker"
    );
    let args = ["talk", "worker", "hello from a shell"];
    assert_eq!(ok(&args, &home.run(&args, None)), "hello from a shell\n");
    let listed = ok(&["list"], &home.run(&["list"], None));
    assert!(listed.contains("worker"), "{listed}");
    // The audit line is written just after the reply.
    let args = ["audit", "worker", "--json"];
    let mut audit = String::new();
    let written = eventually(WAIT, || {
        audit = text(&home.run(&args, None).stdout);
        !audit.is_empty()
    });
    assert!(written, "no audit line");
    let line: Value = serde_json::from_str(audit.lines().last().unwrap()).unwrap();
    // From a plain shell: the operator, depth 0 sent as 1.
    assert_eq!(line["metadata"]["fromInstance"], "operator", "{audit}");
    assert_eq!(line["metadata"]["depth"], 1, "{audit}");
}

#[test]
fn loopbus_root_and_the_flags_win_over_the_default() {
    let home = Home::new("root-wins");
    let elsewhere = TestRoot::new("root-wins-elsewhere");
    let root_var = elsewhere.path.join("bus");
    let mut env = home.env();
    env.push(("LOOPBUS_ROOT".to_owned(), root_var.display().to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = run(&["init", "worker"], &env, None);
    ok(&["init", "worker"], &out);
    assert!(root_var.join("worker/config.json").is_file());
    assert!(!home.root().exists(), "~/.loopbus was created too");

    // --root beats $LOOPBUS_ROOT; --state-dir names its own root.
    let flagged = elsewhere.path.join("flagged");
    let flag = flagged.to_str().unwrap();
    let out = run(&["list", "--root", flag], &env, None);
    let said = text(&out.stderr);
    assert!(said.contains(flag), "{said}");
    let out = run(&["list"], &env, None);
    assert!(text(&out.stderr).contains(root_var.to_str().unwrap()));
    let state_dir = elsewhere.path.join("third/worker");
    let mut with_dir = env.clone();
    let state = state_dir.display().to_string();
    with_dir.push(("LOOPBUS_STATE_DIR", &state));
    std::fs::create_dir_all(&state_dir).unwrap();
    let out = run(&["list"], &with_dir, None);
    let said = text(&out.stderr);
    assert!(said.contains("third/.bus-registry.json"), "{said}");
}

#[test]
fn bug_no_registry_message_did_not_name_the_root_it_looked_at() {
    let home = Home::new("no-registry");
    let registry = loopbus::registry_path(&home.root());
    let out = home.run(&["talk", "worker", "hi"], None);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&["talk"], &out));
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!("not registered in {}", registry.display())),
        "{said}"
    );
    let out = home.run(&["list"], None);
    assert!(text(&out.stderr).contains(registry.to_str().unwrap()));
}

#[test]
fn bug_a_mistyped_target_got_no_did_you_mean() {
    let home = Home::new("did-you-mean");
    ok(&["init", "worker"], &home.run(&["init", "worker"], None));
    let _worker = home.serve("worker");
    let out = home.run(&["talk", "wroker", "hi"], None);
    assert_eq!(out.status.code(), Some(75));
    let said = text(&out.stderr);
    assert!(said.contains("did you mean `worker`?"), "{said}");
    let out = home.run(&["talk", "reviewer", "hi"], None);
    assert!(!text(&out.stderr).contains("did you mean"));
}

#[test]
fn operator_talk_is_still_decided_by_the_targets_peers() {
    let home = Home::new("operator-peers");
    let args = ["init", "worker", "--peers", "reviewer"];
    ok(&args, &home.run(&args, None));
    let _worker = home.serve("worker");
    let out = home.run(&["talk", "worker", "hi"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&["talk"], &out));
    assert!(text(&out.stderr).contains("peer_not_allowed"));
    let args = ["talk", "worker", "hi", "--as", "reviewer"];
    assert_eq!(ok(&args, &home.run(&args, None)), "hi\n");
    // --as is the shell's; an instance talks under its own name.
    let dir = home.root().join("worker");
    let args = [
        "talk",
        "worker",
        "hi",
        "--as",
        "x",
        "--state-dir",
        dir.to_str().unwrap(),
    ];
    assert_eq!(home.run(&args, None).status.code(), Some(2));
}

#[test]
fn bug_request_too_large_named_the_bytes_read_not_the_size() {
    let home = Home::new("too-large");
    let prompt = "x".repeat(1_000_000);
    let out = home.run(&["talk", "worker"], Some(&prompt));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&["talk"], &out));
    let said = text(&out.stderr);
    assert!(said.contains("request_too_large"), "{said}");
    let size: u64 = said
        .split("request body is ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {said}"));
    // The prompt and the request's few fields around it.
    assert!((1_000_000..1_001_000).contains(&size), "{said}");
}

#[test]
fn bug_init_said_start_it_with_right_before_make_run_started_it() {
    let makefile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Makefile")).unwrap();
    let recipe: Vec<&str> = makefile
        .split("\nrun:")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .collect();
    let init = recipe.iter().find(|l| l.contains(" init ")).unwrap();
    assert!(init.contains("--no-serve-hint"), "{init}");
    assert!(recipe.iter().any(|l| l.contains(" serve ")), "{recipe:?}");
    let home = Home::new("serve-hint");
    let args = ["init", "demo", "--no-serve-hint"];
    let said = ok(&args, &home.run(&args, None));
    assert!(!said.contains("start it with"), "{said}");
}

#[test]
fn bug_init_did_not_say_its_engine_command_is_not_on_path() {
    let home = Home::new("engine-missing");
    let args = ["init", "worker", "--engine", "no-such-engine-xyz --fast"];
    let said = ok(&args, &home.run(&args, None));
    assert!(said.contains("warning: "), "{said}");
    assert!(said.contains("no-such-engine-xyz"), "{said}");
    let args = ["init", "echoer", "--engine", "echo"];
    assert!(!ok(&args, &home.run(&args, None)).contains("warning"));
}

#[test]
fn init_and_doctor_speak_json() {
    let home = Home::new("json");
    let args = ["init", "worker", "--json"];
    let done: Value = serde_json::from_str(&ok(&args, &home.run(&args, None))).unwrap();
    assert_eq!(done["name"], "worker");
    assert_eq!(done["engineFound"], true);
    assert_eq!(done["running"], Value::Null);
    assert!(done["config"]
        .as_str()
        .unwrap()
        .ends_with("worker/config.json"));
    let out = home.run(&["doctor", "worker", "--json"], None);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", describe(&["doctor"], &out)));
    // Not running: the registration check fails, and says so in JSON.
    assert_eq!(report["ok"], false);
    assert_eq!(out.status.code(), Some(1));
    let checks = report["checks"].as_array().unwrap();
    assert!(checks
        .iter()
        .all(|c| ["ok", "warn", "fail"].contains(&c["level"].as_str().unwrap())));
    assert!(checks.iter().any(|c| c["level"] == "fail"), "{report}");
}

#[test]
fn bug_the_curl_line_sent_depth_0_against_the_rule_for_scripts() {
    let root = TestRoot::new("curl-depth");
    root.write_config("demo", &json!({"bus": {"peers": "*"}}));
    let demo = Instance::spawn(&root, "demo", &["--print-curl"]);
    let printed = eventually(WAIT, || {
        std::fs::read_to_string(demo.stdout_path.as_ref().unwrap())
            .is_ok_and(|s| s.contains("curl"))
    });
    assert!(printed, "{}", demo.describe());
    let curl = std::fs::read_to_string(demo.stdout_path.as_ref().unwrap()).unwrap();
    // A script's request carries its own depth + 1; from a shell that is 1, as talk sends.
    assert!(curl.contains(r#""depth":1"#), "{curl}");
}

#[test]
fn bug_usage_did_not_say_it_leaves_out_echo_turns() {
    let home = Home::new("usage-echo");
    ok(&["init", "worker"], &home.run(&["init", "worker"], None));
    let _worker = home.serve("worker");
    let args = ["talk", "worker", "hi"];
    ok(&args, &home.run(&args, None));
    let out = home.run(&["usage"], None);
    let table = ok(&["usage"], &out);
    assert!(
        table.lines().nth(1).unwrap().starts_with("worker"),
        "{table}"
    );
    let said = text(&out.stderr);
    assert!(said.contains("echo engine's turns (free)"), "{said}");
    assert!(said.contains("not counted"), "{said}");
}

#[test]
fn bug_serve_did_not_log_why_a_turn_failed() {
    let home = Home::new("failed-turn-log");
    // Fails with a message on stderr; the prompt must not reach the log.
    let script = home.dir.path.join("fails.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nprintf 'boom \\033[31m red\\n' >&2\nexit 3\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let args = ["init", "worker", "--engine", script.to_str().unwrap()];
    ok(&args, &home.run(&args, None));
    let worker = home.serve("worker");
    let out = home.run(&["talk", "worker", "the secret prompt"], None);
    assert_ne!(out.status.code(), Some(0));
    let logged = eventually(WAIT, || worker.log().contains("turn failed"));
    let log = worker.log();
    assert!(logged, "{log}");
    let line = log.lines().find(|l| l.contains("turn failed")).unwrap();
    assert!(line.contains("INFO"), "{line}");
    assert!(
        line.contains("engine_cli") || line.contains("engine"),
        "{line}"
    );
    assert!(line.contains("from operator"), "{line}");
    assert!(!line.contains('\u{1b}'), "{line}");
    assert!(!log.contains("the secret prompt"), "{log}");
    assert!(line.contains("boom"), "{line}");
}

#[test]
fn bug_the_cancel_confirmation_and_the_final_line_came_in_either_order() {
    let home = Home::new("cancel-order");
    // An engine no other test runs, so that its process tells this turn is running.
    let args = ["init", "slow", "--engine", "sleep 29.19"];
    ok(&args, &home.run(&args, None));
    let _slow = home.serve("slow");
    for _ in 0..3 {
        let talk = Command::new(bin())
            .args(["talk", "slow", "hi"])
            .env("HOME", &home.dir.path)
            .env_remove("LOOPBUS_ROOT")
            .env_remove("LOOPBUS_STATE_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let running = eventually(WAIT, || {
            std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
                std::fs::read(p.path().join("cmdline"))
                    .is_ok_and(|c| c.starts_with(b"sleep\x0029.19"))
            })
        });
        assert!(running, "the engine never started");
        signal(talk.id(), "INT");
        let out = talk.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(130));
        let said = text(&out.stderr);
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(
            lines,
            [
                "loopbus: cancel request to slow: cancelled",
                "loopbus: talk to slow: interrupted by SIGINT; the turn was cancelled [cancelled]",
            ],
            "{said}"
        );
    }
}

/// The example itself runs as a doctest (`src/lib.rs`, `EmbeddingDoctests`); this pins
/// that it is pasted whole: no hidden lines, its own `main`, its own root.
#[test]
fn bug_the_embedding_example_was_no_whole_program() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/embedding.md")).unwrap();
    let example = page
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a rust block in docs/embedding.md");
    assert!(example.contains("\nfn main() -> "), "{example}");
    assert!(
        !example.lines().any(|l| l.starts_with("# ")),
        "hidden lines: {example}"
    );
    assert!(
        example.contains("temp_dir()"),
        "a root of its own: {example}"
    );
    assert!(example.contains(".port(0)"), "a port of its own: {example}");
    assert!(!example.contains("~/.loopbus") && !example.contains("\"/tmp/bus"));
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    assert!(lib.contains("include_str!(\"../docs/embedding.md\")"));
}
