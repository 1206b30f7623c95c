//! `<root>/.bus-registry.json`: who is listening where (contract section 6).
//!
//! ```json
//! {"instances": {"<name>": {"port": 1234, "pid": 42, "secret": "...", "updatedAt": "2026-01-01T00:00:00.000Z"}}}
//! ```
//!
//! Reading is forgiving: a missing, torn or malformed file is an empty registry, and
//! entries that fail validation are skipped (and dropped on the next write). Writing is
//! a read-modify-write under [`files::with_lock`], written with [`files::write_atomic`],
//! so concurrent `serve` processes never lose each other's entries.
//!
//! An entry says where an instance *was* listening; only a liveness probe ([`probe`])
//! says whether it still is. A caller sends an entry's secret only on a connection
//! whose probe matched (see `client::delegate`). [`prune`] removes entries whose probe
//! shows they are certainly stale.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::http::client::{Connection, HttpError, Response};
use crate::protocol::{self, Health, ResponseError};
use crate::secret::Secret;
use crate::{files, time};

/// The registry's file name inside the channel root.
pub const REGISTRY_FILE: &str = ".bus-registry.json";

/// A registry file larger than this is not read (it counts as unreadable).
pub const MAX_REGISTRY_BYTES: u64 = 1 << 20;

/// Longest instance name, in bytes.
pub const MAX_INSTANCE_NAME_LEN: usize = 64;

/// How long a liveness probe may take, connect included (contract section 6).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Most probes run at once by [`list`] and [`prune`].
pub const MAX_PARALLEL_PROBES: usize = 32;

/// Longest peer-supplied string (instance name, kind, status) quoted in an error.
const MAX_QUOTED_CHARS: usize = 80;

/// One registered instance. `Debug` prints the secret as `[redacted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The loopback port it listens on (1-65535).
    pub port: u16,
    /// The process id of its `serve` process.
    pub pid: u32,
    /// The bearer secret callers must present.
    pub secret: Secret,
    /// When it registered, as ISO-8601 (validated, kept as written).
    pub updated_at: String,
}

/// Whether `s` is a valid instance name: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn is_valid_instance_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_alphanumeric() => {
            bytes.len() <= MAX_INSTANCE_NAME_LEN
                && bytes[1..]
                    .iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        }
        _ => false,
    }
}

/// The registry file of the channel root `root`.
pub fn registry_path(root: &Path) -> PathBuf {
    root.join(REGISTRY_FILE)
}

/// The valid entries of the registry under `root`. A missing file is an empty registry;
/// so is a file that is not JSON or not `{"instances": {...}}` (with a warning). Invalid
/// entries are skipped with a warning.
///
/// # Errors
///
/// The file exists but can't be read.
pub fn read(root: &Path) -> io::Result<BTreeMap<String, Entry>> {
    let path = registry_path(root);
    let bytes = match files::read_regular_file(&path, MAX_REGISTRY_BYTES) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(err) if err.kind() == io::ErrorKind::InvalidData => {
            log::warn!("{}: {err}; treating it as empty", path.display());
            return Ok(BTreeMap::new());
        }
        Err(err) => return Err(err),
    };
    match parse(&bytes) {
        Ok(Parsed { entries, skipped }) => {
            for reason in skipped {
                log::warn!("{}: ignoring an entry: {reason}", path.display());
            }
            Ok(entries)
        }
        Err(reason) => {
            log::warn!("{}: {reason}; treating it as empty", path.display());
            Ok(BTreeMap::new())
        }
    }
}

/// Registers (or re-registers) `name` as listening on `port` in process `pid`, stamped
/// with the current time. Creates `root` (mode 0700) if it is missing. Invalid entries
/// already in the file are dropped; the file is left with mode 0600.
///
/// # Errors
///
/// `InvalidInput` for an invalid name, port 0 or pid 0 (none of which [`read`] would
/// accept); otherwise any I/O error creating the root, locking, reading or writing.
pub fn register(root: &Path, name: &str, port: u16, pid: u32, secret: &Secret) -> io::Result<()> {
    if !is_valid_instance_name(name) || port == 0 || pid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "registry entries need a valid instance name, a non-zero port and a non-zero pid",
        ));
    }
    files::create_dir_private(root)?;
    let path = registry_path(root);
    files::with_lock(&path, || insert_locked(root, name, port, pid, secret))
}

