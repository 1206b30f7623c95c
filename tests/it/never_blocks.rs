//! The loop thread never blocks (contract section 3): a FIFO in place of the audit log,
//! a stderr pipe nobody reads, a rotation that cannot happen and a registry full of
//! invalid entries each leave health answering, every line accounted for, and the
//! logs small.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a failure should fail the test"
)]

use crate::common;

use common::{eventually, health_within, open_config, read_response, Instance, Req, TestRoot};
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bound for anything that should happen at once.
const PROMPTLY: Duration = Duration::from_secs(10);
/// How long a stopping instance may take (flushes are bounded well below this).
const EXIT_BOUND: Duration = Duration::from_secs(20);

/// A talk without the secret: refused 401 from the head alone, and audited.
fn unauthorized_talk(instance: &Instance) -> Req {
    Req::talk(instance).set("Authorization", "Bearer wrong")
}

/// Sends `req` on a new connection with read and write timeouts, so a frozen server
/// fails the test instead of hanging it.
fn send_within(port: u16, req: &Req, limit: Duration) -> Option<common::HttpResponse> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(limit)).unwrap();
    stream.set_write_timeout(Some(limit)).unwrap();
    stream.write_all(&req.to_bytes()).ok()?;
    read_response(&mut stream)
}

/// Sends `count` talks too deep to run (429, each a debug log line) on one keep-alive
/// connection, reading each answer.
fn send_too_deep(instance: &Instance, count: usize) {
    let bytes = Req::talk(instance)
        .json(&json!({"fromInstance": "alice", "prompt": "hi", "depth": 99}))
        .to_bytes();
    let mut stream = common::connect(instance.port);
    for i in 0..count {
        stream.write_all(&bytes).unwrap();
        let response = read_response(&mut stream).unwrap_or_else(|| panic!("no answer to #{i}"));
        assert_eq!(response.status, 429, "#{i}");
    }
}

fn mkfifo(path: &std::path::Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn is_fifo(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

#[test]
fn bug_a_fifo_in_place_of_the_audit_log_froze_the_server() {
    let root = TestRoot::new("fifo-audit");
    root.write_config("worker", &open_config("fifo-secret-7d2a"));
    let fifo = root.state_dir("worker").join("audit.log.jsonl");
    mkfifo(&fifo); // and nobody ever reads it
    let mut a = Instance::spawn(&root, "worker", &[]);

    let refused = send_within(a.port, &unauthorized_talk(&a), PROMPTLY)
        .unwrap_or_else(|| panic!("no answer to a 401 talk\nstderr:\n{}", a.stderr()));
    assert_eq!(refused.status, 401);
    let answered = send_within(a.port, &Req::talk(&a), PROMPTLY)
        .unwrap_or_else(|| panic!("no answer to a talk\nstderr:\n{}", a.stderr()));
    assert_eq!(answered.status, 200, "{answered:?}");
    assert_eq!(answered.json()["text"], "hi");
    if let Err(e) = health_within(a.port, PROMPTLY) {
        panic!("health: {e}\nstderr:\n{}", a.stderr());
    }
    // Opened without blocking, a FIFO with no reader is ENXIO.
    assert!(
        a.wait_for_log("audit.log.jsonl: No such device or address", PROMPTLY),
        "no warning about the FIFO\nstderr:\n{}",
        a.stderr()
    );

    let status = a.terminate(EXIT_BOUND);
    assert!(status.success(), "{status}\nstderr:\n{}", a.stderr());
    assert!(is_fifo(&fifo), "the FIFO was replaced");
    let stderr = a.stderr();
    assert_eq!(
        stderr.matches("cannot write").count(),
        1,
        "warned once:\n{stderr}"
    );
    assert!(
        stderr.contains("2 audit line(s) could not be written"),
        "{stderr}"
    );
}

#[test]
fn bug_a_stalled_stderr_pipe_froze_the_server() {
    /// Enough debug lines to fill a pipe (64 KiB) and the log queue many times over.
    const REQUESTS: usize = 3_000;
    let root = TestRoot::new("stalled-stderr");
    root.write_config("worker", &open_config("stderr-secret-91be"));
    let mut child = Command::new(common::bin())
        .arg("serve")
        .arg("--state-dir")
        .arg(root.state_dir("worker"))
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap(); // not read until the end
    let pid = child.id();
    let registered = eventually(PROMPTLY, || {
        root.registry()["instances"]["worker"]["pid"].as_u64() == Some(u64::from(pid))
    });
    let entry = root.registry()["instances"]["worker"].clone();
    let mut a = Instance {
        name: "worker".to_owned(),
        port: u16::try_from(entry["port"].as_u64().unwrap_or(0)).unwrap(),
        secret: entry["secret"].as_str().unwrap_or("").to_owned(),
        child: Some(child),
        stderr_path: root.path.join("unused.stderr"),
        state_dir: root.state_dir("worker"),
        command: "loopbus serve --state-dir worker (RUST_LOG=debug, stderr piped and not read)"
            .to_owned(),
        stdout_path: None,
    };
    assert!(registered, "serve did not register");

    send_too_deep(&a, REQUESTS);
    health_within(a.port, PROMPTLY).expect("health with stderr stalled");
    let answered = send_within(a.port, &Req::talk(&a), PROMPTLY).expect("a talk answer");
    assert_eq!(answered.status, 200);

    // Reading stderr again lets the writer catch up and report what it dropped. Only
    // then is it stopped: a stop while the queue is still full would drop its lines.
    const DROPPED: &str = "log line(s) dropped: stderr was not keeping up";
    let (caught_up, caught_up_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        while let Ok(n @ 1..) = stderr.read(&mut chunk) {
            text.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&text).contains(DROPPED) {
                let _ = caught_up.send(());
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    });
    let reported = caught_up_rx.recv_timeout(PROMPTLY).is_ok();
    let status = a.terminate(EXIT_BOUND);
    let text = reader.join().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        reported && text.contains(DROPPED),
        "no report of dropped lines in {} bytes of stderr",
        text.len()
    );
    assert!(text.contains("stopped worker"), "the last lines are lost");
}

#[test]
fn bug_a_rotation_target_that_is_a_directory_lost_half_the_lines() {
    /// The audit log's size cap (`audit::MAX_AUDIT_BYTES`).
    const MAX_AUDIT_BYTES: u64 = 64 * 1024 * 1024;
    const TALKS: usize = 20;
    let root = TestRoot::new("rotate-dir");
    root.write_config("worker", &open_config("rotate-secret-3c0f"));
    let state_dir = root.state_dir("worker");
    // A full log (sparse: no disk used), and a non-empty directory where it would go.
    let log_path = state_dir.join("audit.log.jsonl");
    std::fs::File::create(&log_path)
        .unwrap()
        .set_len(MAX_AUDIT_BYTES)
        .unwrap();
    let rotated = state_dir.join("audit.log.jsonl.1");
    std::fs::create_dir(&rotated).unwrap();
    std::fs::write(rotated.join("keep"), b"x").unwrap();
    let mut a = Instance::spawn(&root, "worker", &[]);

    for _ in 0..TALKS {
        assert_eq!(unauthorized_talk(&a).send(a.port).status, 401);
    }
    let lines_after_the_cap = || {
        let mut file = std::fs::File::open(&log_path).unwrap();
        file.seek(SeekFrom::Start(MAX_AUDIT_BYTES)).unwrap();
        let mut tail = String::new();
        file.read_to_string(&mut tail).unwrap();
        tail.lines()
            .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["type"] == "talk"))
            .count()
    };
    let all_there = eventually(PROMPTLY, || lines_after_the_cap() == TALKS);
    assert!(
        all_there,
        "{} of {TALKS} lines kept\nstderr:\n{}",
        lines_after_the_cap(),
        a.stderr()
    );
    a.assert_alive("after the failed rotations");
    let status = a.terminate(EXIT_BOUND);
    assert!(status.success());
    assert_eq!(lines_after_the_cap(), TALKS);
    assert!(rotated.join("keep").exists());
    let stderr = a.stderr();
    assert_eq!(
        stderr.matches("cannot rotate").count(),
        1,
        "warned once:\n{stderr}"
    );
}

