//! Health latency under attack: 1,000 connections trickle one byte a second (a
//! slowloris that never finishes its head) while `maxConcurrentTurns` slow turns run.

use crate::instance::{self, Root, Server};
use crate::load::{self, Conn, Load, Mode, Stats};
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The attacking connections.
pub const SLOW_CONNECTIONS: usize = 1_000;
/// Attacking connections opened at once; below `loopbus serve`'s listen backlog (128).
const ATTACK_BATCH: usize = 100;
/// Each attacking connection sends one byte per period, spread evenly over it.
const TRICKLE_PERIOD: Duration = Duration::from_secs(1);
/// The start of a request head the attack never finishes; `TRICKLE_FILL` follows.
const TRICKLE_PREFIX: &[u8] = b"GET /api/health HTTP/1.1\r\nX-Slow: ";
const TRICKLE_FILL: u8 = b'a';
/// Longest the trickle may run, whatever happens to the stop flag.
const TRICKLE_MAX: Duration = Duration::from_secs(30);
/// Write timeout of an attacking connection (one byte never waits in practice).
const TRICKLE_WRITE_TIMEOUT: Duration = Duration::from_millis(100);
/// How long the slow engine sleeps before echoing; longer than the measurement, which
/// must also end before the server's 10 s head timeout closes the attackers.
pub const SLOW_TURN: Duration = Duration::from_secs(6);
/// Time left for the slow turns to answer once the measurement ended.
const SLOW_TURN_GRACE: Duration = Duration::from_secs(15);
/// How long to wait for every slow turn to be running.
const TURNS_RUNNING_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two polls (health, finished threads).
const POLL: Duration = Duration::from_millis(10);
/// The instance under attack.
const NAME: &str = "bench-slow";
/// The prompt of the slow turns.
const PROMPT: &str = "slow turn";

/// What the attack measured.
pub struct Attack {
    /// Health on one keep-alive connection during the attack.
    pub health: Stats,
    /// Slow turns started (the instance's `maxConcurrentTurns`).
    pub slow_turns: usize,
    /// Slow turns seen running at once before the measurement.
    pub slow_turns_running: usize,
    /// Slow turns that answered with the echoed prompt afterwards.
    pub slow_turns_ok: usize,
    /// Attacking connections opened.
    pub slow_connections: usize,
    /// Attacking connections still open when the measurement ended.
    pub slow_connections_open: usize,
}

/// Runs the attack on a fresh instance and measures health during `warmup + window`.
///
/// # Errors
/// The instance did not start or its turns did not start; the messages say which.
pub fn run(bin: &Path, root: &Root, warmup: Duration, window: Duration) -> Result<Attack, String> {
    if warmup + window + Duration::from_secs(1) >= SLOW_TURN {
        return Err("the measurement must be shorter than the slow turns".to_owned());
    }
    let engine = json!({
        "command": ["sh", "-c", format!("sleep {}; cat", SLOW_TURN.as_secs())],
        "prompt": "stdin",
        "output": "text",
    });
    let config = instance::config(&json!({}), &json!({ "engine": engine }));
    let server = Server::start(bin, root, NAME, &config)?;
    let addr = server.addr;
    let slow_turns = health_field(addr, "max")?;

    let slow: Vec<JoinHandle<bool>> = (0..slow_turns)
        .map(|_| thread::spawn(move || slow_turn(addr)))
        .collect();
    let deadline = Instant::now() + TURNS_RUNNING_TIMEOUT;
    let mut running = 0;
    while Instant::now() < deadline {
        running = health_field(addr, "running")?;
        if running >= slow_turns {
            break;
        }
        thread::sleep(POLL);
    }

    let attackers = open_attackers(addr);
    let slow_connections = attackers.len();
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || trickle(attackers, &stop))
    };
    let load = Load {
        addr,
        request: instance::health_request(addr).into_bytes().into(),
        clients: 1,
        mode: Mode::KeepAlive,
        warmup,
        window,
        rss_pid: Some(server.pid()),
    };
    let health = load::run(&load);
    stop.store(true, Ordering::SeqCst);
    let slow_connections_open = trickler.join().map(still_open).unwrap_or(0);
    let health = health?;

    let deadline = Instant::now() + SLOW_TURN + SLOW_TURN_GRACE;
    let mut slow_turns_ok = 0;
    for handle in slow {
        while !handle.is_finished() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        if handle.is_finished() && handle.join().unwrap_or(false) {
            slow_turns_ok += 1;
        }
    }
    server.stop();
    Ok(Attack {
        health,
        slow_turns,
        slow_turns_running: running,
        slow_turns_ok,
        slow_connections,
        slow_connections_open,
    })
}

