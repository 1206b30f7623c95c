//! Shared harness for integration tests: temp channel roots, real `loopbus serve`
//! processes on port 0, and a raw HTTP/1.1 client over loopback.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the harness looks again at something it waits for (a registration, an
/// exit, a condition): often enough that waiting adds little to a test, rarely enough
/// to cost little CPU next to the servers it polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Path of the binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_loopbus")
}

/// A temp directory (a channel root) removed on drop.
pub struct TestRoot {
    pub path: PathBuf,
}

impl TestRoot {
    pub fn new(label: &str) -> TestRoot {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "loopbus-test-{label}-{}-{n}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestRoot { path }
    }

    pub fn state_dir(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `<root>/<name>/config.json` (mode 0600).
    pub fn write_config(&self, name: &str, config: &Value) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.state_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    /// The registry as JSON; `Null` when it is missing, not JSON, or not a regular file
    /// (a test may put a FIFO there, and reading one would block).
    pub fn registry(&self) -> Value {
        let path = self.path.join(".bus-registry.json");
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            return Value::Null;
        }
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    /// Starts `loopbus serve` for `name` with `config` and waits until it is registered.
    pub fn start(&self, name: &str, config: &Value) -> Instance {
        self.write_config(name, config);
        Instance::spawn(self, name, &[])
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A config with the bus enabled, every peer allowed and a known secret.
pub fn open_config(secret: &str) -> Value {
    serde_json::json!({"bus": {"peers": "*", "secret": secret}})
}

/// A running `loopbus serve`. Killed on drop.
pub struct Instance {
    pub name: String,
    pub port: u16,
    pub secret: String,
    pub child: Option<Child>,
    pub stderr_path: PathBuf,
    pub state_dir: PathBuf,
    /// The command line it was started with, for failure messages.
    pub command: String,
    /// Where its stdout goes (`None`: nowhere).
    pub stdout_path: Option<PathBuf>,
}

impl Instance {
    pub fn spawn(root: &TestRoot, name: &str, extra_args: &[&str]) -> Instance {
        Self::spawn_with_env(root, name, extra_args, &[])
    }

    pub fn spawn_with_env(
        root: &TestRoot,
        name: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Instance {
        Self::spawn_via(root, name, Command::new(bin()), extra_args, env)
    }

    /// Like [`Instance::spawn`], with the open-files limit (`ulimit -n`) set to `limit`.
    pub fn spawn_with_fd_limit(root: &TestRoot, name: &str, limit: u32) -> Instance {
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
            .arg(bin());
        Self::spawn_via(root, name, shell, &[], &[])
    }

    /// Runs `command` with `serve --state-dir DIR` and `extra_args` appended, and waits
    /// until it is registered. `command` must end up exec'ing the binary (same pid).
    fn spawn_via(
        root: &TestRoot,
        name: &str,
        mut command: Command,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Instance {
        fd_limit(); // raise it first: the server inherits it
        let state_dir = root.state_dir(name);
        let stderr_path = root.path.join(format!("{name}.stderr"));
        let stdout_path = root.path.join(format!("{name}.stdout"));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let stdout = std::fs::File::create(&stdout_path).unwrap();
        command
            .arg("serve")
            .arg("--state-dir")
            .arg(&state_dir)
            .args(extra_args)
            .env("HOME", no_home())
            .env_remove("LOOPBUS_ROOT")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        for (k, v) in env {
            command.env(k, v);
        }
        let command_line = format!("{command:?}");
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {command_line}: {e}"));
        let pid = child.id();
        let mut instance = Instance {
            name: name.to_owned(),
            port: 0,
            secret: String::new(),
            child: Some(child),
            stderr_path,
            state_dir,
            command: command_line,
            stdout_path: Some(stdout_path),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let registry = root.registry();
            let entry = &registry["instances"][name];
            if entry["pid"].as_u64() == Some(u64::from(pid)) {
                instance.port = u16::try_from(entry["port"].as_u64().unwrap()).unwrap();
                instance.secret = entry["secret"].as_str().unwrap().to_owned();
                return instance;
            }
            if let Some(status) = instance.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "loopbus serve for {name} exited with {status} before registering\n{}",
                    instance.describe()
                );
            }
            assert!(
                Instant::now() < deadline,
                "loopbus serve for {name} did not register in time\n{}",
                instance.describe()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The command, its stdout and its stderr so far, for failure messages.
    pub fn describe(&self) -> String {
        let stdout = match &self.stdout_path {
            Some(path) => std::fs::read_to_string(path).unwrap_or_default(),
            None => "(not kept)".to_owned(),
        };
        format!(
            "command: {}\nstdout:\n{stdout}\nstderr:\n{}",
            self.command,
            self.stderr()
        )
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sends SIGTERM and waits for the exit status (at most `limit`).
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        signal(self.pid(), "TERM");
        self.wait(limit)
    }

    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "instance did not exit in time\n{}",
                self.describe()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// `GET /api/health`, asserting it answers with 200 within a few seconds.
    pub fn health(&self) -> Value {
        let response = request(
            self.port,
            &format!("GET /api/health HTTP/1.1\r\nHost: {}\r\n\r\n", self.host()),
        );
        assert_eq!(
            response.status,
            200,
            "health: {response:?}\n{}",
            self.describe()
        );
        response.json()
    }

    /// A well-formed, authorized talk with `body`.
    pub fn talk_body(&self, body: &Value) -> HttpResponse {
        let body = body.to_string();
        let head = format!(
            "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host(),
            self.secret,
            body.len()
        );
        request(self.port, &(head + &body))
    }

    /// The raw bytes of a well-formed, authorized legacy (unversioned) talk.
    pub fn talk_request(&self, from: &str, prompt: &str, depth: u64) -> Vec<u8> {
        let body =
            serde_json::json!({"fromInstance": from, "prompt": prompt, "depth": depth}).to_string();
        format!(
            "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n{body}",
            self.host(),
            self.secret,
            body.len()
        )
        .into_bytes()
    }

    /// Sends a talk from another thread; join the handle for its answer.
    pub fn spawn_talk(&self, prompt: &str) -> std::thread::JoinHandle<HttpResponse> {
        let port = self.port;
        let raw = self.talk_request("c", prompt, 0);
        std::thread::spawn(move || request_bytes(port, &raw))
    }

    pub fn talk(&self, from: &str, prompt: &str, depth: u64) -> HttpResponse {
        self.talk_body(&serde_json::json!({
            "fromInstance": from, "prompt": prompt, "depth": depth, "protocolVersion": 1,
            "capabilities": ["structured-errors", "retryable-errors"]
        }))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends the signal `name` (`TERM`, `INT`, `KILL`, `STOP`, `CONT`, `HUP`, `QUIT`, `USR1`,
/// `USR2`, `ALRM`) to `pid`.
pub fn signal(pid: u32, name: &str) {
    use rustix::process::Signal;
    let signal = match name {
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "KILL" => Signal::KILL,
        "STOP" => Signal::STOP,
        "CONT" => Signal::CONT,
        "HUP" => Signal::HUP,
        "QUIT" => Signal::QUIT,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "ALRM" => Signal::ALARM,
        other => panic!("no signal named {other:?} in the test harness"),
    };
    send_signal(pid, signal);
}

/// Sends `signal` to `pid`, failing the test if it can't be sent.
pub fn send_signal(pid: u32, signal: rustix::process::Signal) {
    if let Err(e) = try_signal(pid, signal) {
        panic!("kill({pid}, {signal:?}) failed: {e}");
    }
}

/// Sends `signal` to `pid`; an error if there is no such process (any more).
pub fn try_signal(pid: u32, signal: rustix::process::Signal) -> std::io::Result<()> {
    let raw = rustix::process::RawPid::try_from(pid).map_err(std::io::Error::other)?;
    let target = rustix::process::Pid::from_raw(raw)
        .ok_or_else(|| std::io::Error::other("pid 0 is not a process"))?;
    Ok(rustix::process::kill_process(target, signal)?)
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Sends `raw` on a new connection and reads one response.
pub fn request(port: u16, raw: &str) -> HttpResponse {
    request_bytes(port, raw.as_bytes())
}

pub fn request_bytes(port: u16, raw: &[u8]) -> HttpResponse {
    let mut stream = connect(port);
    let head = |raw: &[u8]| {
        let text = String::from_utf8_lossy(raw);
        text.lines().next().unwrap_or_default().to_owned()
    };
    stream
        .write_all(raw)
        .unwrap_or_else(|e| panic!("port {port}: cannot send {:?}: {e}", head(raw)));
    read_response(&mut stream)
        .unwrap_or_else(|| panic!("port {port}: no response to {:?}", head(raw)))
}

/// Reads one response (head + Content-Length body) from `stream`.
pub fn read_response(stream: &mut TcpStream) -> Option<HttpResponse> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(_) => buf.push(byte[0]),
        }
    }
    let head = String::from_utf8(buf).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some(HttpResponse {
        status,
        headers,
        body,
    })
}

/// A `HOME` that does not exist: a command that falls back to the default channel
/// root (`~/.loopbus`) finds nothing there and creates nothing, and never touches the
/// real one. A test that wants a home passes its own `HOME`.
pub fn no_home() -> PathBuf {
    std::env::temp_dir().join("loopbus-test-no-home/missing")
}

/// Runs the binary with `args` and `env`, returning its output.
pub fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut command = Command::new(bin());
    command
        .args(args)
        .env("HOME", no_home())
        .env_remove("LOOPBUS_ROOT")
        .env_remove("LOOPBUS_STATE_DIR")
        .env_remove("LOOPBUS_DEPTH")
        .env_remove("LOOPBUS_TRACE_ID")
        .env_remove("LOOPBUS_REQUEST_ID")
        .env_remove("TRACEPARENT");
    for (k, v) in env {
        command.env(k, v);
    }
    command.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Describes a finished command for assertion messages.
pub fn describe(args: &[&str], output: &Output) -> String {
    format!(
        "command: loopbus {}\nstatus: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Polls `f` until it returns true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    f()
}

pub fn file_mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------
// Expectations written from the spec, independent of src/.

/// The capabilities every v1 answer advertises (bus-protocol.md, contract section 4).
pub const CAPABILITIES: [&str; 2] = ["structured-errors", "retryable-errors"];

/// The largest accepted `/api/talk` body (contract section 3, check 4).
pub const MAX_BODY: usize = 262_144;

/// How long `/api/health` may take to answer in liveness checks. Generous on purpose:
/// tests run in parallel on small machines; this is "still answering", not a benchmark.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(2);

/// The retry table of bus-protocol.md plus contract section 4.
pub fn expected_retryable(code: &str) -> bool {
    match code {
        "invalid_request" | "request_too_large" | "bus_disabled" | "auth_failed"
        | "peer_not_allowed" | "max_depth_exceeded" | "budget_exhausted" | "auth"
        | "write_permission" | "file_workflow" | "workflow_state" | "session_state" => false,
        "invalid_handler_response"
        | "internal_error"
        | "instance_unavailable"
        | "invalid_response"
        | "timeout"
        | "telegram_conflict"
        | "telegram_delivery"
        | "engine_cli"
        | "unknown"
        | "server_busy" => true,
        other => panic!("no retry expectation for error code {other:?}"),
    }
}

/// Asserts the headers every response carries (contract section 3).
pub fn assert_standard_headers(r: &HttpResponse, context: &str) {
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{context}: Content-Type: {r:?}"
    );
    let length = r
        .header("content-length")
        .unwrap_or_else(|| panic!("{context}: no Content-Length: {r:?}"));
    assert_eq!(
        length.parse::<usize>().ok(),
        Some(r.body.len()),
        "{context}: Content-Length: {r:?}"
    );
    assert_eq!(
        r.header("cache-control"),
        Some("no-store"),
        "{context}: Cache-Control: {r:?}"
    );
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{context}: X-Content-Type-Options: {r:?}"
    );
    for (name, _) in &r.headers {
        assert!(
            !name.to_ascii_lowercase().starts_with("access-control-"),
            "{context}: CORS header {name}: {r:?}"
        );
    }
}

/// Asserts the v1 fields shared by success and failure envelopes.
fn assert_v1_common(v: &Value, instance: &str, context: &str) {
    assert_eq!(v["fromInstance"], instance, "{context}: fromInstance: {v}");
    assert_eq!(v["protocolVersion"], 1, "{context}: protocolVersion: {v}");
    assert_eq!(
        v["capabilities"],
        serde_json::json!(CAPABILITIES),
        "{context}: capabilities: {v}"
    );
    assert!(v["durationMs"].is_u64(), "{context}: durationMs: {v}");
}

/// Asserts `r` is a v1 failure envelope from `instance` with `status` and `code`, the
/// retryable flag of the retry table, and the standard headers.
pub fn assert_failure(r: &HttpResponse, instance: &str, status: u16, code: &str, context: &str) {
    assert_eq!(r.status, status, "{context}: status: {r:?}");
    assert_standard_headers(r, context);
    let v = r.json();
    assert_eq!(v["success"], false, "{context}: success: {v}");
    assert_eq!(v["text"], "", "{context}: text: {v}");
    assert_eq!(v["errorCode"], code, "{context}: errorCode: {v}");
    assert_eq!(
        v["retryable"],
        expected_retryable(code),
        "{context}: retryable: {v}"
    );
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{context}: error text: {v}"
    );
    assert_v1_common(&v, instance, context);
}

/// Asserts `r` is a 200 v1 success envelope from `instance` whose text is `text`.
pub fn assert_success(r: &HttpResponse, instance: &str, text: &str, context: &str) {
    assert_eq!(r.status, 200, "{context}: status: {r:?}");
    assert_standard_headers(r, context);
    let v = r.json();
    assert_eq!(v["success"], true, "{context}: success: {v}");
    assert_eq!(v["text"], text, "{context}: text: {v}");
    assert!(v.get("errorCode").is_none(), "{context}: errorCode: {v}");
    assert_v1_common(&v, instance, context);
}

// ---------------------------------------------------------------------------------------
// Building raw requests.

/// A raw HTTP/1.1 request. `Content-Length` is computed from the body unless a test set
/// or removed it explicitly.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub auto_length: bool,
}

impl Req {
    pub fn new(method: &str, path: &str) -> Req {
        Req {
            method: method.to_owned(),
            path: path.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            auto_length: false,
        }
    }

    /// A well-formed, authorized talk to `instance` from `alice` at depth 0.
    pub fn talk(instance: &Instance) -> Req {
        Req::new("POST", "/api/talk")
            .header("Host", &instance.host())
            .header("Authorization", &format!("Bearer {}", instance.secret))
            .header("Content-Type", "application/json")
            .json(&serde_json::json!({
                "fromInstance": "alice", "prompt": "hi", "depth": 0,
                "protocolVersion": 1, "capabilities": CAPABILITIES
            }))
    }

    /// `GET /api/health` to `instance`.
    pub fn health(instance: &Instance) -> Req {
        Req::new("GET", "/api/health").header("Host", &instance.host())
    }

    /// Adds a header (even if one with that name exists).
    pub fn header(mut self, name: &str, value: &str) -> Req {
        if name.eq_ignore_ascii_case("content-length") {
            self.auto_length = false;
        }
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Replaces every header `name` with one `name: value`.
    pub fn set(self, name: &str, value: &str) -> Req {
        self.without(name).header(name, value)
    }

    /// Removes every header `name` (for `Content-Length`: sends none at all).
    pub fn without(mut self, name: &str) -> Req {
        if name.eq_ignore_ascii_case("content-length") {
            self.auto_length = false;
        }
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    /// Sets the body; `Content-Length` follows it.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Req {
        self.headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case("content-length"));
        self.auto_length = true;
        self.body = body.into();
        self
    }

    pub fn json(self, body: &Value) -> Req {
        self.body(body.to_string())
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.path).into_bytes();
        for (name, value) in &self.headers {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if self.auto_length {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }

    /// Sends the request on a new connection and reads one response.
    pub fn send(&self, port: u16) -> HttpResponse {
        request_bytes(port, &self.to_bytes())
    }
}

/// Reads until EOF (or `limit`); true when the peer closed the connection in time.
pub fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            // A reset is a close too.
            Err(_) => return true,
        }
    }
}

/// `GET /api/health` on a fresh connection, failing unless it answers 200 within `bound`.
pub fn health_within(port: u16, bound: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), bound)
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(bound)).unwrap();
    stream.set_write_timeout(Some(bound)).unwrap();
    stream
        .write_all(format!("GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let response = read_response(&mut stream).ok_or("no response")?;
    let took = started.elapsed();
    if response.status != 200 {
        return Err(format!("status {}", response.status));
    }
    if took > bound {
        return Err(format!("answered after {took:?}"));
    }
    Ok(took)
}

impl Instance {
    /// Asserts the process is still running and `/api/health` answers 200 within
    /// [`LIVENESS_BOUND`].
    pub fn assert_alive(&mut self, context: &str) {
        if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
            panic!(
                "{context}: loopbus exited with {status}\n{}",
                self.describe()
            );
        }
        if let Err(e) = health_within(self.port, LIVENESS_BOUND) {
            panic!("{context}: health failed: {e}\n{}", self.describe());
        }
    }

    /// Replaces config.json atomically (temp file + rename), as an editor would.
    pub fn write_config(&self, config: &Value) {
        write_file_atomic(
            &self.state_dir.join("config.json"),
            &serde_json::to_vec_pretty(config).unwrap(),
        );
    }

    /// Waits until stderr contains `needle`.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) -> bool {
        eventually(limit, || self.stderr().contains(needle))
    }
}

