//! The secret reaches only the instance it belongs to (contract 6.1, issue 10): a
//! squatter on a dead instance's port never sees the secret or the prompt, a client
//! dials exactly the registered address, and every start makes a fresh secret.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a condition is polled for before the test gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// A caller allowed to call everyone.
fn caller(root: &TestRoot, name: &str) -> PathBuf {
    root.write_config(name, &json!({"bus": {"peers": "*"}}));
    root.state_dir(name)
}

/// A config without a fixed secret: each start makes a fresh one.
fn per_start_config() -> Value {
    json!({"bus": {"peers": "*"}})
}

/// `loopbus talk --state-dir DIR ARGS...`.
fn talk(dir: &std::path::Path, args: &[&str]) -> (std::process::Output, String) {
    let mut all = vec!["talk", "--state-dir", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&all, &[], None);
    let shown = describe(&all, &out);
    (out, shown)
}

/// Kills `instance` with SIGKILL (no deregistering) and waits until it is gone.
fn kill_hard(instance: &mut Instance) {
    send_signal(instance.pid(), rustix::process::Signal::KILL);
    instance.wait(PATIENCE);
}

/// A process squatting on a port: it answers `GET /api/health` as `name`, kind
/// `loopbus`, status ok, with `proof` as given (never a valid one), answers anything
/// else with a forged success, and records every request's raw bytes.
struct Squatter {
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    health: Arc<Mutex<Value>>,
}

impl Squatter {
    fn start(listener: TcpListener, name: &str) -> Squatter {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let health = Arc::new(Mutex::new(
            json!({"kind": "loopbus", "instance": name, "status": "ok", "pid": 1,
            "protocolVersion": 1,
            "capabilities": ["structured-errors", "retryable-errors", "secret-proof"]}),
        ));
        let answer = Arc::clone(&health);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let record = Arc::clone(&record);
                let health = answer.lock().unwrap().clone();
                std::thread::spawn(move || serve_squatted(stream, &health, &record));
            }
        });
        Squatter { seen, health }
    }

    /// Answers health with this `proof` from now on.
    fn set_proof(&self, proof: &str) {
        self.health.lock().unwrap()["proof"] = proof.into();
    }

    /// Every request received so far, as text.
    fn requests(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }
}

/// Reads requests off one connection until it closes, answering each.
fn serve_squatted(mut stream: TcpStream, health: &Value, seen: &Mutex<Vec<Vec<u8>>>) {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buffer = Vec::new();
    loop {
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    if !buffer.is_empty() {
                        seen.lock().unwrap().push(buffer);
                    }
                    return;
                }
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap_or(0));
        while buffer.len() < end + 4 + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let take = (end + 4 + length).min(buffer.len());
        let request: Vec<u8> = buffer.drain(..take).collect();
        seen.lock().unwrap().push(request);
        let body = if head.starts_with("get /api/health") {
            health.to_string()
        } else {
            json!({"success": true, "text": "forged reply", "fromInstance": health["instance"]})
                .to_string()
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Binds `addr`, retrying while the port is still being released.
fn bind_when_free(addr: &str) -> TcpListener {
    let mut last = None;
    let bound = eventually(PATIENCE, || match TcpListener::bind(addr) {
        Ok(listener) => {
            last = Some(Ok(listener));
            true
        }
        Err(e) => {
            last = Some(Err(e));
            false
        }
    });
    match last {
        Some(Ok(listener)) if bound => listener,
        other => panic!("cannot bind {addr}: {:?}", other.map(|r| r.err())),
    }
}

#[test]
fn a_squatter_on_a_dead_entry_never_receives_the_secret_or_the_prompt() {
    let root = TestRoot::new("proof-squatter");
    let me = caller(&root, "me");
    let mut worker = root.start("worker", &per_start_config());
    let entry = root.registry()["instances"]["worker"].clone();
    assert_eq!(entry["proof"], true, "{entry}");
    let (port, secret) = (worker.port, worker.secret.clone());
    kill_hard(&mut worker);

    let prompt = "the private prompt 7f3a";
    let squatter = Squatter::start(bind_when_free(&format!("127.0.0.1:{port}")), "worker");
    // No proof at all, then a forged one.
    for forged in [None, Some("00".repeat(32))] {
        if let Some(forged) = &forged {
            squatter.set_proof(forged);
        }
        let (out, shown) = talk(&me, &["worker", prompt, "--json"]);
        assert_eq!(out.status.code(), Some(1), "not retryable\n{shown}");
        let envelope: Value = serde_json::from_slice(&out.stdout).expect(&shown);
        assert_eq!(envelope["errorCode"], "instance_unavailable", "{shown}");
        assert_eq!(envelope["retryable"], false, "{shown}");
        let error = envelope["error"].as_str().unwrap();
        assert!(error.contains(&format!("port {port}")), "{shown}");
        assert!(error.contains("proof"), "{shown}");
        let seen = squatter.requests();
        assert!(!seen.is_empty(), "the squatter was never probed");
        for request in &seen {
            assert!(request.starts_with("GET /api/health "), "{request}");
            assert!(
                !request.to_lowercase().contains("authorization"),
                "{request}"
            );
            assert!(!request.contains(&secret), "{request}");
            assert!(!request.contains(prompt), "{request}");
            assert!(request.contains("X-Loopbus-Nonce: "), "{request}");
        }
    }
}

#[test]
fn a_squatted_name_is_not_already_running_the_instance_takes_it_over() {
    let root = TestRoot::new("proof-takeover");
    let me = caller(&root, "me");
    let mut worker = root.start("worker", &per_start_config());
    let port = worker.port;
    kill_hard(&mut worker);
    let squatter = Squatter::start(bind_when_free(&format!("127.0.0.1:{port}")), "worker");

    let worker = Instance::spawn(&root, "worker", &[]);
    assert_ne!(worker.port, port, "the squatter holds the old port");
    // The log is written by its own thread: the line may land just after the entry.
    worker.wait_for_log("taking the entry over", PATIENCE);
    let stderr = worker.stderr();
    assert!(
        stderr.contains(&format!("port {port}")) && stderr.contains("taking the entry over"),
        "the takeover names the port and why\n{stderr}"
    );
    let (out, shown) = talk(&me, &["worker", "after the takeover"]);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "after the takeover\n",
        "{shown}"
    );
    assert!(squatter
        .requests()
        .iter()
        .all(|r| !r.to_lowercase().contains("authorization")));
}