/// Inserts or replaces `name`'s entry; the caller holds the registry lock.
fn insert_locked(root: &Path, name: &str, port: u16, pid: u32, secret: &Secret) -> io::Result<()> {
    let path = registry_path(root);
    set_aside_if_torn(&path);
    let mut entries = read(root)?;
    entries.insert(
        name.to_owned(),
        Entry {
            port,
            pid,
            secret: secret.clone(),
            updated_at: time::now_iso8601(),
        },
    );
    write(&path, &entries)
}

/// Re-registers `name` if its entry is missing (the file was deleted, torn or
/// rewritten without it). Returns whether it wrote. An entry of another process under
/// the same name is left alone (and reported as `Ok(false)`): two live instances must
/// not take turns overwriting each other. Never waits for the lock: if another process
/// holds it, nothing is written this time (`Ok(false)`), so the event loop can call
/// this.
///
/// # Errors
///
/// As [`register`].
pub fn ensure_registered(
    root: &Path,
    name: &str,
    port: u16,
    pid: u32,
    secret: &Secret,
) -> io::Result<bool> {
    if read(root)?.contains_key(name) {
        return Ok(false);
    }
    if !is_valid_instance_name(name) || port == 0 || pid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "registry entries need a valid instance name, a non-zero port and a non-zero pid",
        ));
    }
    let written = files::try_with_lock(&registry_path(root), || {
        if read(root)?.contains_key(name) {
            return Ok(false);
        }
        insert_locked(root, name, port, pid, secret)?;
        Ok(true)
    })?;
    written.unwrap_or(Ok(false))
}

/// A registry file that is not JSON at all (torn by something that did not write it
/// atomically) is renamed to `.bus-registry.json.corrupt-<millis>` before it is
/// rewritten, so nothing is destroyed without a trace. The caller holds the lock.
fn set_aside_if_torn(path: &Path) {
    match files::read_regular_file(path, MAX_REGISTRY_BYTES) {
        Ok(bytes) if parse(&bytes).is_ok() => return,
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
        Err(_) => return,
    }
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{millis}"));
    match std::fs::rename(path, &aside) {
        Ok(()) => log::warn!(
            "{} was unreadable; moved to {}",
            path.display(),
            Path::new(&aside).display()
        ),
        Err(e) => log::warn!(
            "{}: cannot set the unreadable file aside: {e}",
            path.display()
        ),
    }
}

/// Removes `name`'s entry if, and only if, it was registered by process `pid` (so a
/// stopping process never removes its successor's entry). Returns whether it removed
/// one. A missing root or registry is not an error.
///
/// # Errors
///
/// Any I/O error locking, reading or writing the registry.
pub fn deregister(root: &Path, name: &str, pid: u32) -> io::Result<bool> {
    if !root.is_dir() {
        return Ok(false);
    }
    let path = registry_path(root);
    files::with_lock(&path, || {
        let mut entries = read(root)?;
        if entries.get(name).is_none_or(|entry| entry.pid != pid) {
            return Ok(false);
        }
        entries.remove(name);
        write(&path, &entries)?;
        Ok(true)
    })
}

/// The entry registered as `name` under `root`, if there is a valid one.
///
/// # Errors
///
/// The registry file exists but can't be read.
pub fn lookup(root: &Path, name: &str) -> io::Result<Option<Entry>> {
    Ok(read(root)?.remove(name))
}

/// A health answer that matched what the probe asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthAnswer {
    /// The fields every health answer has.
    pub health: Health,
    /// The whole answer, for display (it may carry more fields).
    pub body: Value,
}

