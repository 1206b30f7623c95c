//! The delegation workflows of contract 9, client-side compositions of [`delegate`]:
//! [`fan`] (one prompt to several instances at once), [`chain`] (each stage's reply
//! passed on to the next) and [`verify`] (an answer, then a verifier's verdict on it).
//!
//! Each acts as the caller, like `loopbus talk`: every delegation is an ordinary one,
//! with its own request id from the start, the caller's retries (never running a turn
//! twice) and timeout, and a cancel request when it gives up for good on a timeout.
//! Nothing new goes on the wire. The list is checked before anything is sent
//! ([`WorkflowError`]). A [`StopHandle`] stops a workflow from another thread; an
//! [`Observer`] sees each delegation start and end, from the thread that ran it.
//!
//! ```no_run
//! use loopbus::{fan, BusConfig, InstanceName, WorkflowOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let options = WorkflowOptions::new("/home/me/.loopbus", InstanceName::new("lead")?, BusConfig::open());
//! let targets = [InstanceName::new("a")?, InstanceName::new("b")?];
//! let outcome = fan(&options, &targets, "Name one risk in this plan")?;
//! for stage in &outcome.stages {
//!     match &stage.outcome {
//!         Ok(reply) => println!("{}: {}", stage.target, reply.text),
//!         Err(e) => println!("{}: {e} [{}]", stage.target, e.code()),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use crate::client::{self, TraceContext};
use crate::config::BusConfig;
use crate::protocol::{InstanceName, RequestId};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

mod outcome;
mod plan;
mod stop;
mod templates;

pub use outcome::{Conclusion, Outcome, Stage};
use plan::prepare;
pub use plan::WorkflowError;
pub use stop::StopHandle;
pub use templates::Verdict;
use templates::{chain_prompt, parse_verdict, verify_prompt};

/// Most delegations `fan` runs at once; further targets wait for a thread.
pub const FAN_THREADS: usize = 8;

/// Most targets a workflow's list may name.
pub const MAX_TARGETS: usize = 32;

/// The caller's delegation settings that every delegation of a workflow shares,
/// built with [`WorkflowOptions::new`] and the `with_` setters.
#[derive(Clone)]
#[non_exhaustive]
pub struct WorkflowOptions {
    /// The channel root whose registry names the targets.
    pub root: PathBuf,
    /// The calling instance, sent as `fromInstance`.
    pub caller: InstanceName,
    /// The caller's own `bus` config: its `peers` decide which targets are allowed.
    pub bus: BusConfig,
    /// The caller's current depth; each request carries `depth + 1`.
    pub depth: u64,
    /// How long each attempt of each delegation waits for its answer.
    pub timeout: Duration,
    /// How many times each delegation retries a retryable failure.
    pub retries: u32,
    /// Stops the workflow from another thread.
    pub stop: StopHandle,
    /// Told of each delegation's start and end.
    pub observer: Option<Arc<dyn Observer>>,
    /// The tree every delegation of the workflow joins (contract 8.4), each with its
    /// own request id; `None`: a new tree per workflow.
    pub trace: Option<TraceContext>,
}

impl WorkflowOptions {
    /// Delegations from `caller`, under its own `bus` config, to instances of the
    /// channel root `root`: at depth 0, with [`client::DEFAULT_TIMEOUT`], no retries, a
    /// fresh [`StopHandle`] and no observer until set otherwise.
    pub fn new(root: impl Into<PathBuf>, caller: InstanceName, bus: BusConfig) -> WorkflowOptions {
        WorkflowOptions {
            root: root.into(),
            caller,
            bus,
            depth: 0,
            timeout: client::DEFAULT_TIMEOUT,
            retries: 0,
            stop: StopHandle::new(),
            observer: None,
            trace: None,
        }
    }

    /// The caller's current delegation depth.
    pub fn with_depth(self, depth: u64) -> WorkflowOptions {
        WorkflowOptions { depth, ..self }
    }

    /// How long each attempt of each delegation waits for its answer.
    pub fn with_timeout(self, timeout: Duration) -> WorkflowOptions {
        WorkflowOptions { timeout, ..self }
    }

    /// Retries of each delegation, as [`client::DelegateOptions::with_retries`].
    pub fn with_retries(self, retries: u32) -> WorkflowOptions {
        WorkflowOptions { retries, ..self }
    }

    /// The handle that stops this workflow; keep a clone to call it.
    pub fn with_stop(self, stop: StopHandle) -> WorkflowOptions {
        WorkflowOptions { stop, ..self }
    }

    /// The observer told of each delegation's start and end.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> WorkflowOptions {
        self.observer = Some(observer);
        self
    }

    /// The tree the workflow's delegations join, as [`TraceContext::from_env`] finds
    /// it in an engine's environment, or a given one.
    pub fn with_trace(mut self, trace: TraceContext) -> WorkflowOptions {
        self.trace = Some(trace);
        self
    }
}

