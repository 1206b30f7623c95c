//! Connection classes (contract section 3, "open connections"): when the connection
//! table is full, incomplete heads are evicted before idle keep-alive connections and
//! authorized work never is; a reserve of connections is kept from talks so that health
//! always has room; a config whose turns can't fit is refused at startup; and the
//! answers written during a shutdown say that the connection closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::json;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Open files for a server with a cap of 64 connections when 4 turns may run (48
/// descriptors are kept for the instance and 5 for each running turn's engine), 32 of
/// which may hold talks (32 are kept for health).
const FD_LIMIT_FOR_64: u32 = 132;
/// `bus.maxConcurrentTurns` that [`FD_LIMIT_FOR_64`] is counted for (the default).
const TURNS_FOR_64: usize = 4;
/// Connections that may hold authorized work under that limit.
const TALK_ROOM: usize = 32;
/// How long to wait for a condition that should come at once; generous on purpose.
const BOUND: Duration = Duration::from_secs(20);

fn config(turns: (usize, usize), engine: Option<serde_json::Value>) -> serde_json::Value {
    let mut config = json!({"bus": {
        "peers": "*", "secret": "s-0123456789abcdef",
        "maxConcurrentTurns": turns.0, "maxQueuedTurns": turns.1
    }});
    if let Some(engine) = engine {
        config["engine"] = engine;
    }
    config
}

