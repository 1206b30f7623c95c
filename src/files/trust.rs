//! Trust: who may have written a state file. A file or directory is trusted only when
//! it belongs to us (or root) and neither its group nor others may write to it, so that
//! another local user can neither plant a config nor redirect a registry.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Permission bits that let the group or others change a file or a directory's entries.
const GROUP_OTHER_WRITE: u32 = 0o022;

/// What [`check_trusted`] checks, for its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrustKind {
    /// A state file (the registry, config.json).
    File,
    /// A state directory or a channel root.
    Dir,
}

/// A file or directory that another user may have written, so its contents can't be
/// trusted: it is owned by another uid than ours (and not by root), or it is writable
/// by its group or by others. The message names the path, owner, mode and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Untrusted {
    /// The path checked.
    pub path: PathBuf,
    /// File or directory.
    pub kind: TrustKind,
    /// Its owner's uid.
    pub owner: u32,
    /// Its permission bits.
    pub mode: u32,
    /// Our effective uid.
    pub us: u32,
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, owner, mode, us) = (self.kind, self.owner, self.mode, self.us);
        let what = match kind {
            TrustKind::File => "file",
            TrustKind::Dir => "directory",
        };
        let path = self.path.display();
        write!(
            f,
            "refusing {path}: this {what} is owned by uid {owner} with mode {mode:o}"
        )?;
        if !owner_trusted(owner, us) {
            write!(
                f,
                ", not by us (uid {us}): another user may have planted it; remove it, or \
                 `chown {us} {path}` if it is really ours"
            )
        } else if kind == TrustKind::Dir && mode & STICKY != 0 {
            // A shared sticky directory such as /tmp: never loosen it; move off it.
            f.write_str(
                ", a directory every user may write to (like /tmp); put the channel root in \
                 a private directory of its own instead (`loopbus init /tmp/bus/NAME` \
                 creates /tmp/bus private)",
            )
        } else {
            write!(
                f,
                ", writable by others than its owner; run `chmod go-w {path}`"
            )
        }
    }
}

impl std::error::Error for Untrusted {}

/// The sticky bit: in a directory everyone may write to, only a file's owner may remove
/// or rename it (`/tmp`).
const STICKY: u32 = 0o1000;

/// Whether files of `owner` are trusted by the process running as `us`: our own, and
/// root's (root can write anything of ours anyway).
fn owner_trusted(owner: u32, us: u32) -> bool {
    owner == us || owner == 0
}

/// Checks that `meta` (the metadata of `path`) is of a file or directory no other user may
/// have written: owned by us or by root, and not writable by group or others. A
/// directory writable by others is refused even with the sticky bit: a channel root
/// or a state directory must be private to us (contract 1).
///
/// # Errors
///
/// `PermissionDenied` wrapping an [`Untrusted`] (see [`untrusted`]).
pub fn check_trusted_metadata(path: &Path, meta: &fs::Metadata, kind: TrustKind) -> io::Result<()> {
    let us = rustix::process::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    if owner_trusted(meta.uid(), us) && mode & GROUP_OTHER_WRITE == 0 {
        return Ok(());
    }
    let untrusted = Untrusted {
        path: path.to_path_buf(),
        kind,
        owner: meta.uid(),
        mode,
        us,
    };
    Err(io::Error::new(io::ErrorKind::PermissionDenied, untrusted))
}

/// Checks that the file or directory at `path` is one no other user may have written:
/// owned by us or by root, and not writable by group or others (a directory writable
/// by others is refused even with the sticky bit). A symlink is trusted only if it is
/// owned by us or root, and then its target is checked. The rule `serve` applies to
/// the channel root, the state directory, config.json and the registry.
///
/// # Errors
///
/// Any error reading the metadata (`NotFound` for a missing path), or
/// `PermissionDenied` wrapping an [`Untrusted`].
pub fn check_trusted(path: &Path, kind: TrustKind) -> io::Result<()> {
    let link = fs::symlink_metadata(path)?;
    if !link.file_type().is_symlink() {
        return check_trusted_metadata(path, &link, kind);
    }
    // A symlink: only its owner counts (its own mode means nothing), then its target.
    match check_trusted_metadata(path, &link, kind) {
        Err(err) if untrusted(&err).is_some_and(|u| !owner_trusted(u.owner, u.us)) => Err(err),
        _ => check_trusted_metadata(path, &fs::metadata(path)?, kind),
    }
}

/// The [`Untrusted`] inside an error of [`check_trusted`] (or of a trusted read), if
/// that is what it is.
pub fn untrusted(err: &io::Error) -> Option<&Untrusted> {
    err.get_ref()?.downcast_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn untrusted(kind: TrustKind, mode: u32) -> String {
        Untrusted {
            path: PathBuf::from("/some/dir"),
            kind,
            owner: 1000,
            mode,
            us: 1000,
        }
        .to_string()
    }

    /// The fix named for a shared sticky directory was `chmod go-w /tmp`, which would
    /// break every other user of /tmp.
    #[test]
    fn bug_the_fix_for_a_state_directory_in_tmp_was_to_chmod_tmp() {
        let sticky = untrusted(TrustKind::Dir, 0o1777);
        assert!(!sticky.contains("chmod"), "{sticky}");
        assert!(sticky.contains("private directory"), "{sticky}");
        // A plain group-writable directory or file: tightening it is the fix.
        assert!(untrusted(TrustKind::Dir, 0o775).contains("chmod go-w /some/dir"));
        assert!(untrusted(TrustKind::File, 0o1666).contains("chmod go-w /some/dir"));
    }
}
