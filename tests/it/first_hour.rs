//! What a new user tripped over in the first hour (issue 13): readiness, `init`'s
//! options and `--force`, help and "did you mean", a closed stdout, messages that name
//! their instance, `--bind localhost`, shutdown progress, `HEAD /api/health`, and log
//! lines a person can read.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long a test waits for something that should happen at once.
const WAIT: Duration = Duration::from_secs(20);

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn health_wait_succeeds_once_serve_registers() {
    let root = TestRoot::new("wait");
    let root_arg = root.path.to_str().unwrap().to_owned();
    // The README's script: health runs before serve has registered.
    let waiting = Command::new(bin())
        .args(["health", "worker", "--root", &root_arg, "--wait", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _worker = root.start("worker", &open_config("s-0123456789abcdef"));
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        describe(&["health"], &out)
    );
    let answer: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(answer["instance"], "worker");
}

#[test]
fn health_wait_gives_up_with_the_usual_failure() {
    let root = TestRoot::new("wait-none");
    let args = [
        "health",
        "nobody",
        "--root",
        root.path.to_str().unwrap(),
        "--wait",
        "0.3",
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&args, &out));
    assert!(
        stderr(&out).contains("nobody is not registered"),
        "{}",
        describe(&args, &out)
    );
    let args = [
        "health",
        "nobody",
        "--root",
        root.path.to_str().unwrap(),
        "--wait",
        "x",
    ];
    assert_eq!(run(&args, &[], None).status.code(), Some(2));
}

#[test]
fn health_json_is_accepted() {
    let root = TestRoot::new("health-json");
    let _worker = root.start("worker", &open_config("s-0123456789abcdef"));
    let args = [
        "health",
        "worker",
        "--root",
        root.path.to_str().unwrap(),
        "--json",
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let answer: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(answer["status"], "ok");
}

#[test]
fn serve_logs_one_ready_line_with_engine_peers_and_budget() {
    let root = TestRoot::new("ready");
    let worker = root.start(
        "worker",
        &json!({"bus": {"peers": ["alice", "bob"], "secret": "s-0123456789abcdef"}, "budgetUsd": 2.5}),
    );
    let want = format!(
        "ready: worker on http://127.0.0.1:{} (pid {}), engine built-in echo, peers alice,bob, \
         maxDepth 3, budget 2.5 USD",
        worker.port,
        worker.pid()
    );
    assert!(worker.wait_for_log(&want, WAIT), "{}", worker.describe());
    assert_eq!(worker.stderr().matches("ready: ").count(), 1);
}

#[test]
fn init_takes_engine_peers_budget_port_and_kind() {
    let root = TestRoot::new("init-options");
    let dir = root.path.join("worker");
    let args = [
        "init",
        dir.to_str().unwrap(),
        "--engine",
        "claude",
        "--peers",
        "alice,bob",
        "--budget",
        "1.20",
        "--port",
        "7801",
        "--kind",
        "cc-telegram-bridge",
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let config = read_json(&dir.join("config.json"));
    assert_eq!(config["engine"], json!({"preset": "claude"}));
    assert_eq!(config["bus"]["peers"], json!(["alice", "bob"]));
    assert_eq!(config["bus"]["port"], 7801);
    assert_eq!(config["bus"]["kind"], "cc-telegram-bridge");
    assert_eq!(config["budgetUsd"], json!(1.2));
    assert!(config["bus"].get("secret").is_none(), "{config}");
    // A command line is split on whitespace; `echo` is the built-in engine.
    let args = [
        "init",
        dir.to_str().unwrap(),
        "--force",
        "--engine",
        "my-engine  --fast",
    ];
    assert_eq!(run(&args, &[], None).status.code(), Some(0));
    let config = read_json(&dir.join("config.json"));
    assert_eq!(
        config["engine"],
        json!({"command": ["my-engine", "--fast"]})
    );
    let args = ["init", dir.to_str().unwrap(), "--force", "--engine", "echo"];
    assert_eq!(run(&args, &[], None).status.code(), Some(0));
    assert!(read_json(&dir.join("config.json")).get("engine").is_none());
    for bad in [
        ["--peers", ","],
        ["--budget", "-1"],
        ["--engine", " "],
        ["--port", "x"],
    ] {
        let args = ["init", dir.to_str().unwrap(), "--force", bad[0], bad[1]];
        let out = run(&args, &[], None);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    }
}

#[test]
fn init_force_keeps_engine_budget_and_peers() {
    let root = TestRoot::new("init-force");
    let dir = root.path.join("worker");
    let d = dir.to_str().unwrap();
    let first = [
        "init",
        d,
        "--engine",
        "claude",
        "--peers",
        "alice",
        "--budget",
        "3",
        "--fixed-secret",
    ];
    assert_eq!(run(&first, &[], None).status.code(), Some(0));
    let path = dir.join("config.json");
    let before = read_json(&path);
    let before_bytes = std::fs::read(&path).unwrap();

    let args = ["init", d, "--force", "--port", "7802"];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let after = read_json(&path);
    assert_eq!(after["engine"], before["engine"]);
    assert_eq!(after["budgetUsd"], before["budgetUsd"]);
    assert_eq!(after["bus"]["peers"], before["bus"]["peers"]);
    assert_eq!(
        after["bus"]["secret"], before["bus"]["secret"],
        "no rotation asked"
    );
    assert_eq!(after["bus"]["port"], 7802);

    // The old file is kept, private.
    let backups: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("config.json.bak-")
        })
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(file_mode(&backups[0]), 0o600);
    assert_eq!(std::fs::read(&backups[0]).unwrap(), before_bytes);
    assert!(
        stdout(&out).contains(&backups[0].display().to_string()),
        "{}",
        stdout(&out)
    );

    let args = ["init", d, "--force", "--rotate-secret"];
    assert_eq!(run(&args, &[], None).status.code(), Some(0));
    let rotated = read_json(&path);
    assert_ne!(rotated["bus"]["secret"], before["bus"]["secret"]);
    assert_eq!(rotated["engine"], before["engine"]);
}