/// Writes `bytes` to `path` through a temp file and a rename, mode 0600.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp-test");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The open-files soft limit of this test process. The first call raises it towards
/// 16,384 (within the hard limit), so that the connection-flood tests also run under a
/// default `ulimit -n` of 1,024. Servers spawned afterwards inherit it.
pub fn fd_limit() -> u64 {
    use rustix::process::{getrlimit, prlimit, Resource, Rlimit};
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // `None` is "unlimited".
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        let soft = current.unwrap_or(u64::MAX);
        let want = maximum.unwrap_or(u64::MAX).min(16_384);
        if soft < want {
            let raised = Rlimit {
                current: Some(want),
                maximum,
            };
            if let Err(e) = prlimit(None, Resource::Nofile, raised) {
                eprintln!("note: cannot raise the open-files limit from {soft} to {want}: {e}");
            }
        }
        getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
    })
}

/// `wanted` connections, or fewer if this process's open-files limit can't hold that
/// many next to another test running at the same time (with a note on stderr).
pub fn connections_to_open(wanted: usize) -> usize {
    let room = usize::try_from(fd_limit() / 3).unwrap_or(usize::MAX);
    if room < wanted {
        eprintln!(
            "note: open-files limit {}: opening {room} connections instead of {wanted}",
            fd_limit()
        );
    }
    wanted.min(room)
}

