//! Cancelling a delegation (contract 8.1): the cancel request `loopbus talk` sends on
//! SIGINT/SIGTERM and when it gives up for good, and that a library caller sends with
//! [`cancel`].
//!
//! A cancel request is `POST /api/talk` from the same `fromInstance`, at the same
//! depth, with `prompt: ""` and `ext: {"requestId": ID, "cancel": true}`. It goes only
//! to a peer whose health listed `cancel-on-hangup`: the original implementation would
//! run it as a new turn with an empty prompt. The target is proven exactly as for the
//! delegation itself (the secret goes only on a connection whose health answer
//! matched), and the whole cancel is bounded by [`CANCEL_TIMEOUT`].

use super::attempt;
use super::{DelegateError, DelegateOptions};
use crate::engine::KILL_GRACE;
use crate::protocol::{self, Envelope, RequestExt, CANCEL_ON_HANGUP};
use crate::registry::probe::PROBE_TIMEOUT;
use std::time::Duration;

/// What a cancel waits beyond the engine's kill grace: the health probe (at most
/// `PROBE_TIMEOUT`, 500 ms), the reaping of the killed engine and the answer's round
/// trip.
const CANCEL_MARGIN: Duration = Duration::from_secs(2);

/// Longest a cancel may take, its health probe included: the engine's kill grace
/// (3 s) plus a margin of 2 s. A server answers a cancel once the turn's engine is
/// gone, and an engine that ignores SIGTERM goes only at the SIGKILL that follows
/// SIGTERM after that grace; a shorter wait would report such a cancel as
/// unconfirmed although it worked.
pub const CANCEL_TIMEOUT: Duration = KILL_GRACE.saturating_add(CANCEL_MARGIN);

/// How a cancel ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The peer answered the cancel request with this envelope: a `cancelled` failure
    /// for a turn it cancelled, the stored envelope of a turn that had finished, or an
    /// `invalid_request` failure for a request id it does not know (the turn never
    /// arrived, or was forgotten).
    Answered(Envelope),
    /// The target's health did not list `cancel-on-hangup`: nothing was sent, and
    /// closing the delegation's connection is all a caller can do.
    NotSupported,
    /// The options carry no request id ([`DelegateOptions::with_request_id`]), so the
    /// delegation cannot be named; nothing was sent.
    NoRequestId,
}

/// Cancels the delegation that `options` describe: the one sent with the same
/// `options` (the same caller, target, depth and request id), which may be running on
/// another thread. Give the delegation its id with
/// [`DelegateOptions::with_request_id`] (from [`super::new_request_id`]) so that both
/// name the same turn.
///
/// ```no_run
/// use loopbus::{cancel, delegate, new_request_id, BusConfig, DelegateOptions, InstanceName};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let options = DelegateOptions::new(
///     "/home/me/.loopbus",
///     InstanceName::new("reviewer")?,
///     BusConfig::open(),
///     InstanceName::new("worker")?,
///     "A long review",
/// )
/// .with_request_id(new_request_id()?);
/// let running = options.clone();
/// let turn = std::thread::spawn(move || delegate(&running));
/// // ... the user gives up:
/// let outcome = cancel(&options)?;
/// println!("{outcome:?}; the delegation ends with {:?}", turn.join());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// A [`DelegateError`] when the cancel could not be sent or got no envelope back
/// within [`CANCEL_TIMEOUT`]: the target is not registered or its probe failed, the
/// connection broke, the answer is not an envelope. The caller's local checks apply
/// as to the delegation.
pub fn cancel(options: &DelegateOptions) -> Result<CancelOutcome, DelegateError> {
    let Some(request_id) = options.request_id.clone() else {
        return Ok(CancelOutcome::NoRequestId);
    };
    attempt::local_checks(options)?;
    let peer = attempt::prove(options)?;
    if !peer.capabilities.iter().any(|c| c == CANCEL_ON_HANGUP) {
        return Ok(CancelOutcome::NotSupported);
    }
    let ext = RequestExt {
        request_id: Some(request_id),
        cancel: true,
        ..RequestExt::default()
    };
    let request = attempt::request(options, "", ext);
    // The probe takes at most PROBE_TIMEOUT; the answer gets the rest.
    let timeout = CANCEL_TIMEOUT.saturating_sub(PROBE_TIMEOUT);
    let response = attempt::send(options, peer, request, timeout)?;
    protocol::parse_answer(response.status, &response.body)
        .map(CancelOutcome::Answered)
        .map_err(|e| DelegateError::InvalidResponse {
            target: options.target.to_string(),
            reason: format!("HTTP {} to the cancel request: {e}", response.status),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusConfig;
    use crate::protocol::InstanceName;

    #[test]
    fn the_whole_cancel_fits_its_bound() {
        assert!(PROBE_TIMEOUT < CANCEL_MARGIN);
        // The answer to a cancel of an engine that ignores SIGTERM comes after the
        // kill grace; the wait for it, after the probe, outlasts that.
        assert!(CANCEL_TIMEOUT.saturating_sub(PROBE_TIMEOUT) > KILL_GRACE);
        assert_eq!(CANCEL_TIMEOUT, Duration::from_secs(5), "as the docs say");
    }

    #[test]
    fn a_delegation_without_a_request_id_cannot_be_cancelled() {
        let name = |s: &str| InstanceName::new(s).unwrap();
        let options = DelegateOptions::new(
            "/nonexistent",
            name("me"),
            BusConfig::default(),
            name("w"),
            "p",
        );
        assert_eq!(cancel(&options).unwrap(), CancelOutcome::NoRequestId);
    }
}
