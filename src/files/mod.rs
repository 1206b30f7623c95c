//! Files on disk: atomic writes, advisory locks, bounded non-blocking reads, setting a
//! corrupt file aside, and private directories. The modules that own a state file (audit, usage, registry,
//! config) do their file I/O through these helpers.
//!
//! Every JSON state file goes through
//! [`write_atomic`] (temp file in the same directory, fsync, rename, fsync the directory),
//! so a crash at any moment leaves the old file or the new one, never a torn one.
//! Read-modify-write cycles (registry, usage) run inside [`with_lock`], which serializes
//! them across processes and threads.

use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, Permissions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

mod pid;
mod trust;
pub use pid::{children_of, group_has_live_member, parent_of, pid_is_gone};

pub use trust::{check_trusted, check_trusted_metadata, untrusted, TrustKind, Untrusted};

/// Mode of private state files: the registry, config.json, usage.json, the audit log and
/// lock files.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Mode of private state directories, such as the channel root.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// How many temp-file names [`write_atomic`] tries before giving up. A name is only taken
/// when a crashed process with the same pid left its temp file behind.
const TEMP_NAME_ATTEMPTS: u32 = 64;

// ---------------------------------------------------------------------------------------
// Atomic writes

/// Distinguishes temp files of concurrent writers in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces the file at `path` with `bytes`, atomically, leaving it with exactly `mode`.
///
/// The bytes go to a new temp file `.<name>.tmp.<pid>.<n>` in the same directory, created
/// with `mode`, which is fsynced and renamed over `path`; then the directory is fsynced so
/// that the rename itself is durable. Readers see the old content or the new, never a
/// mix. Because the rename puts a new inode in place, an old file with a wider mode does
/// not keep it.
///
/// # Errors
///
/// Any I/O error creating, writing, syncing or renaming the temp file (which is then
/// removed), or syncing the directory. `path` without a file name is `InvalidInput`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let Some(name) = path.file_name() else {
        let message = format!("{}: not a file path", path.display());
        return Err(io::Error::new(ErrorKind::InvalidInput, message));
    };
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // A fresh temp file next to the target. Never an existing file, so it can't
    // clobber another writer's temp file.
    let mut tries = 0;
    let (tmp_path, mut file) = loop {
        tries += 1;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        tmp_name.push(format!(".tmp.{}.{n}", std::process::id()));
        let tmp_path = dir.join(tmp_name);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        match open_no_follow(&tmp_path, flags, Mode::from_raw_mode(mode)) {
            Ok((file, _)) => break (tmp_path, file),
            Err(err) if err.kind() == ErrorKind::AlreadyExists && tries < TEMP_NAME_ATTEMPTS => {}
            Err(err) => return Err(err),
        }
    };
    // The exact mode (the umask may have narrowed it), the bytes, synced, renamed.
    file.set_permissions(Permissions::from_mode(mode))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp_path, path))
        // Best effort: the error worth reporting is the one that made us stop.
        .inspect_err(|_| drop(fs::remove_file(&tmp_path)))?;
    File::open(dir)?.sync_all()
}

/// Removes the temp files of [`write_atomic`] (`.<name>.tmp.<pid>.<n>`) in `dir` that
/// no live process owns: a writer killed mid-write (`kill -9`) leaves one behind, and
/// nothing else ever removes it. A file whose pid is alive (another instance writing
/// now, or a process that reused the pid) is kept. Returns the paths removed.
///
/// # Errors
///
/// An error listing `dir`; files that cannot be removed are skipped.
pub fn remove_stale_temp_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let ours_and_dead = |entry: &fs::DirEntry| {
        let pid = entry.file_name().to_str().and_then(temp_file_pid);
        // Symlinks are not followed; only a regular file can be ours.
        entry.file_type().is_ok_and(|t| t.is_file()) && pid.is_some_and(pid_is_gone)
    };
    Ok(fs::read_dir(dir)?
        .flatten()
        .filter(ours_and_dead)
        .map(|entry| entry.path())
        .filter(|path| fs::remove_file(path).is_ok())
        .collect())
}

/// The writer's pid in a temp file name of [`write_atomic`]: `.<name>.tmp.<pid>.<n>`.
fn temp_file_pid(name: &str) -> Option<u32> {
    let (target, tail) = name.strip_prefix('.')?.rsplit_once(".tmp.")?;
    let (pid, n) = tail.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ours = !target.is_empty() && digits(pid) && digits(n);
    pid.parse().ok().filter(|_| ours)
}

// ---------------------------------------------------------------------------------------
// Locks