/// `count` entries named `<prefix>-<n>`, each invalid (port 0; kept short, so that
/// twice as many still fit under the registry's 1 MiB cap).
fn invalid_entries(prefix: &str, count: usize) -> Vec<(String, Value)> {
    (0..count)
        .map(|i| (format!("{prefix}-{i}"), json!({"port": 0})))
        .collect()
}

/// Rewrites the registry: the instance's own entry as it is, and `extra`.
fn write_registry(root: &TestRoot, own: &Value, extra: &[(String, Value)]) {
    let mut instances = serde_json::Map::new();
    instances.insert("worker".to_owned(), own.clone());
    for (name, value) in extra {
        instances.insert(name.clone(), value.clone());
    }
    let bytes = serde_json::to_vec(&json!({ "instances": instances })).unwrap();
    common::write_file_atomic(&root.path.join(".bus-registry.json"), &bytes);
}

#[test]
fn bug_ten_thousand_invalid_registry_entries_flooded_the_log() {
    const INVALID: usize = 10_000;
    /// Far below the megabyte that one warning per entry per read writes.
    const STDERR_BOUND: usize = 64 * 1024;
    let root = TestRoot::new("registry-flood");
    let mut a = root.start("worker", &open_config("flood-secret-55aa"));
    let own = root.registry()["instances"]["worker"].clone();
    let mut entries = invalid_entries("bad", INVALID);
    write_registry(&root, &own, &entries);
    assert!(
        a.wait_for_log("more problems not listed", PROMPTLY),
        "no summary\nstderr:\n{}",
        a.stderr()
    );
    a.assert_alive("with 10,000 invalid entries");

    // A second batch: only it is new at the next read, so the first is not repeated.
    entries.extend(invalid_entries("worse", INVALID));
    write_registry(&root, &own, &entries);
    // The summary is the read's last line: waiting for it (not for the first `worse-`
    // line) waits for the whole read's lines. A third read may list again the `worse-`
    // entries past the memory bound (`MAX_PROBLEMS_REMEMBERED`), never a `bad-` one.
    let summaries = || a.stderr().matches("more problems not listed").count();
    assert!(
        eventually(PROMPTLY, || summaries() >= 2),
        "the next read did not report the new entries\nstderr:\n{}",
        a.stderr()
    );
    a.assert_alive("with 20,000 invalid entries");
    let stderr = a.stderr();
    assert!(stderr.contains("worse-"), "{stderr}");
    assert!(
        stderr.len() < STDERR_BOUND,
        "{} bytes of stderr",
        stderr.len()
    );
    assert_eq!(stderr.matches("bad-0:").count(), 1, "{stderr}");
    let started = Instant::now();
    let status = a.terminate(EXIT_BOUND);
    assert!(status.success(), "{status} after {:?}", started.elapsed());
}
