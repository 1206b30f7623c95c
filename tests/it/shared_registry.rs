//! One channel root shared with the original implementation (issue 12, contract 6):
//! the registry lock is its lock directory, both programs' entries survive each other's
//! rewrites, and stale locks of either program are recovered.
//!
//! The stand-in registry writer below is ours, written from the facts the issue lists
//! about the original: it takes `<root>/.bus-registry.json.lock` with `mkdir`, writes
//! `owner.json`, retries every 10 ms, clears a lock whose owner is gone or older than
//! 30 s (or, without a readable owner.json, whose directory is older than 30 s), keeps
//! fields it does not know, and writes atomically; its older releases write without a
//! lock and without a rename.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::{json, Map, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The stand-in's lock poll and stale age (the original's values).
const STANDIN_POLL: Duration = Duration::from_millis(10);
const STANDIN_STALE: Duration = Duration::from_secs(30);
/// How long the stand-in waits for the lock before the test fails.
const STANDIN_PATIENCE: Duration = Duration::from_secs(20);

fn registry_path(root: &Path) -> PathBuf {
    root.join(".bus-registry.json")
}

fn lock_path(root: &Path) -> PathBuf {
    root.join(".bus-registry.json.lock")
}

fn pid_alive(pid: u64) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    rustix::process::test_kill_process(pid) != Err(rustix::io::Errno::SRCH)
}