/// Runs `f` while holding an exclusive advisory lock tied to `path`.
///
/// The lock is taken on the sibling file `<file name>.lock` (created with mode 0600 and
/// never removed: removing it would let two writers lock different inodes). Each call
/// opens its own handle, so the lock serializes callers in other processes and in other
/// threads of this one alike. It is released when `f` returns or panics.
///
/// Waiting for the lock is bounded by [`LOCK_TIMEOUT`]: a process that holds it for
/// longer (stuck, or hostile) makes this an error instead of a hang.
///
/// # Errors
///
/// An error opening the lock file, `TimedOut` if the lock stayed taken for
/// [`LOCK_TIMEOUT`], or whatever `f` returns.
pub fn with_lock<T>(path: &Path, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    lock_within(path, LOCK_TIMEOUT, f)
}

/// How long [`with_lock`] waits for a lock another process holds.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a taken lock is tried again.
const LOCK_RETRY: Duration = Duration::from_millis(5);

/// Runs `f` under the lock if it can be had within `wait`; else `TimedOut`.
fn lock_within<T>(path: &Path, wait: Duration, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let deadline = std::time::Instant::now() + wait;
    loop {
        // Closing the handle releases the lock.
        if let Some(_held) = hold_lock(Path::new(&lock_path))? {
            return f();
        }
        if std::time::Instant::now() >= deadline {
            let (path, secs) = (path.display(), wait.as_secs());
            let text = format!("cannot lock {path}.lock: another process has held it for {secs} s");
            return Err(io::Error::new(ErrorKind::TimedOut, text));
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

/// Holds an exclusive lock on `path` (created 0600) for as long as the returned file
/// lives, or says who has it: `Ok(None)` when another process holds it. `serve` uses
/// this so that two processes can never serve one state directory.
///
/// # Errors
///
/// An error opening the file or locking it.
pub fn hold_lock(path: &Path) -> io::Result<Option<File>> {
    // Opened like every other state file: a FIFO or a link planted in its place can
    // neither stall nor redirect the locker.
    let flags = OFlags::RDWR | OFlags::CREATE;
    let (file, _) = open_no_follow(path, flags, Mode::from_raw_mode(PRIVATE_FILE_MODE))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

// ---------------------------------------------------------------------------------------
// Reading

/// Reads the regular file `path` whole, if it is at most `max` bytes. It is opened
/// without blocking and without following a symlink, and checked on the open handle,
/// so a FIFO or device put in its place can never block the caller (the event loop
/// reads config files).
///
/// # Errors
///
/// `NotFound` and other open errors as they are; `InvalidData` when it is a symlink,
/// is not a regular file or is larger than `max`.
pub fn read_regular_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    read_checked(path, max, false)
}

/// Opens the regular file `path` for reading without blocking (a FIFO put in its place
/// cannot stall the reader) and without following a symlink, checked on the open
/// handle, for a caller that reads it as a stream (`loopbus audit`).
///
/// # Errors
///
/// `NotFound` and other open errors as they are; `InvalidData` when it is a symlink or
/// not a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    open_no_follow(path, OFlags::RDONLY, Mode::empty()).map(|(file, _)| file)
}

/// [`read_regular_file`] for a file whose contents decide where secrets and prompts
/// go (the registry): the open handle's owner and mode must pass
/// [`check_trusted_metadata`] too.
///
/// # Errors
///
/// As [`read_regular_file`], and `PermissionDenied` wrapping an [`Untrusted`].
pub fn read_trusted_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    read_checked(path, max, true)
}

/// Reads a regular file no-follow, checking the handle's owner and mode if `trusted`.
fn read_checked(path: &Path, max: u64, trusted: bool) -> io::Result<Vec<u8>> {
    let (file, metadata) = open_no_follow(path, OFlags::RDONLY, Mode::empty())?;
    if trusted {
        check_trusted_metadata(path, &metadata, TrustKind::File)?;
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        let message = format!("larger than {max} bytes");
        return Err(io::Error::new(ErrorKind::InvalidData, message));
    }
    Ok(bytes)
}

/// Opens the regular file `path` for appending, creating it with exactly `mode` if it
/// is missing, and returns it with its current length. It is opened without blocking
/// and without following a symlink, and checked on the open handle, so a FIFO, device
/// or symlink put in its place is refused instead of blocking the caller (writes to a
/// regular file never wait for a reader). An existing file whose mode is not `mode` is
/// set to it.
///
/// # Errors
///
/// Open errors as they are (a FIFO without a reader is `ENXIO`); `InvalidData` when it
/// is a symlink or not a regular file; any error setting the mode.
pub fn open_append_regular(path: &Path, mode: u32) -> io::Result<(File, u64)> {
    let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE;
    let (file, metadata) = open_no_follow(path, flags, Mode::from_raw_mode(mode))?;
    // The umask may have narrowed a new file; an old one may be wider.
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok((file, metadata.len()))
}

/// Opens `path` with `flags`, never blocking and never following a symlink in its
/// last component, and only if it is a regular file (else `InvalidData`), with its
/// metadata.
fn open_no_follow(path: &Path, flags: OFlags, mode: Mode) -> io::Result<(File, fs::Metadata)> {
    let invalid = |what: &str| io::Error::new(ErrorKind::InvalidData, what);
    let flags = flags | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let file = match rustix::fs::open(path, flags, mode) {
        Ok(fd) => File::from(fd),
        Err(Errno::LOOP) => return Err(invalid("a symbolic link, which is not followed")),
        Err(e) => return Err(e.into()),
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(invalid("not a regular file"));
    }
    Ok((file, metadata))
}

/// Sets a corrupt file aside: renames `path` to `<path>.<suffix>-<millis since the
/// epoch>` in the same directory, so nothing is destroyed without a trace, and returns
/// the new path. The caller holds whatever lock guards `path`.
///
/// # Errors
///
/// Any I/O error from the rename (`NotFound` when `path` is gone).
pub fn set_aside(path: &Path, suffix: &str) -> io::Result<PathBuf> {
    let millis = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_millis());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".{suffix}-{millis}"));
    fs::rename(path, &aside).map(|()| aside.into())
}

