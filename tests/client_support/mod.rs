//! Helpers for the client and discovery tests: fake peers (tiny HTTP servers on
//! threads that answer however a test needs), registry entries written by hand, and
//! `loopbus talk` runs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::common::{describe, run, TestRoot};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One request a fake peer received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// What a fake peer does with a request.
pub enum Answer {
    /// A response with this status and body (Content-Length framed, keep-alive).
    Respond(u16, Vec<u8>),
    /// Never answer; hold the connection until the peer is dropped.
    Hang,
}

impl Answer {
    pub fn json(status: u16, body: &Value) -> Answer {
        Answer::Respond(status, body.to_string().into_bytes())
    }
}

/// A health answer for `instance` of kind `loopbus`.
pub fn health_of(instance: &str) -> Answer {
    Answer::json(
        200,
        &json!({"kind": "loopbus", "instance": instance, "status": "ok", "pid": 1,
                "protocolVersion": 1, "capabilities": ["structured-errors", "retryable-errors"]}),
    )
}

type Handler = dyn Fn(&Seen) -> Answer + Send + Sync;

/// A tiny HTTP/1.1 server on a thread, answering through `handler` and recording
/// every request. Stops on drop.
pub struct FakePeer {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakePeer {
    pub fn start(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> FakePeer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (seen, stop, handler) =
                        (Arc::clone(&seen), Arc::clone(&stop), Arc::clone(&handler));
                    std::thread::spawn(move || serve_connection(stream, &seen, &stop, &*handler));
                }
            })
        };
        FakePeer {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// A peer that answers health as `name` and every talk with `talk`.
    pub fn answering(name: &str, talk: Answer) -> FakePeer {
        let name = name.to_owned();
        let talk = Mutex::new(Some(talk));
        FakePeer::start(move |request| {
            if request.path == "/api/health" {
                health_of(&name)
            } else {
                match talk.lock().unwrap().as_ref() {
                    Some(Answer::Respond(status, body)) => Answer::Respond(*status, body.clone()),
                    _ => Answer::Hang,
                }
            }
        })
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_connection(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    stop: &AtomicBool,
    handler: &Handler,
) {
    // Answers go out in one write, at once: a head and a body written apart, with
    // Nagle's algorithm on, wait for the client's delayed ACK (about 40 ms) before the
    // body leaves, and that wait counts against the client's 500 ms health-probe bound.
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        // Parse one complete request out of the buffer, if there is one.
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        let parsed = match request.parse(&buffer) {
            Ok(httparse::Status::Complete(len)) => {
                let headers: Vec<(String, String)> = request
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let length: usize = headers
                    .iter()
                    .find(|(n, _)| n == "content-length")
                    .map_or(0, |(_, v)| v.trim().parse().unwrap());
                (buffer.len() >= len + length)
                    .then(|| Seen {
                        method: request.method.unwrap().to_owned(),
                        path: request.path.unwrap().to_owned(),
                        headers,
                        body: buffer[len..len + length].to_vec(),
                    })
                    .map(|seen| (seen, len + length))
            }
            Ok(httparse::Status::Partial) => None,
            Err(_) => return,
        };
        if let Some((request, used)) = parsed {
            buffer.drain(..used);
            seen.lock().unwrap().push(request.clone());
            match handler(&request) {
                Answer::Respond(status, body) => {
                    let mut answer = format!(
                        "HTTP/1.1 {status} Fake\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    answer.extend_from_slice(&body);
                    if stream.write_all(&answer).is_err() {
                        return;
                    }
                }
                Answer::Hang => {
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    return;
                }
            }
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// Adds (or replaces) `name` in the registry under `root`, written by hand.
pub fn register_by_hand(root: &Path, name: &str, port: u16, pid: u32, secret: &str) {
    let path = root.join(".bus-registry.json");
    let mut registry: Value = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .filter(|v: &Value| v["instances"].is_object())
        .unwrap_or_else(|| json!({"instances": {}}));
    registry["instances"][name] = json!({"port": port, "pid": pid, "secret": secret, "updatedAt": "2026-01-01T00:00:00.000Z"});
    std::fs::write(&path, registry.to_string()).unwrap();
}

/// A port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A finished `loopbus talk`, with what it printed.
pub struct Talk {
    pub output: Output,
    pub args: Vec<String>,
    pub took: Duration,
}

impl Talk {
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// stdout as the JSON envelope `--json` prints.
    pub fn envelope(&self) -> Value {
        serde_json::from_slice(&self.output.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{}", self.describe()))
    }

    pub fn describe(&self) -> String {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        describe(&args, &self.output)
    }

    /// Asserts the exit status and, from the `--json` envelope, code and retryable.
    pub fn assert_failure(&self, exit: i32, code: &str, retryable: bool) -> Value {
        assert_eq!(self.code(), Some(exit), "{}", self.describe());
        let envelope = self.envelope();
        assert_eq!(envelope["success"], false, "{}", self.describe());
        assert_eq!(envelope["errorCode"], code, "{}", self.describe());
        assert_eq!(envelope["retryable"], retryable, "{}", self.describe());
        assert_eq!(envelope["text"], "", "{}", self.describe());
        // A legacy peer's own failure keeps its absent protocolVersion (issue 12).
        assert!(
            envelope.get("protocolVersion").is_none() || envelope["protocolVersion"] == 1,
            "{}",
            self.describe()
        );
        assert!(
            envelope["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}",
            self.describe()
        );
        assert!(self.stderr().contains(code), "{}", self.describe());
        envelope
    }
}

/// What `loopbus talk` prints when the target's health probe got no answer within the
/// client's fixed 500 ms bound (`registry::PROBE_TIMEOUT`).
pub const PROBE_TIMED_OUT: &str = "health check failed: no answer in time";

/// How many times [`talk`] runs a talk whose health probe timed out.
pub const PROBE_ATTEMPTS: usize = 5;

/// Runs `loopbus talk ARGS...` as the instance whose state directory is `state_dir`.
///
/// A run whose health probe got no answer within the client's fixed 500 ms bound is run
/// again, up to [`PROBE_ATTEMPTS`] times in all: on a loaded machine the peer (a fake
/// peer's thread, or a `serve` process) may not be scheduled within 500 ms, and that
/// says nothing about the row a test checks. Nothing but the probe was sent in such a
/// run (the secret and the talk go out only after a matching probe), so running it
/// again has no other effect. A probe that never answers still fails every attempt;
/// tests of the probe bound itself use [`talk_once`].
pub fn talk(state_dir: &Path, args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Talk {
    let mut attempt = 1;
    loop {
        let t = talk_once(state_dir, args, env, stdin);
        if attempt == PROBE_ATTEMPTS || !t.stderr().contains(PROBE_TIMED_OUT) {
            return t;
        }
        eprintln!(
            "note: attempt {attempt}: the health probe timed out (a loaded machine?); again\n{}",
            t.describe()
        );
        attempt += 1;
    }
}

/// What a health probe's timeout reads as wherever it is shown (`talk`, `health`,
/// `list`): the HTTP layer's message for a deadline that passed.
pub const NO_ANSWER_IN_TIME: &str = "no answer in time";

/// Runs the binary like [`run`], again (up to [`PROBE_ATTEMPTS`] times in all) while
/// its output says a health probe timed out. For `health` and `list` runs against
/// instances that are alive: on a loaded machine one may not be scheduled within the
/// probe's fixed 500 ms bound, which says nothing about what the test checks.
pub fn run_probing(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut attempt = 1;
    loop {
        let out = run(args, env, None);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if attempt == PROBE_ATTEMPTS || !said.contains(NO_ANSWER_IN_TIME) {
            return out;
        }
        eprintln!(
            "note: attempt {attempt}: a health probe timed out (a loaded machine?); again\n{}",
            describe(args, &out)
        );
        attempt += 1;
    }
}

/// Runs `loopbus talk ARGS...` once, as [`talk`] without its retry of probe timeouts.
pub fn talk_once(
    state_dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&str>,
) -> Talk {
    let mut all = vec![
        "talk".to_owned(),
        "--state-dir".to_owned(),
        state_dir.display().to_string(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let started = Instant::now();
    let output = run(&refs, env, stdin);
    Talk {
        output,
        args: all,
        took: started.elapsed(),
    }
}

/// `loopbus list --root ROOT --json`: the instances it lists.
pub fn list_json(root: &TestRoot) -> Vec<Value> {
    let root_arg = root.path.display().to_string();
    let args = ["list", "--root", root_arg.as_str(), "--json"];
    let out = run_probing(&args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", describe(&args, &out)));
    v["instances"].as_array().unwrap().clone()
}
