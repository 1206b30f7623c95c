//! A peer's bytes and a peer's port, from the caller's side (issue 10): a legacy peer
//! whose port is held by another user's process never gets the secret, and what a peer
//! or its engine says reaches stderr escaped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{describe, open_config, run, TestRoot};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a test waits for a helper process to report its port.
const START_LIMIT: Duration = Duration::from_secs(10);

/// The secret the squatted entry holds; it must never reach the squatter.
const SQUATTED_SECRET: &str = "squatted-secret-7f3e9a";

/// The OSC 52 clipboard write an engine puts on its stderr.
const OSC52: &str = "\x1b]52;c;aGk=\x07";
/// The same, as the escaping rule shows it.
const OSC52_ESCAPED: &str = "\\u001b]52;c;aGk=\\u0007";

/// A tiny HTTP server that answers every request as the legacy instance `worker`
/// (kind cc-telegram-bridge, no proof), prints its port first and then every request
/// head it gets on stdout, flushed line by line. With `CLOSE_LISTENER` set it closes
/// its listening socket as soon as it accepts the first connection, keeping only that.
/// Run with a first line `CLOSE_LISTENER = True` or `False`.
const SQUATTER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
body = b'{"kind":"cc-telegram-bridge","instance":"worker","status":"ok"}'
while True:
    c, _ = s.accept()
    if CLOSE_LISTENER:
        s.close()
    c.settimeout(5)
    data = b""
    try:
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                sys.stdout.write(repr(data) + "\n")
                sys.stdout.flush()
                data = b""
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
    except Exception as e:
        sys.stdout.write("error " + repr(e) + "\n")
        sys.stdout.flush()
    c.close()
    if CLOSE_LISTENER:
        break
"#;

/// Why this machine cannot run a process under another uid, if it cannot.
fn second_uid_unavailable() -> Option<String> {
    if !rustix::process::getuid().is_root() {
        return Some("not running as root".to_owned());
    }
    for tool in ["/usr/bin/setpriv", "/usr/bin/python3"] {
        if !Path::new(tool).exists() {
            return Some(format!("{tool} is missing"));
        }
    }
    None
}

/// Kills and reaps the child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the [`SQUATTER`] as `nobody` and registers a legacy entry `worker` (no proof,
/// the squatter's live pid) on its port: the squatter, its port, and what it prints
/// (the port line, then the requests it got once it is killed).
fn squat_legacy_entry(
    root: &TestRoot,
    close_listener: bool,
) -> (Reaped, u16, std::sync::mpsc::Receiver<String>) {
    let mut as_nobody = Command::new("/usr/bin/setpriv");
    as_nobody.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
    ]);
    squat_legacy_entry_with(root, close_listener, as_nobody)
}

/// [`squat_legacy_entry`] with the squatter run by `python` (a command running
/// python3, to which the script's arguments are added).
fn squat_legacy_entry_with(
    root: &TestRoot,
    close_listener: bool,
    mut python: Command,
) -> (Reaped, u16, std::sync::mpsc::Receiver<String>) {
    let script = format!(
        "CLOSE_LISTENER = {}\n{SQUATTER}",
        if close_listener { "True" } else { "False" }
    );
    let mut squatter = Reaped(
        python
            .args(["-c", &script])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(squatter.0.stdout.take().unwrap());
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = lines.read_line(&mut first);
        let _ = sender.send(first);
        // Everything else it prints: the requests it got.
        let mut rest = String::new();
        let _ = lines.read_to_string(&mut rest);
        let _ = sender.send(rest);
    });
    let port: u16 = receiver
        .recv_timeout(START_LIMIT)
        .expect("the squatter reports its port")
        .trim()
        .parse()
        .expect("a port number");

    // The legacy entry the squatter took over: no proof, a live pid (the squatter's).
    let registry = json!({"instances": {"worker": {
        "port": port,
        "pid": squatter.0.id(),
        "secret": SQUATTED_SECRET,
        "updatedAt": "2026-01-01T00:00:00.000Z",
    }}});
    common::write_file_atomic(
        &root.path.join(".bus-registry.json"),
        &serde_json::to_vec(&registry).unwrap(),
    );
    (squatter, port, receiver)
}

#[test]
fn bug_a_squatter_of_another_uid_on_a_legacy_peers_port_got_the_secret() {
    squatter_of_another_uid_gets_nothing(false);
}

#[test]
fn bug_a_squatter_that_closed_its_listener_after_the_probe_got_the_secret() {
    squatter_of_another_uid_gets_nothing(true);
}