/// Whether the stand-in would take the lock directory `lock` as stale.
fn standin_is_stale(lock: &Path) -> bool {
    let owner: Option<Value> = fs::read(lock.join("owner.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let old = |t: SystemTime| {
        SystemTime::now()
            .duration_since(t)
            .is_ok_and(|age| age > STANDIN_STALE)
    };
    match owner {
        Some(owner) if owner["pid"].is_u64() => {
            let acquired = owner["acquiredAt"]
                .as_str()
                .and_then(parse_iso_seconds)
                .unwrap_or(SystemTime::UNIX_EPOCH);
            !pid_alive(owner["pid"].as_u64().unwrap()) || old(acquired)
        }
        _ => fs::metadata(lock).and_then(|m| m.modified()).is_ok_and(old),
    }
}

/// `YYYY-MM-DDTHH:MM:SS...` to a time, to the second: enough for a 30 s stale age.
fn parse_iso_seconds(s: &str) -> Option<SystemTime> {
    let num = |range: std::ops::Range<usize>| s.get(range)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (the proleptic Gregorian calendar).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Takes the registry lock the original's way; returns the lock directory.
fn standin_lock(root: &Path) -> PathBuf {
    let lock = lock_path(root);
    let deadline = Instant::now() + STANDIN_PATIENCE;
    loop {
        match fs::create_dir(&lock) {
            Ok(()) => {
                let owner = json!({
                    "pid": std::process::id(),
                    "acquiredAt": loopbus::now_iso8601(),
                });
                fs::write(lock.join("owner.json"), owner.to_string()).unwrap();
                return lock;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match fs::symlink_metadata(&lock) {
                    // Released in between: try again.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    other => assert!(
                        other.unwrap().is_dir(),
                        "the registry lock is not a directory"
                    ),
                }
                if standin_is_stale(&lock) {
                    let _ = fs::remove_dir_all(&lock);
                    continue;
                }
                assert!(Instant::now() < deadline, "the stand-in never got the lock");
                std::thread::sleep(STANDIN_POLL);
            }
            Err(e) => panic!("the stand-in cannot lock the registry: {e}"),
        }
    }
}

/// How the stand-in writes the registry.
#[derive(Clone, Copy, PartialEq)]
enum Writer {
    /// Its current releases: under the lock, written to a temp file then renamed.
    Locked,
    /// Its older releases: no lock, written in place.
    Old,
}

/// One read-modify-write of the registry's `instances` by the stand-in.
fn standin_update(root: &Path, writer: Writer, change: impl FnOnce(&mut Map<String, Value>)) {
    let lock = (writer == Writer::Locked).then(|| standin_lock(root));
    let path = registry_path(root);
    let mut document = fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter(|d| d["instances"].is_object())
        .unwrap_or_else(|| json!({"instances": {}}));
    change(document["instances"].as_object_mut().unwrap());
    let bytes = serde_json::to_vec_pretty(&document).unwrap();
    match writer {
        Writer::Locked => {
            let temp = root.join(format!(
                ".bus-registry.json.standin-{:?}",
                std::thread::current().id()
            ));
            fs::write(&temp, &bytes).unwrap();
            fs::rename(&temp, &path).unwrap();
        }
        Writer::Old => fs::write(&path, &bytes).unwrap(),
    }
    if let Some(lock) = lock {
        fs::remove_dir_all(lock).unwrap();
    }
}

/// The stand-in's own entry for `name`, with a field loopbus does not know.
fn standin_entry(port: u16, chat: u64) -> Value {
    json!({
        "port": port,
        "pid": std::process::id(),
        "secret": format!("standin-secret-{port}"),
        "updatedAt": loopbus::now_iso8601(),
        "telegramChat": chat,
    })
}

fn standin_register(root: &Path, writer: Writer, name: &str, entry: Value) {
    standin_update(root, writer, |instances| {
        // The original prunes entries whose process is gone.
        instances.retain(|_, e| e["pid"].as_u64().is_none_or(pid_alive));
        instances.insert(name.to_owned(), entry);
    });
}

fn standin_deregister(root: &Path, writer: Writer, name: &str) {
    standin_update(root, writer, |instances| {
        instances.remove(name);
    });
}

/// The pid of a process that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn loopbus_and_the_original_share_one_registry_concurrently() {
    const EACH: usize = 20;
    let root = TestRoot::new("shared-reg");
    // Entries of processes that are gone: whoever writes first prunes them.
    let ghost = dead_pid();
    standin_update(&root.path, Writer::Locked, |instances| {
        for i in 0..3 {
            let mut entry = standin_entry(4000 + i, 0);
            entry["pid"] = json!(ghost);
            instances.insert(format!("ghost-{i}"), entry);
        }
    });
    for i in 0..EACH {
        root.write_config(
            &format!("lb-{i}"),
            &open_config(&format!("s{i}-0123456789abcdef")),
        );
    }

    let standins = std::thread::scope(|scope| {
        let loopbus: Vec<_> = (0..EACH)
            .map(|i| {
                let root = &root;
                scope.spawn(move || Instance::spawn(root, &format!("lb-{i}"), &[]))
            })
            .collect();
        let standins: Vec<_> = (0..EACH)
            .map(|i| {
                let root = &root.path;
                scope.spawn(move || {
                    let name = format!("bridge-{i}");
                    let port = 5000 + u16::try_from(i).unwrap();
                    // Start, stop, start again: it ends up registered.
                    standin_register(root, Writer::Locked, &name, standin_entry(port, 1));
                    standin_deregister(root, Writer::Locked, &name);
                    let entry = standin_entry(port, 1);
                    standin_register(root, Writer::Locked, &name, entry.clone());
                    (name, entry)
                })
            })
            .collect();
        let mut instances: Vec<Instance> = loopbus.into_iter().map(|h| h.join().unwrap()).collect();
        // Half the loopbus instances stop again while the stand-ins are at work.
        let stopped: Vec<Instance> = instances.drain(..EACH / 2).collect();
        let stopping: Vec<_> = stopped
            .into_iter()
            .map(|mut instance| {
                scope.spawn(move || {
                    let status = instance.terminate(Duration::from_secs(20));
                    assert_eq!(status.code(), Some(0), "{}", instance.describe());
                    instance.name.clone()
                })
            })
            .collect();
        let standins: Vec<(String, Value)> =
            standins.into_iter().map(|h| h.join().unwrap()).collect();
        let stopped: Vec<String> = stopping.into_iter().map(|h| h.join().unwrap()).collect();
        (standins, stopped, instances)
    });
    let (standins, stopped, running) = standins;

    let registry = root.registry();
    let listed = registry["instances"].as_object().unwrap();
    for (name, entry) in &standins {
        assert_eq!(&listed[name.as_str()], entry, "{name} in {registry:#}");
    }
    for instance in &running {
        let entry = &listed[instance.name.as_str()];
        assert_eq!(entry["pid"], u64::from(instance.pid()), "{registry:#}");
        assert_eq!(entry["port"], instance.port, "{registry:#}");
        assert_eq!(entry["secret"], instance.secret.as_str());
        assert_eq!(instance.health()["instance"], instance.name.as_str());
    }
    for name in &stopped {
        assert!(
            listed.get(name.as_str()).is_none(),
            "{name} in {registry:#}"
        );
    }
    for i in 0..3 {
        assert!(listed.get(&format!("ghost-{i}")).is_none(), "{registry:#}");
    }
    assert_eq!(listed.len(), standins.len() + running.len(), "{registry:#}");
    assert!(
        eventually(Duration::from_secs(10), || !lock_path(&root.path).exists()),
        "a lock was left behind"
    );
}