/// Why an entry is not alive. Peer-supplied strings in the message are quoted and cut
/// short; nothing here ever holds a secret.
#[derive(Debug)]
pub enum ProbeError {
    /// No HTTP answer: refused, broken, timed out or not HTTP.
    Http(HttpError),
    /// An HTTP answer with a status other than 200.
    Status(u16),
    /// A 200 answer whose body is not a health object.
    NotHealth(ResponseError),
    /// A health answer from an instance with another name: the port changed hands.
    OtherInstance(Health),
    /// The instance answered but is not serving (`status` is not `"ok"`, e.g.
    /// `"stopping"`).
    NotReady(Health),
    /// The instance answered, but its `kind` is not one the caller accepts.
    KindNotAccepted(Health),
}

/// A peer-supplied string, quoted and cut to [`MAX_QUOTED_CHARS`].
fn quoted(s: &str) -> String {
    format!(
        "{:?}",
        protocol::truncate_chars(s.to_owned(), MAX_QUOTED_CHARS)
    )
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Http(e) => write!(f, "health check failed: {e}"),
            ProbeError::Status(status) => write!(f, "health check answered HTTP {status}"),
            ProbeError::NotHealth(e) => write!(f, "health check answer is not valid: {e}"),
            ProbeError::OtherInstance(h) => write!(
                f,
                "the port is held by another instance ({})",
                quoted(&h.instance)
            ),
            ProbeError::NotReady(h) => {
                write!(
                    f,
                    "the instance is not serving (status {})",
                    quoted(&h.status)
                )
            }
            ProbeError::KindNotAccepted(h) => {
                write!(f, "the instance's kind {} is not accepted", quoted(&h.kind))
            }
        }
    }
}

impl std::error::Error for ProbeError {}

impl ProbeError {
    /// Whether the entry is certainly stale, so that [`prune`] may remove it: nothing
    /// listens on its port, or whatever does is not that instance (not HTTP, not a
    /// health endpoint, or another instance's). A timeout or a broken connection is
    /// not proof (the instance may be overloaded), and an instance that answers as
    /// itself but is stopping or of another kind is still there.
    pub fn is_stale(&self) -> bool {
        match self {
            ProbeError::Http(HttpError::Connect(_) | HttpError::Malformed(_))
            | ProbeError::Http(HttpError::Closed)
            | ProbeError::Status(_)
            | ProbeError::NotHealth(_)
            | ProbeError::OtherInstance(_) => true,
            ProbeError::Http(
                HttpError::NotLoopback(_)
                | HttpError::Timeout
                | HttpError::Io(_)
                | HttpError::UnsendableSecret,
            )
            | ProbeError::NotReady(_)
            | ProbeError::KindNotAccepted(_) => false,
        }
    }
}

/// Probes, on an open connection, whether the instance `name` answers there: `GET
/// /api/health` answered by `deadline` with 200, `status: "ok"`, `instance` equal to
/// `name`, and (unless `accept_kinds` is `None`) a `kind` in `accept_kinds`. The
/// connection stays usable for a following request when the server keeps it open.
///
/// # Errors
///
/// The first of those conditions that does not hold.
pub fn probe_on(
    connection: &mut Connection,
    name: &str,
    accept_kinds: Option<&[String]>,
    deadline: Instant,
) -> Result<HealthAnswer, ProbeError> {
    let response = connection.get_health(deadline).map_err(ProbeError::Http)?;
    check_health(&response, Some(name), accept_kinds)
}

