//! The work of a delegating call (a [`Job`] on threads of its own, named by a handle
//! from its start), the bounded wait for it with progress notifications, and the tool
//! results it makes: running, or a page of its answer.
//!
//! Progress (2025-06-18 and later, unchanged in 2026-07-28): a call whose `_meta`
//! carries a `progressToken` gets `notifications/progress` [`PROGRESS_FIRST`] after it
//! starts waiting, then at least every [`PROGRESS_INTERVAL`] and whenever one more
//! target answers, until its answer is sent.

use super::answers::Answer;
use super::calls::Out;
use super::tools;
use loopbus::StopHandle;
use serde_json::{json, Value};
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

/// Locks `mutex`; a panic while it was held left valid data behind (every update
/// is a single assignment).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A finished job's answer, how long its work took, and the trace of its
/// delegations.
pub struct Done {
    answer: Answer,
    elapsed: Duration,
    trace_id: String,
}

impl Done {
    /// Whether the whole answer fits in one page of `max_chars`.
    pub fn fits(&self, max_chars: usize) -> bool {
        self.answer.text.chars().count() <= max_chars
    }

    /// The tool result of the page of the answer from `offset`, at most `max_chars`; a
    /// cut page names `handle` for the rest.
    pub fn result(&self, handle: Option<&str>, offset: usize, max_chars: usize) -> Value {
        let page = tools::page(&self.answer.text, offset, max_chars);
        let mut fields = self.answer.fields.clone();
        fields.insert("status".to_owned(), json!("done"));
        fields.insert("elapsedSecs".to_owned(), json!(secs(self.elapsed)));
        fields.insert("offset".to_owned(), json!(offset));
        fields.insert("nextOffset".to_owned(), json!(page.next));
        fields.insert("totalChars".to_owned(), json!(page.total));
        fields.insert("traceId".to_owned(), json!(self.trace_id));
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
        tools::tool_result(&text, Some(Value::Object(fields)), self.answer.is_error)
    }

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
    /// Work named by `handle`, started now: `label` says what it is, `total` how many
    /// targets answer, `trace_id` the trace its delegations join, `stop` stops them.
    pub fn new(
        handle: String,
        label: String,
        total: usize,
        trace_id: String,
        stop: StopHandle,
    ) -> Job {
        Job {
            handle,
            label,
            total,
            trace_id,
            started: Instant::now(),
            state: Mutex::new(JobState::default()),
            changed: Condvar::new(),
            stop,
        }
    }

    /// One more target answered.
    pub fn answered(&self) {
        lock(&self.state).answered += 1;
        self.changed.notify_all();
    }

    /// The work's answer is in; returns what keeping it costs, in bytes.
    pub fn finish(&self, answer: Answer) -> usize {
        let done = Done {
            answer,
            elapsed: self.started.elapsed(),
            trace_id: self.trace_id.clone(),
        };
        let bytes = done.bytes();
        lock(&self.state).done = Some(Arc::new(done));
        self.changed.notify_all();
        bytes
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

    /// Waits at most `limit` for the work, sending progress notifications through
    /// `out`.
    pub fn wait(
        &self,
        limit: Duration,
        mut progress: Option<&mut Progress>,
        ctl: &CallCtl,
        out: &Out,
    ) -> Waited {
        let start = Instant::now();
        let deadline = start + limit;
        let mut next_note = start + PROGRESS_FIRST;
        let mut state = lock(&self.state);
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
                    if let Some(note) = self.notification(noted, progress) {
                        out.send(&note);
                    }
                    next_note = Instant::now() + PROGRESS_INTERVAL;
                    state = lock(&self.state);
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
            state = self
                .changed
                .wait_timeout(state, until.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The progress notification of the work with `answered` targets done, unless
    /// its value would not be above the last one sent, or past the total (all answered:
    /// the answer follows).
    fn notification(&self, answered: usize, progress: &mut Progress) -> Option<Value> {
        let elapsed = self.started.elapsed();
        let value = progress_value(answered, elapsed);
        if value <= progress.last || answered >= self.total {
            return None;
        }
        progress.last = value;
        Some(json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progressToken": progress.token,
                "progress": value,
                "total": self.total,
                "message": format!("{}: {answered} of {} answered, {} s",
                    self.label, self.total, elapsed.as_secs()),
            },
        }))
    }

    /// The tool result of work still running.
    pub fn running(&self) -> Value {
        let state = lock(&self.state);
        let elapsed = self.started.elapsed();
        let text = format!(
            "{} is still running after {} s ({} of {} answered). Call `result` with handle \
         \"{}\" to wait for the answer (the work goes on meanwhile), or `cancel` to stop it.",
            self.label,
            elapsed.as_secs(),
            state.answered,
            self.total,
            self.handle
        );
        let structured = json!({
            "status": "running",
            "handle": self.handle,
            "elapsedSecs": secs(elapsed),
            "answered": state.answered,
            "total": self.total,
            "traceId": self.trace_id,
        });
        tools::tool_result(&text, Some(structured), false)
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

    /// The call waits on `job`; `owned`: it started it. A cancel that came first
    /// (before the job existed) applies to it now.
    pub fn watch(&self, job: &Arc<Job>, owned: bool) {
        *lock(&self.watching) = Some((Arc::clone(job), owned));
        if self.cancelled() {
            self.cancel();
        }
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

/// How a wait ended.
pub enum Waited {
    Done(Arc<Done>),
    Running,
    /// The call was cancelled.
    Abandoned,
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
    fn progress_never_passes_the_total() {
        let job = Job::new("h".into(), "fan".into(), 2, "t".into(), StopHandle::new());
        let mut progress = Progress::new(json!("tok"));
        let note = job.notification(1, &mut progress).unwrap();
        assert!(note["params"]["progress"].as_f64().unwrap() < 2.0, "{note}");
        assert_eq!(job.notification(2, &mut progress), None);
    }

    #[test]
    fn a_cancel_before_the_call_started_its_job_still_stops_the_job() {
        let job = |stop: &StopHandle| {
            let stop = stop.clone();
            Arc::new(Job::new("h".into(), "talk".into(), 1, "t".into(), stop))
        };
        let (owned, other) = (StopHandle::new(), StopHandle::new());
        let ctl = CallCtl::default();
        ctl.cancel();
        ctl.watch(&job(&owned), true);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !owned.is_stopped() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            owned.is_stopped(),
            "the job the cancelled call started runs on"
        );
        // A job the call only waits on (`result`) is not its to stop.
        let waiting = CallCtl::default();
        waiting.cancel();
        waiting.watch(&job(&other), false);
        assert!(!other.is_stopped());
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
        assert!(!done.fits(4) && done.fits(6));
        let result = done.result(Some("h1"), 0, 4);
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
        let last = done.result(Some("h1"), 4, 4);
        assert_eq!(last["content"][0]["text"], "ef");
        assert_eq!(last["structuredContent"]["nextOffset"], Value::Null);
    }
}
