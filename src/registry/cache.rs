//! The client's registry lookup, with the last registry read kept in memory: a caller
//! that delegates again and again reads and parses the file only when it changed.
//!
//! Each lookup still checks the channel root and the file exactly as a read does
//! (owner and mode, no symlink: contract 1), from a fresh `lstat` of each. The kept
//! entries are used only when the file's identity (device, inode, size, modification
//! and change times, owner, mode) is the one they were read from. Every write of
//! loopbus and of the original goes through an atomic rename, which makes a new
//! inode; an in-place rewrite (older releases of the original) changes the times, and
//! a read made within [`RACY_MARGIN`] of the file's last change is not kept at all,
//! since two changes inside one tick of the file system's clock show the same times.

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::store::{self, Entry};
use crate::files::{self, TrustKind};
use crate::protocol::InstanceName;

/// How long after a file's last change a read of it is kept: well above the coarse
/// clock (a few milliseconds) that stamps file times.
pub const RACY_MARGIN: Duration = Duration::from_millis(100);

/// What identifies one version of the registry file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    uid: u32,
    mode: u32,
}

impl Identity {
    fn of(metadata: &Metadata) -> Identity {
        Identity {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
            uid: metadata.uid(),
            mode: metadata.mode(),
        }
    }
}

/// The last registry read kept.
struct Kept {
    path: PathBuf,
    identity: Identity,
    entries: BTreeMap<InstanceName, Entry>,
}

/// The one registry read kept (the client asks one channel root, as a rule).
static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// The registry file's metadata when it is a regular file we trust, `None` when it
/// is missing or not a regular file (the full read then says what is wrong).
///
/// # Errors
/// The root or the file is one others may write (contract 1), or its metadata can't
/// be read.
fn trusted_identity(root: &Path, path: &Path) -> io::Result<Option<Identity>> {
    match files::check_trusted(root, TrustKind::Dir) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        other => other?,
    }
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_file() => metadata,
        Ok(_) => return Ok(None),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    files::check_trusted_metadata(path, &metadata, TrustKind::File)?;
    Ok(Some(Identity::of(&metadata)))
}

/// The valid entry of `name` in the registry under `root`, or `None`; as
/// [`store::read`] reads it, from memory when the file did not change.
///
/// # Errors
///
/// As [`store::read`].
pub fn lookup(root: &Path, name: &InstanceName) -> io::Result<Option<Entry>> {
    let path = store::registry_path(root);
    let before = trusted_identity(root, &path)?;
    if let Some(identity) = before {
        // A panic while holding the lock left nothing half-done.
        let kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = kept.as_ref() {
            if kept.path == path && kept.identity == identity {
                return Ok(kept.entries.get(name).cloned());
            }
        }
    }
    let entries = store::read(root)?;
    let found = entries.get(name).cloned();
    // Kept only when the file was the same before and after the read, and old enough
    // that a change within the same clock tick can't hide behind equal times.
    let after = trusted_identity(root, &path)?;
    let settled = std::fs::symlink_metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|changed| SystemTime::now().duration_since(changed).ok())
        .is_some_and(|age| age > RACY_MARGIN);
    if let (Some(identity), true, true) = (before, before == after, settled) {
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        *kept = Some(Kept {
            path,
            identity,
            entries,
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(port: u16) -> serde_json::Value {
        serde_json::json!({"port": port, "pid": 1, "secret": "s",
                           "updatedAt": "2026-01-01T00:00:00.000Z"})
    }

    fn write(path: &Path, port: u16) {
        let doc = serde_json::json!({"instances": {"w": entry(port)}});
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, doc.to_string()).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    fn age(path: &Path) {
        let old = SystemTime::now() - Duration::from_secs(10);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    #[test]
    fn a_changed_registry_is_read_again_and_an_unchanged_one_is_not() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("loopbus-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = store::registry_path(&root);
        let name = InstanceName::new("w").unwrap();
        let port = |found: Option<Entry>| found.map(|e| e.port);

        assert_eq!(port(lookup(&root, &name).unwrap()), None);
        write(&path, 7701);
        // Just written: read, and not kept yet (too fresh).
        assert_eq!(port(lookup(&root, &name).unwrap()), Some(7701));
        age(&path);
        assert_eq!(port(lookup(&root, &name).unwrap()), Some(7701));
        assert_eq!(port(lookup(&root, &name).unwrap()), Some(7701));
        // Replaced (a new inode): read again at once.
        write(&path, 7702);
        assert_eq!(port(lookup(&root, &name).unwrap()), Some(7702));
        age(&path);
        assert_eq!(port(lookup(&root, &name).unwrap()), Some(7702));
        // Made writable by others: refused, kept copy or not.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            lookup(&root, &name).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Removed: nothing, kept copy or not.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(port(lookup(&root, &name).unwrap()), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
