//! Real `loopbus serve` processes for the bench: a private channel root, configs,
//! start (learning the port from the registry), health probes, and a clean stop.

use crate::load::{self, Conn};
use serde_json::Value;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long `serve` may take to register and answer health before the bench gives up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between two looks at the registry while an instance starts.
const REGISTRY_POLL: Duration = Duration::from_millis(5);
/// Pause between two health probes while timing start-up.
const STARTUP_POLL: Duration = Duration::from_micros(200);
/// How long `serve` gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);
/// Pause between two checks that a stopping instance exited.
const EXIT_POLL: Duration = Duration::from_millis(5);
/// The bus secret pinned in every bench config.
pub const SECRET: &str = "bench-secret-0123456789abcdef";

/// A private channel root in the temp directory, removed on drop.
pub struct Root {
    path: PathBuf,
}

impl Root {
    /// Creates `<tmp>/loopbus-bench-<pid>` with mode 0700.
    ///
    /// # Errors
    /// The directory could not be created.
    pub fn new() -> io::Result<Root> {
        let path = std::env::temp_dir().join(format!("loopbus-bench-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Root { path })
    }

    /// The state directory of instance `name`.
    pub fn state_dir(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `<root>/<name>/config.json` (mode 0600).
    ///
    /// # Errors
    /// A directory or the file could not be written.
    pub fn write_config(&self, name: &str, config: &Value) -> io::Result<PathBuf> {
        let dir = self.state_dir(name);
        DirBuilder::new().mode(0o700).recursive(true).create(&dir)?;
        let path = dir.join("config.json");
        let _ = fs::remove_file(&path);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        serde_json::to_writer_pretty(file, config).map_err(io::Error::other)?;
        Ok(path)
    }

    /// The registry's entry for `name`, as `(port, pid)`.
    fn registered(&self, name: &str) -> Option<(u16, u32)> {
        let bytes = fs::read(self.path.join(".bus-registry.json")).ok()?;
        let registry: Value = serde_json::from_slice(&bytes).ok()?;
        let entry = registry.get("instances")?.get(name)?;
        let port = u16::try_from(entry.get("port")?.as_u64()?).ok()?;
        let pid = u32::try_from(entry.get("pid")?.as_u64()?).ok()?;
        Some((port, pid))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A config for a bench instance: every peer allowed, the bench secret, and the
/// given extra `bus` fields and top-level fields merged in.
pub fn config(bus_extra: &Value, top_extra: &Value) -> Value {
    let mut config = serde_json::json!({"bus": {"peers": "*", "secret": SECRET}});
    if let (Some(bus), Some(extra)) = (config["bus"].as_object_mut(), bus_extra.as_object()) {
        bus.extend(extra.clone());
    }
    if let (Some(top), Some(extra)) = (config.as_object_mut(), top_extra.as_object()) {
        top.extend(extra.clone());
    }
    config
}

/// A running `loopbus serve`. Stopped (SIGTERM, then SIGKILL) on drop.
pub struct Server {
    child: Option<Child>,
    /// The instance's name.
    pub name: String,
    /// Its listening address.
    pub addr: SocketAddr,
    stderr_path: PathBuf,
}

impl Server {
    /// Starts `bin serve` for `name` with `config` on an OS-chosen port, and waits
    /// until it is registered and answers health.
    ///
    /// # Errors
    /// The config could not be written, or the instance did not come up in time
    /// (the message carries its stderr).
    pub fn start(bin: &Path, root: &Root, name: &str, config: &Value) -> Result<Server, String> {
        root.write_config(name, config)
            .map_err(|e| format!("cannot write the config of {name}: {e}"))?;
        let mut server = Server::spawn(bin, root, name, &["--port", "0"])?;
        let deadline = Instant::now() + START_TIMEOUT;
        let pid = server.pid();
        loop {
            if let Some((port, registered_pid)) = root.registered(name) {
                if registered_pid == pid {
                    server.addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
                    break;
                }
            }
            server.check_alive(deadline)?;
            thread::sleep(REGISTRY_POLL);
        }
        if health_status(server.addr) != Some(200) {
            return Err(format!(
                "{name} is registered but health does not answer 200\nstderr:\n{}",
                server.stderr()
            ));
        }
        Ok(server)
    }

    /// Starts `bin serve` for an existing config on `port`, and returns it with the
    /// time from just before the spawn to the first 200 from `GET /api/health`.
    ///
    /// # Errors
    /// The instance exited or did not answer within the start timeout.
    pub fn start_timed(
        bin: &Path,
        root: &Root,
        name: &str,
        port: u16,
    ) -> Result<(Server, Duration), String> {
        let started = Instant::now();
        let mut server = Server::spawn(bin, root, name, &["--port", &port.to_string()])?;
        server.addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let deadline = started + START_TIMEOUT;
        loop {
            if health_status(server.addr) == Some(200) {
                return Ok((server, started.elapsed()));
            }
            server.check_alive(deadline)?;
            thread::sleep(STARTUP_POLL);
        }
    }

    fn spawn(bin: &Path, root: &Root, name: &str, extra: &[&str]) -> Result<Server, String> {
        let stderr_path = root.path.join(format!("{name}.stderr"));
        let stderr = File::create(&stderr_path)
            .map_err(|e| format!("cannot create {}: {e}", stderr_path.display()))?;
        let child = Command::new(bin)
            .arg("serve")
            .arg("--state-dir")
            .arg(root.state_dir(name))
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("LOOPBUS_STATE_DIR")
            .env_remove("LOOPBUS_DEPTH")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        Ok(Server {
            child: Some(child),
            name: name.to_owned(),
            addr: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
            stderr_path,
        })
    }

    /// Fails if the process exited or `deadline` passed.
    fn check_alive(&mut self, deadline: Instant) -> Result<(), String> {
        let exited = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = exited {
            return Err(format!(
                "loopbus serve for {} exited with {status} before answering\nstderr:\n{}",
                self.name,
                self.stderr()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "loopbus serve for {} did not answer within {START_TIMEOUT:?}\nstderr:\n{}",
                self.name,
                self.stderr()
            ));
        }
        Ok(())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Its current VmRSS in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        load::rss_kib(self.pid())
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after [`STOP_TIMEOUT`]).
    pub fn stop(mut self) -> Option<ExitStatus> {
        self.terminate()
    }

    fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).ok()?)?;
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => thread::sleep(EXIT_POLL),
                Err(_) => break,
            }
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// A loopback port that was free a moment ago.
///
/// # Errors
/// No port could be bound.
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// `GET /api/health` on a new connection; the status, or `None` if nothing answered.
pub fn health_status(addr: SocketAddr) -> Option<u16> {
    let mut conn = Conn::connect(addr).ok()?;
    conn.exchange(health_request(addr).as_bytes())
        .ok()
        .map(|a| a.status)
}

/// The health request the bench sends.
pub fn health_request(addr: SocketAddr) -> String {
    format!("GET /api/health HTTP/1.1\r\nHost: {addr}\r\n\r\n")
}

/// An authorized talk request with `body`.
pub fn talk_request(addr: SocketAddr, body: &str) -> String {
    format!(
        "POST /api/talk HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
