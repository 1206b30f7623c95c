//! The registry lock (contract section 6): the original implementation's protocol, so
//! that loopbus and the original exclude each other when they rewrite the registry.
//!
//! The lock is the *directory* `<root>/.bus-registry.json.lock`, taken with `mkdir`
//! (mode 0700); the holder then writes `owner.json` `{"pid": N, "acquiredAt":
//! "<ISO-8601>"}` (0600) inside it, and releases the lock by removing `owner.json` and
//! the directory. A waiter retries every [`POLL_INTERVAL`] and removes a lock as stale
//! when `owner.json` names a pid that no longer exists or an `acquiredAt` older than
//! [`STALE_AGE`], or, when `owner.json` is missing or unreadable (a holder that died
//! between `mkdir` and writing it), when the directory's mtime is older than
//! [`STALE_AGE`]. Waiting is bounded by [`LOCK_PATIENCE`].
//!
//! A stale lock is first renamed to a name of its own and checked to be the very
//! directory that was judged stale (same [`Fingerprint`]) before it is removed, so a waiter that
//! judged an old lock stale can never remove the fresh lock another waiter took
//! meanwhile. Anything else at the lock's name (a file, a symlink) is refused, never
//! removed.

use std::fs::{self, DirBuilder};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{renameat_with, RenameFlags, CWD};
use serde_json::Value;

use crate::files::{self, pid_is_gone, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE};
use crate::time;

/// A lock whose owner took it longer ago than this, or whose directory (without a
/// readable `owner.json`) was last changed longer ago than this, is stale.
pub const STALE_AGE: Duration = Duration::from_secs(30);
/// How often a waiter tries the lock again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a registry write waits for the lock before it fails.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(10);

/// The file inside the lock directory naming its holder.
const OWNER_FILE: &str = "owner.json";
/// An `owner.json` larger than this is unreadable.
const MAX_OWNER_BYTES: u64 = 4096;

/// The lock directory's name inside the channel root: the registry file's name plus
/// `.lock`, as the original implementation names it.
pub const LOCK_DIR: &str = ".bus-registry.json.lock";

/// The lock directory of the channel root `root`.
pub fn lock_path(root: &Path) -> PathBuf {
    root.join(LOCK_DIR)
}

/// Runs `f` while holding the registry lock of `root`, waiting at most
/// [`LOCK_PATIENCE`] for it.
///
/// # Errors
///
/// `TimedOut` (naming the holder) if the lock stayed taken, any I/O error taking or
/// releasing it, or whatever `f` returns.
pub fn with_registry_lock<T>(root: &Path, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    within(root, LOCK_PATIENCE, f)?.ok_or_else(|| timed_out(root, LOCK_PATIENCE))
}

