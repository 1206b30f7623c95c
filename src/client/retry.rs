//! When a failed delegation is tried again, and after how long: the pure decision and
//! the backoff with full jitter, on plain values (no clock, no sleep, no socket, and
//! the random number given), so that they are tested with fixed ones.
//!
//! A failure is retried only when its `retryable` is true and retries are left. A
//! failure that may have run the turn (a timeout, ours or the peer's own, a connection
//! broken after the request was sent, an answer that is no envelope, an `unknown`
//! failure: `DelegateError::may_have_run`) is retried
//! only against a peer whose health listed `idempotent-requests`: that peer attaches
//! the retry to the turn (contract 8.2), any other would run it a second time.

use super::{DelegateError, DelegateOptions};
use std::time::Duration;

/// The first retry's backoff ceiling, unless `DelegateOptions::backoff_base` says
/// otherwise: retry `n` (from 0) waits a uniform random time in
/// `[0, min(cap, base * 2^n)]`.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(250);
/// The largest backoff ceiling, unless `DelegateOptions::backoff_cap` says otherwise.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Try again, after [`DelegateOptions::backoff_delay`].
    Retry,
    /// Stop: the failure is not retryable, or no retries are left.
    GiveUp,
    /// Stop although retries are left: the failure may have run the turn and the peer
    /// does not deduplicate requests, so a retry could run it twice.
    WouldRunTwice,
}

/// Exponential backoff with full jitter, between `backoff_base` and `backoff_cap`.
impl DelegateOptions {
    /// The ceiling of retry `retry` (from 0): `min(backoff_cap, backoff_base * 2^retry)`,
    /// without overflow.
    pub(super) fn backoff_ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.backoff_cap)
    }

    /// How long retry `retry` waits: uniform in `[0, backoff_ceiling(retry)]`, to the
    /// microsecond, given a uniform `random` number (the modulo's bias is far below
    /// what jitter cares for).
    pub(super) fn backoff_delay(&self, retry: u32, random: u64) -> Duration {
        let ceiling = u64::try_from(self.backoff_ceiling(retry).as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(random % ceiling.saturating_add(1))
    }
}