/// The pids whose parent is `pid` (in any state), from /proc: a server's engines, and
/// the leftovers reparented to it.
pub fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(pid) {
            found.push(child);
        }
    }
    found
}

// The original TypeScript implementation's strict rules (contract 4.1), for the
// stand-ins of tests/it/original_peer.rs and tests/it/client_lifetime.rs: written from the
// contract's facts, not from its code.

/// The only capability strings the original's parsers accept.
pub const ORIGINAL_CAPABILITIES: [&str; 2] = ["structured-errors", "retryable-errors"];
/// The only top-level request fields the original's parser accepts.
pub const ORIGINAL_REQUEST_FIELDS: [&str; 6] = [
    "fromInstance",
    "prompt",
    "depth",
    "protocolVersion",
    "capabilities",
    "ext",
];

/// Why the original's request parser would reject `body`, if it would.
pub fn original_rejects_request(body: &Value) -> Option<String> {
    let Some(object) = body.as_object() else {
        return Some("not an object".into());
    };
    if let Some(field) = object
        .keys()
        .find(|k| !ORIGINAL_REQUEST_FIELDS.contains(&k.as_str()))
    {
        return Some(format!("unknown field {field}"));
    }
    if !object.get("fromInstance").is_some_and(Value::is_string)
        || !object.get("prompt").is_some_and(Value::is_string)
        || !object.get("depth").is_some_and(Value::is_u64)
    {
        return Some("a required field is missing or of the wrong type".into());
    }
    if object.get("ext").is_some_and(|ext| !ext.is_object()) {
        return Some("ext is not an object".into());
    }
    capabilities_problem(object.get("capabilities"))
}

/// Why a `capabilities` value is one the original rejects, if it is.
pub fn capabilities_problem(capabilities: Option<&Value>) -> Option<String> {
    match capabilities {
        None => None,
        Some(Value::Array(items)) => items
            .iter()
            .find(|c| {
                !c.as_str()
                    .is_some_and(|c| ORIGINAL_CAPABILITIES.contains(&c))
            })
            .map(|c| format!("capability {c} is not a base one")),
        Some(other) => Some(format!("capabilities is {other}")),
    }
}
