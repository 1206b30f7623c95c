//! [`StopHandle`]: stops a running workflow from another thread, by cancelling every
//! delegation in flight by its request id (contract 8.1) and sending no new one.

use crate::client::{cancel, CancelOutcome, DelegateError, DelegateOptions, CANCEL_TIMEOUT};
use crate::protocol::{ErrorCode, InstanceName};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a cancel that found no turn of its request id (the request was still on
/// its way: probe, proof) waits before it is sent again, for as long as the delegation
/// is in flight, within [`CANCEL_TIMEOUT`].
const CANCEL_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// Stops a workflow from another thread; clones share one state. Give it to the
/// workflow with [`super::WorkflowOptions::with_stop`], keep a clone, and call
/// [`StopHandle::stop`] when the user gives up.
#[derive(Clone, Debug, Default)]
pub struct StopHandle {
    /// The delegations sent and not yet answered.
    in_flight: Arc<Mutex<Vec<DelegateOptions>>>,
    /// Set (while `in_flight` is locked) by [`StopHandle::stop`]; each delegation's
    /// retries look at it too.
    stopped: Arc<AtomicBool>,
}

impl StopHandle {
    /// A handle not yet stopped.
    pub fn new() -> StopHandle {
        StopHandle::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<DelegateOptions>> {
        // Every update leaves a valid list: a panic while holding it changes nothing.
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether [`StopHandle::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Stops the workflow: no delegation is sent from now on (chain's later stages,
    /// verify's verifier, fan's targets still waiting for a thread end with
    /// `DelegateError::Stopped`; one waiting to retry sends no retry and ends with its
    /// last failure), and every one in flight gets its cancel request, all at once;
    /// those then end with the peer's `cancelled` failure. A cancel the peer
    /// answers with `invalid_request` (no turn of that id yet: the request is still on
    /// its way) is sent again every 100 ms while the delegation is in
    /// flight, within [`CANCEL_TIMEOUT`]. Returns each cancel's target and last outcome.
    pub fn stop(&self) -> Vec<(InstanceName, Result<CancelOutcome, DelegateError>)> {
        let in_flight = {
            let in_flight = self.lock();
            self.stopped.store(true, Ordering::SeqCst);
            in_flight.clone()
        };
        std::thread::scope(|scope| {
            let cancels: Vec<_> = in_flight
                .iter()
                .map(|options| scope.spawn(move || (options.target.clone(), self.cancel(options))))
                .collect();
            cancels
                .into_iter()
                .filter_map(|cancel| cancel.join().ok())
                .collect()
        })
    }

    /// Cancels one delegation, again while its request has not arrived.
    fn cancel(&self, options: &DelegateOptions) -> Result<CancelOutcome, DelegateError> {
        let deadline = Instant::now() + CANCEL_TIMEOUT;
        loop {
            let outcome = cancel(options);
            let not_yet = matches!(&outcome, Ok(CancelOutcome::Answered(envelope))
                if envelope.failure.as_ref().is_some_and(|f| f.code == ErrorCode::InvalidRequest));
            let in_flight = || {
                self.lock()
                    .iter()
                    .any(|o| o.request_id == options.request_id)
            };
            if !not_yet || Instant::now() + CANCEL_AGAIN_AFTER >= deadline || !in_flight() {
                return outcome;
            }
            std::thread::sleep(CANCEL_AGAIN_AFTER);
        }
    }

    /// Records a delegation about to be sent, and gives it the stop flag its retries
    /// look at; `false` (nothing recorded) when stopped.
    pub(super) fn enter(&self, options: &mut DelegateOptions) -> bool {
        let mut in_flight = self.lock();
        let stopped = self.is_stopped();
        if !stopped {
            options.stop = Some(Arc::clone(&self.stopped));
            in_flight.push(options.clone());
        }
        !stopped
    }

    /// Forgets a delegation that ended.
    pub(super) fn leave(&self, options: &DelegateOptions) {
        self.lock().retain(|o| o.request_id != options.request_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusConfig;

    #[test]
    fn a_stopped_handle_lets_nothing_in() {
        let name = |s: &str| InstanceName::new(s).unwrap();
        let mut options = DelegateOptions::new(
            "/nonexistent",
            name("me"),
            BusConfig::open(),
            name("w"),
            "p",
        );
        let handle = StopHandle::new();
        let clone = handle.clone();
        assert!(handle.enter(&mut options));
        assert!(options.stop.is_some(), "its retries look at the flag");
        handle.leave(&options);
        assert!(!clone.is_stopped());
        // Nothing in flight: nothing to cancel.
        assert!(clone.stop().is_empty());
        assert!(handle.is_stopped());
        assert!(!handle.enter(&mut options));
        assert!(handle.stop().is_empty());
    }
}
