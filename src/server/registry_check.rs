//! The instance's registry entry while it lives ([`Registration`]): a self-check on a
//! thread of its own that every [`REGISTRY_CHECK_INTERVAL`] checks that the entry is
//! still there and writes it again if the file was deleted, torn or rewritten without
//! it, and the entry's removal when the registration is dropped (after `run`, or with
//! an instance dropped without it). The check reads and writes files and takes the
//! registry lock, so it never runs on the event loop. The instance starts it just before
//! registering (its first check is an interval away), and dropping it stops the thread
//! before the entry is removed, so that it cannot write the entry back.

use crate::protocol::InstanceName;
use crate::registry;
use crate::secret::Secret;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// How often the instance checks that its registry entry is still there (and writes it
/// again if the file was deleted or torn).
pub const REGISTRY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long stopping waits for a check in progress to end. A check only reads and
/// writes a small file and never waits for the registry lock, so it ends at once
/// unless the file system itself hangs.
const STOP_PATIENCE: Duration = Duration::from_secs(5);

/// The entry as registered: what the check writes again, and what is removed.
struct OwnEntry {
    root: PathBuf,
    name: InstanceName,
    addr: SocketAddr,
    pid: u32,
    secret: Secret,
}

/// The running self-check. Dropping it stops the check (waiting at most
/// [`STOP_PATIENCE`] for one in progress), then removes the entry if it is still this
/// process's (its pid).
pub(super) struct Registration {
    entry: Arc<OwnEntry>,
    /// Dropped (disconnected) to ask the thread to stop.
    stop: Option<Sender<()>>,
    /// Signalled (or disconnected) when the thread has ended.
    stopped: Receiver<()>,
}

impl Registration {
    /// Starts checking `name`'s entry under `root`, first after one interval.
    ///
    /// # Errors
    ///
    /// The OS refused to start the thread.
    pub(super) fn start(
        root: PathBuf,
        name: InstanceName,
        addr: SocketAddr,
        pid: u32,
        secret: Secret,
    ) -> io::Result<Registration> {
        let entry = Arc::new(OwnEntry {
            root,
            name,
            addr,
            pid,
            secret,
        });
        let (stop, stop_asked) = mpsc::channel();
        // One slot: the thread signals once, and never waits to do so.
        let (stopped_tx, stopped) = mpsc::sync_channel(1);
        let checked = Arc::clone(&entry);
        std::thread::Builder::new()
            .name("loopbus-registry".to_owned())
            .spawn(move || run(&checked, &stop_asked, &stopped_tx))?;
        Ok(Registration {
            entry,
            stop: Some(stop),
            stopped,
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop = None;
        if let Err(RecvTimeoutError::Timeout) = self.stopped.recv_timeout(STOP_PATIENCE) {
            log::warn!(
                "the registry check did not stop within {} s",
                STOP_PATIENCE.as_secs()
            );
        }
        let OwnEntry { root, name, .. } = &*self.entry;
        if let Err(e) = registry::deregister(root, name, self.entry.pid) {
            log::warn!(
                "cannot deregister from {}: {e}",
                registry::registry_path(root).display()
            );
        }
    }
}

fn run(entry: &OwnEntry, stop_asked: &Receiver<()>, stopped: &SyncSender<()>) {
    let mut last_error = None;
    // Nothing is ever sent: the channel disconnects when a stop is asked for.
    while let Err(RecvTimeoutError::Timeout) = stop_asked.recv_timeout(REGISTRY_CHECK_INTERVAL) {
        check(entry, &mut last_error);
    }
    let _ = stopped.try_send(());
}

/// Writes the entry again if it went missing. An error is warned about when it differs
/// from the last one, so a lasting problem is not repeated every interval.
fn check(entry: &OwnEntry, last_error: &mut Option<String>) {
    let OwnEntry { root, name, .. } = entry;
    match registry::ensure_registered(root, name, entry.addr, entry.pid, &entry.secret) {
        Ok(written) => {
            if written {
                log::warn!(
                    "{}: the entry of {name} was missing; registered again",
                    registry::registry_path(root).display()
                );
            }
            *last_error = None;
        }
        Err(e) => {
            let error = e.to_string();
            if last_error.as_deref() != Some(error.as_str()) {
                log::warn!(
                    "cannot check {}: {error}",
                    registry::registry_path(root).display()
                );
            }
            *last_error = Some(error);
        }
    }
}