/// Decides what follows the failed attempt `failed`, when `retries_left` of the retries
/// allowed have not been made yet, against a peer that deduplicates requests
/// (`peer_dedupes`: its health listed `idempotent-requests`) or not.
pub fn decide(failed: &DelegateError, retries_left: u32, peer_dedupes: bool) -> Decision {
    if !failed.retryable() || retries_left == 0 {
        Decision::GiveUp
    } else if failed.may_have_run() && !peer_dedupes {
        Decision::WouldRunTwice
    } else {
        Decision::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options with this backoff; nothing else of them matters here.
    fn with_backoff(base: Duration, cap: Duration) -> DelegateOptions {
        let name = |s: &str| crate::protocol::InstanceName::new(s).unwrap();
        let bus = crate::config::BusConfig::default();
        DelegateOptions {
            backoff_base: base,
            backoff_cap: cap,
            ..DelegateOptions::new("/r", name("a"), bus, name("b"), "p")
        }
    }

    /// The default backoff.
    fn default() -> DelegateOptions {
        with_backoff(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP)
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let backoff = default();
        let cases = [
            (0, MS(250)),
            (1, MS(500)),
            (2, MS(1_000)),
            (5, MS(8_000)),
            (6, MS(10_000)),
            (31, MS(10_000)),
            (32, MS(10_000)),
            (u32::MAX, MS(10_000)),
        ];
        for (retry, want) in cases {
            assert_eq!(backoff.backoff_ceiling(retry), want, "retry {retry}");
        }
        let huge = with_backoff(Duration::MAX, Duration::MAX);
        assert_eq!(huge.backoff_ceiling(3), Duration::MAX);
    }

    #[test]
    fn delays_are_full_jitter_within_the_ceiling() {
        let backoff = default();
        // splitmix64 stands in for the OS's random numbers.
        let mut state = 7u64;
        let mut random = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = (state ^ (state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for retry in 0..10 {
            let mut lowest = Duration::MAX;
            let mut highest = Duration::ZERO;
            for _ in 0..2_000 {
                let delay = backoff.backoff_delay(retry, random());
                assert!(
                    delay <= backoff.backoff_ceiling(retry),
                    "retry {retry}: {delay:?}"
                );
                lowest = lowest.min(delay);
                highest = highest.max(delay);
            }
            // Full jitter: the whole range is used, from near zero to near the ceiling.
            assert!(
                lowest < backoff.backoff_ceiling(retry) / 20,
                "retry {retry}"
            );
            assert!(
                highest > backoff.backoff_ceiling(retry) * 19 / 20,
                "retry {retry}"
            );
        }
        let none = with_backoff(Duration::ZERO, Duration::ZERO);
        assert_eq!(none.backoff_delay(4, u64::MAX), Duration::ZERO);
    }

    #[test]
    fn the_same_random_gives_the_same_delay_and_the_ends_are_reached() {
        let backoff = default();
        assert_eq!(backoff.backoff_delay(3, 42), backoff.backoff_delay(3, 42));
        assert_ne!(backoff.backoff_delay(3, 42), backoff.backoff_delay(3, 43));
        let ceiling = backoff.backoff_ceiling(3);
        assert_eq!(backoff.backoff_delay(3, 0), Duration::ZERO);
        let top = u64::try_from(ceiling.as_micros()).unwrap();
        assert_eq!(backoff.backoff_delay(3, top), ceiling);
        let huge = with_backoff(Duration::MAX, Duration::MAX);
        assert!(huge.backoff_delay(0, u64::MAX) <= Duration::MAX);
    }

    #[test]
    fn decision_table() {
        use crate::protocol::{ErrorCode, Failure};
        let t = || "worker".to_owned();
        // (retryable, may have run the turn): one failure of each kind.
        let failed = |retryable, may_have_run| match (retryable, may_have_run) {
            (true, false) => DelegateError::NotRegistered { target: t() },
            (false, false) => DelegateError::BusDisabled { caller: t() },
            (false, true) => DelegateError::Remote {
                from_instance: t(),
                failure: Failure {
                    retryable: false,
                    ..Failure::new(ErrorCode::Timeout, "e")
                },
                duration_ms: 1,
                peer: Box::default(),
                usage: None,
            },
            (true, true) => DelegateError::Timeout {
                target: t(),
                after: Duration::from_secs(1),
            },
        };
        // (failure, retries done, retries allowed, peer dedupes, retried?)
        let cases: [(DelegateError, u32, u32, bool, Option<Decision>); 10] = [
            (failed(true, false), 0, 2, false, None),
            (failed(true, false), 1, 2, false, None),
            (failed(true, false), 2, 2, false, Some(Decision::GiveUp)),
            (failed(true, false), 0, 0, true, Some(Decision::GiveUp)),
            (failed(false, false), 0, 5, true, Some(Decision::GiveUp)),
            (failed(false, true), 0, 5, false, Some(Decision::GiveUp)),
            (
                failed(true, true),
                0,
                5,
                false,
                Some(Decision::WouldRunTwice),
            ),
            (failed(true, true), 0, 5, true, None),
            (failed(true, true), 4, 5, true, None),
            (failed(true, true), 5, 5, false, Some(Decision::GiveUp)),
        ];
        for (failure, done, allowed, dedupes, want) in cases {
            assert_eq!(
                (failure.retryable(), failure.may_have_run()),
                (
                    !matches!(
                        failure,
                        DelegateError::BusDisabled { .. } | DelegateError::Remote { .. }
                    ),
                    matches!(
                        failure,
                        DelegateError::Timeout { .. } | DelegateError::Remote { .. }
                    )
                ),
                "{failure:?}"
            );
            let got = decide(&failure, allowed - done, dedupes);
            let want = want.unwrap_or(Decision::Retry);
            assert_eq!(got, want, "{failure:?} {done}/{allowed} {dedupes}");
        }
    }

    /// The peer's own `timeout` envelope (its engine ran until the peer stopped it) was
    /// retried against a peer without `idempotent-requests`, which ran it again.
    #[test]
    fn bug_a_timeout_the_peer_answered_was_retried_against_a_peer_that_reruns_it() {
        use crate::client::PeerProtocol;
        use crate::protocol::{ErrorCode, Failure};
        let remote = |code| DelegateError::Remote {
            from_instance: "worker".into(),
            failure: Failure::new(code, "e"),
            duration_ms: 1,
            peer: Box::new(PeerProtocol::default()),
            usage: None,
        };
        let ours = DelegateError::Timeout {
            target: "worker".into(),
            after: Duration::from_secs(1),
        };
        // (failure, peer dedupes, what follows)
        let cases = [
            (
                remote(ErrorCode::Timeout),
                false,
                Some(Decision::WouldRunTwice),
            ),
            (remote(ErrorCode::Timeout), true, None),
            (ours, false, Some(Decision::WouldRunTwice)),
            (
                remote(ErrorCode::Unknown),
                false,
                Some(Decision::WouldRunTwice),
            ),
            // Refused before any engine ran: retried against any peer.
            (remote(ErrorCode::ServerBusy), false, None),
        ];
        for (error, dedupes, want) in cases {
            let got = decide(&error, 3, dedupes);
            assert_eq!(got, want.unwrap_or(Decision::Retry), "{error:?} {dedupes}");
        }
    }
}
