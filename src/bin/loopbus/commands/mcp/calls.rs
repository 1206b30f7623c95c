//! Running tool calls: who delegates, the one stdout writer, and each tool's call:
//! a delegating one starts a [`Job`] under a new handle and waits for it; `result`
//! and `cancel` find a job by its handle; `list_instances` and `trace` read.

use super::answers::{self, Answer, Kind};
use super::handles::{Handles, Refused};
use super::job::{lock, CallCtl, Job, Progress, Waited};
use super::tools::{self, Call, View};
use loopbus::{BusConfig, Event, InstanceName, StopHandle, TraceContext, TraceId, WorkflowOptions};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long `cancel` waits for the work to end once its cancel requests are answered.
pub const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// stdout, written one whole message a line at a time by every thread.
pub struct Out {
    stdout: Mutex<std::fs::File>,
}

impl Out {
    /// The process's stdout, through a descriptor of its own: a write blocked on a
    /// client that does not read holds no lock of std's `Stdout`, whose flush at the
    /// end of the process would otherwise wait for it.
    ///
    /// # Errors
    /// No descriptor left.
    pub fn stdout() -> std::io::Result<Out> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Out {
            stdout: Mutex::new(fd.into()),
        })
    }

    /// Writes `message` as one line. A failure (the client is gone) is logged: the
    /// end of stdin ends the process.
    pub fn send(&self, message: &Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        let mut stdout = lock(&self.stdout);
        if let Err(e) = stdout.write_all(&line).and_then(|()| stdout.flush()) {
            log::debug!("cannot write to stdout: {e}");
        }
    }
}

/// Who this process delegates as (contract 10: the instance of `--state-dir`, or the
/// operator of the channel root, as `loopbus talk`).
pub struct Caller {
    /// The channel root whose registry names the targets.
    pub root: PathBuf,
    /// `fromInstance`.
    pub name: InstanceName,
    /// The instance's state directory, whose config.json is read again for each call
    /// (peers and lists edited meanwhile count); `None`: the operator.
    pub state_dir: Option<PathBuf>,
    /// The bus config read at start-up (the operator's for good).
    pub bus: BusConfig,
    /// The current depth; delegations carry depth + 1.
    pub depth: u64,
}

impl Caller {
    /// The caller's bus config as it is now.
    fn bus(&self) -> Result<BusConfig, String> {
        match &self.state_dir {
            Some(dir) => super::super::own_config(dir)
                .map(|c| c.bus)
                .map_err(|e| e.to_string()),
            None => Ok(self.bus.clone()),
        }
    }
}

/// What the process shares between its calls.
pub struct Shared {
    /// stdout.
    pub out: Out,
    /// Who delegates.
    pub caller: Caller,
    /// The handles.
    pub handles: Mutex<Handles<Arc<Job>>>,
}

impl Shared {
    /// Runs `call` to its tool result (`None` when the client cancelled it).
    pub fn run(
        self: &Arc<Self>,
        call: Call,
        mut progress: Option<Progress>,
        parent: Option<TraceId>,
        ctl: &CallCtl,
    ) -> Option<Value> {
        let (job, offset, view, first) = match call {
            Call::ListInstances => return Some(self.list_instances()),
            Call::Trace { trace_id } => return Some(self.trace(trace_id)),
            Call::Delegate {
                kind,
                targets,
                verifier,
                prompt,
                timeout,
                view,
            } => match self.start(kind, targets, verifier, prompt, timeout, parent) {
                Ok(job) => (job, 0, view, true),
                Err(message) => return Some(tools::tool_result(&message, None, true)),
            },
            Call::Result {
                handle,
                offset,
                view,
            } => match self.job(&handle) {
                Ok(job) => (job, offset, view, false),
                Err(result) => return Some(result),
            },
            Call::Cancel { handle } => match self.job(&handle) {
                Ok(job) => {
                    job.cancel();
                    let view = View {
                        wait: CANCEL_WAIT,
                        max_chars: tools::DEFAULT_MAX_CHARS,
                    };
                    (job, 0, view, false)
                }
                Err(result) => return Some(result),
            },
        };
        ctl.watch(&job, first);
        let done = match job.wait(view.wait, progress.as_mut(), ctl, &self.out) {
            Waited::Abandoned => return None,
            Waited::Running => return Some(job.running()),
            Waited::Done(done) => done,
        };
        // A whole answer on the first try needs no handle.
        let handle = if first && done.fits(view.max_chars) {
            lock(&self.handles).remove(&job.handle);
            None
        } else {
            Some(job.handle.as_str())
        };
        Some(done.result(handle, offset, view.max_chars))
    }