/// Checks a `GET /api/health` answer: 200, a health object, `instance` equal to `name`
/// (unless `name` is `None`), `status: "ok"`, and (unless `accept_kinds` is `None`) a
/// `kind` in `accept_kinds`.
///
/// # Errors
///
/// The first of those conditions that does not hold.
pub fn check_health(
    response: &Response,
    name: Option<&str>,
    accept_kinds: Option<&[String]>,
) -> Result<HealthAnswer, ProbeError> {
    if response.status != 200 {
        return Err(ProbeError::Status(response.status));
    }
    let health = protocol::parse_health(&response.body).map_err(ProbeError::NotHealth)?;
    let body: Value = serde_json::from_slice(&response.body)
        .map_err(|_| ProbeError::NotHealth(ResponseError::NotJson))?;
    if name.is_some_and(|name| health.instance != name) {
        return Err(ProbeError::OtherInstance(health));
    }
    if health.status != "ok" {
        return Err(ProbeError::NotReady(health));
    }
    if let Some(kinds) = accept_kinds {
        if !kinds.contains(&health.kind) {
            return Err(ProbeError::KindNotAccepted(health));
        }
    }
    Ok(HealthAnswer { health, body })
}

/// Probes whether the instance `name` answers on `127.0.0.1:port`, within
/// [`PROBE_TIMEOUT`]; see [`probe_on`].
///
/// # Errors
///
/// As [`probe_on`], plus a failure to connect.
pub fn probe(
    name: &str,
    port: u16,
    accept_kinds: Option<&[String]>,
) -> Result<HealthAnswer, ProbeError> {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut connection = Connection::open_local(port, deadline).map_err(ProbeError::Http)?;
    probe_on(&mut connection, name, accept_kinds, deadline)
}

/// One registry entry with the outcome of its liveness probe.
#[derive(Debug)]
pub struct Listed {
    /// The instance's name.
    pub name: String,
    /// Its registry entry.
    pub entry: Entry,
    /// Its health answer if it is alive, else why not.
    pub liveness: Result<HealthAnswer, ProbeError>,
}

/// Probes every entry, [`MAX_PARALLEL_PROBES`] at a time, so that a registry full of
/// unresponsive ports costs about one [`PROBE_TIMEOUT`], not one per entry.
fn probe_all(entries: BTreeMap<String, Entry>, accept_kinds: Option<&[String]>) -> Vec<Listed> {
    let entries: Vec<(String, Entry)> = entries.into_iter().collect();
    let mut listed = Vec::with_capacity(entries.len());
    for batch in entries.chunks(MAX_PARALLEL_PROBES) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|(name, entry)| {
                    let spawned = std::thread::Builder::new()
                        .name(format!("probe-{name}"))
                        .spawn_scoped(scope, move || probe(name, entry.port, accept_kinds));
                    (name, entry, spawned)
                })
                .collect();
            for (name, entry, spawned) in handles {
                let liveness = match spawned {
                    // A probe never panics; if one did, the entry is not known to be
                    // alive, nor known to be stale.
                    Ok(handle) => handle.join().unwrap_or(Err(ProbeError::Http(HttpError::Io(
                        io::Error::other("the probe failed unexpectedly"),
                    )))),
                    // No thread to spare: probe here instead.
                    Err(_) => probe(name, entry.port, accept_kinds),
                };
                listed.push(Listed {
                    name: name.clone(),
                    entry: entry.clone(),
                    liveness,
                });
            }
        });
    }
    listed
}

/// Every valid entry under `root`, by name, each with its liveness probe (kinds
/// checked against `accept_kinds` unless it is `None`).
///
/// # Errors
///
/// The registry file exists but can't be read.
pub fn list(root: &Path, accept_kinds: Option<&[String]>) -> io::Result<Vec<Listed>> {
    Ok(probe_all(read(root)?, accept_kinds))
}

/// Removes the entries whose probe shows they are stale ([`ProbeError::is_stale`]) and
/// returns their names. Probes run without the lock; the removal then happens under
/// it, and only for entries that did not change meanwhile, so an instance that
/// re-registered in between is kept.
///
/// # Errors
///
/// Any I/O error reading, locking or writing the registry.
pub fn prune(root: &Path) -> io::Result<Vec<String>> {
    let entries = read(root)?;
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let stale: Vec<Listed> = probe_all(entries, None)
        .into_iter()
        .filter(|listed| listed.liveness.as_ref().is_err_and(ProbeError::is_stale))
        .collect();
    if stale.is_empty() {
        return Ok(Vec::new());
    }
    let path = registry_path(root);
    files::with_lock(&path, || {
        let mut current = read(root)?;
        let mut removed = Vec::new();
        for listed in stale {
            if current.get(&listed.name) == Some(&listed.entry) {
                current.remove(&listed.name);
                removed.push(listed.name);
            }
        }
        if !removed.is_empty() {
            write(&path, &current)?;
        }
        Ok(removed)
    })
}

