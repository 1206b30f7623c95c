//! Before a workflow sends anything: its list checked ([`WorkflowError`]), the tree its
//! delegations join, and a request id for each delegation.

use super::{WorkflowOptions, MAX_TARGETS};
use crate::client::{new_request_id, TraceContext};
use crate::protocol::{InstanceName, RequestId, TraceId};
use std::fmt;

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

/// A workflow about to run: its options with the tree its delegations join, and a
/// request id for each delegation.
pub(super) struct Plan {
    pub(super) options: WorkflowOptions,
    pub(super) trace_id: TraceId,
    pub(super) ids: Vec<RequestId>,
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
    let trace = match &options.trace {
        Some(trace) => trace.clone(),
        None => TraceContext::new().map_err(random)?,
    };
    let ids = targets
        .iter()
        .map(|_| new_request_id().map_err(random))
        .collect::<Result<_, _>>()?;
    Ok(Plan {
        trace_id: trace.trace_id.clone(),
        options: options.clone().with_trace(trace),
        ids,
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
                    assert_eq!(plan.options.trace.map(|t| t.trace_id), Some(plan.trace_id));
                }
                (got, want) => panic!("{list:?}: {:?} where {want:?}", got.err()),
            }
        }
    }
}