/// Kills the process groups of `pid`'s children (its engines lead their own groups).
fn kill_engines(pid: u32) {
    for child in children(pid) {
        let group = i32::try_from(child)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Reads one response on `stream` on another thread; counts a 503 `server_busy` in
/// `busy` as soon as it arrives.
fn read_on_thread(
    mut stream: TcpStream,
    busy: &Arc<AtomicUsize>,
) -> thread::JoinHandle<Option<HttpResponse>> {
    let busy = Arc::clone(busy);
    thread::spawn(move || {
        let r = read_response(&mut stream)?;
        if r.status == 503 && r.json()["errorCode"] == "server_busy" {
            busy.fetch_add(1, Ordering::SeqCst);
        }
        Some(r)
    })
}

/// Runs `serve` on `state_dir` under the open-files limit `fd_limit` and returns its
/// exit code and stderr; fails if it is still running after [`BOUND`].
fn serve_exit(state_dir: &std::path::Path, fd_limit: Option<u32>) -> (Option<i32>, String) {
    let mut command = match fd_limit {
        Some(limit) => {
            let mut shell = Command::new("sh");
            shell
                .arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(bin());
            shell
        }
        None => Command::new(bin()),
    };
    let mut child = command
        .arg("serve")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--port")
        .arg("0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started with a config that cannot fit");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

/// Regression: with `ulimit -n 1024`, `maxQueuedTurns` 1024 and a slow engine, a peer
/// with the secret opened 1,074 talks and every health check was reset. A config whose
/// turns can't fit under the connection cap less the health reserve is now refused at
/// startup; and under the largest one that fits, talks (waiting, or still sending their
/// bodies) past the room left by the reserve are answered 503 at once, and health
/// answers throughout.
#[test]
fn bug_queued_talks_held_every_connection() {
    let root = TestRoot::new("reserve");
    let engine = json!({"command": ["sh", "-c", "sleep 20; cat"]});
    // The report's config, under the same cap: refused.
    let dir = root.write_config("late", &config((4, 1024), Some(engine.clone())));
    let (code, stderr) = serve_exit(dir.parent().unwrap(), Some(1024));
    assert_eq!(code, Some(2), "{stderr}");

    root.write_config(
        "worker",
        &config((TURNS_FOR_64, TALK_ROOM - TURNS_FOR_64), Some(engine)),
    );
    let mut w = Instance::spawn_with_fd_limit(&root, "worker", FD_LIMIT_FOR_64);
    let busy = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    // Talks that wait for their turn...
    for i in 0..20 {
        let mut stream = connect(w.port);
        stream
            .write_all(&w.talk_request("c", &format!("t{i}"), 0))
            .unwrap();
        readers.push(read_on_thread(stream, &busy));
    }
    // ...and talks that passed their checks and are still sending their bodies.
    let head = format!(
        "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Length: 1000\r\n\r\n{{\"fromIn",
        w.host(),
        w.secret
    );
    for _ in 0..60 {
        let mut stream = connect(w.port);
        stream.write_all(head.as_bytes()).unwrap();
        readers.push(read_on_thread(stream, &busy));
    }
    // Past the cap, with connections that never send a byte.
    let silent: Vec<TcpStream> = (0..100).map(|_| connect(w.port)).collect();
    assert!(
        w.wait_for_log("connection limit reached", BOUND),
        "the cap was never reached\nstderr:\n{}",
        w.stderr()
    );
    let refused = 80 - TALK_ROOM;
    assert!(
        eventually(BOUND, || busy.load(Ordering::SeqCst) >= refused),
        "{} of the {refused} talks past the reserve were answered server_busy\nstderr:\n{}",
        busy.load(Ordering::SeqCst),
        w.stderr()
    );
    for i in 0..5 {
        w.assert_alive(&format!("health {i} with every talk slot held"));
    }
    kill_engines(w.pid());
    drop(silent);
    drop(w);
    for reader in readers {
        if let Some(r) = reader.join().unwrap() {
            assert!([200, 408, 503].contains(&r.status), "{r:?}");
        }
    }
}

/// The startup refusal itself: running + queued turns one over what fits under the cap
/// less the reserve, and the largest config allowed at all, under the default cap.
#[test]
fn bug_a_config_whose_turns_cannot_fit_the_connections_started() {
    let root = TestRoot::new("fit");
    let over = (TURNS_FOR_64, TALK_ROOM + 1 - TURNS_FOR_64);
    let dir = root.write_config("over", &config(over, None));
    let (code, stderr) = serve_exit(dir.parent().unwrap(), Some(FD_LIMIT_FOR_64));
    assert_eq!(code, Some(2), "{stderr}");
    for needle in [
        "maxConcurrentTurns + bus.maxQueuedTurns is 33",
        "at most 32 connections",
        "ulimit -n",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    fd_limit(); // the default cap of 1,024 connections, where the limit allows it
    let dir = root.write_config("most", &config((64, 1024), None));
    let (code, stderr) = serve_exit(dir.parent().unwrap(), None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is 1088"), "{stderr}");
}

/// Regression: 1,100 trickling connections without the secret cut every authorized
/// 200 KB upload sent in pieces, and half of a keep-alive client's health calls: the
/// least recently active connection was evicted, whatever it was doing. Incomplete
/// heads now go first, then idle connections, and authorized uploads never.
#[test]
fn bug_an_unauthenticated_flood_evicted_authorized_uploads() {
    let root = TestRoot::new("flood");
    root.write_config("worker", &open_config("s-0123456789abcdef"));
    let w = Instance::spawn_with_fd_limit(&root, "worker", FD_LIMIT_FOR_64);
    let health = Req::health(&w).to_bytes();
    let mut keep_alive = connect(w.port);
    keep_alive.write_all(&health).unwrap();
    let r = read_response(&mut keep_alive).unwrap();
    assert_eq!((r.status, r.header("connection")), (200, None), "{r:?}");

    let prompt = "x".repeat(200_000);
    let upload = Req::talk(&w)
        .json(
            &json!({"fromInstance": "alice", "prompt": prompt, "depth": 0,
            "protocolVersion": 1, "capabilities": CAPABILITIES}),
        )
        .to_bytes();
    let piece = upload.len().div_ceil(4);
    let mut uploads: Vec<TcpStream> = (0..4).map(|_| connect(w.port)).collect();
    let mut flood = Vec::new();
    for (round, chunk) in upload.chunks(piece).enumerate() {
        for (i, stream) in uploads.iter_mut().enumerate() {
            stream.write_all(chunk).unwrap_or_else(|e| {
                panic!(
                    "upload {i} was cut ({e}) at piece {round}\nstderr:\n{}",
                    w.stderr()
                )
            });
        }
        // A flood past the cap between the pieces: each sends part of a head and
        // nothing more.
        for _ in 0..100 {
            let mut stream = connect(w.port);
            let _ = stream.write_all(b"GET /api/health HTTP/1.1\r\nHo");
            flood.push(stream);
        }
        if round == 0 {
            assert!(
                w.wait_for_log("connection limit reached", BOUND),
                "the flood never reached the cap\nstderr:\n{}",
                w.stderr()
            );
        }
    }
    for (i, stream) in uploads.iter_mut().enumerate() {
        let r = read_response(stream)
            .unwrap_or_else(|| panic!("upload {i} was cut\nstderr:\n{}", w.stderr()));
        assert_success(&r, "worker", &prompt, &format!("upload {i}"));
    }
    keep_alive.write_all(&health).unwrap();
    let r = read_response(&mut keep_alive).expect("the keep-alive client was evicted");
    assert_eq!(r.status, 200, "{r:?}");
}

/// Regression: answers written during a shutdown (a queued turn refused, a running
/// turn's result) did not say `Connection: close`, though the connection closed after
/// them.
#[test]
fn bug_answers_during_shutdown_kept_the_connection_open() {
    let root = TestRoot::new("shutdown-close");
    let engine = json!({"command": ["sh", "-c", "sleep 1; cat"]});
    root.write_config("worker", &config((1, 4), Some(engine)));
    let mut w = Instance::spawn(&root, "worker", &[]);
    let mut running = connect(w.port);
    running
        .write_all(&w.talk_request("c", "running", 0))
        .unwrap();
    assert!(
        eventually(BOUND, || !children(w.pid()).is_empty()),
        "the engine never started"
    );
    let mut queued = connect(w.port);
    queued.write_all(&w.talk_request("c", "queued", 0)).unwrap();
    // Answered only after the queued talk was accepted and read.
    w.health();
    signal(w.pid(), "TERM");

    let r = read_response(&mut queued).expect("no answer to the queued talk");
    assert_failure(&r, "worker", 503, "server_busy", "queued at shutdown");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(closed_within(&mut queued, BOUND));

    let r = read_response(&mut running).expect("no answer to the running talk");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["text"], "running");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(closed_within(&mut running, BOUND));
    assert!(w.wait(BOUND).success());
}

/// Reads a response head only (through the blank line): its status.
fn read_status(stream: &mut TcpStream) -> Option<u16> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match std::io::Read::read(stream, &mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8(head).ok()?;
    head.split(' ').nth(1)?.parse().ok()
}

/// Regression: response bytes had no budget: many clients that never read, each owed
/// a 6 MiB engine reply, grew the server's memory by 6 MiB each. Past the response
/// budget (16 MiB) an answer is replaced by a small 503 `server_busy`.
#[test]
fn bug_non_reading_clients_grew_response_memory_without_bound() {
    let root = TestRoot::new("response-budget");
    let engine = json!({
        "command": ["sh", "-c", "cat > /dev/null; head -c 6000000 /dev/zero | tr '\\0' x"],
        "maxOutputBytes": 8_000_000
    });
    root.write_config("worker", &config((3, 0), Some(engine)));
    let w = Instance::spawn(&root, "worker", &[]);
    let mut clients: Vec<TcpStream> = (0..3)
        .map(|i| {
            let mut stream = connect(w.port);
            // A small receive buffer: with the server's send buffer (4 MiB at most by
            // default) the kernel can't take a whole reply off the server's hands.
            rustix::net::sockopt::set_socket_recv_buffer_size(&stream, 4096).unwrap();
            stream
                .write_all(&w.talk_request("c", &format!("p{i}"), 0))
                .unwrap();
            stream
        })
        .collect();
    // Each keeps its connection open and reads no more than the head.
    let statuses: Vec<Option<u16>> = clients.iter_mut().map(read_status).collect();
    let ok = statuses.iter().filter(|s| **s == Some(200)).count();
    let busy = statuses.iter().filter(|s| **s == Some(503)).count();
    // 6 MB each, more than the kernel takes off a connection that is not read: two fit
    // in the budget, the third would go past it.
    assert_eq!((ok, busy), (2, 1), "{statuses:?}\nstderr:\n{}", w.stderr());
    drop(clients);
}

/// Regression: a connection whose head arrived together with a flood (its readiness
/// event waiting behind the accept of the flood) was evicted as an incomplete head
/// before its bytes were read, though they held a head that passed its checks. An
/// incomplete head is now read once more before it is evicted.
#[test]
fn bug_a_head_that_came_with_a_flood_was_evicted_unread() {
    let root = TestRoot::new("unread-head");
    root.write_config("worker", &open_config("s-0123456789abcdef"));
    let w = Instance::spawn_with_fd_limit(&root, "worker", FD_LIMIT_FOR_64);
    let mut caller = connect(w.port);
    // Accepted in order: once this health check is answered, so is the caller.
    let r = Req::health(&w).header("Connection", "close").send(w.port);
    assert_eq!(r.status, 200, "{r:?}");
    // While the server is stopped, the caller sends its talk and a flood fills the
    // table: on waking, one poll reports both, and the flood is accepted first.
    signal(w.pid(), "STOP");
    caller
        .write_all(&w.talk_request("c", "still here", 0))
        .unwrap();
    let flood: Vec<TcpStream> = (0..80).map(|_| connect(w.port)).collect();
    signal(w.pid(), "CONT");
    let r = read_response(&mut caller)
        .unwrap_or_else(|| panic!("the caller was evicted\nstderr:\n{}", w.stderr()));
    assert_eq!(r.json()["text"], "still here");
    assert!(w.wait_for_log("connection limit reached", BOUND));
    drop(flood);
}

/// The number in `/proc/<pid>/fd`'s count of descriptors (for a hint in a failure).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Regression: the connection cap left no room for the running engines' pipes: under a
/// low `ulimit -n`, with every turn running (its engine holding three pipes, a pidfd
/// and its cancel eventfd) and the queue full, accept ran out of descriptors ("Too many open files")
/// and health waited seconds behind the backlog. The cap now keeps
/// `FDS_PER_TURN` descriptors free per `bus.maxConcurrentTurns`.
#[test]
fn bug_engine_pipes_took_the_descriptors_health_needed() {
    // 48 kept for the instance, 5 for each of 16 engines: a cap of 64, 32 for talks.
    // (Before, the cap was 192 - 48 = 144, and 16 engines took more than the 48 kept.)
    const TURNS: usize = 16;
    const FD_LIMIT: u32 = 192;
    const ROOM: usize = 32;
    let root = TestRoot::new("engine-fds");
    let gate = root.path.join("gate");
    let engine = json!({
        "command": [format!("{}/tests/engines/gate.sh", env!("CARGO_MANIFEST_DIR"))],
        "env": {"GATE": gate.to_str().unwrap()},
    });
    root.write_config("worker", &config((TURNS, ROOM - TURNS), Some(engine)));
    let mut w = Instance::spawn_with_fd_limit(&root, "worker", FD_LIMIT);
    // The queue filled with authorized talks, up to what the config allows.
    let busy = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for i in 0..ROOM {
        let mut stream = connect(w.port);
        stream
            .write_all(&w.talk_request("c", &format!("t{i}"), 0))
            .unwrap();
        readers.push(read_on_thread(stream, &busy));
    }
    assert!(
        eventually(BOUND, || children(w.pid()).len() >= TURNS),
        "the engines did not all start\nstderr:\n{}",
        w.stderr()
    );
    // Idle connections past the cap: each new one evicts one of them.
    let idle: Vec<TcpStream> = (0..100).map(|_| connect(w.port)).collect();
    for i in 0..12 {
        w.assert_alive(&format!(
            "health {i} with every engine running ({} fds open)",
            open_fds(w.pid())
        ));
    }
    let stderr = w.stderr();
    assert!(
        !stderr.contains("Too many open files"),
        "accept ran out of descriptors:\n{stderr}"
    );
    assert_eq!(
        busy.load(Ordering::SeqCst),
        0,
        "a talk that fits was refused"
    );
    std::fs::write(&gate, b"").unwrap();
    drop(idle);
    for reader in readers {
        let r = reader
            .join()
            .unwrap()
            .expect("a queued talk lost its answer");
        assert_eq!(r.status, 200, "{r:?}");
    }
}