/// The entry of `name` if a process answers on its port as that instance with
/// `status: "ok"`, of any kind: an instance of that name is running.
///
/// # Errors
///
/// The registry file exists but can't be read.
pub fn running(root: &Path, name: &str) -> io::Result<Option<Entry>> {
    let Some(entry) = lookup(root, name)? else {
        return Ok(None);
    };
    Ok(probe(name, entry.port, None).is_ok().then_some(entry))
}

/// Writes `entries` as the whole registry.
fn write(path: &Path, entries: &BTreeMap<String, Entry>) -> io::Result<()> {
    let instances: Map<String, Value> = entries
        .iter()
        .map(|(name, entry)| {
            let mut fields = Map::new();
            fields.insert("port".into(), entry.port.into());
            fields.insert("pid".into(), entry.pid.into());
            fields.insert("secret".into(), entry.secret.expose().into());
            fields.insert("updatedAt".into(), entry.updated_at.as_str().into());
            (name.clone(), Value::Object(fields))
        })
        .collect();
    let mut document = Map::new();
    document.insert("instances".into(), Value::Object(instances));
    let mut bytes =
        serde_json::to_vec_pretty(&Value::Object(document)).map_err(io::Error::other)?;
    bytes.push(b'\n');
    files::write_atomic(path, &bytes, files::PRIVATE_FILE_MODE)
}

/// What a registry file holds.
struct Parsed {
    /// The valid entries.
    entries: BTreeMap<String, Entry>,
    /// Why each invalid entry was skipped. Never contains a secret.
    skipped: Vec<String>,
}

/// Parses a registry file, or says why the whole file is unusable.
fn parse(bytes: &[u8]) -> Result<Parsed, &'static str> {
    let document: Value = serde_json::from_slice(bytes).map_err(|_| "not valid JSON")?;
    let Some(Value::Object(instances)) = document.get("instances") else {
        return Err("not of the form {\"instances\": {...}}");
    };
    let mut entries = BTreeMap::new();
    let mut skipped = Vec::new();
    for (name, value) in instances {
        if !is_valid_instance_name(name) {
            skipped.push("invalid instance name".to_owned());
            continue;
        }
        match parse_entry(value) {
            Ok(entry) => {
                entries.insert(name.clone(), entry);
            }
            Err(reason) => skipped.push(format!("{name}: {reason}")),
        }
    }
    Ok(Parsed { entries, skipped })
}

fn parse_entry(value: &Value) -> Result<Entry, &'static str> {
    let port = value
        .get("port")
        .and_then(integer)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&port| port != 0)
        .ok_or("port must be an integer from 1 to 65535")?;
    let pid = value
        .get("pid")
        .and_then(integer)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&pid| pid != 0)
        .ok_or("pid must be a positive integer")?;
    let secret = value
        .get("secret")
        .and_then(Value::as_str)
        .and_then(Secret::new)
        .ok_or("secret must be a non-empty string")?;
    let updated_at = value
        .get("updatedAt")
        .and_then(Value::as_str)
        .filter(|s| time::parse_iso8601(s).is_some())
        .ok_or("updatedAt must be an ISO-8601 time")?;
    Ok(Entry {
        port,
        pid,
        secret,
        updated_at: updated_at.to_owned(),
    })
}