#[test]
fn an_old_writer_without_lock_or_rename_loses_nothing_of_loopbus_and_keeps_its_own() {
    let root = TestRoot::new("shared-reg-old");
    standin_register(&root.path, Writer::Old, "bridge", standin_entry(5100, 7));
    let mut alpha = root.start("alpha", &open_config("sa-0123456789abcdef"));
    let registry = root.registry();
    assert_eq!(registry["instances"]["bridge"]["telegramChat"], 7);
    // The old writer rewrites with alpha's entry in it, as it found it.
    standin_register(&root.path, Writer::Old, "other", standin_entry(5101, 8));
    let after = root.registry();
    assert_eq!(
        after["instances"]["alpha"], registry["instances"]["alpha"],
        "{after:#}"
    );
    assert_eq!(alpha.terminate(Duration::from_secs(10)).code(), Some(0));
    let last = root.registry();
    assert!(last["instances"].get("alpha").is_none(), "{last:#}");
    assert_eq!(last["instances"]["bridge"], registry["instances"]["bridge"]);
    assert_eq!(last["instances"]["other"], after["instances"]["other"]);
}

/// Starts `alpha` with a leftover at the lock's name and expects it to register.
fn serve_recovers(label: &str, plant: impl FnOnce(&Path)) {
    let root = TestRoot::new(label);
    plant(&lock_path(&root.path));
    let alpha = root.start("alpha", &open_config("sa-0123456789abcdef"));
    let lock = lock_path(&root.path);
    // The entry is visible just before the lock is released.
    assert!(
        eventually(Duration::from_secs(10), || !lock.exists()),
        "{label}: {}",
        alpha.describe()
    );
    assert_eq!(
        root.registry()["instances"]["alpha"]["pid"],
        u64::from(alpha.pid())
    );
}

fn owner_json(lock: &Path, pid: u32, acquired: SystemTime) {
    fs::create_dir(lock).unwrap();
    let acquired_at = iso(acquired);
    let owner = json!({"pid": pid, "acquiredAt": acquired_at});
    fs::write(lock.join("owner.json"), owner.to_string()).unwrap();
}

/// A time as ISO-8601 in UTC with milliseconds (the inverse of
/// [`parse_iso_seconds`], for the owner files planted here).
fn iso(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let secs = i64::try_from(since.as_secs()).unwrap();
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

#[test]
fn bug_a_stale_lock_directory_of_a_killed_writer_made_serve_exit() {
    serve_recovers("stale-dead-pid", |lock| {
        owner_json(lock, dead_pid(), SystemTime::now());
    });
    serve_recovers("stale-old-owner", |lock| {
        // A live pid (this test's), but the lock was taken 31 s ago.
        owner_json(
            lock,
            std::process::id(),
            SystemTime::now() - Duration::from_secs(31),
        );
    });
    serve_recovers("stale-no-owner", |lock| {
        // A writer killed between mkdir and owner.json, 31 s ago.
        fs::create_dir(lock).unwrap();
        let dir = fs::File::open(lock).unwrap();
        dir.set_modified(SystemTime::now() - Duration::from_secs(31))
            .unwrap();
    });
}

/// No release ever locked the registry with a lock *file*, so one at the lock's name
/// is not ours to remove: `serve` refuses to register and says what to do.
#[test]
fn a_file_at_the_locks_name_is_refused_not_removed() {
    let root = TestRoot::new("lock-file");
    fs::write(lock_path(&root.path), b"").unwrap();
    let dir = root.state_dir("alpha");
    root.write_config("alpha", &open_config("sa-0123456789abcdef"));
    let output = run(&["serve", "--state-dir", dir.to_str().unwrap()], &[], None);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not a lock directory; remove it"),
        "{stderr}"
    );
    assert!(lock_path(&root.path).is_file());
}

#[test]
fn bug_the_lock_file_of_todays_loopbus_locked_the_original_out() {
    // The original can lock the root once loopbus has written there: loopbus leaves
    // no lock file behind.
    let root = TestRoot::new("lock-file-after");
    let _alpha = root.start("alpha", &open_config("sa-0123456789abcdef"));
    standin_register(&root.path, Writer::Locked, "bridge", standin_entry(5200, 1));
    assert_eq!(root.registry()["instances"]["bridge"]["telegramChat"], 1);
    assert!(root.registry()["instances"]["alpha"].is_object());
}

#[test]
fn the_iso_helpers_agree() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    assert_eq!(iso(t), "2026-01-01T00:00:00.000Z");
    assert_eq!(parse_iso_seconds("2026-01-01T00:00:00.000Z"), Some(t));
    let now = SystemTime::now();
    let back = parse_iso_seconds(&iso(now)).unwrap();
    assert!(now.duration_since(back).unwrap() < Duration::from_secs(1));
}
