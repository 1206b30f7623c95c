//! A workflow's [`Plan`]: before it sends anything, its list checked
//! ([`WorkflowError`]), the tree its delegations join and a request id for each; then
//! each delegation run, and the [`Outcome`] of those run.

use super::outcome::sum_usage;
use super::{Event, Outcome, Stage, Verdict, WorkflowOptions, MAX_TARGETS};
use crate::client::{self, delegate, new_request_id, DelegateError, DelegateOptions, TraceContext};
use crate::protocol::{Failure, InstanceName, RequestId};
use std::fmt;
use std::time::Instant;

/// Why a workflow sent nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkflowError {
    /// The list of targets is empty.
    NoTargets,
    /// The list names more than [`MAX_TARGETS`].
    TooManyTargets {
        /// How many it names.
        count: usize,
    },
    /// The list names the caller itself.
    CallerInList {
        /// The caller.
        caller: InstanceName,
    },
    /// The list names an instance the caller's `peers` does not allow.
    PeerNotAllowed {
        /// The caller.
        caller: InstanceName,
        /// The instance named.
        target: InstanceName,
    },
    /// No request id could be made from the OS's randomness.
    NoRandomness {
        /// Why not.
        error: std::io::Error,
    },
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoTargets => f.write_str("the list of instances is empty"),
            Self::TooManyTargets { count } => {
                write!(
                    f,
                    "the list names {count} instances, more than {MAX_TARGETS}"
                )
            }
            Self::CallerInList { caller } => {
                write!(f, "the list names the caller itself, {caller}")
            }
            Self::PeerNotAllowed { caller, target } => {
                write!(f, "{target} is not among {caller}'s own peers")
            }
            Self::NoRandomness { error } => {
                write!(
                    f,
                    "cannot make a request id from the OS's randomness: {error}"
                )
            }
        }
    }
}

impl std::error::Error for WorkflowError {}

/// A workflow under way: its options and targets, the tree its delegations join, a
/// request id for each delegation, and when it started.
pub(super) struct Plan {
    options: WorkflowOptions,
    targets: Vec<InstanceName>,
    trace: TraceContext,
    ids: Vec<RequestId>,
    started: Instant,
}

impl Plan {
    /// Runs delegation `index` unless the workflow was stopped, telling the observer.
    pub(super) fn run(&self, index: usize, prompt: String) -> Stage {
        let (options, target, request_id) = (&self.options, &self.targets[index], &self.ids[index]);
        let mut delegation = DelegateOptions::new(
            &options.root,
            options.caller.clone(),
            options.bus.clone(),
            target.clone(),
            prompt,
        )
        .with_depth(options.depth)
        .with_timeout(options.timeout)
        .with_retries(options.retries)
        .with_request_id(request_id.clone())
        .with_trace(self.trace.clone());
        let tell = |event| {
            if let Some(observer) = &options.observer {
                observer.event(event);
            }
        };
        let started = Instant::now();
        let outcome = if options.stop.enter(&mut delegation) {
            tell(Event::Started {
                index,
                target,
                request_id,
            });
            let outcome = delegate(&delegation);
            options.stop.leave(&delegation);
            // Given up for good on a turn that may still run there: cancel it (contract
            // 8.1), as `talk` does.
            if outcome
                .as_ref()
                .is_err_and(|e| matches!(e.cause(), DelegateError::Timeout { .. }))
            {
                let _ = client::cancel(&delegation);
            }
            outcome
        } else {
            Err(DelegateError::Stopped {
                target: target.to_string(),
            })
        };
        let stage = Stage {
            target: target.clone(),
            request_id: request_id.clone(),
            outcome,
            elapsed: started.elapsed(),
        };
        tell(Event::Finished {
            index,
            stage: &stage,
        });
        stage
    }

    /// The outcome of `stages`, with their summed usage (a failed turn may have cost
    /// something too).
    pub(super) fn finish(
        self,
        stages: Vec<Stage>,
        verdict: Option<Result<Verdict, Failure>>,
    ) -> Outcome {
        let usage = sum_usage(stages.iter().filter_map(|s| match &s.outcome {
            Ok(reply) => reply.usage.as_ref(),
            Err(error) => error.usage(),
        }));
        Outcome {
            stages,
            planned: self.targets.len(),
            usage,
            verdict,
            trace_id: self.trace.trace_id,
            elapsed: self.started.elapsed(),
        }
    }
}

/// Checks a workflow's list before anything is sent, and makes the [`Plan`].
pub(super) fn prepare(
    options: &WorkflowOptions,
    targets: &[InstanceName],
) -> Result<Plan, WorkflowError> {
    if targets.is_empty() {
        return Err(WorkflowError::NoTargets);
    }
    if targets.len() > MAX_TARGETS {
        return Err(WorkflowError::TooManyTargets {
            count: targets.len(),
        });
    }
    let caller = &options.caller;
    for target in targets {
        if target == caller {
            return Err(WorkflowError::CallerInList {
                caller: caller.clone(),
            });
        }
        if !options.bus.peers.allows(target.as_str()) {
            return Err(WorkflowError::PeerNotAllowed {
                caller: caller.clone(),
                target: target.clone(),
            });
        }
    }
    let random = |error| WorkflowError::NoRandomness { error };
    let trace = options.trace.clone().map_or_else(TraceContext::new, Ok);
    let trace = trace.map_err(random)?;
    let ids = targets
        .iter()
        .map(|_| new_request_id().map_err(random))
        .collect::<Result<_, _>>()?;
    Ok(Plan {
        options: options.clone(),
        targets: targets.to_vec(),
        trace,
        ids,
        started: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BusConfig, Peers};

    #[test]
    fn lists_are_checked_before_anything_is_sent() {
        let name = |s: &str| InstanceName::new(s).unwrap();
        let mut bus = BusConfig::open();
        bus.peers = Peers::Only(vec!["a".into(), "b".into(), "me".into()]);
        let options = WorkflowOptions::new("/nonexistent", name("me"), bus);
        let many: Vec<InstanceName> = (0..=MAX_TARGETS).map(|_| name("a")).collect();
        // (list, the refusal's message, or None: accepted)
        let cases: [(&[InstanceName], Option<&str>); 6] = [
            (&[], Some("the list of instances is empty")),
            (
                &[name("a"), name("me")],
                Some("names the caller itself, me"),
            ),
            (
                &[name("a"), name("c")],
                Some("c is not among me's own peers"),
            ),
            (&many, Some("names 33 instances, more than 32")),
            (&[name("a")], None),
            (&[name("a"), name("b"), name("a")], None),
        ];
        for (list, refusal) in cases {
            match (prepare(&options, list), refusal) {
                (Err(e), Some(message)) => assert!(e.to_string().contains(message), "{e}"),
                (Ok(plan), None) => {
                    assert_eq!(plan.ids.len(), list.len());
                    let mut ids = plan.ids.clone();
                    ids.dedup();
                    assert_eq!(ids.len(), list.len(), "one request id per delegation");
                    let given = TraceContext::new().unwrap();
                    let joined = prepare(&options.clone().with_trace(given.clone()), list);
                    assert_eq!(joined.unwrap().trace.trace_id, given.trace_id, "one trace");
                }
                (got, want) => panic!("{list:?}: {:?} where {want:?}", got.err()),
            }
        }
    }
}