/// Regression: `health` and `list` called another user's squatter on a legacy entry's
/// port (no `proof: true`) alive, since it answered health with the entry's name. A
/// legacy entry is alive only when the same-user check passes.
#[test]
fn bug_health_and_list_called_another_users_squatter_alive() {
    if let Some(why) = second_uid_unavailable() {
        eprintln!("skipped: the uid check needs a second uid ({why})");
        return;
    }
    let root = TestRoot::new("uid-squatter-alive");
    let (_squatter, port, _requests) = squat_legacy_entry(&root, false);
    let root_arg = root.path.display().to_string();
    let held = format!("port {port} is held by another user's process, uid 65534");

    let args = ["health", "worker", "--root", root_arg.as_str()];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(output.stdout.is_empty(), "{shown}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&held),
        "{shown}"
    );

    let args = ["list", "--root", root_arg.as_str(), "--json"];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    let listed: Value = serde_json::from_slice(&output.stdout).expect(&shown);
    let worker = listed["instances"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == "worker"))
        .expect(&shown);
    assert_eq!(worker["alive"], false, "{shown}");
    assert!(
        worker["problem"]
            .as_str()
            .is_some_and(|p| p.contains(&held)),
        "{shown}"
    );
}

/// Regression: where `/proc/net/tcp*` could not be read (a sandbox without /proc), the
/// same-user check let the talk go on, and a legacy peer's port got the secret whoever
/// held it. Now `talk` refuses locally, not retryable, and says what would fix it.
/// Runs `talk` in a private mount namespace with an empty /proc (`unshare`, root).
#[test]
fn bug_a_sandbox_without_proc_sent_the_secret_to_an_unchecked_peer() {
    let hidden = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs none /proc && ! test -e /proc/net/tcp")
        .output();
    if !hidden.is_ok_and(|o| o.status.success()) || !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: hiding /proc needs `unshare --mount` (root) and python3");
        return;
    }
    let root = TestRoot::new("no-proc");
    root.write_config("me", &open_config("caller-secret-9e8d"));
    // Our own uid this time: only the unreadable tables refuse it.
    let (squatter, port, receiver) =
        squat_legacy_entry_with(&root, false, Command::new("/usr/bin/python3"));
    let state_dir = root.state_dir("me");
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs none /proc && exec \"$0\" \"$@\"")
        .arg(common::bin())
        .args(["talk", "--state-dir"])
        .arg(&state_dir)
        .args(["worker", "the private prompt"])
        .env_remove("LOOPBUS_STATE_DIR")
        .output()
        .unwrap();
    let shown = describe(&["unshare ... talk worker"], &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot tell who holds port {port}"))
            && stderr.contains("mount /proc")
            && stderr.contains("[instance_unavailable, not retryable]"),
        "{shown}"
    );
    drop(squatter);
    let requests = receiver.recv_timeout(START_LIMIT).unwrap_or_default();
    assert!(
        !requests.to_ascii_lowercase().contains("authorization") && !requests.contains("/api/talk"),
        "the peer got the secret or the prompt: {requests}"
    );
}

/// A squatter running as `nobody` on a legacy entry's port: `talk` refuses with the uid
/// message, and the squatter sees the health probe only.
fn squatter_of_another_uid_gets_nothing(close_listener: bool) {
    if let Some(why) = second_uid_unavailable() {
        eprintln!("skipped: the uid check needs a second uid ({why})");
        return;
    }
    let root = TestRoot::new("uid-squatter");
    root.write_config("me", &open_config("caller-secret-1a2b"));
    let (squatter, port, receiver) = squat_legacy_entry(&root, close_listener);

    let state_dir = root.state_dir("me");
    let args = [
        "talk",
        "--state-dir",
        state_dir.to_str().unwrap(),
        "worker",
        "the private prompt",
    ];
    let output = run(&args, &[], None);
    let shown = describe(&args, &output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "port {port} is held by another user's process, uid 65534; not sending the secret"
        )),
        "{shown}"
    );
    assert!(
        stderr.contains("[instance_unavailable, not retryable]"),
        "{shown}"
    );

    if !close_listener {
        // --json says the same in the envelope.
        let json_args = [&args[..4], &["--json", "p"]].concat();
        let output = run(&json_args, &[], None);
        let shown = describe(&json_args, &output);
        assert_eq!(output.status.code(), Some(1), "{shown}");
        let envelope: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(envelope["errorCode"], "instance_unavailable", "{shown}");
        assert_eq!(envelope["retryable"], false, "{shown}");
    }

    drop(squatter);
    let requests = receiver
        .recv_timeout(START_LIMIT)
        .expect("the squatter's output ends when it is killed");
    assert!(
        requests.contains("/api/health"),
        "the probe reached the squatter: {requests}"
    );
    assert!(
        !requests.to_ascii_lowercase().contains("authorization")
            && !requests.contains(SQUATTED_SECRET)
            && !requests.contains("private prompt")
            && !requests.contains("/api/talk"),
        "the squatter got the secret or the prompt: {requests}"
    );
}

/// An instance `worker` whose engine fails with an OSC 52 clipboard write on stderr,
/// or answers with one in its reply, and a caller `me` allowed to call it.
fn osc52_pair(root: &TestRoot, script: &str) -> common::Instance {
    root.write_config("me", &open_config("caller-secret-3c4d"));
    let mut config = open_config("worker-secret-5e6f");
    config["engine"] = json!({"command": ["sh", "-c", script]});
    root.start("worker", &config)
}

