//! Running tool calls: the work a delegating call starts (a [`Job`] on threads of its
//! own, named by a handle from its start), the bounded wait for it with progress
//! notifications, the pages of its answer, and its cancellation.
//!
//! Progress (2025-06-18 and later, unchanged in 2026-07-28): a call whose `_meta`
//! carries a `progressToken` gets `notifications/progress` [`PROGRESS_FIRST`] after it
//! starts waiting, then at least every [`PROGRESS_INTERVAL`] and whenever one more
//! target answers, until its answer is sent.

use super::answers::{self, Answer, Kind};
use super::handles::{Handles, Refused};
use super::tools::{self, Call, View};
use loopbus::{BusConfig, Event, InstanceName, StopHandle, TraceContext, TraceId, WorkflowOptions};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// When the first progress notification of a waiting call goes out.
pub const PROGRESS_FIRST: Duration = Duration::from_secs(1);
/// Longest time between two progress notifications of a waiting call.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// The elapsed time at which the progress within one target's share reaches half
/// (see [`progress_value`]).
const PROGRESS_HALF_SECS: f64 = 60.0;
/// How long `cancel` waits for the work to end once its cancel requests are answered.
pub const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// Locks `mutex`; a panic while it was held left valid data behind (every update
/// is a single assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// stdout, written one whole message a line at a time by every thread.
pub struct Out {
    stdout: Mutex<std::io::Stdout>,
}