/// A number under `turns` in the health answer.
fn health_field(addr: SocketAddr, field: &str) -> Result<usize, String> {
    let mut conn = Conn::connect(addr).map_err(|e| format!("health: {e}"))?;
    let answer = conn
        .exchange(instance::health_request(addr).as_bytes())
        .map_err(|e| format!("health: {e}"))?;
    let body: Value = serde_json::from_slice(conn.body(&answer))
        .map_err(|e| format!("health answer is not JSON: {e}"))?;
    body["turns"][field]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("health answer has no turns.{field}: {body}"))
}

/// One slow turn; true if it answered with the echoed prompt.
fn slow_turn(addr: SocketAddr) -> bool {
    let body = json!({"fromInstance": "bench", "prompt": PROMPT, "depth": 0}).to_string();
    let Ok(mut conn) = Conn::connect(addr) else {
        return false;
    };
    if conn.set_read_timeout(SLOW_TURN + SLOW_TURN_GRACE).is_err() {
        return false;
    }
    let Ok(answer) = conn.exchange(instance::talk_request(addr, &body).as_bytes()) else {
        return false;
    };
    let envelope: Value = serde_json::from_slice(conn.body(&answer)).unwrap_or(Value::Null);
    answer.status == 200 && envelope["success"] == true && envelope["text"] == PROMPT
}

/// Opens the attacking connections, each having sent its first byte. They open in
/// batches smaller than the server's listen backlog, each followed by a health
/// request on a new connection: accept is first-in first-out, so its answer means the
/// batch was accepted, and no connection is lost to a full accept queue.
fn open_attackers(addr: SocketAddr) -> Vec<Option<TcpStream>> {
    let mut attackers = Vec::with_capacity(SLOW_CONNECTIONS);
    for _ in 0..SLOW_CONNECTIONS.div_ceil(ATTACK_BATCH) {
        let batch = ATTACK_BATCH.min(SLOW_CONNECTIONS - attackers.len());
        attackers.extend((0..batch).map(|_| {
            let mut stream = TcpStream::connect_timeout(&addr, load::IO_TIMEOUT).ok()?;
            stream.set_write_timeout(Some(TRICKLE_WRITE_TIMEOUT)).ok()?;
            stream.write_all(&TRICKLE_PREFIX[..1]).ok()?;
            Some(stream)
        }));
        let _ = instance::health_status(addr);
    }
    attackers.into_iter().filter(Option::is_some).collect()
}

/// Sends every connection one more byte per [`TRICKLE_PERIOD`], one connection at a
/// time, until `stop` is set (or [`TRICKLE_MAX`] passed). A connection whose write
/// fails is dropped.
fn trickle(mut conns: Vec<Option<TcpStream>>, stop: &AtomicBool) -> Vec<Option<TcpStream>> {
    let count = u32::try_from(conns.len()).unwrap_or(u32::MAX);
    if count == 0 {
        return conns;
    }
    let interval = TRICKLE_PERIOD / count;
    let ticks = TRICKLE_MAX.as_nanos() / interval.as_nanos().max(1);
    let mut sent = vec![1usize; conns.len()];
    let started = Instant::now();
    for tick in 0..u32::try_from(ticks).unwrap_or(u32::MAX) {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let due = started + interval * tick;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        let index = usize::try_from(tick % count).unwrap_or(0);
        if let Some(stream) = conns[index].as_mut() {
            let byte = TRICKLE_PREFIX
                .get(sent[index])
                .copied()
                .unwrap_or(TRICKLE_FILL);
            if stream.write_all(&[byte]).is_ok() {
                sent[index] += 1;
            } else {
                conns[index] = None;
            }
        }
    }
    conns
}

/// How many connections the server has not closed: a non-blocking read would block.
fn still_open(conns: Vec<Option<TcpStream>>) -> usize {
    conns
        .into_iter()
        .flatten()
        .filter(|stream| {
            let mut byte = [0u8; 1];
            stream.set_nonblocking(true).is_ok()
                && matches!((&*stream).read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock)
        })
        .count()
}