/// Runs `f` under the registry lock of `root` if it can be had within `patience`
/// (stale locks are recovered on the way); `Ok(None)` if a live holder kept it that
/// long. With no patience, for the registry self-check, which tries again at its next
/// round.
///
/// # Errors
///
/// Any I/O error taking or releasing the lock, or whatever `f` returns.
pub fn within<T>(
    root: &Path,
    patience: Duration,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<Option<T>> {
    let path = lock_path(root);
    let deadline = Instant::now() + patience;
    let mut held = loop {
        match DirBuilder::new().mode(PRIVATE_DIR_MODE).create(&path) {
            Ok(()) => break take(&path)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Something holds the name: a stale lock is cleared and the name tried again
        // at once; a live one is waited for.
        if clear_if_stale(&path)? {
            continue;
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    let result = f();
    let released = held.release();
    result.and_then(|value| released.map(|()| Some(value)))
}

fn timed_out(root: &Path, patience: Duration) -> io::Error {
    let path = lock_path(root);
    let holder = read_owner(&path).map_or("another process".to_owned(), |(pid, at, _)| {
        format!("process {pid} since {at}")
    });
    let (path, secs) = (path.display(), patience.as_secs());
    let message = format!(
        "cannot lock the registry: {path} has been held by {holder} for more than {secs} s; \
         remove it if no process is writing the registry"
    );
    io::Error::new(io::ErrorKind::TimedOut, message)
}

/// What identifies one taking of the lock: the directory's inode, its mtime and the
/// bytes of its `owner.json`. An inode alone is not enough (a directory removed and
/// made again often gets the same one back); an `owner.json` names its pid and the
/// moment the lock was taken, and without one the mtime tells an old directory from a
/// new one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    dir: bool,
    inode: (u64, u64),
    mtime: Option<SystemTime>,
    owner: Option<Vec<u8>>,
}

/// The fingerprint of the lock directory `path`; `NotFound` when it is gone.
fn fingerprint(path: &Path) -> io::Result<Fingerprint> {
    let meta = fs::symlink_metadata(path)?;
    Ok(Fingerprint {
        dir: meta.is_dir(),
        inode: (meta.dev(), meta.ino()),
        mtime: meta.modified().ok(),
        // Under anything but a directory, `owner.json` is not found.
        owner: files::read_regular_file(&path.join(OWNER_FILE), MAX_OWNER_BYTES).ok(),
    })
}

/// `Ok(())` for a `NotFound` error: what was to be removed is gone already.
fn gone_is_fine(e: io::Error) -> io::Result<()> {
    (e.kind() == io::ErrorKind::NotFound).then_some(()).ok_or(e)
}

/// A held lock: the directory this process made, known by its fingerprint once it
/// wrote `owner.json`.
#[derive(Debug)]
struct Held {
    path: PathBuf,
    print: Fingerprint,
    /// Set once [`Held::release`] ran, so that dropping does not release twice.
    released: bool,
}

impl Held {
    /// Releases the lock: removes `owner.json`, then the directory, but only if the
    /// directory is still the one this process made (a lock that replaced it is
    /// another holder's). A lock already gone is released.
    ///
    /// # Errors
    ///
    /// An I/O error removing them.
    fn release(&mut self) -> io::Result<()> {
        self.released = true;
        match fingerprint(&self.path) {
            Ok(print) if print == self.print => {}
            Ok(_) => return Ok(()),
            Err(e) => return gone_is_fine(e),
        }
        fs::remove_file(self.path.join(OWNER_FILE)).or_else(gone_is_fine)?;
        fs::remove_dir(&self.path).or_else(gone_is_fine)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(e) = self.release() {
            log::warn!("cannot release {}: {e}", self.path.display());
        }
    }
}

/// Completes taking the lock whose directory `path` was just made: sets its mode and
/// writes `owner.json`. On failure the directory is removed again.
fn take(path: &Path) -> io::Result<Held> {
    let owner = serde_json::json!({
        "pid": std::process::id(),
        "acquiredAt": time::now_iso8601(),
    });
    let owner = owner.to_string().into_bytes();
    // The umask may have narrowed the mode; make it exactly 0700.
    let print = fs::set_permissions(path, fs::Permissions::from_mode(PRIVATE_DIR_MODE))
        .and_then(|()| files::open_append_regular(&path.join(OWNER_FILE), PRIVATE_FILE_MODE))
        .and_then(|(mut file, _)| file.write_all(&owner))
        .and_then(|()| fingerprint(path))
        .inspect_err(|_| {
            // Nothing else can have written owner.json into the directory we just made.
            let _ = fs::remove_file(path.join(OWNER_FILE));
            let _ = fs::remove_dir(path);
        })?;
    Ok(Held {
        path: path.to_path_buf(),
        print,
        released: false,
    })
}

/// The owner of the lock directory `path`, or `None` when `owner.json` is missing or
/// unreadable.
fn read_owner(path: &Path) -> Option<(u32, String, SystemTime)> {
    parse_owner(&files::read_regular_file(&path.join(OWNER_FILE), MAX_OWNER_BYTES).ok()?)
}

/// The pid and `acquiredAt` (as written, and as a time) `owner.json` names, or `None`
/// when it is unreadable (not JSON, no positive pid, no ISO-8601 `acquiredAt`).
fn parse_owner(bytes: &[u8]) -> Option<(u32, String, SystemTime)> {
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let pid = super::store::positive(&value, "pid")?;
    let at = value.get("acquiredAt")?.as_str()?;
    Some((pid, at.to_owned(), time::parse_iso8601(at)?))
}

/// Why the lock of fingerprint `print` is stale, or `None` if it is live: its owner's
/// pid is gone, or it took the lock more than [`STALE_AGE`] before `now`, or, without a
/// readable `owner.json`, the directory was last changed that long ago (a time in the
/// future is not old).
fn staleness(print: &Fingerprint, now: SystemTime) -> Option<String> {
    let old = |then| now.duration_since(then).is_ok_and(|age| age > STALE_AGE);
    let secs = STALE_AGE.as_secs();
    match print.owner.as_deref().and_then(parse_owner) {
        Some((pid, ..)) if pid_is_gone(pid) => Some(format!("its owner, process {pid}, is gone")),
        Some((pid, at, acquired)) if old(acquired) => {
            Some(format!("process {pid} took it at {at}, over {secs} s ago"))
        }
        Some(_) => None,
        None => print
            .mtime
            .filter(|&mtime| old(mtime))
            .map(|_| format!("it has no readable {OWNER_FILE} and is over {secs} s old")),
    }
}

/// Distinguishes the names stale locks are moved to by this process.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// Removes the lock directory at the lock's name if it is stale, and returns whether
/// it did. `false` when it is live, or when it vanished meanwhile (the caller tries
/// again either way).
fn clear_if_stale(path: &Path) -> io::Result<bool> {
    let print = match fingerprint(path) {
        Ok(print) => print,
        Err(e) => return gone_is_fine(e).map(|()| true),
    };
    if !print.dir {
        let message = format!("{}: not a lock directory; remove it", path.display());
        return Err(io::Error::new(io::ErrorKind::InvalidData, message));
    }
    let Some(why) = staleness(&print, SystemTime::now()) else {
        return Ok(false);
    };
    let n = MOVED.fetch_add(1, Ordering::Relaxed);
    let moved = path.with_extension(format!("stale-{}-{n}", std::process::id()));
    if let Err(e) = fs::rename(path, &moved) {
        // NotFound: another waiter cleared it first.
        return gone_is_fine(e).map(|()| true);
    }
    if fingerprint(&moved)? != print {
        // Between the check and the rename another waiter cleared the stale lock and
        // a third took the name afresh: this is that fresh lock. Put it back (never
        // over a newer one).
        let back = renameat_with(CWD, &moved, CWD, path, RenameFlags::NOREPLACE);
        let Err(e) = back else { return Ok(false) };
        log::warn!(
            "{}: moved a live lock aside by accident and cannot put it back ({e}); removing it",
            path.display()
        );
        fs::remove_dir_all(&moved)?;
        return Ok(true);
    }
    fs::remove_dir_all(&moved)?;
    log::warn!("{}: removed a stale lock: {why}", path.display());
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn iso_ago(secs: u64) -> String {
        time::iso8601(SystemTime::now() - Duration::from_secs(secs))
    }

    /// Makes a lock directory under `root` as another program would, with
    /// `owner` (if any) as its `owner.json`.
    fn plant(root: &Path, owner: Option<Value>) -> PathBuf {
        let path = lock_path(root);
        fs::create_dir(&path).unwrap();
        if let Some(owner) = owner {
            fs::write(path.join(OWNER_FILE), owner.to_string()).unwrap();
        }
        path
    }

    fn set_mtime_ago(path: &Path, secs: u64) {
        let dir = fs::File::open(path).unwrap();
        dir.set_modified(SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn the_lock_is_a_directory_with_owner_json_and_is_removed_on_release() {
        let dir = TestDir::new("rlock-shape");
        let root = dir.path();
        let path = lock_path(root);
        assert_eq!(path, root.join(".bus-registry.json.lock"));
        let seen = with_registry_lock(root, || {
            let meta = fs::symlink_metadata(&path)?;
            let owner = read_owner(&path).ok_or_else(|| io::Error::other("no owner"))?;
            let file_mode = fs::metadata(path.join(OWNER_FILE))?.permissions().mode();
            Ok((
                meta.is_dir(),
                meta.permissions().mode() & 0o777,
                file_mode & 0o777,
                owner.0,
            ))
        })
        .unwrap();
        assert_eq!(seen, (true, 0o700, 0o600, std::process::id()));
        assert!(!path.exists(), "released");
        // An error from the closure is returned, and the lock is released all the same.
        let err = with_registry_lock(root, || Err::<(), _>(io::Error::other("boom"))).unwrap_err();
        assert_eq!(err.to_string(), "boom");
        assert!(!path.exists());
    }

    #[test]
    fn stale_lock_directories_are_recovered() {
        let live = std::process::id();
        let cases: Vec<(&str, Option<Value>, Option<u64>)> = vec![
            (
                "dead pid",
                Some(serde_json::json!({"pid": dead_pid(), "acquiredAt": iso_ago(0)})),
                None,
            ),
            (
                "old acquiredAt",
                Some(serde_json::json!({"pid": live, "acquiredAt": iso_ago(31)})),
                None,
            ),
            ("no owner.json, old mtime", None, Some(31)),
            (
                "unreadable owner.json, old mtime",
                Some(serde_json::json!("torn")),
                Some(31),
            ),
        ];
        for (what, owner, mtime_ago) in cases {
            let dir = TestDir::new("rlock-stale");
            let path = plant(dir.path(), owner);
            if let Some(secs) = mtime_ago {
                set_mtime_ago(&path, secs);
            }
            let held = within(dir.path(), Duration::ZERO, || Ok(read_owner(&path))).unwrap();
            let owner = held.unwrap_or_else(|| panic!("{what}: not recovered"));
            assert_eq!(owner.unwrap().0, live, "{what}");
            let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "{what}: {left:?}");
        }
    }

    #[test]
    fn a_live_lock_is_waited_for_then_fails_clearly() {
        let live = std::process::id();
        let cases: Vec<(&str, Option<Value>)> = vec![
            (
                "live pid, fresh acquiredAt",
                Some(serde_json::json!({"pid": live, "acquiredAt": iso_ago(1)})),
            ),
            ("no owner.json yet, fresh mtime", None),
            (
                "owner.json being written",
                Some(serde_json::json!({"pid": live})),
            ),
        ];
        for (what, owner) in cases {
            let dir = TestDir::new("rlock-live");
            let path = plant(dir.path(), owner);
            let started = Instant::now();
            let patience = Duration::from_millis(60);
            let taken = within(dir.path(), patience, || Ok(())).unwrap();
            assert!(taken.is_none(), "{what}");
            assert!(started.elapsed() >= patience, "{what}");
            assert!(path.is_dir(), "{what}: a live lock is left alone");
        }
        let err = timed_out(Path::new("/r"), LOCK_PATIENCE);
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let shown = err.to_string();
        assert!(shown.contains("/r/.bus-registry.json.lock"), "{shown}");
        assert!(shown.contains("10 s"), "{shown}");
    }

    #[test]
    fn a_file_at_the_locks_name_is_refused_not_removed() {
        let dir = TestDir::new("rlock-file");
        let path = lock_path(dir.path());
        fs::write(&path, b"").unwrap();
        let refused = within(dir.path(), Duration::ZERO, || Ok(())).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
        assert!(
            refused.to_string().contains("not a lock directory"),
            "{refused}"
        );
        assert!(path.is_file(), "left alone");
        fs::remove_file(&path).unwrap();
        let held = within(dir.path(), Duration::ZERO, || Ok(path.is_dir())).unwrap();
        assert_eq!(held, Some(true));
        assert!(!path.exists());
    }

    #[test]
    fn a_lock_moved_aside_by_a_late_waiter_is_put_back() {
        // A waiter judged an old lock stale; before it renamed, the stale lock was
        // cleared and a fresh one taken (often with the same inode). Its rename then
        // moves the fresh lock, which it must notice by the fingerprint and put back.
        let dir = TestDir::new("rlock-race");
        let stale_owner = serde_json::json!({"pid": dead_pid(), "acquiredAt": iso_ago(0)});
        let path = plant(dir.path(), Some(stale_owner));
        let judged = fingerprint(&path).unwrap();
        assert!(staleness(&judged, SystemTime::now()).is_some());
        fs::remove_dir_all(&path).unwrap();
        let fresh = within(dir.path(), Duration::ZERO, || {
            let moved = dir.path().join("moved");
            fs::rename(&path, &moved)?;
            assert_ne!(fingerprint(&moved)?, judged);
            fs::rename(&moved, &path)?;
            // The real code path: a live lock is not cleared.
            assert!(!clear_if_stale(&path)?);
            Ok(path.join(OWNER_FILE).is_file())
        });
        assert_eq!(fresh.unwrap(), Some(true));
        assert!(!path.exists());
    }

    #[test]
    fn release_leaves_a_lock_that_replaced_ours() {
        let dir = TestDir::new("rlock-replaced");
        let path = lock_path(dir.path());
        within(dir.path(), Duration::ZERO, || {
            fs::remove_file(path.join(OWNER_FILE))?;
            fs::remove_dir(&path)?;
            let owner = serde_json::json!({"pid": 1, "acquiredAt": iso_ago(0)});
            plant(dir.path(), Some(owner));
            Ok(())
        })
        .unwrap();
        assert!(
            path.join(OWNER_FILE).is_file(),
            "another holder's lock is kept"
        );
    }

    #[test]
    fn owner_json_parsing_and_pid_liveness() {
        let t = "2026-01-01T00:00:00.000Z";
        let cases: &[(&str, Option<u32>)] = &[
            (
                r#"{"pid": 42, "acquiredAt": "2026-01-01T00:00:00.000Z"}"#,
                Some(42),
            ),
            (
                r#"{"pid": 42.0, "acquiredAt": "2026-01-01T00:00:00.000Z", "x": 1}"#,
                Some(42),
            ),
            (
                r#"{"pid": 0, "acquiredAt": "2026-01-01T00:00:00.000Z"}"#,
                None,
            ),
            (
                r#"{"pid": "42", "acquiredAt": "2026-01-01T00:00:00.000Z"}"#,
                None,
            ),
            (r#"{"pid": 42, "acquiredAt": "soon"}"#, None),
            (r#"{"pid": 42}"#, None),
            (r#"{"pid": 42, "acq"#, None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = parse_owner(text.as_bytes());
            assert_eq!(got.as_ref().map(|o| o.0), *want, "{text}");
            if let Some(owner) = got {
                assert_eq!(owner.1, t);
            }
        }
        assert!(!files::pid_is_gone(std::process::id()));
        assert!(!files::pid_is_gone(1), "another user's process exists");
        assert!(files::pid_is_gone(dead_pid()));
        assert!(files::pid_is_gone(u32::MAX));
        let now = SystemTime::now();
        let changed = |mtime| Fingerprint {
            dir: true,
            inode: (0, 0),
            mtime: Some(mtime),
            owner: None,
        };
        let stale = |mtime| staleness(&changed(mtime), now).is_some();
        assert!(stale(now - Duration::from_secs(31)));
        assert!(!stale(now - Duration::from_secs(29)));
        assert!(
            !stale(now + Duration::from_secs(100)),
            "the future is not old"
        );
    }
}