/// Runs `loopbus talk worker hello` as `me` with `extra` flags; the args for
/// failure messages and the output.
fn talk(root: &TestRoot, extra: &[&str]) -> (String, std::process::Output) {
    let state_dir = root.state_dir("me");
    let mut args = vec!["talk", "--state-dir", state_dir.to_str().unwrap(), "worker"];
    args.extend_from_slice(extra);
    args.push("hello");
    let output = run(&args, &[], None);
    (describe(&args, &output), output)
}

#[test]
fn bug_an_engines_escape_sequence_reached_the_callers_terminal_raw() {
    let root = TestRoot::new("osc52-error");
    let _worker = osc52_pair(&root, "printf '\\033]52;c;aGk=\\007 boom\\n' >&2; exit 3");

    let (shown, output) = talk(&root, &[]);
    assert!(matches!(output.status.code(), Some(1 | 75)), "{shown}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(OSC52_ESCAPED), "{shown}");
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\x07'),
        "{shown}"
    );

    // --json: the envelope as JSON (which escapes it anyway), the same text inside.
    let (shown, output) = talk(&root, &["--json"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains('\x1b') && !stdout.contains('\x07'),
        "{shown}"
    );
    let envelope: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        envelope["error"].as_str().unwrap().contains(OSC52),
        "{shown}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains('\x1b'), "{shown}");
}

#[test]
fn bug_talk_raw_did_not_give_the_replys_exact_bytes() {
    let root = TestRoot::new("osc52-reply");
    let _worker = osc52_pair(&root, "printf 'a\\033]52;c;aGk=\\007b\\rc'");

    // Not a terminal: the reply as it came, and a final newline (issue 13).
    let (shown, output) = talk(&root, &[]);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert_eq!(output.stdout, format!("a{OSC52}b\rc\n").as_bytes());

    // --raw: the exact bytes, no newline added.
    let (shown, output) = talk(&root, &["--raw"]);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert_eq!(output.stdout, format!("a{OSC52}b\rc").as_bytes());

    // --json and --raw together is a usage error.
    let (shown, output) = talk(&root, &["--json", "--raw"]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
}

/// Regression: serve's own log lines carried outside text raw (a caller's name in the
/// hang-up line, an engine's or a peer's error text, a command or a path from
/// config). Every log line now goes through the one escaping rule: here the `ready:`
/// line names an engine command holding an OSC title write.
#[test]
fn bug_serve_log_lines_carried_outside_text_raw() {
    let root = TestRoot::new("log-escape");
    let mut config = open_config("log-secret-7a8b9c");
    config["engine"] = json!({"command": ["sh", "-c", "cat", "x\u{1b}]0;pwned\u{7}\u{9b}2J"]});
    let worker = root.start("worker", &config);
    assert!(
        worker.wait_for_log("ready:", START_LIMIT),
        "{}",
        worker.describe()
    );
    let log = worker.stderr();
    assert!(
        log.contains(r"x\u001b]0;pwned\u0007\u009b2J"),
        "{}",
        worker.describe()
    );
    assert!(
        !log.contains('\x1b') && !log.contains('\x07') && !log.contains('\u{9b}'),
        "{}",
        worker.describe()
    );
}

/// Regression: `audit --json` printed the log's lines raw on a terminal, and JSON
/// leaves C1 controls and DEL unescaped (a caller's name, an engine's error text).
/// On a terminal (run under `script`, which gives it one) they are escaped into the
/// same JSON values; piped, the lines are the log's own bytes.
#[test]
fn bug_audit_json_showed_outside_text_raw_on_a_terminal() {
    let root = TestRoot::new("audit-tty");
    root.write_config("worker", &open_config("audit-secret-1a2b3c"));
    let state_dir = root.state_dir("worker");
    let line = "{\"timestamp\":\"2026-12-01T09:00:00.000Z\",\"outcome\":\"error\",\
                \"metadata\":{\"fromInstance\":\"m\u{9b}2Jallory\"},\"detail\":\"boom\u{7f}\u{85}\"}\n";
    std::fs::write(state_dir.join("audit.log.jsonl"), line).unwrap();
    let state = state_dir.to_str().unwrap();

    let args = ["audit", "--state-dir", state, "--json"];
    let piped = run(&args, &[], None);
    assert_eq!(piped.status.code(), Some(0), "{}", describe(&args, &piped));
    assert_eq!(piped.stdout, line.as_bytes(), "{}", describe(&args, &piped));

    let Some(script) = which_script() else {
        eprintln!("skipped the terminal half: no `script` (util-linux) on PATH");
        return;
    };
    let command = format!("'{}' audit --state-dir '{state}' --json", common::bin());
    let out = Command::new(script)
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{shown:?}");
    assert!(
        shown.contains(r"m\u009b2Jallory") && shown.contains(r"boom\u007f\u0085"),
        "{shown:?}"
    );
    assert!(!shown.contains(['\u{9b}', '\u{7f}', '\u{85}']), "{shown:?}");
    let value: Value = serde_json::from_str(shown.trim()).unwrap();
    let want: Value = serde_json::from_str(line).unwrap();
    assert_eq!(value, want, "the same JSON values");
}

/// `script` from util-linux, which runs a command on a pseudo-terminal.
fn which_script() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("script"))
        .find(|candidate| candidate.is_file())
}