impl fmt::Debug for WorkflowOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowOptions")
            .field("root", &self.root)
            .field("caller", &self.caller)
            .field("depth", &self.depth)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("stopped", &self.stop.is_stopped())
            .finish_non_exhaustive()
    }
}

/// Something that happened to one delegation of a workflow.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// Delegation `index` is being sent (its place in the list; verify: 0 the
    /// answerer, 1 the verifier).
    Started {
        /// Its place.
        index: usize,
        /// The instance asked.
        target: &'a InstanceName,
        /// Its request id.
        request_id: &'a RequestId,
    },
    /// Delegation `index` ended: answered or failed.
    Finished {
        /// Its place.
        index: usize,
        /// The delegation and its outcome.
        stage: &'a Stage,
    },
}

/// Told of each [`Event`], on the thread that ran the delegation (fan's run on
/// several at once): keep `event` short, it holds up that delegation's result.
pub trait Observer: Send + Sync {
    /// One event.
    fn event(&self, event: Event<'_>);
}

impl<F: Fn(Event<'_>) + Send + Sync> Observer for F {
    fn event(&self, event: Event<'_>) {
        self(event)
    }
}

/// Sends `prompt` to every target at once (at most [`FAN_THREADS`] at a time), each at
/// the same depth; the outcome keeps the list's order, whatever the order of the
/// answers. One target's slowness or failure holds up no other's: the observer hears
/// of each as it ends.
///
/// # Errors
/// A [`WorkflowError`] when the list is empty, too long, names the caller or a target
/// the caller's `peers` does not allow; nothing is sent then. Every delegation's own
/// failure is in its [`Stage`].
pub fn fan(
    options: &WorkflowOptions,
    targets: &[InstanceName],
    prompt: &str,
) -> Result<Outcome, WorkflowError> {
    let plan = prepare(options, targets)?;
    let next = AtomicUsize::new(0);
    let done: Vec<OnceLock<Stage>> = targets.iter().map(|_| OnceLock::new()).collect();
    std::thread::scope(|scope| {
        for _ in 0..targets.len().min(FAN_THREADS) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                let Some(slot) = done.get(index) else { return };
                // Each index is taken once: its slot is set once.
                let _ = slot.set(plan.run(index, prompt.to_owned()));
            });
        }
    });
    let stages = done.into_iter().filter_map(OnceLock::into_inner).collect();
    Ok(plan.finish(stages, None))
}

/// Sends `prompt` to the first target, then to each next one the prompt with the
/// previous stage's reply under a line naming that stage (contract 9's template), one
/// after the other. The first failure ends the chain; the completed stages and the
/// failed one are in the outcome.
///
/// # Errors
/// As [`fan`]'s.
pub fn chain(
    options: &WorkflowOptions,
    targets: &[InstanceName],
    prompt: &str,
) -> Result<Outcome, WorkflowError> {
    let plan = prepare(options, targets)?;
    let mut stages: Vec<Stage> = Vec::new();
    for index in 0..targets.len() {
        let stage_prompt = match stages.last().map(|s| (s.target.as_str(), &s.outcome)) {
            None => prompt.to_owned(),
            Some((by, Ok(reply))) => chain_prompt(prompt, by, index, targets.len(), &reply.text),
            Some((_, Err(_))) => break,
        };
        stages.push(plan.run(index, stage_prompt));
    }
    Ok(plan.finish(stages, None))
}

/// Asks `answerer` the prompt, then `verifier` to check the answer (contract 9's
/// template), and reads the verdict from its reply: its first non-empty line is
/// `VERDICT: PASS` or `VERDICT: FAIL` in any case, else the verdict is a retryable
/// `invalid_handler_response` failure. If the answerer fails, the verifier is not
/// asked.
///
/// # Errors
/// As [`fan`]'s, for the list of the answerer and the verifier.
pub fn verify(
    options: &WorkflowOptions,
    answerer: &InstanceName,
    verifier: &InstanceName,
    prompt: &str,
) -> Result<Outcome, WorkflowError> {
    let plan = prepare(options, &[answerer.clone(), verifier.clone()])?;
    let answer = plan.run(0, prompt.to_owned());
    let check = answer
        .outcome
        .as_ref()
        .ok()
        .map(|reply| plan.run(1, verify_prompt(prompt, answerer.as_str(), &reply.text)));
    let verdict = check
        .as_ref()
        .and_then(|check| check.outcome.as_ref().ok())
        .map(|reply| parse_verdict(&reply.text));
    let stages = std::iter::once(answer).chain(check).collect();
    Ok(plan.finish(stages, verdict))
}