impl Out {
    /// The process's stdout.
    pub fn stdout() -> Out {
        Out {
            stdout: Mutex::new(std::io::stdout()),
        }
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

/// A finished job's answer, how long its work took, and the trace of its
/// delegations.
pub struct Done {
    answer: Answer,
    elapsed: Duration,
    trace_id: String,
}

impl Done {
    /// Roughly what keeping the answer costs, for the handles' byte bound.
    fn bytes(&self) -> usize {
        let fields = Value::Object(self.answer.fields.clone());
        self.answer.text.len() + fields.to_string().len()
    }
}

#[derive(Default)]
struct JobState {
    answered: usize,
    done: Option<Arc<Done>>,
    cancelling: bool,
}

/// The work of one delegating call: its delegations run on threads of their own
/// until they end, whether or not anyone still waits.
pub struct Job {
    /// The handle naming it.
    pub handle: String,
    /// What it is, for messages: `talk to worker`.
    label: String,
    /// How many targets answer in all.
    total: usize,
    /// The trace every delegation of the job joins.
    trace_id: String,
    started: Instant,
    state: Mutex<JobState>,
    changed: Condvar,
    /// Stops its workflow: cancels every delegation in flight, sends no new one.
    stop: StopHandle,
}

impl Job {
    /// One more target answered.
    fn answered(&self) {
        lock(&self.state).answered += 1;
        self.changed.notify_all();
    }

    fn finish(&self, done: Done) {
        lock(&self.state).done = Some(Arc::new(done));
        self.changed.notify_all();
    }

    /// Cancels the work's delegations (the first call only; blocks until the
    /// targets answered the cancel requests, at most `loopbus::CANCEL_TIMEOUT`).
    pub fn cancel(&self) {
        {
            let mut state = lock(&self.state);
            if state.done.is_some() || state.cancelling {
                return;
            }
            state.cancelling = true;
        }
        self.stop.stop();
    }

    /// Wakes whoever waits on the job (its call was cancelled).
    fn poke(&self) {
        let _state = lock(&self.state);
        self.changed.notify_all();
    }

    /// Waits until the work is done, at most until `deadline`.
    pub fn wait_done(&self, deadline: Instant) {
        let mut state = lock(&self.state);
        while state.done.is_none() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A tool call in flight, as `notifications/cancelled` finds it.
#[derive(Default)]
pub struct CallCtl {
    cancelled: AtomicBool,
    /// The job the call waits on, and whether the call started it (its delegations
    /// are then the call's own, cancelled with it).
    watching: Mutex<Option<(Arc<Job>, bool)>>,
}

impl CallCtl {
    /// Whether the client cancelled the call: it then gets no answer.
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// The client cancelled the call: stop its wait, and cancel the work it started.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let Some((job, owned)) = lock(&self.watching).clone() else {
            return;
        };
        job.poke();
        if owned {
            // Not on the reading thread: the cancel requests take their time.
            let spawned = std::thread::Builder::new()
                .name("mcp-cancel".to_owned())
                .spawn(move || job.cancel());
            if let Err(e) = spawned {
                log::warn!("cannot start a thread to cancel a call: {e}");
            }
        }
    }

    fn watch(&self, job: &Arc<Job>, owned: bool) {
        *lock(&self.watching) = Some((Arc::clone(job), owned));
    }
}

/// A call's progress notifications: its token and the last value sent.
pub struct Progress {
    /// The client's `progressToken`.
    pub token: Value,
    last: f64,
}

impl Progress {
    /// Notifications for `token`.
    pub fn new(token: Value) -> Progress {
        Progress { token, last: -1.0 }
    }
}

/// The `progress` value of a job with `answered` targets done after `elapsed`: the
/// count answered plus a share of the next one that grows with time but never
/// reaches it, so that it increases with each notification as the spec requires.
pub fn progress_value(answered: usize, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    answered as f64 + secs / (secs + PROGRESS_HALF_SECS)
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

/// How a wait ended.
enum Waited {
    Done(Arc<Done>),
    Running,
    /// The call was cancelled.
    Abandoned,
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
        let done = match self.wait(&job, view.wait, progress.as_mut(), ctl) {
            Waited::Abandoned => return None,
            Waited::Running => return Some(running(&job)),
            Waited::Done(done) => done,
        };
        let page = tools::page(&done.answer.text, offset, view.max_chars);
        // A whole answer on the first try needs no handle.
        let handle = if first && page.next.is_none() {
            lock(&self.handles).remove(&job.handle);
            None
        } else {
            Some(job.handle.as_str())
        };
        Some(answer(&done, handle, offset, &page))
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

    /// Waits at most `limit` for `job`, sending progress notifications.
    fn wait(
        &self,
        job: &Job,
        limit: Duration,
        mut progress: Option<&mut Progress>,
        ctl: &CallCtl,
    ) -> Waited {
        let start = Instant::now();
        let deadline = start + limit;
        let mut next_note = start + PROGRESS_FIRST;
        let mut state = lock(&job.state);
        let mut noted = state.answered;
        loop {
            if let Some(done) = &state.done {
                return Waited::Done(Arc::clone(done));
            }
            if ctl.cancelled() {
                return Waited::Abandoned;
            }
            let now = Instant::now();
            if let Some(progress) = progress.as_deref_mut() {
                if now >= next_note || state.answered != noted {
                    noted = state.answered;
                    drop(state);
                    self.notify(job, noted, progress);
                    next_note = Instant::now() + PROGRESS_INTERVAL;
                    state = lock(&job.state);
                    continue;
                }
            }
            if now >= deadline {
                return Waited::Running;
            }
            let until = if progress.is_some() {
                deadline.min(next_note)
            } else {
                deadline
            };
            state = job
                .changed
                .wait_timeout(state, until.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn notify(&self, job: &Job, answered: usize, progress: &mut Progress) {
        let elapsed = job.started.elapsed();
        let value = progress_value(answered, elapsed);
        if value <= progress.last {
            return;
        }
        progress.last = value;
        self.out.send(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progressToken": progress.token,
                "progress": value,
                "total": job.total,
                "message": format!("{}: {answered} of {} answered, {} s",
                    job.label, job.total, elapsed.as_secs()),
            },
        }));
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
                Err(error) => Answer {
                    text: error.to_string(),
                    is_error: true,
                    ..Answer::default()
                },
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
        let job = Arc::new(Job {
            handle: handle.clone(),
            label,
            total,
            trace_id,
            started: Instant::now(),
            state: Mutex::new(JobState::default()),
            changed: Condvar::new(),
            stop,
        });
        match lock(&self.handles).add(&handle, Arc::clone(&job)) {
            Ok(()) => Ok(job),
            Err(Refused::Full) => Err(format!(
                "{} delegations are running already under handles (the limit): wait for \
                 their results or cancel some, then try again [server_busy, retryable]",
                super::handles::MAX_PENDING
            )),
            Err(Refused::Taken) => Err("a handle was minted twice; try again".to_owned()),
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
                let done = Done {
                    answer: work(),
                    elapsed: job.started.elapsed(),
                    trace_id: job.trace_id.clone(),
                };
                let bytes = done.bytes();
                job.finish(done);
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
            None => match loopbus::last_trace(root, self.caller.name.as_str()) {
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
        let trace = match loopbus::read_trace(root, &trace_id) {
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
    /// the process is about to exit.
    pub fn cancel_all(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let jobs: Vec<Arc<Job>> = lock(&self.handles).pending_values().cloned().collect();
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

/// The tool result of work still running.
fn running(job: &Job) -> Value {
    let state = lock(&job.state);
    let elapsed = job.started.elapsed();
    let text = format!(
        "{} is still running after {} s ({} of {} answered). Call `result` with handle \
         \"{}\" to wait for the answer (the work goes on meanwhile), or `cancel` to stop it.",
        job.label,
        elapsed.as_secs(),
        state.answered,
        job.total,
        job.handle
    );
    let structured = json!({
        "status": "running",
        "handle": job.handle,
        "elapsedSecs": secs(elapsed),
        "answered": state.answered,
        "total": job.total,
        "traceId": job.trace_id,
    });
    tools::tool_result(&text, Some(structured), false)
}

/// The tool result of a finished job's page.
fn answer(done: &Done, handle: Option<&str>, offset: usize, page: &tools::Page<'_>) -> Value {
    let mut fields = done.answer.fields.clone();
    fields.insert("status".to_owned(), json!("done"));
    fields.insert("elapsedSecs".to_owned(), json!(secs(done.elapsed)));
    fields.insert("offset".to_owned(), json!(offset));
    fields.insert("nextOffset".to_owned(), json!(page.next));
    fields.insert("totalChars".to_owned(), json!(page.total));
    fields.insert("traceId".to_owned(), json!(done.trace_id));
    let mut text = page.text.to_owned();
    if let Some(handle) = handle {
        fields.insert("handle".to_owned(), json!(handle));
        if let Some(next) = page.next {
            text.push_str(&format!(
                "\n\n[cut at character {next} of {}: call `result` with handle \"{handle}\" \
                 and offset {next} for the rest]",
                page.total
            ));
        }
    }
    tools::tool_result(&text, Some(Value::Object(fields)), done.answer.is_error)
}

/// Seconds, to the millisecond.
fn secs(elapsed: Duration) -> f64 {
    (elapsed.as_millis() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_grows_with_time_and_with_each_answer() {
        let at = |answered, secs| progress_value(answered, Duration::from_secs(secs));
        assert_eq!(at(0, 0), 0.0);
        assert!(at(0, 1) < at(0, 10) && at(0, 10) < at(0, 3600));
        assert!(
            at(0, 1_000_000) < 1.0,
            "a target's share never reaches the next"
        );
        assert!(at(1, 0) > at(0, 1_000_000));
        assert_eq!(at(2, 60), 2.5);
    }

    #[test]
    fn a_cut_page_tells_how_to_get_the_rest() {
        let done = Done {
            answer: Answer {
                text: "abcdef".to_owned(),
                ..Answer::default()
            },
            elapsed: Duration::from_millis(1500),
            trace_id: "t".to_owned(),
        };
        let page = tools::page(&done.answer.text, 0, 4);
        let result = answer(&done, Some("h1"), 0, &page);
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with("abcd\n\n[cut at character 4 of 6"),
            "{text}"
        );
        assert!(text.contains("handle \"h1\" and offset 4"), "{text}");
        let s = &result["structuredContent"];
        assert_eq!(s["nextOffset"], 4);
        assert_eq!(s["totalChars"], 6);
        assert_eq!(s["elapsedSecs"], 1.5);
        assert_eq!(s["handle"], "h1");
        let last = answer(&done, Some("h1"), 4, &tools::page(&done.answer.text, 4, 4));
        assert_eq!(last["content"][0]["text"], "ef");
        assert_eq!(last["structuredContent"]["nextOffset"], Value::Null);
    }
}