// ---------------------------------------------------------------------------------------
// Directories and modes

/// Creates the directory `path` and any missing parents, each one it creates with mode
/// 0700 whatever the umask (`create_dir_all` made them 0777 under umask 000); an
/// existing directory is left as it is (use [`mode_is_wider`] to warn about it).
///
/// # Errors
///
/// Any I/O error from creating the directories; `AlreadyExists` if `path` exists and is
/// not a directory.
pub fn create_dir_private(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_private(parent)?;
    }
    match DirBuilder::new().mode(PRIVATE_DIR_MODE).create(path) {
        // The umask may have narrowed the mode; make it exactly 0700.
        Ok(()) => fs::set_permissions(path, Permissions::from_mode(PRIVATE_DIR_MODE)),
        // Another process won the race to create it.
        Err(err) if err.kind() == ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(err) => Err(err),
    }
}

/// The permission bits of `path` if they grant anything beyond `allowed` (for example
/// `Some(0o644)` for a 0644 file checked against 0600), else `None`. Symlinks are
/// followed.
///
/// # Errors
///
/// Any I/O error reading the file's metadata.
pub fn mode_is_wider(path: &Path, allowed: u32) -> io::Result<Option<u32>> {
    let mode = fs::metadata(path)?.permissions().mode() & 0o7777;
    Ok((mode & !allowed != 0).then_some(mode))
}

/// Test support shared with other modules' tests (in the tests module below).
#[cfg(test)]
pub(crate) use tests::test_support;

#[cfg(test)]
mod tests {
    #[test]
    fn bug_temp_files_of_a_killed_writer_were_left_forever() {
        use test_support::TestDir;
        let dir = TestDir::new("files-stale-temp");
        // A pid that is surely dead: beyond the kernel's pid_max.
        let dead = ".usage.json.tmp.2147483646.0";
        let ours = format!(".usage.json.tmp.{}.7", std::process::id());
        let others = [
            "usage.json",
            ".usage.json.tmp.x.1",
            ".tmp.1.1",
            "notes.tmp.1.1",
        ];
        for name in [dead, ours.as_str()].into_iter().chain(others) {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let removed = remove_stale_temp_files(dir.path()).unwrap();
        assert_eq!(removed, vec![dir.path().join(dead)]);
        for name in [ours.as_str()].into_iter().chain(others) {
            assert!(dir.path().join(name).exists(), "{name}");
        }
        assert_eq!(temp_file_pid(".registry.json.tmp.12.3"), Some(12));
        assert_eq!(temp_file_pid(".a.tmp.12.3.4"), None);
    }

    use super::test_support::TestDir;
    use super::*;
    use std::sync::Arc;
    use std::thread;

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn write_atomic_creates_replaces_and_narrows_mode() {
        let dir = TestDir::new("atomic");
        let path = dir.path().join("state.json");

        write_atomic(&path, b"{\"a\":1}", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}");
        assert_eq!(mode_of(&path), 0o600);

        fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"second", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(mode_of(&path), 0o600, "a wider old mode must not survive");

        write_atomic(&path, b"", 0o640).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"");
        assert_eq!(mode_of(&path), 0o640, "the mode given is applied exactly");

        assert_eq!(
            names_in(dir.path()),
            vec!["state.json"],
            "no temp file left"
        );
    }