    /// The job a handle names.
    fn job(&self, handle: &str) -> Result<Arc<Job>, Value> {
        lock(&self.handles)
            .get(handle, Instant::now())
            .cloned()
            .ok_or_else(|| {
                let message = format!(
                    "unknown or expired handle `{handle}`: answers are kept {} minutes after \
                     they come in, and handles die with the loopbus mcp process",
                    super::handles::FINISHED_TTL.as_secs() / 60
                );
                tools::tool_result(&message, None, true)
            })
    }

    /// Starts the workflow of a delegating tool under a new handle: `talk` is a fan
    /// to one target. A list not given is the caller's config's.
    fn start(
        self: &Arc<Self>,
        kind: Kind,
        targets: Option<Vec<InstanceName>>,
        verifier: Option<InstanceName>,
        prompt: String,
        timeout: Duration,
        parent: Option<TraceId>,
    ) -> Result<Arc<Job>, String> {
        let caller = &self.caller;
        let bus = caller.bus()?;
        // A trace the client names (`_meta.traceparent`), else the environment's
        // (this process runs inside an instance's turn), else a new one (contract 8.4).
        let trace = match parent {
            Some(trace_id) => TraceContext::joined(trace_id, None),
            None => {
                let (trace, warnings) =
                    TraceContext::from_env().map_err(|e| format!("cannot make a trace id: {e}"))?;
                for warning in warnings {
                    log::warn!("mcp: {warning}");
                }
                trace
            }
        };
        let (targets, key) = match (targets, kind) {
            (Some(targets), _) => (targets, ""),
            (None, Kind::Chain) => (bus.chain.clone(), "bus.chain"),
            (None, _) => (bus.parallel.clone(), "bus.parallel"),
        };
        if targets.is_empty() {
            return Err(format!(
                "no instances to ask: give `targets`, or list them in {key} of {}'s config.json",
                caller.name
            ));
        }
        let verifier = match (kind, verifier.or_else(|| bus.verifier.clone())) {
            (Kind::Verify, None) => {
                return Err(format!(
                    "no verifier: give `verifier`, or set bus.verifier in {}'s config.json",
                    caller.name
                ))
            }
            (_, verifier) => verifier,
        };
        let names: Vec<&str> = targets.iter().map(InstanceName::as_str).collect();
        let label = match (kind, &verifier) {
            (Kind::Verify, Some(verifier)) => format!("verify by {} and {verifier}", names[0]),
            (Kind::Talk, _) => format!("talk to {}", names.join(", ")),
            (Kind::Chain, _) => format!("chain through {}", names.join(", ")),
            _ => format!("fan to {}", names.join(", ")),
        };
        let total = targets.len() + usize::from(kind == Kind::Verify);
        let stop = StopHandle::new();
        let job = self.add_job(label, total, trace.trace_id.to_string(), stop.clone())?;
        let seen = Arc::clone(&job);
        let options = WorkflowOptions::new(caller.root.clone(), caller.name.clone(), bus)
            .with_depth(caller.depth)
            .with_timeout(timeout)
            .with_trace(trace)
            .with_stop(stop)
            .with_observer(Arc::new(move |event: Event<'_>| {
                if let Event::Finished { .. } = event {
                    seen.answered();
                }
            }));
        let caller_name = caller.name.to_string();
        self.spawn_work(&job, move || {
            let ran = match (kind, &verifier) {
                (Kind::Chain, _) => loopbus::chain(&options, &targets, &prompt),
                (Kind::Verify, Some(verifier)) => {
                    loopbus::verify(&options, &targets[0], verifier, &prompt)
                }
                _ => loopbus::fan(&options, &targets, &prompt),
            };
            match ran {
                Ok(outcome) => match (kind, outcome.stages.first()) {
                    (Kind::Talk, Some(stage)) => answers::talk(stage, &caller_name),
                    _ => answers::workflow(kind, &outcome, &caller_name),
                },
                Err(error) => answers::refused(&error),
            }
        })?;
        Ok(job)
    }

    /// A new job under a fresh handle.
    fn add_job(
        &self,
        label: String,
        total: usize,
        trace_id: String,
        stop: StopHandle,
    ) -> Result<Arc<Job>, String> {
        let handle = loopbus::new_request_id()
            .map_err(|e| format!("cannot make a handle: {e}"))?
            .to_string();
        let job = Arc::new(Job::new(handle.clone(), label, total, trace_id, stop));
        match lock(&self.handles).add(&handle, Arc::clone(&job)) {
            Ok(()) => Ok(job),
            Err(Refused::Full) => Err(format!(
                "{} delegations are running already under handles (the limit): wait for \
                 their results or cancel some, then try again [server_busy, retryable]",
                super::handles::MAX_PENDING
            )),
            Err(Refused::Taken) => Err("a handle was minted twice; try again".to_owned()),
            Err(Refused::Closed) => Err("loopbus mcp is exiting".to_owned()),
        }
    }

    /// Runs `work` on a thread of its own; its outcome finishes `job`.
    fn spawn_work(
        self: &Arc<Self>,
        job: &Arc<Job>,
        work: impl FnOnce() -> Answer + Send + 'static,
    ) -> Result<(), String> {
        let shared = Arc::clone(self);
        let job = Arc::clone(job);
        let handle = job.handle.clone();
        let spawned = std::thread::Builder::new()
            .name("mcp-work".to_owned())
            .spawn(move || {
                let bytes = job.finish(answers::caught(work));
                lock(&shared.handles).finish(&job.handle, bytes, Instant::now());
            });
        spawned.map(drop).map_err(|e| {
            lock(&self.handles).remove(&handle);
            format!("cannot start the delegation: {e}")
        })
    }

    /// The `list_instances` result.
    fn list_instances(&self) -> Value {
        let kinds = match self.caller.bus() {
            Ok(bus) => bus.accept_kinds,
            Err(message) => return tools::tool_result(&message, None, true),
        };
        let listed = match loopbus::list_instances(&self.caller.root, Some(&kinds)) {
            Ok(listed) => listed,
            Err(e) => {
                let path = loopbus::registry_path(&self.caller.root);
                let message = format!("cannot read {}: {e}", path.display());
                return tools::tool_result(&message, None, true);
            }
        };
        let mut lines = Vec::new();
        let instances: Vec<Value> = listed
            .iter()
            .map(|l| {
                let health = l.liveness.as_ref().ok().map(|a| &a.health);
                let busy = health
                    .and_then(|h| h.turns)
                    .map(|t| t.running + t.queued > 0);
                let problem = l.liveness.as_ref().err().map(ToString::to_string);
                lines.push(match (&problem, busy) {
                    (Some(problem), _) => format!("{}: not alive ({problem})", l.name),
                    (None, Some(true)) => format!("{}: alive, busy", l.name),
                    (None, _) => format!("{}: alive", l.name),
                });
                json!({
                    "name": l.name.as_str(),
                    "alive": l.liveness.is_ok(),
                    "kind": health.map(|h| h.kind.clone()),
                    "busy": busy,
                    "problem": problem,
                })
            })
            .collect();
        if lines.is_empty() {
            lines.push(format!(
                "no instances registered in {}",
                loopbus::registry_path(&self.caller.root).display()
            ));
        }
        tools::tool_result(
            &lines.join("\n"),
            Some(json!({ "instances": instances })),
            false,
        )
    }

    /// The `trace` result: the tree of `trace_id`, else of the caller's last trace.
    fn trace(&self, trace_id: Option<TraceId>) -> Value {
        let root = &self.caller.root;
        let cannot = |e: std::io::Error| {
            let message = format!("cannot read the channel root {}: {e}", root.display());
            tools::tool_result(&message, None, true)
        };
        let trace_id = match trace_id {
            Some(trace_id) => trace_id,
            None => match super::super::trace::last_trace(root, self.caller.name.as_str()) {
                Ok(Some(trace_id)) => trace_id,
                Ok(None) => {
                    let message = format!(
                        "no trace started by {} in the audit logs under {}",
                        self.caller.name,
                        root.display()
                    );
                    return tools::tool_result(&message, None, true);
                }
                Err(e) => return cannot(e),
            },
        };
        let trace = match super::super::trace::read_trace(root, &trace_id) {
            Ok(trace) => trace,
            Err(e) => return cannot(e),
        };
        if trace.nodes.is_empty() {
            let message = format!(
                "no turn of trace {trace_id} in the audit logs under {}",
                root.display()
            );
            return tools::tool_result(&message, None, true);
        }
        // Strings, numbers and options always serialize.
        let structured = serde_json::to_value(&trace).unwrap_or_default();
        let text = super::super::trace::render(&trace);
        tools::tool_result(text.trim_end(), Some(structured), false)
    }

    /// Cancels every job still running, and waits (at most `limit`) for them to end:
    /// the process is about to exit, and starts no job any more.
    pub fn cancel_all(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let jobs: Vec<Arc<Job>> = {
            let mut handles = lock(&self.handles);
            handles.close();
            handles.pending_values().cloned().collect()
        };
        for job in &jobs {
            let job = Arc::clone(job);
            let _ = std::thread::Builder::new()
                .name("mcp-cancel".to_owned())
                .spawn(move || job.cancel());
        }
        for job in &jobs {
            job.wait_done(deadline);
        }
    }
}
