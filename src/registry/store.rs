//! The registry store: reading, validating and rewriting `<root>/.bus-registry.json`
//! under the registry lock (contract section 6). No network here; liveness is
//! [`probe`](mod@super::probe)'s job.

use std::collections::BTreeMap;
use std::env::var_os;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::lock;
use super::warnings::warn_once;
use crate::protocol::{non_negative_integer, InstanceName};
use crate::secret::Secret;
use crate::{files, time};

/// The registry's file name inside the channel root.
pub const REGISTRY_FILE: &str = ".bus-registry.json";

/// A registry file larger than this is not read (it counts as unreadable).
pub const MAX_REGISTRY_BYTES: u64 = 1 << 20;

/// How many times, [`lock::POLL_INTERVAL`] apart, a registry file that is not a JSON
/// object is read again before it is set aside as torn: the original implementation's
/// older releases rewrite it in place and without the lock, so a torn read may be a
/// write in progress.
const TORN_REREADS: u32 = 5;

/// A JSON object, as the registry file and its entries are rewritten.
type Object = Map<String, Value>;

/// The suffix (before `-<millis>`) of a torn registry file that was set aside.
const CORRUPT_SUFFIX: &str = "corrupt";

/// One registered instance. `Debug` prints the secret as `[redacted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryEntry {
    /// The loopback port it listens on (1-65535).
    pub port: u16,
    /// The process id of its `serve` process.
    pub pid: u32,
    /// The bearer secret callers must present.
    pub secret: Secret,
    /// When it registered, as ISO-8601 (validated, kept as written).
    pub updated_at: String,
    /// The loopback address it is bound to, the only one a client dials (`host`;
    /// absent means 127.0.0.1).
    pub host: IpAddr,
    /// Whether it answers the health proof (`proof: true`, contract 6.1): a client
    /// then sends the secret only after a valid proof.
    pub proof: bool,
}

/// The address of an entry without `host`.
pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The registry file of the channel root `root`.
pub fn registry_path(root: &Path) -> PathBuf {
    root.join(REGISTRY_FILE)
}

/// The valid entries of the registry under `root`. A missing file is an empty registry;
/// so is a file that is not JSON or not `{"instances": {...}}` (with a warning). Invalid
/// entries are skipped with a warning. Each distinct problem is warned about once per
/// process (`warnings::warn_once`).
///
/// # Errors
///
/// The file exists but can't be read.
pub fn read(root: &Path) -> io::Result<BTreeMap<InstanceName, RegistryEntry>> {
    let path = registry_path(root);
    let parsed = match read_file(root) {
        Ok(bytes) => parse(&bytes).map_err(str::to_owned),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(err) if err.kind() == io::ErrorKind::InvalidData => Err(err.to_string()),
        Err(err) => return Err(err),
    };
    let parsed = parsed.unwrap_or_else(|reason| {
        warn_once(&path, "", &[format!("{reason}; treating it as empty")]);
        Parsed::default()
    });
    warn_once(&path, "ignoring an entry: ", &parsed.skipped);
    Ok(parsed.entries)
}

/// The registry file's bytes, read as [`files::read_trusted_file`] does, in a channel
/// root that no other user owns or may write to (contract 1): its registry decides
/// where prompts and secrets go. A missing root is not refused (it has no registry,
/// so `NotFound`).
///
/// # Errors
///
/// `PermissionDenied` wrapping a [`files::Untrusted`], or an error reading the root's
/// metadata or the file.
fn read_file(root: &Path) -> io::Result<Vec<u8>> {
    match files::check_trusted(root, files::TrustKind::Dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => files::read_trusted_file(&registry_path(root), MAX_REGISTRY_BYTES),
    }
}

/// Registers (or re-registers) `name` as listening on `host` and `port` in process
/// `pid`, stamped with the current time; the entry records `proof: true` (every
/// instance of this build answers the health proof). Creates `root` (mode 0700) if it
/// is missing. Every other entry (valid or not), every top-level field and every field
/// of `name`'s old entry that loopbus does not write are kept as they were; the file
/// is left with mode 0600. Unless `taken` says that the entry another process
/// registered under `name` is of a running instance: then nothing is written and that
/// entry is returned. The check and the write are one hold of the registry lock, so of
/// two instances of one name started at once exactly one registers.
///
/// # Errors
///
/// `InvalidInput` for port 0 or pid 0 (neither of which [`read`] would accept);
/// otherwise any I/O error creating the root, locking, reading or writing.
pub fn register_at(
    root: &Path,
    name: &InstanceName,
    addr: SocketAddr,
    pid: u32,
    secret: &Secret,
    taken: impl FnOnce(&RegistryEntry) -> bool,
) -> io::Result<Option<RegistryEntry>> {
    files::create_dir_private(root)?;
    lock::with_registry_lock(root, || {
        register_locked(root, name, addr, pid, secret, taken)
    })
}