    #[test]
    fn write_atomic_removes_temp_file_on_failure() {
        let dir = TestDir::new("atomic-fail");
        // Renaming a file over a non-empty directory fails.
        let target = dir.path().join("occupied");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"x").unwrap();

        assert!(write_atomic(&target, b"data", 0o600).is_err());
        assert_eq!(names_in(dir.path()), vec!["occupied"]);
        assert!(write_atomic(&dir.path().join("missing/x.json"), b"", 0o600).is_err());
        assert!(write_atomic(Path::new("/"), b"", 0o600).is_err());
    }

    #[test]
    fn with_lock_serializes_threads() {
        const THREADS: usize = 8;
        const ROUNDS: usize = 10;
        let dir = TestDir::new("lock");
        let counter = Arc::new(dir.path().join("counter"));
        write_atomic(&counter, b"0", 0o600).unwrap();

        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        with_lock(&counter, || {
                            let n: usize = fs::read_to_string(&*counter).unwrap().parse().unwrap();
                            // Widen the window in which an unserialized writer would race.
                            thread::yield_now();
                            write_atomic(&counter, (n + 1).to_string().as_bytes(), 0o600)
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let total: usize = fs::read_to_string(&*counter).unwrap().parse().unwrap();
        assert_eq!(total, THREADS * ROUNDS);
        assert_eq!(mode_of(&dir.path().join("counter.lock")), 0o600);
    }

    #[test]
    fn a_held_lock_is_waited_for_only_so_long() {
        let dir = TestDir::new("lock-patience");
        let path = dir.path().join("file.json");
        let holder = File::create(dir.path().join("file.json.lock")).unwrap();
        holder.lock().unwrap();
        let started = std::time::Instant::now();
        let got = lock_within(&path, Duration::from_millis(100), || Ok(1));
        assert_eq!(
            got.unwrap_err().kind(),
            ErrorKind::TimedOut,
            "taken while held"
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(lock_within(&path, Duration::ZERO, || Ok(1)).is_err());
        drop(holder);
        assert_eq!(lock_within(&path, Duration::ZERO, || Ok(1)).unwrap(), 1);
        // hold_lock: one holder at a time.
        let serving = dir.path().join(".serve.lock");
        let first = hold_lock(&serving).unwrap();
        assert!(first.is_some());
        assert!(hold_lock(&serving).unwrap().is_none());
        drop(first);
        assert!(hold_lock(&serving).unwrap().is_some());
    }

    #[test]
    fn state_files_are_never_opened_through_a_symlink_or_as_a_fifo() {
        let dir = TestDir::new("files-no-follow");
        let target = dir.path().join("target");
        fs::write(&target, b"{}").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        for path in [&link, &fifo] {
            let err = read_regular_file(path, 10).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{path:?}: {err}");
            assert!(
                open_append_regular(path, PRIVATE_FILE_MODE).is_err(),
                "{path:?}"
            );
        }
        assert_eq!(
            fs::read(&target).unwrap(),
            b"{}",
            "written through the link"
        );
        assert_eq!(read_regular_file(&target, 10).unwrap(), b"{}");
        let (_, len) = open_append_regular(&target, PRIVATE_FILE_MODE).unwrap();
        assert_eq!(len, 2);
        assert_eq!(mode_of(&target), PRIVATE_FILE_MODE);
    }

    #[test]
    fn with_lock_returns_errors_and_releases_after_panic() {
        let dir = TestDir::new("lock-release");
        let path = dir.path().join("f.json");

        let err = with_lock(&path, || Err::<(), _>(io::Error::other("boom"))).unwrap_err();
        assert_eq!(err.to_string(), "boom");

        let panicked = std::panic::catch_unwind(|| {
            let _ = with_lock(&path, || -> io::Result<()> { panic!("inside the lock") });
        });
        assert!(panicked.is_err());

        // A second handle can take the lock again at once.
        let value = with_lock(&path, || Ok(7)).unwrap();
        assert_eq!(value, 7);
    }

    #[test]
    fn set_aside_renames_next_to_the_file() {
        let dir = TestDir::new("files-aside");
        let path = dir.path().join("state.json");
        fs::write(&path, b"torn").unwrap();
        let aside = set_aside(&path, "corrupt").unwrap();
        assert!(!path.exists());
        assert_eq!(aside.parent(), Some(dir.path()));
        let name = aside.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with("state.json.corrupt-"), "{name}");
        assert_eq!(fs::read(&aside).unwrap(), b"torn");
        let err = set_aside(&path, "corrupt").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn create_dir_private_and_mode_checks() {
        let dir = TestDir::new("dirs");
        let nested = dir.path().join("a/b/root");
        create_dir_private(&nested).unwrap();
        assert!(nested.is_dir());
        assert_eq!(mode_of(&nested), 0o700);

        // An existing directory is left alone.
        fs::set_permissions(&nested, Permissions::from_mode(0o755)).unwrap();
        create_dir_private(&nested).unwrap();
        assert_eq!(mode_of(&nested), 0o755);
        assert_eq!(mode_is_wider(&nested, 0o700).unwrap(), Some(0o755));

        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(create_dir_private(&file).is_err());

        let cases = [
            (0o600, 0o600, None),
            (0o400, 0o600, None),
            (0o644, 0o600, Some(0o644)),
            (0o660, 0o600, Some(0o660)),
            (0o700, 0o600, Some(0o700)),
        ];
        for (mode, allowed, want) in cases {
            fs::set_permissions(&file, Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                mode_is_wider(&file, allowed).unwrap(),
                want,
                "{mode:o} vs {allowed:o}"
            );
        }
        assert!(mode_is_wider(&dir.path().join("absent"), 0o600).is_err());
    }

    #[test]
    fn bug_files_other_users_could_write_were_trusted() {
        let dir = TestDir::new("files-trust");
        let file = dir.path().join("registry.json");
        fs::write(&file, b"{}").unwrap();
        for (mode, trusted) in [(0o600, true), (0o644, true), (0o620, false), (0o606, false)] {
            fs::set_permissions(&file, Permissions::from_mode(mode)).unwrap();
            let got = read_trusted_file(&file, 10);
            assert_eq!(got.is_ok(), trusted, "{mode:o}: {got:?}");
            if let Err(err) = got {
                assert_eq!(err.kind(), ErrorKind::PermissionDenied);
                let refused = untrusted(&err).unwrap();
                assert_eq!((refused.mode, refused.kind), (mode, TrustKind::File));
                assert!(err.to_string().contains("chmod go-w"), "{err}");
            }
        }
        for (mode, trusted) in [
            (0o700, true),
            (0o755, true),
            (0o777, false),
            (0o1777, false),
        ] {
            fs::set_permissions(dir.path(), Permissions::from_mode(mode)).unwrap();
            let got = check_trusted(dir.path(), TrustKind::Dir);
            assert_eq!(got.is_ok(), trusted, "{mode:o}: {got:?}");
        }
        fs::set_permissions(dir.path(), Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(&file, Permissions::from_mode(0o600)).unwrap();
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
            let err = read_trusted_file(&file, 10).unwrap_err();
            assert_eq!(untrusted(&err).unwrap().owner, 65534);
            assert!(err.to_string().contains("uid 65534"), "{err}");
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(dir.path(), &link).unwrap();
            std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
            assert!(
                check_trusted(&link, TrustKind::Dir).is_err(),
                "nobody's link"
            );
        }
        assert_eq!(
            check_trusted(&dir.path().join("absent"), TrustKind::File)
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
    }

    #[test]
    fn bug_lock_files_followed_symlinks_and_blocked_on_fifos() {
        let dir = TestDir::new("lock-kinds");
        let target = dir.path().join("elsewhere");
        fs::write(&target, b"").unwrap();
        let link = dir.path().join("linked");
        std::os::unix::fs::symlink(&target, dir.path().join("linked.lock")).unwrap();
        let err = with_lock(&link, || Ok(())).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
        let fifo = dir.path().join("fifo.lock");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        // Without O_NONBLOCK this open would wait for a writer forever.
        let err = hold_lock(&fifo).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
        assert!(hold_lock(&dir.path().join("plain.lock")).unwrap().is_some());
    }

    #[allow(
        clippy::unwrap_used,
        reason = "test helper: a failure should fail the test"
    )]
    pub(crate) mod test_support {
        use super::*;

        /// A uniquely named directory under the system temp dir, removed on drop.
        pub(crate) struct TestDir(PathBuf);

        impl TestDir {
            /// Creates `<tmp>/loopbus-<label>-<pid>-<n>-<nanos>`.
            pub(crate) fn new(label: &str) -> TestDir {
                static COUNTER: AtomicU64 = AtomicU64::new(0);
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0);
                let path = std::env::temp_dir().join(format!(
                    "loopbus-{label}-{}-{}-{nanos}",
                    std::process::id(),
                    COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                fs::create_dir_all(&path).unwrap();
                TestDir(path)
            }

            /// The directory's path.
            pub(crate) fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for TestDir {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(&self.0);
            }
        }
    }
}
