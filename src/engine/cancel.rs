//! [`CancelToken`]: how the server tells a running turn that its caller gave up
//! (contract 8.1). Cancelling sets a flag and makes the turn's eventfd readable, so the
//! turn's thread, asleep in `poll` over the engine's pipes, wakes at once. The eventfd
//! exists only while an engine runs ([`CancelToken::arm`]): a queued turn holds no
//! descriptor.

use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Shared by the server (which cancels) and the turn's thread (which stops its engine).
/// Cloning shares the one flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    cancelled: Arc<AtomicBool>,
    /// Readable once cancelled, while armed.
    wake: Arc<Mutex<Option<Arc<OwnedFd>>>>,
}

impl CancelToken {
    /// A token not cancelled yet.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels: the turn stops its engine (SIGTERM, then SIGKILL after
    /// [`super::process::KILL_GRACE`]) or, if it has not started one, does not start it.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let wake = self.wake_lock().clone();
        if let Some(fd) = wake {
            // The counter only has to become non-zero; a full counter is readable too.
            let _ = rustix::io::write(&*fd, &1u64.to_ne_bytes());
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Creates the eventfd a running engine's turn polls beside its pipes: readable
    /// once cancelled (also when the cancel came first). `None` where the OS gave no
    /// eventfd: the turn then looks at the flag every [`super::process::CANCEL_POLL`].
    /// Dropped again by [`CancelToken::disarm`].
    pub(super) fn arm(&self) -> Option<Arc<OwnedFd>> {
        let fd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok()?);
        *self.wake_lock() = Some(Arc::clone(&fd));
        // A cancel that came before the fd was there wrote nothing to it.
        if self.is_cancelled() {
            let _ = rustix::io::write(&*fd, &1u64.to_ne_bytes());
        }
        Some(fd)
    }

    /// Drops the eventfd once the engine is gone.
    pub(super) fn disarm(&self) {
        *self.wake_lock() = None;
    }

    fn wake_lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<OwnedFd>>> {
        // Nothing panics while holding this lock.
        self.wake.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    #[test]
    fn cancel_sets_the_flag_and_wakes_a_poll() {
        let token = CancelToken::new();
        let clone = token.clone();
        assert!(!clone.is_cancelled());
        let fd = token.arm().expect("eventfd");
        let zero = Timespec::default();
        let mut fds = [PollFd::new(&*fd, PollFlags::IN)];
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 0);
        token.cancel();
        token.cancel();
        assert!(clone.is_cancelled());
        let mut fds = [PollFd::new(&*fd, PollFlags::IN)];
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 1);
        token.disarm();
        // Armed after the cancel: readable at once.
        let late = token.arm().expect("eventfd");
        let mut fds = [PollFd::new(&*late, PollFlags::IN)];
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 1);
    }
}