/// [`register_at`] once the caller holds the registry lock. Port 0 or pid 0 (neither of
/// which [`read`] would accept; the name is valid by its type) is `InvalidInput`.
fn register_locked(
    root: &Path,
    name: &InstanceName,
    addr: SocketAddr,
    pid: u32,
    secret: &Secret,
    taken: impl FnOnce(&RegistryEntry) -> bool,
) -> io::Result<Option<RegistryEntry>> {
    if addr.port() == 0 || pid == 0 {
        let message = "registry entries need a non-zero port and a non-zero pid";
        return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    }
    let holder = read(root)?.remove(name);
    if let Some(entry) = holder.filter(|entry| entry.pid != pid && taken(entry)) {
        return Ok(Some(entry));
    }
    let (document, mut instances) = load(root)?;
    let old = instances.get_mut(name.as_str());
    let old = old.and_then(Value::as_object_mut);
    let mut fields = old.map(std::mem::take).unwrap_or_default();
    fields.insert("port".into(), addr.port().into());
    fields.insert("pid".into(), pid.into());
    fields.insert("secret".into(), secret.expose().into());
    fields.insert("updatedAt".into(), time::now_iso8601().into());
    fields.insert("host".into(), addr.ip().to_string().into());
    fields.insert("proof".into(), true.into());
    if addr.ip() == DEFAULT_HOST {
        fields.remove("host");
    }
    instances.insert(name.to_string(), Value::Object(fields));
    save(root, document, instances).map(|()| None)
}

/// Re-registers `name` if its entry is missing (the file was deleted, torn or
/// rewritten without it). Returns whether it wrote. An entry of another process under
/// the same name is left alone (and reported as `Ok(false)`): two live instances must
/// not take turns overwriting each other. Never waits for the lock: if another process
/// holds it, nothing is written this time (`Ok(false)`) and the instance's registry
/// self-check tries again at its next round.
///
/// # Errors
///
/// As [`register_at`].
pub fn ensure_registered(
    root: &Path,
    name: &InstanceName,
    addr: SocketAddr,
    pid: u32,
    secret: &Secret,
) -> io::Result<bool> {
    if read(root)?.contains_key(name) {
        return Ok(false);
    }
    let register = || register_locked(root, name, addr, pid, secret, |_| true);
    let held = lock::within(root, std::time::Duration::ZERO, register)?;
    Ok(matches!(held, Some(None)))
}

/// Removes `name`'s entry if, and only if, it was registered by process `pid` (so a
/// stopping process never removes its successor's entry). Returns whether it removed
/// one. A missing root or registry is not an error.
///
/// # Errors
///
/// Any I/O error locking, reading or writing the registry.
pub fn deregister(root: &Path, name: &InstanceName, pid: u32) -> io::Result<bool> {
    let removed = remove_if(root, |n, entry| n == name.as_str() && entry.pid == pid)?;
    Ok(!removed.is_empty())
}

/// The entry registered as `name` under `root`, if there is a valid one.
///
/// # Errors
///
/// The registry file exists but can't be read.
pub fn lookup(root: &Path, name: &InstanceName) -> io::Result<Option<RegistryEntry>> {
    Ok(read(root)?.remove(name))
}

/// Removes, under the lock, every valid entry for which `matches` holds, and returns
/// their names; writes only when it removed one. Skips the lock only when a first read
/// parses and finds no such entry (a missing root or registry has none); a file that
/// does not parse may be a writer halfway through, which [`load`] reads again.
pub fn remove_if(
    root: &Path,
    matches: impl Fn(&str, &RegistryEntry) -> bool,
) -> io::Result<Vec<InstanceName>> {
    let first = match read_file(root) {
        Ok(bytes) => parse(&bytes).ok().map(|parsed| parsed.entries),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Some(BTreeMap::new()),
        Err(err) if err.kind() == io::ErrorKind::InvalidData => None,
        Err(err) => return Err(err),
    };
    if first.is_some_and(|entries| !entries.iter().any(|(name, entry)| matches(name, entry))) {
        return Ok(Vec::new());
    }
    lock::with_registry_lock(root, || {
        let (document, mut instances) = load(root)?;
        let removed: Vec<InstanceName> = instances
            .iter()
            .filter(|(name, value)| parse_entry(value).is_ok_and(|entry| matches(name, &entry)))
            .filter_map(|(name, _)| InstanceName::new(name.as_str()).ok())
            .collect();
        for name in &removed {
            instances.remove(name.as_str());
        }
        if !removed.is_empty() {
            save(root, document, instances)?;
        }
        Ok(removed)
    })
}

