//! The instance's registry entry while it lives ([`Registration`]): a self-check on a
//! thread of its own that every [`REGISTRY_CHECK_INTERVAL`] checks that the entry is
//! still there and writes it again if the file was deleted, torn or rewritten without
//! it, and the entry's removal when the registration is dropped (after `run`, or with
//! an instance dropped without it). The check reads and writes files and takes the
//! registry lock, so it never runs on the event loop. [`Registration::claim`] registers the
//! instance, refusing a name already running, just after starting the thread (its first
//! check is an interval away), and dropping it stops the thread before the entry is
//! removed, so that it cannot write the entry back.

use super::error::setup;
use super::ServeError;
use crate::protocol::InstanceName;
use crate::registry;
use crate::secret::Secret;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// How often the instance checks that its registry entry is still there (and writes it
/// again if the file was deleted or torn).
pub const REGISTRY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long stopping waits for a check in progress to end. A check only reads and
/// writes a small file and never waits for the registry lock, so it ends at once
/// unless the file system itself hangs.
const STOP_PATIENCE: Duration = Duration::from_secs(5);

/// The running self-check. Dropping it stops the check (waiting at most
/// [`STOP_PATIENCE`] for one in progress), then removes the entry if it is still this
/// process's (its pid).
pub(super) struct Registration {
    /// The channel root it is registered under.
    pub(super) root: PathBuf,
    name: InstanceName,
    pid: u32,
    /// Dropped (disconnected) to ask the thread to stop.
    stop: Option<Sender<()>>,
    /// Disconnected when the thread has ended.
    stopped: Receiver<()>,
}

impl Registration {
    /// Registers `name` at `addr` under `root`, refusing when an instance of that name
    /// is already running there ([`registry::holds_name`]): the check and the write are
    /// one hold of the registry lock, so of two starts of one name at the same moment
    /// exactly one runs (a check before binding and a write after let both run, and one
    /// was left unreachable). Then checks the entry every interval.
    ///
    /// # Errors
    ///
    /// [`ServeError::NameTaken`]; [`ServeError::Setup`] when the OS refused the thread
    /// or the registry could not be written.
    pub(super) fn claim(
        root: PathBuf,
        name: InstanceName,
        addr: SocketAddr,
        pid: u32,
        secret: &Secret,
    ) -> Result<Registration, ServeError> {
        let (stop, stop_asked) = mpsc::channel::<()>();
        // Disconnected when the thread ends, which drops its sender.
        let (stopped_tx, stopped) = mpsc::channel::<()>();
        let checked = (root.clone(), name.clone(), secret.clone(), stopped_tx);
        // Started before registering, so that no failure comes after it; its first
        // check is one interval away.
        std::thread::Builder::new()
            .name("loopbus-registry".to_owned())
            .spawn(move || {
                let (root, name, secret, _stopped) = checked;
                let mut last_error = None;
                // Nothing is ever sent: the channel disconnects when a stop is asked for.
                while let Err(RecvTimeoutError::Timeout) =
                    stop_asked.recv_timeout(REGISTRY_CHECK_INTERVAL)
                {
                    let path = registry::registry_path(&root);
                    let error = match registry::ensure_registered(&root, &name, addr, pid, &secret)
                    {
                        Ok(true) => {
                            let path = path.display();
                            log::warn!("{path}: the entry of {name} was missing; registered again");
                            None
                        }
                        Ok(false) => None,
                        Err(e) => Some(e.to_string()),
                    };
                    // Warned about when it differs from the last one, so that a lasting
                    // problem is not repeated every interval.
                    if let Some(error) = error.as_ref().filter(|e| last_error.as_ref() != Some(*e))
                    {
                        log::warn!("cannot check {}: {error}", path.display());
                    }
                    last_error = error;
                }
            })
            .map_err(setup("cannot start the registry check"))?;
        // Refused, the registration is dropped: its check stops, and the entry, not
        // ours, stays.
        let registration = Registration {
            root,
            name,
            pid,
            stop: Some(stop),
            stopped,
        };
        let (root, name) = (&registration.root, &registration.name);
        let holder = registry::register_at(root, name, addr, pid, secret, |entry| {
            registry::holds_name(name, entry)
        });
        let path = registry::registry_path(root);
        match holder.map_err(setup(format!("cannot register in {}", path.display())))? {
            None => Ok(registration),
            Some(entry) => Err(ServeError::NameTaken {
                name: name.to_string(),
                root: root.to_path_buf(),
                pid: entry.pid,
                port: entry.port,
            }),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop = None;
        if let Err(RecvTimeoutError::Timeout) = self.stopped.recv_timeout(STOP_PATIENCE) {
            let secs = STOP_PATIENCE.as_secs();
            log::warn!("the registry check did not stop within {secs} s");
        }
        if let Err(e) = registry::deregister(&self.root, &self.name, self.pid) {
            log::warn!(
                "cannot deregister from {}: {e}",
                registry::registry_path(&self.root).display()
            );
        }
    }
}