#[test]
fn init_force_on_a_running_instance_does_not_say_start_it() {
    let root = TestRoot::new("init-running");
    let worker = root.start("worker", &open_config("s-0123456789abcdef"));
    let args = [
        "init",
        worker.state_dir.to_str().unwrap(),
        "--force",
        "--budget",
        "4",
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    assert!(
        !stdout(&out).contains("start it with"),
        "{}",
        describe(&args, &out)
    );
    assert!(
        stdout(&out).contains("worker is running"),
        "{}",
        describe(&args, &out)
    );
    // The reload that follows says what changed, and the secret stayed.
    assert!(
        worker.wait_for_log("reloaded: changed budgetUsd", WAIT),
        "{}",
        worker.describe()
    );
    assert_eq!(
        read_json(&worker.state_dir.join("config.json"))["bus"]["secret"],
        "s-0123456789abcdef"
    );
}

#[test]
fn help_talk_shows_talk_help() {
    for command in ["talk", "health", "list", "serve", "init"] {
        let via_help = run(&["help", command], &[], None);
        let via_flag = run(&[command, "--help"], &[], None);
        assert_eq!(
            via_help.status.code(),
            Some(0),
            "{}",
            describe(&["help", command], &via_help)
        );
        assert_eq!(stdout(&via_help), stdout(&via_flag), "{command}");
        assert!(
            stdout(&via_help).starts_with(&format!("loopbus {command}")),
            "{command}"
        );
    }
    let out = run(&["help", "tlak"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("did you mean `talk`?"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unknown_option_suggests() {
    let out = run(&["list", "--jsno", "--root", "/nonexistent"], &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown option `--jsno`; did you mean `--json`?"),
        "{}",
        stderr(&out)
    );
    let out = run(&["lsit"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("did you mean `list`?"),
        "{}",
        stderr(&out)
    );
}

/// Runs `args` with stdout a pipe whose reader has already gone.
fn run_into_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(bin())
        .args(args)
        .env_remove("LOOPBUS_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn list_into_a_closed_pipe_exits_quietly() {
    let root = TestRoot::new("closed-pipe");
    let _worker = root.start("worker", &open_config("s-0123456789abcdef"));
    let r = root.path.to_str().unwrap();
    let cases: [&[&str]; 6] = [
        &["list", "--root", r],
        &["list", "--root", r, "--json"],
        &["health", "worker", "--root", r],
        &["help", "talk"],
        &["talk", "--help"],
        &["--version"],
    ];
    for args in cases {
        let out = run_into_closed_pipe(args);
        assert_eq!(out.status.code(), Some(0), "{}", describe(args, &out));
        assert!(out.stderr.is_empty(), "{}", describe(args, &out));
    }
}

#[test]
fn head_health_has_the_get_headers_and_no_body() {
    let root = TestRoot::new("head-health");
    let worker = root.start("worker", &open_config("s-0123456789abcdef"));
    let host = worker.host();
    let mut stream = connect(worker.port);
    let raw = format!(
        "HEAD /api/health HTTP/1.1\r\nHost: {host}\r\n\r\nGET /api/health HTTP/1.1\r\nHost: {host}\r\n\r\n"
    );
    stream.write_all(raw.as_bytes()).unwrap();
    // The HEAD answer's head, read byte by byte: its body must not be there.
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    // The very next bytes are the GET's answer, whose headers the HEAD answer had.
    let get = read_response(&mut stream).expect("the GET answer");
    assert_eq!(get.status, 200);
    assert_eq!(get.json()["instance"], "worker");
    for (name, value) in &get.headers {
        assert!(
            head.contains(&format!("{name}: {value}\r\n")),
            "HEAD lacks {name}: {value}\n{head}"
        );
    }
}

#[test]
fn bind_localhost_is_loopback() {
    let root = TestRoot::new("bind-localhost");
    root.write_config("worker", &open_config("s-0123456789abcdef"));
    let mut worker = Instance::spawn(&root, "worker", &["--bind", "localhost"]);
    worker.assert_alive("serve --bind localhost");
    // The ready line goes through the log queue: it may reach stderr a moment after
    // the registration the spawn waited for.
    assert!(
        worker.wait_for_log("on http://127.0.0.1:", WAIT),
        "{}",
        worker.describe()
    );
}

#[test]
fn a_non_loopback_refusal_says_it_once() {
    let root = TestRoot::new("bind-any");
    root.write_config("worker", &open_config("s-0123456789abcdef"));
    let dir = root.state_dir("worker");
    let args = [
        "serve",
        "--state-dir",
        dir.to_str().unwrap(),
        "--bind",
        "0.0.0.0",
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    let text = stderr(&out);
    assert_eq!(text.matches("0.0.0.0").count(), 1, "{text}");
    assert!(text.contains("loopback"), "{text}");
}

#[test]
fn address_in_use_names_the_registered_instance_holding_it() {
    let root = TestRoot::new("in-use");
    let holder = root.start("holder", &open_config("s-0123456789abcdef"));
    root.write_config("second", &open_config("t-0123456789abcdef"));
    let dir = root.state_dir("second");
    let port = holder.port.to_string();
    let args = [
        "serve",
        "--state-dir",
        dir.to_str().unwrap(),
        "--port",
        &port,
    ];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    let text = stderr(&out);
    assert!(
        text.contains("in use, registered to instance holder"),
        "{text}"
    );
    assert!(text.contains(&format!("pid {}", holder.pid())), "{text}");
}

#[test]
fn refusals_name_the_instance_instead_of_this_instance() {
    let root = TestRoot::new("named-refusal");
    let worker = root.start(
        "worker",
        &json!({"bus": {"peers": ["alice"], "secret": "s-0123456789abcdef", "maxDepth": 2}}),
    );
    let mallory = worker.talk("mallory", "hi", 0).json();
    assert_eq!(mallory["errorCode"], "peer_not_allowed");
    assert!(
        mallory["error"].as_str().unwrap().contains("worker"),
        "{mallory}"
    );
    let deep = worker.talk("alice", "hi", 5).json();
    assert_eq!(deep["errorCode"], "max_depth_exceeded");
    assert!(
        deep["error"]
            .as_str()
            .unwrap()
            .contains("worker's maxDepth"),
        "{deep}"
    );
    for answer in [mallory, deep] {
        assert!(
            !answer["error"].as_str().unwrap().contains("this instance"),
            "{answer}"
        );
    }
}

#[test]
fn shutdown_says_what_it_waits_for() {
    let root = TestRoot::new("shutdown-wait");
    let gate = root.path.join("gate");
    let calls = root.path.join("calls");
    let engine = json!({
        "command": ["sh", format!("{}/tests/engines/gate.sh", env!("CARGO_MANIFEST_DIR"))],
        "env": {"GATE": gate.to_string_lossy(), "CALLS_FILE": calls.to_string_lossy()},
    });
    let mut worker = root.start(
        "worker",
        &json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": engine}),
    );
    let talk = worker.spawn_talk("hi");
    assert!(
        eventually(WAIT, || calls.exists()),
        "the turn started\n{}",
        worker.describe()
    );
    signal(worker.pid(), "TERM");
    let want = "worker stopping: no new connections; waiting up to 30 s for 1 running turn; \
                Ctrl-C again to stop now";
    let said = worker.wait_for_log(want, WAIT);
    std::fs::write(&gate, b"").unwrap();
    assert!(said, "{}", worker.describe());
    assert_eq!(talk.join().unwrap().status, 200);
    assert_eq!(worker.wait(WAIT).code(), Some(0), "{}", worker.describe());
}

#[test]
fn client_warnings_have_no_timestamp() {
    let root = TestRoot::new("client-warning");
    let registry = root.path.join(".bus-registry.json");
    std::fs::write(&registry, br#"{"instances": {"bad": {"port": "x"}}}"#).unwrap();
    let args = ["list", "--root", root.path.to_str().unwrap()];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let text = stderr(&out);
    let warning = text
        .lines()
        .find(|l| l.contains("warning:"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    assert!(
        warning.starts_with(&format!("loopbus: warning: {}", registry.display())),
        "{text}"
    );
}

#[test]
fn debug_logs_have_no_rust_debug_formatting() {
    let root = TestRoot::new("no-debug-format");
    let worker = root.start(
        "worker",
        &json!({"bus": {"peers": ["alice"], "secret": "s-0123456789abcdef"}}),
    );
    let _ = worker.talk("mallory", "hi", 1);
    assert!(
        worker.wait_for_log("talk refused", WAIT),
        "{}",
        worker.describe()
    );
    let log = worker.stderr();
    for needle in ["Some(", "None", "\"mallory\""] {
        assert!(!log.contains(needle), "{needle} in the log:\n{log}");
    }
    assert!(log.contains("from mallory, depth 1"), "{log}");
}

/// Every command that looks up the registry takes `--root`; `talk` did not.
#[test]
fn talk_takes_root_for_a_target_registered_under_another_root() {
    let theirs = TestRoot::new("talk-root-theirs");
    let ours = TestRoot::new("talk-root-ours");
    let _worker = theirs.start("worker", &open_config("s3cret-for-talk-root"));
    let me = ours.write_config("me", &json!({"bus": {"peers": "*"}}));
    let state_dir = me.parent().unwrap().to_str().unwrap().to_owned();
    let root = theirs.path.to_str().unwrap().to_owned();
    // Without --root, worker is looked up under our own root: not there.
    let out = run(
        &["talk", "--state-dir", &state_dir, "worker", "hi"],
        &[],
        None,
    );
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("not registered"), "{}", stderr(&out));
    let out = run(
        &[
            "talk",
            "--state-dir",
            &state_dir,
            "--root",
            &root,
            "worker",
            "hi",
        ],
        &[],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hi\n");
}

/// `--rotate-secret` on an instance without a fixed secret quietly wrote one, with all
/// a fixed secret costs: it is refused, and names the option that writes one.
#[test]
fn rotate_secret_without_a_fixed_secret_is_refused_not_a_quiet_fixed_secret() {
    let root = TestRoot::new("rotate-none");
    let dir = root.state_dir("w");
    let d = dir.to_str().unwrap();
    assert_eq!(run(&["init", d], &[], None).status.code(), Some(0));
    let before = std::fs::read(dir.join("config.json")).unwrap();
    let out = run(&["init", d, "--force", "--rotate-secret"], &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--fixed-secret"), "{}", stderr(&out));
    assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), before);
    // Asked for both: a fixed secret is written.
    let out = run(
        &["init", d, "--force", "--rotate-secret", "--fixed-secret"],
        &[],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(read_json(&dir.join("config.json"))["bus"]["secret"].is_string());
}

/// A stderr that can't be written (a full disk, a log pipe whose reader died) made
/// every command exit 101 (a panic in `eprintln!`), and `talk` after a signal hang
/// forever ignoring further signals.
#[test]
fn a_stderr_that_cannot_be_written_changes_no_exit_status() {
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let root = TestRoot::new("stderr-full");
    let me = root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let state_dir = me.parent().unwrap().to_str().unwrap().to_owned();
    let status = Command::new(bin())
        .args(["talk", "--state-dir", &state_dir, "nobody", "hi"])
        .stdout(Stdio::null())
        .stderr(full())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(75), "not registered is retryable");
    // A talk waiting for a slow engine, then SIGINT: it cancels and exits 130.
    let slow = json!({
        "bus": {"peers": "*", "secret": "s3cret-stderr-full"},
        "engine": {"command": ["sleep", "30"]},
    });
    let worker = root.start("worker", &slow);
    let mut talk = Command::new(bin())
        .args(["talk", "--state-dir", &state_dir, "worker", "hi"])
        .stdout(Stdio::null())
        .stderr(full())
        .spawn()
        .unwrap();
    assert!(eventually(WAIT, || worker.health()["turns"]["running"] == 1));
    send_signal(talk.id(), rustix::process::Signal::INT);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = talk.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > WAIT {
            let _ = talk.kill();
            panic!("talk hung after SIGINT with an unwritable stderr");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(130));
}

/// The first `curl` on `PATH`, if any.
fn find_curl() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("curl"))
        .find(|candidate| candidate.is_file())
}

/// Regression: `serve --print-curl` (what `make run` prints) put
/// `Authorization: Bearer <secret>` among curl's arguments, where every local user can
/// read it (/proc/PID/cmdline). The printed line is run as pasted into a shell (on sh's
/// stdin), with every program it starts recording its arguments: it must work, and no
/// argument list may hold the secret.
#[test]
fn bug_print_curl_put_the_secret_on_curls_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let root = TestRoot::new("print-curl");
    let secret = "print-curl-secret-4d5e6f7a8b";
    root.write_config("demo", &open_config(secret));
    let demo = Instance::spawn(&root, "demo", &["--print-curl"]);
    let stdout_path = demo.stdout_path.clone().unwrap();
    let printed = || std::fs::read_to_string(&stdout_path).unwrap_or_default();
    assert!(
        eventually(WAIT, || printed().contains("Check its health")),
        "{}",
        demo.describe()
    );
    let text = printed();
    let command = text
        .lines()
        .skip_while(|line| !line.starts_with("Talk to it"))
        .skip(1)
        .take_while(|line| !line.starts_with("Check its health"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(command.contains(secret), "{text}");
    let Some(curl) = find_curl() else {
        eprintln!("skipped running the printed line: no curl on PATH");
        return;
    };
    // Wrappers first on PATH: curl records its arguments and runs the real one; a
    // `printf` program would record that it ran (the line must use the shell builtin).
    let wrappers = root.path.join("wrappers");
    std::fs::create_dir(&wrappers).unwrap();
    let argv_log = root.path.join("argv.log");
    for (name, script) in [
        (
            "curl",
            format!(
                "#!/bin/sh\nprintf 'curl %s\\n' \"$*\" >> \"$ARGV_LOG\"\nexec '{}' \"$@\"\n",
                curl.display()
            ),
        ),
        (
            "printf",
            "#!/bin/sh\necho \"printf program $*\" >> \"$ARGV_LOG\"\nexit 1\n".to_owned(),
        ),
    ] {
        let path = wrappers.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        wrappers.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut shell = Command::new("sh")
        .arg("-s")
        .env("PATH", path)
        .env("ARGV_LOG", &argv_log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    shell
        .stdin
        .take()
        .unwrap()
        .write_all(command.as_bytes())
        .unwrap();
    let out = shell.wait_with_output().unwrap();
    let shown = format!(
        "{command}\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    let envelope: Value = serde_json::from_str(&stdout(&out)).expect(&shown);
    assert_eq!(
        (envelope["success"].as_bool(), envelope["text"].as_str()),
        (Some(true), Some("hello")),
        "{shown}"
    );
    let argv = std::fs::read_to_string(&argv_log).unwrap();
    assert!(argv.starts_with("curl "), "{argv}");
    assert!(!argv.contains("printf program"), "{argv}");
    assert!(!argv.contains(secret), "{argv}");
}