/// The registry file of `root` as a JSON document, for a rewrite that keeps everything
/// it does not change (other programs' entries, invalid entries and unknown fields
/// alike), with its `instances` taken out (empty when missing or of another shape,
/// which [`read`] treats as an empty registry; [`save`] puts them back). A missing
/// file is an empty document. A registry file that is not a JSON object (torn by something that did not write it
/// atomically) is set aside as `.bus-registry.json.corrupt-<millis>` before it is
/// rewritten, so nothing is destroyed without a trace. It is first read again up to
/// [`TORN_REREADS`] times, since a writer without the lock may be halfway through.
/// The caller holds the registry lock.
///
/// # Errors
///
/// The file exists but can't be read.
fn load(root: &Path) -> io::Result<(Object, Object)> {
    for _ in 0..=TORN_REREADS {
        match read_file(root) {
            Ok(bytes) => {
                if let Ok(Value::Object(mut document)) = serde_json::from_slice(&bytes) {
                    let instances = document.get_mut("instances").and_then(Value::as_object_mut);
                    let instances = instances.map(std::mem::take).unwrap_or_default();
                    return Ok((document, instances));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => break,
            // Another user's file is refused, not set aside: it was never ours.
            Err(e) => return Err(e),
        }
        std::thread::sleep(lock::POLL_INTERVAL);
    }
    let path = registry_path(root);
    let shown = path.display();
    match files::set_aside(&path, CORRUPT_SUFFIX) {
        Ok(aside) => log::warn!("{shown} was unreadable; moved to {}", aside.display()),
        Err(e) => log::warn!("{shown}: cannot set the unreadable file aside: {e}"),
    }
    Ok(Default::default())
}

/// Writes `document` with `instances` as the whole registry of `root`, atomically,
/// mode 0600.
fn save(root: &Path, mut document: Object, instances: Object) -> io::Result<()> {
    document.insert("instances".into(), Value::Object(instances));
    let mut bytes = serde_json::to_vec_pretty(&document).map_err(io::Error::other)?;
    bytes.push(b'\n');
    files::write_atomic(&registry_path(root), &bytes, files::PRIVATE_FILE_MODE)
}

/// What a registry file holds.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The valid entries.
    pub entries: BTreeMap<InstanceName, RegistryEntry>,
    /// Why each invalid entry was skipped. Never contains a secret.
    pub skipped: Vec<String>,
}

/// Parses a registry file, or says why the whole file is unusable. Pure; public for
/// the fuzz target only (through `loopbus::fuzzing`).
pub fn parse(bytes: &[u8]) -> Result<Parsed, &'static str> {
    let document: Value = serde_json::from_slice(bytes).map_err(|_| "not valid JSON")?;
    let Some(Value::Object(instances)) = document.get("instances") else {
        return Err("not of the form {\"instances\": {...}}");
    };
    let mut parsed = Parsed::default();
    for (name, value) in instances {
        match (InstanceName::new(name.as_str()), parse_entry(value)) {
            (Err(_), _) => parsed.skipped.push("invalid instance name".to_owned()),
            (Ok(name), Err(reason)) => parsed.skipped.push(format!("{name}: {reason}")),
            (Ok(name), Ok(entry)) => {
                parsed.entries.insert(name, entry);
            }
        }
    }
    Ok(parsed)
}

/// `value[key]` as a whole number from 1 to `T`'s largest (written as an integer or a
/// whole float), as the original implementation writes ports and pids.
pub(super) fn positive<T: TryFrom<u64>>(value: &Value, key: &str) -> Option<T> {
    let n = value.get(key).and_then(non_negative_integer)?;
    T::try_from(n).ok().filter(|_| n != 0)
}

