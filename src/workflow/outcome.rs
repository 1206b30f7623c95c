//! What a workflow returns: each delegation's [`Stage`], the summed usage, the verdict,
//! and the [`Conclusion`] the exit status follows (contract 9), decided by pure
//! functions.

use super::templates::Verdict;
use crate::client::{DelegateError, Reply};
use crate::protocol::{Failure, InstanceName, RequestId, TraceId, UsageReport};
use std::time::Duration;

/// One delegation of a workflow.
#[derive(Debug)]
#[non_exhaustive]
pub struct Stage {
    /// The instance asked.
    pub target: InstanceName,
    /// Its request id (the same across its retries).
    pub request_id: RequestId,
    /// The reply, or why there is none.
    pub outcome: Result<Reply, DelegateError>,
    /// From sending to the answer, retries included.
    pub elapsed: Duration,
}

/// A workflow's result.
#[derive(Debug)]
#[non_exhaustive]
pub struct Outcome {
    /// The delegations made, in the order of the list: fan's every target; chain's
    /// completed stages and the one that failed; verify's answerer, then its verifier
    /// when the answer came.
    pub stages: Vec<Stage>,
    /// How many delegations the workflow meant to make (chain: the stages listed;
    /// verify: 2).
    pub planned: usize,
    /// The summed usage of the delegations, failed ones too (tokens added, the cost the
    /// sum of the costs reported); `None` when none reported any.
    pub usage: Option<UsageReport>,
    /// verify only: the verdict, or the failure to read one, once the verifier replied.
    pub verdict: Option<Result<Verdict, Failure>>,
    /// The tree every delegation of the workflow joined (contract 8.4).
    pub trace_id: TraceId,
    /// The whole workflow's wall time.
    pub elapsed: Duration,
}

/// How a workflow ended, which the exit status follows (contract 9: 0, 1, 75).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conclusion {
    /// Every delegation succeeded (verify: with `VERDICT: PASS`).
    Success,
    /// A failure that is not retryable (verify: `VERDICT: FAIL`).
    Failure,
    /// Failures, every one of them retryable.
    Retryable,
}

impl Outcome {
    /// How the workflow ended: a failure when a failure is not retryable or the verdict
    /// is `FAIL` (or no verdict could be read, and that failure is not retryable), else
    /// retryable when anything failed, else success.
    pub fn conclusion(&self) -> Conclusion {
        let failures = self.stages.iter().filter_map(|s| s.outcome.as_ref().err());
        let verdict = match &self.verdict {
            Some(Ok(Verdict::Fail)) => Some(false),
            Some(Err(failure)) => Some(failure.retryable),
            None | Some(Ok(Verdict::Pass)) => None,
        };
        let flags: Vec<bool> = failures
            .map(DelegateError::retryable)
            .chain(verdict)
            .collect();
        match (flags.contains(&false), flags.is_empty()) {
            (true, _) => Conclusion::Failure,
            (false, true) => Conclusion::Success,
            (false, false) => Conclusion::Retryable,
        }
    }
}

/// The sum of the usage reports: tokens added (saturating), the cost the sum of the
/// costs reported (`None` when none reported one); `None` when there are no reports.
pub(super) fn sum_usage<'a>(
    reports: impl IntoIterator<Item = &'a UsageReport>,
) -> Option<UsageReport> {
    reports.into_iter().copied().reduce(|sum, one| UsageReport {
        cost_usd: match (sum.cost_usd, one.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        },
        input_tokens: sum.input_tokens.saturating_add(one.input_tokens),
        output_tokens: sum.output_tokens.saturating_add(one.output_tokens),
        cached_tokens: sum.cached_tokens.saturating_add(one.cached_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conclusion_table() {
        use crate::protocol::ErrorCode;
        use Conclusion::*;
        // A failed delegation, retryable or not.
        let stage = |retryable: bool| {
            let target = "w".to_owned();
            let error = match retryable {
                true => DelegateError::Timeout {
                    target,
                    after: Duration::ZERO,
                },
                false => DelegateError::Stopped { target },
            };
            assert_eq!(error.retryable(), retryable);
            Stage {
                target: InstanceName::new("w").unwrap(),
                request_id: RequestId::new("rrrrrrrrrrrrrrrr").unwrap(),
                outcome: Err(error),
                elapsed: Duration::ZERO,
            }
        };
        let unreadable = |retryable| crate::protocol::Failure {
            retryable,
            ..crate::protocol::Failure::new(ErrorCode::InvalidHandlerResponse, "no verdict")
        };
        /// Failures' retryable flags, the verdict (`Err`: none readable, retryable or
        /// not), the conclusion.
        type Case = (&'static [bool], Option<Result<Verdict, bool>>, Conclusion);
        let cases: [Case; 12] = [
            (&[], None, Success),
            (&[true], None, Retryable),
            (&[true, true], None, Retryable),
            (&[false], None, Failure),
            (&[true, false, true], None, Failure),
            (&[], Some(Ok(Verdict::Pass)), Success),
            (&[], Some(Ok(Verdict::Fail)), Failure),
            (&[], Some(Err(true)), Retryable),
            (&[], Some(Err(false)), Failure),
            (&[true], Some(Ok(Verdict::Fail)), Failure),
            (&[false], Some(Ok(Verdict::Pass)), Failure),
            (&[true], Some(Err(true)), Retryable),
        ];
        for (failures, verdict, want) in cases {
            let outcome = Outcome {
                stages: failures.iter().map(|&r| stage(r)).collect(),
                planned: failures.len(),
                usage: None,
                verdict: verdict.map(|v| v.map_err(unreadable)),
                trace_id: TraceId::new("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                elapsed: Duration::ZERO,
            };
            assert_eq!(outcome.conclusion(), want, "{failures:?} {verdict:?}");
        }
    }

    #[test]
    fn usage_sum_table() {
        let report = |cost_usd, tokens| UsageReport {
            cost_usd,
            input_tokens: tokens,
            output_tokens: tokens / 2,
            cached_tokens: 1,
        };
        assert_eq!(sum_usage([]), None);
        let cases = [
            (vec![report(Some(0.4), 10)], Some(0.4), 10),
            (
                vec![report(Some(0.4), 10), report(Some(0.6), 5)],
                Some(1.0),
                15,
            ),
            (vec![report(None, 10), report(Some(0.6), 5)], Some(0.6), 15),
            (vec![report(None, 10), report(None, 5)], None, 15),
            (
                vec![report(None, u64::MAX), report(None, 5)],
                None,
                u64::MAX,
            ),
        ];
        for (reports, cost, input) in cases {
            let sum = sum_usage(&reports).unwrap();
            match (sum.cost_usd, cost) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "{reports:?}"),
                (a, b) => assert_eq!(a, b, "{reports:?}"),
            }
            assert_eq!(sum.input_tokens, input);
            assert_eq!(sum.cached_tokens, reports.len() as u64);
        }
    }
}