/// A JSON number that is a non-negative integer (`42` or `42.0`).
fn integer(value: &Value) -> Option<u64> {
    let number = value.as_number()?;
    if let Some(n) = number.as_u64() {
        return Some(n);
    }
    let f = number.as_f64()?;
    // Only integral values up to u32::MAX matter to callers; larger ones fail their
    // range checks after the saturating cast.
    (f.fract() == 0.0 && f >= 0.0).then_some(f as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::thread;

    fn secret(s: &str) -> Secret {
        Secret::new(s).unwrap()
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn instance_names() {
        let long_ok = "a".repeat(64);
        let too_long = "a".repeat(65);
        let cases = [
            ("a", true),
            ("Z9", true),
            ("worker-1", true),
            ("my.bot_2", true),
            ("0", true),
            (long_ok.as_str(), true),
            (too_long.as_str(), false),
            ("", false),
            ("-a", false),
            (".hidden", false),
            ("_a", false),
            ("a b", false),
            ("a/b", false),
            ("é", false),
            ("a\n", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_valid_instance_name(name), want, "{name:?}");
        }
    }

    #[test]
    fn register_read_round_trip_with_private_modes() {
        let dir = TestDir::new("registry");
        let root = dir.path().join("channel");

        register(&root, "alpha", 4100, 11, &secret("s-alpha")).unwrap();
        register(&root, "beta", 4200, 22, &secret("s-beta")).unwrap();
        register(&root, "alpha", 4101, 12, &secret("s-alpha2")).unwrap();

        let entries = read(&root).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["alpha", "beta"]);
        let alpha = &entries["alpha"];
        assert_eq!((alpha.port, alpha.pid), (4101, 12));
        assert_eq!(alpha.secret.expose(), "s-alpha2");
        assert!(time::parse_iso8601(&alpha.updated_at).is_some());
        assert_eq!(entries["beta"].port, 4200);

        assert_eq!(mode_of(&root), 0o700);
        assert_eq!(mode_of(&registry_path(&root)), 0o600);
        let raw: Value =
            serde_json::from_slice(&std::fs::read(registry_path(&root)).unwrap()).unwrap();
        assert_eq!(raw["instances"]["beta"]["secret"], "s-beta");
        assert_eq!(raw["instances"]["beta"]["pid"], 22);
    }

    #[test]
    fn register_refuses_what_read_would_skip() {
        let dir = TestDir::new("registry-refuse");
        let cases = [("bad name", 1, 1), ("ok", 0, 1), ("ok", 1, 0)];
        for (name, port, pid) in cases {
            let err = register(dir.path(), name, port, pid, &secret("s")).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidInput,
                "{name} {port} {pid}"
            );
        }
        assert!(read(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn deregister_needs_the_matching_pid() {
        let dir = TestDir::new("registry-dereg");
        let root = dir.path();
        assert!(!deregister(&root.join("absent"), "a", 1).unwrap());
        assert!(!deregister(root, "a", 1).unwrap());

        register(root, "a", 5000, 100, &secret("x")).unwrap();
        register(root, "b", 5001, 200, &secret("y")).unwrap();
        assert!(!deregister(root, "a", 101).unwrap());
        assert!(!deregister(root, "c", 100).unwrap());
        assert!(read(root).unwrap().contains_key("a"));

        assert!(deregister(root, "a", 100).unwrap());
        let entries = read(root).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["b"]);
        assert!(!deregister(root, "a", 100).unwrap());
    }

    #[test]
    fn invalid_entries_are_ignored_then_dropped() {
        let dir = TestDir::new("registry-invalid");
        let root = dir.path();
        let t = "2026-01-01T00:00:00.000Z";
        let raw = serde_json::json!({
            "instances": {
                "good": {"port": 4000, "pid": 1, "secret": "s", "updatedAt": t},
                "float-ok": {"port": 4001.0, "pid": 2.0, "secret": "s", "updatedAt": t},
                "port-zero": {"port": 0, "pid": 1, "secret": "s", "updatedAt": t},
                "port-big": {"port": 65536, "pid": 1, "secret": "s", "updatedAt": t},
                "port-string": {"port": "4000", "pid": 1, "secret": "s", "updatedAt": t},
                "port-frac": {"port": 4000.5, "pid": 1, "secret": "s", "updatedAt": t},
                "pid-zero": {"port": 4000, "pid": 0, "secret": "s", "updatedAt": t},
                "pid-negative": {"port": 4000, "pid": -5, "secret": "s", "updatedAt": t},
                "pid-big": {"port": 4000, "pid": 4_294_967_296u64, "secret": "s", "updatedAt": t},
                "secret-empty": {"port": 4000, "pid": 1, "secret": "", "updatedAt": t},
                "secret-number": {"port": 4000, "pid": 1, "secret": 7, "updatedAt": t},
                "time-bad": {"port": 4000, "pid": 1, "secret": "s", "updatedAt": "yesterday"},
                "time-missing": {"port": 4000, "pid": 1, "secret": "s"},
                "not-object": 4000,
                "-bad-name": {"port": 4000, "pid": 1, "secret": "s", "updatedAt": t},
            },
            "otherTopLevel": true
        });
        std::fs::write(registry_path(root), raw.to_string()).unwrap();

        let entries = read(root).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["float-ok", "good"]);
        assert_eq!(
            (entries["float-ok"].port, entries["float-ok"].pid),
            (4001, 2)
        );
        assert_eq!(entries["good"].updated_at, t);

        register(root, "new", 4500, 3, &secret("n")).unwrap();
        let rewritten: Value =
            serde_json::from_slice(&std::fs::read(registry_path(root)).unwrap()).unwrap();
        let names: Vec<&String> = rewritten["instances"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["float-ok", "good", "new"]);
        assert_eq!(rewritten["instances"]["float-ok"]["port"], 4001);
    }

    #[test]
    fn garbage_registry_is_empty_and_register_recovers() {
        let dir = TestDir::new("registry-garbage");
        let root = dir.path();
        let cases: &[&[u8]] = &[
            b"{\"instances\": {\"a\": {\"port\": 1",
            b"",
            b"\x00\xff",
            b"[]",
            b"{\"instances\": []}",
            b"{\"other\": {}}",
        ];
        for bytes in cases {
            std::fs::write(registry_path(root), bytes).unwrap();
            assert!(read(root).unwrap().is_empty(), "{bytes:?}");
            register(root, "a", 4000, 1, &secret("s")).unwrap();
            assert_eq!(read(root).unwrap().len(), 1, "{bytes:?}");
        }
    }

    #[test]
    fn concurrent_registrations_lose_nothing() {
        const THREADS: u16 = 20;
        let dir = TestDir::new("registry-threads");
        let root = Arc::new(dir.path().join("root"));
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let root = Arc::clone(&root);
                thread::spawn(move || {
                    let name = format!("inst-{i}");
                    register(&root, &name, 6000 + i, 1000 + u32::from(i), &secret(&name))
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap().unwrap();
        }
        let entries = read(&root).unwrap();
        assert_eq!(entries.len(), usize::from(THREADS));
        for i in 0..THREADS {
            let entry = &entries[&format!("inst-{i}")];
            assert_eq!((entry.port, entry.pid), (6000 + i, 1000 + u32::from(i)));
        }
    }

    fn health(kind: &str, instance: &str, status: &str) -> Health {
        Health {
            kind: kind.into(),
            instance: instance.into(),
            status: status.into(),
            pid: 1,
        }
    }

    #[test]
    fn health_check_table() {
        let kinds = ["loopbus".to_owned(), "cc-telegram-bridge".to_owned()];
        let answer = |status: u16, body: &str| Response {
            status,
            body: body.as_bytes().to_vec(),
        };
        let ok = r#"{"kind":"loopbus","instance":"w","status":"ok","pid":3,"extra":[1]}"#;
        // (answer, expected name, kinds, Ok or the error's variant name)
        type Row<'a> = (Response, Option<&'a str>, Option<&'a [String]>, &'a str);
        let cases: Vec<Row> = vec![
            (answer(200, ok), Some("w"), Some(&kinds), "ok"),
            (answer(200, ok), None, Some(&kinds), "ok"),
            (answer(200, ok), Some("w"), None, "ok"),
            (
                answer(
                    200,
                    r#"{"kind":"cc-telegram-bridge","instance":"w","status":"ok"}"#,
                ),
                Some("w"),
                Some(&kinds),
                "ok",
            ),
            (answer(200, ok), Some("v"), Some(&kinds), "OtherInstance"),
            (answer(200, ok), Some("w"), Some(&[]), "KindNotAccepted"),
            (
                answer(
                    200,
                    r#"{"kind":"loopbus","instance":"w","status":"stopping"}"#,
                ),
                Some("w"),
                Some(&kinds),
                "NotReady",
            ),
            (answer(404, ok), Some("w"), Some(&kinds), "Status"),
            (answer(200, "<html>"), Some("w"), Some(&kinds), "NotHealth"),
            (
                answer(200, r#"{"instance":"w","status":"ok"}"#),
                Some("w"),
                Some(&kinds),
                "NotHealth",
            ),
        ];
        for (response, name, kinds, want) in cases {
            let got = match check_health(&response, name, kinds) {
                Ok(answer) => {
                    assert_eq!(
                        answer.body["extra"].is_array(),
                        response.body.ends_with(b"[1]}")
                    );
                    "ok".to_owned()
                }
                Err(e) => format!("{e:?}").split('(').next().unwrap_or("").to_owned(),
            };
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&response.body));
        }
    }

    #[test]
    fn staleness_table() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        let cases = [
            (ProbeError::Http(HttpError::Connect(refused())), true),
            (ProbeError::Http(HttpError::Malformed("x")), true),
            (ProbeError::Http(HttpError::Closed), true),
            (ProbeError::Status(404), true),
            (ProbeError::NotHealth(ResponseError::NotJson), true),
            (
                ProbeError::OtherInstance(health("loopbus", "other", "ok")),
                true,
            ),
            (ProbeError::Http(HttpError::Timeout), false),
            (ProbeError::Http(HttpError::Io(refused())), false),
            (
                ProbeError::NotReady(health("loopbus", "w", "stopping")),
                false,
            ),
            (
                ProbeError::KindNotAccepted(health("other", "w", "ok")),
                false,
            ),
        ];
        for (error, stale) in cases {
            assert_eq!(error.is_stale(), stale, "{error:?}");
        }
        let long = "x".repeat(500);
        let shown = ProbeError::OtherInstance(health("loopbus", &long, "ok")).to_string();
        assert!(shown.len() < 200, "peer strings are cut: {shown}");
    }

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    #[test]
    fn lookup_probe_and_prune_of_dead_entries() {
        let dir = TestDir::new("registry-prune");
        let root = dir.path();
        assert!(prune(&root.join("absent")).unwrap().is_empty());
        assert!(lookup(root, "a").unwrap().is_none());

        register(root, "a", closed_port(), 10, &secret("sa")).unwrap();
        register(root, "b", closed_port(), 11, &secret("sb")).unwrap();
        assert_eq!(lookup(root, "a").unwrap().map(|e| e.pid), Some(10));
        assert!(lookup(root, "c").unwrap().is_none());
        assert!(running(root, "a").unwrap().is_none());

        let listed = list(root, None).unwrap();
        assert_eq!(listed.len(), 2);
        for l in &listed {
            let err = l.liveness.as_ref().unwrap_err();
            assert!(err.is_stale(), "{err}");
        }
        assert_eq!(prune(root).unwrap(), ["a", "b"]);
        assert!(read(root).unwrap().is_empty());
        assert!(prune(root).unwrap().is_empty());
    }

    #[test]
    fn entry_debug_redacts_the_secret() {
        let entry = Entry {
            port: 1,
            pid: 2,
            secret: secret("top-secret-value"),
            updated_at: "2026-01-01T00:00:00.000Z".into(),
        };
        let shown = format!("{entry:?}");
        assert!(!shown.contains("top-secret-value"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
}