fn parse_entry(value: &Value) -> Result<RegistryEntry, &'static str> {
    let text = |key| value.get(key).and_then(Value::as_str);
    Ok(RegistryEntry {
        port: positive(value, "port").ok_or("port must be an integer from 1 to 65535")?,
        pid: positive(value, "pid").ok_or("pid must be a positive integer")?,
        secret: text("secret")
            .and_then(Secret::new)
            .ok_or("secret must be a non-empty string")?,
        updated_at: text("updatedAt")
            .filter(|s| time::parse_iso8601(s).is_some())
            .ok_or("updatedAt must be an ISO-8601 time")?
            .to_owned(),
        // Only a loopback address is ever dialled; anything else makes the entry
        // invalid rather than quietly pointing elsewhere.
        host: match value.get("host").map(|h| h.as_str()?.parse().ok()) {
            None => DEFAULT_HOST,
            Some(host) => host
                .filter(IpAddr::is_loopback)
                .ok_or("host must be a loopback address such as \"127.0.0.1\" or \"::1\"")?,
        },
        // `proof` other than `true` (absent, false, or of another shape) is an entry
        // that does not claim to prove itself.
        proof: value.get("proof").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// The directory under `$HOME` that is the default channel root: `~/.loopbus`.
pub const DEFAULT_ROOT_DIR: &str = ".loopbus";

/// The channel root when no state directory names one (contract section 5):
/// `$LOOPBUS_ROOT`, else `$HOME/.loopbus` ([`DEFAULT_ROOT_DIR`]); `None` when neither
/// variable is set. Nothing is created here.
pub fn default_channel_root() -> Option<PathBuf> {
    let var = |name| var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("LOOPBUS_ROOT").or_else(|| var("HOME").map(|home| home.join(DEFAULT_ROOT_DIR)))
}

/// The channel root of a state directory (contract section 1): its parent, made
/// absolute. Every instance under one root shares its registry.
pub fn channel_root(state_dir: &Path) -> PathBuf {
    let absolute = absolute(state_dir);
    absolute.parent().map_or("/".into(), Path::to_path_buf)
}

/// The name an instance takes by default: its state directory's last component (of
/// the absolute path, so `.` works too). `None` when there is none or it is not UTF-8;
/// the caller still parses it as an [`InstanceName`].
pub fn default_name(state_dir: &Path) -> Option<String> {
    Some(absolute(state_dir).file_name()?.to_str()?.to_owned())
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`register_at`] on the default host.
    fn register(
        root: &Path,
        name: &InstanceName,
        port: u16,
        pid: u32,
        secret: &Secret,
    ) -> io::Result<()> {
        let addr = SocketAddr::new(DEFAULT_HOST, port);
        register_at(root, name, addr, pid, secret, |_| false).map(drop)
    }

    /// The lock directory is named after the registry file, as the original names it.
    #[test]
    fn the_lock_directory_is_named_after_the_registry_file() {
        assert_eq!(
            super::super::lock::LOCK_DIR,
            format!("{REGISTRY_FILE}.lock")
        );
    }
    use crate::files::test_support::TestDir;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::thread;

    fn secret(s: &str) -> Secret {
        Secret::new(s).unwrap()
    }

    fn name(s: &str) -> InstanceName {
        InstanceName::new(s).unwrap()
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn register_read_round_trip_with_private_modes() {
        let dir = TestDir::new("registry");
        let root = dir.path().join("channel");

        register(&root, &name("alpha"), 4100, 11, &secret("s-alpha")).unwrap();
        register(&root, &name("beta"), 4200, 22, &secret("s-beta")).unwrap();
        register(&root, &name("alpha"), 4101, 12, &secret("s-alpha2")).unwrap();

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
        // A bad name can't reach `register`: it is not an `InstanceName`.
        assert!(InstanceName::new("bad name").is_err());
        let cases = [("ok", 0, 1), ("ok", 1, 0)];
        for (text, port, pid) in cases {
            let err = register(dir.path(), &name(text), port, pid, &secret("s")).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidInput,
                "{text} {port} {pid}"
            );
        }
        assert!(read(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn deregister_needs_the_matching_pid() {
        let dir = TestDir::new("registry-dereg");
        let root = dir.path();
        assert!(!deregister(&root.join("absent"), &name("a"), 1).unwrap());
        assert!(!deregister(root, &name("a"), 1).unwrap());

        register(root, &name("a"), 5000, 100, &secret("x")).unwrap();
        register(root, &name("b"), 5001, 200, &secret("y")).unwrap();
        assert!(!deregister(root, &name("a"), 101).unwrap());
        assert!(!deregister(root, &name("c"), 100).unwrap());
        assert!(read(root).unwrap().contains_key("a"));

        assert!(deregister(root, &name("a"), 100).unwrap());
        let entries = read(root).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["b"]);
        assert!(!deregister(root, &name("a"), 100).unwrap());
    }

    #[test]
    fn bug_invalid_entries_were_dropped_on_rewrite() {
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

        register(root, &name("new"), 4500, 3, &secret("n")).unwrap();
        let rewritten: Value =
            serde_json::from_slice(&std::fs::read(registry_path(root)).unwrap()).unwrap();
        let mut want = raw.clone();
        want["instances"]["new"] = rewritten["instances"]["new"].clone();
        assert_eq!(rewritten, want, "everything else is kept as it was");
        assert_eq!(rewritten["instances"]["float-ok"]["port"], 4001.0);
        assert_eq!(rewritten["instances"]["new"]["pid"], 3);
    }

    #[test]
    fn bug_fields_of_other_programs_were_dropped_on_rewrite() {
        let dir = TestDir::new("registry-keep");
        let root = dir.path();
        let t = "2026-01-01T00:00:00.000Z";
        let raw = serde_json::json!({
            "instances": {
                "bridge": {"port": 4000, "pid": 1, "secret": "s", "updatedAt": t, "telegramChat": 1},
                "mine": {"port": 4001, "pid": 2, "secret": "s", "updatedAt": t, "note": "kept"},
                "torn-entry": {"port": "x"},
            },
            "version": 3,
            "extra": {"nested": [1, 2]}
        });
        std::fs::write(registry_path(root), raw.to_string()).unwrap();
        let reread = || -> Value {
            serde_json::from_slice(&std::fs::read(registry_path(root)).unwrap()).unwrap()
        };

        // Re-registering "mine" keeps the fields it does not write.
        register(root, &name("mine"), 4100, 20, &secret("m")).unwrap();
        let after = reread();
        assert_eq!(after["instances"]["mine"]["note"], "kept");
        assert_eq!(after["instances"]["mine"]["port"], 4100);
        assert_eq!(after["instances"]["bridge"], raw["instances"]["bridge"]);
        assert_eq!(
            after["instances"]["torn-entry"],
            raw["instances"]["torn-entry"]
        );
        assert_eq!(
            (&after["version"], &after["extra"]),
            (&raw["version"], &raw["extra"])
        );

        // A v6 registration then a v4 one: host comes and goes, unknown fields stay.
        let v6: IpAddr = "::1".parse().unwrap();
        let addr = SocketAddr::new(v6, 4101);
        register_at(root, &name("mine"), addr, 20, &secret("m"), |_| false).unwrap();
        assert_eq!(reread()["instances"]["mine"]["host"], "::1");
        register(root, &name("mine"), 4102, 20, &secret("m")).unwrap();
        assert!(reread()["instances"]["mine"].get("host").is_none());

        // Deregistering and pruning remove one entry and keep everything else.
        assert!(deregister(root, &name("mine"), 20).unwrap());
        let mut want = raw.clone();
        want["instances"].as_object_mut().unwrap().remove("mine");
        assert_eq!(reread(), want);
        let bridge = read(root).unwrap()["bridge"].clone();
        let unchanged = |n: &str, e: &RegistryEntry| n == "bridge" && *e == bridge;
        assert_eq!(remove_if(root, unchanged).unwrap(), ["bridge"]);
        want["instances"].as_object_mut().unwrap().remove("bridge");
        assert_eq!(reread(), want);
        // An invalid entry is never ours to deregister.
        assert!(!deregister(root, &name("torn-entry"), 1).unwrap());
        assert_eq!(reread(), want);
    }

    #[test]
    fn a_document_without_instances_keeps_its_other_fields() {
        let dir = TestDir::new("registry-no-instances");
        let root = dir.path();
        for raw in [
            r#"{"other": {"a": 1}}"#,
            r#"{"other": {"a": 1}, "instances": [3]}"#,
        ] {
            std::fs::write(registry_path(root), raw).unwrap();
            register(root, &name("a"), 4000, 1, &secret("s")).unwrap();
            let after: Value =
                serde_json::from_slice(&std::fs::read(registry_path(root)).unwrap()).unwrap();
            assert_eq!(after["other"], serde_json::json!({"a": 1}), "{raw}");
            assert_eq!(after["instances"]["a"]["port"], 4000, "{raw}");
        }
    }

    #[test]
    fn bug_deregister_gave_up_on_a_torn_read_of_an_in_place_writer() {
        let dir = TestDir::new("registry-dereg-torn");
        let root = dir.path().to_path_buf();
        register(&root, &name("a"), 4000, 4242, &secret("s")).unwrap();
        let path = registry_path(&root);
        let full = std::fs::read(&path).unwrap();
        // The original's older releases rewrite the file in place and without the
        // lock: deregister first finds it halfway written.
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(lock::POLL_INTERVAL * 2);
            std::fs::write(path, full).unwrap();
        });
        let removed = deregister(&root, &name("a"), 4242).unwrap();
        writer.join().unwrap();
        assert!(removed, "the entry of the exiting instance stayed behind");
        assert!(read(&root).unwrap().is_empty());
    }

    #[test]
    fn a_torn_registry_is_set_aside_under_the_lock_dir() {
        let dir = TestDir::new("registry-torn");
        let root = dir.path();
        std::fs::write(registry_path(root), b"{\"instances\": {\"a\": {\"po").unwrap();
        register(root, &name("a"), 4000, 1, &secret("s")).unwrap();
        let names: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(".bus-registry.json.corrupt-")),
            "{names:?}"
        );
        assert!(
            !lock::lock_path(root).exists(),
            "the lock is released: {names:?}"
        );
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
            register(root, &name("a"), 4000, 1, &secret("s")).unwrap();
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
                    let text = format!("inst-{i}");
                    register(
                        &root,
                        &name(&text),
                        6000 + i,
                        1000 + u32::from(i),
                        &secret(&text),
                    )
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap().unwrap();
        }
        let entries = read(&root).unwrap();
        assert_eq!(entries.len(), usize::from(THREADS));
        for i in 0..THREADS {
            let entry = &entries[format!("inst-{i}").as_str()];
            assert_eq!((entry.port, entry.pid), (6000 + i, 1000 + u32::from(i)));
        }
    }

    #[test]
    fn host_and_proof_are_recorded_and_read() {
        let dir = TestDir::new("registry-host");
        let root = dir.path();
        let v6: IpAddr = "::1".parse().unwrap();
        let addr = SocketAddr::new(v6, 4300);
        register_at(root, &name("six"), addr, 7, &secret("s6"), |_| false).unwrap();
        register(root, &name("four"), 4301, 8, &secret("s4")).unwrap();
        let entries = read(root).unwrap();
        assert_eq!((entries["six"].host, entries["six"].proof), (v6, true));
        assert_eq!(
            (entries["four"].host, entries["four"].proof),
            (DEFAULT_HOST, true)
        );
        let raw: Value =
            serde_json::from_slice(&std::fs::read(registry_path(root)).unwrap()).unwrap();
        assert_eq!(raw["instances"]["six"]["host"], "::1");
        assert_eq!(raw["instances"]["six"]["proof"], true);
        assert!(raw["instances"]["four"].get("host").is_none());

        let base = r#""port":1,"pid":2,"secret":"s","updatedAt":"2026-01-01T00:00:00.000Z""#;
        let cases: &[(&str, Option<(&str, bool)>)] = &[
            ("", Some(("127.0.0.1", false))),
            (r#","host":"::1""#, Some(("::1", false))),
            (
                r#","host":"127.0.0.1","proof":true"#,
                Some(("127.0.0.1", true)),
            ),
            (r#","proof":"yes""#, Some(("127.0.0.1", false))),
            (r#","host":"192.0.2.1""#, None),
            (r#","host":"localhost""#, None),
            (r#","host":1"#, None),
        ];
        for (extra, want) in cases {
            let value: Value = serde_json::from_str(&format!("{{{base}{extra}}}")).unwrap();
            let got = parse_entry(&value)
                .ok()
                .map(|e| (e.host.to_string(), e.proof));
            let want = want.map(|(h, p)| (h.to_owned(), p));
            assert_eq!(got, want, "{extra}");
        }
    }

    #[test]
    fn entry_debug_redacts_the_secret() {
        let entry = RegistryEntry {
            port: 1,
            pid: 2,
            secret: secret("top-secret-value"),
            updated_at: "2026-01-01T00:00:00.000Z".into(),
            host: DEFAULT_HOST,
            proof: true,
        };
        let shown = format!("{entry:?}");
        assert!(!shown.contains("top-secret-value"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
}