#[test]
fn a_v6_instance_is_reached_at_v6_never_at_a_v4_listener_on_its_port() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: ::1 is not available here");
        return;
    }
    let root = TestRoot::new("proof-v6");
    let me = caller(&root, "me");
    root.write_config("six", &per_start_config());
    let six = Instance::spawn(&root, "six", &["--bind", "::1"]);
    let entry = root.registry()["instances"]["six"].clone();
    assert_eq!(entry["host"], "::1", "{entry}");
    let Ok(v4) = TcpListener::bind(format!("127.0.0.1:{}", six.port)) else {
        eprintln!("skipped: 127.0.0.1:{} is taken", six.port);
        return;
    };
    v4.set_nonblocking(true).unwrap();

    let (out, shown) = talk(&me, &["six", "to the right one"]);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "to the right one\n",
        "{shown}"
    );
    match v4.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the 127.0.0.1 listener was dialled: {other:?}"),
    }
}

#[test]
fn a_restart_after_sigkill_gets_a_new_secret_and_the_old_one_is_refused() {
    let root = TestRoot::new("proof-restart");
    let mut first = root.start("worker", &per_start_config());
    let old = first.secret.clone();
    kill_hard(&mut first);
    let second = Instance::spawn(&root, "worker", &[]);
    assert_ne!(second.secret, old, "a fresh secret at each start");
    assert_eq!(
        root.registry()["instances"]["worker"]["secret"],
        second.secret.as_str()
    );
    let body = json!({"fromInstance": "me", "prompt": "hi", "depth": 1}).to_string();
    let raw = format!(
        "POST /api/talk HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {old}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        second.port,
        body.len()
    );
    let answer = request(second.port, &raw);
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["errorCode"], "auth_failed");
}

#[test]
fn init_writes_no_secret_unless_asked_to_fix_one() {
    let root = TestRoot::new("proof-init");
    let dir = root.path.join("inst");
    let args = ["init", dir.to_str().unwrap()];
    let out = run(&args, &[], None);
    assert!(out.status.success(), "{}", describe(&args, &out));
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert!(config["bus"].get("secret").is_none(), "{config}");

    let args = ["init", dir.to_str().unwrap(), "--force", "--fixed-secret"];
    let out = run(&args, &[], None);
    assert!(out.status.success(), "{}", describe(&args, &out));
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert!(config["bus"]["secret"]
        .as_str()
        .is_some_and(|s| s.len() >= 32));

    let help = run(&["init", "--help"], &[], None);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--fixed-secret") && help.contains("keeps working"),
        "{help}"
    );
}

#[test]
fn health_lists_secret_proof_and_answers_a_nonce_envelopes_do_not() {
    let root = TestRoot::new("proof-health");
    let worker = root.start("worker", &per_start_config());
    let nonce = "0123456789abcdef0123456789abcdef";
    let ask = |nonce_header: &str| {
        request(
            worker.port,
            &format!(
                "GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{nonce_header}Connection: close\r\n\r\n",
                worker.port
            ),
        )
        .json()
    };
    let health = ask(&format!("X-Loopbus-Nonce: {nonce}\r\n"));
    assert!(health["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("secret-proof")));
    let proof = health["proof"].as_str().expect("a proof");
    assert_eq!(proof.len(), 64);
    assert!(proof
        .bytes()
        .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    for bad in [
        "",
        "X-Loopbus-Nonce: 0123\r\n",
        "X-Loopbus-Nonce: 0123456789ABCDEF0123456789abcdef\r\n",
    ] {
        assert!(ask(bad).get("proof").is_none(), "{bad:?}");
    }
    let answer = worker.talk("me", "hi", 1);
    assert_eq!(
        answer.json()["capabilities"],
        json!(["structured-errors", "retryable-errors"])
    );
}
