//! The engines running now: spawned, signalled and reaped under one lock, so that a pid
//! is only ever signalled while it is still ours (not yet reaped, so never recycled),
//! and so that the leftover reaper ([`super::reaper`]) never mistakes an engine for a
//! leftover.

use super::reaper::LEFTOVER_POLL;
use crate::files::children_of;
use rustix::process::{Pid, Signal};
use std::collections::HashSet;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// How long serve, stopping, waits for its engines' leftovers to be killed and reaped
/// ([`RunningEngines::wait_contained`]): the leftover reaper's 2 s between SIGTERM and
/// SIGKILL, and time to reap them and to look again.
pub const SHUTDOWN_CONTAIN_LIMIT: Duration = Duration::from_secs(5);

/// The engines running now (spawned, not yet reaped), so that shutdown can kill them
/// and the leftover reaper can tell them apart from leftovers.
#[derive(Debug, Default, Clone)]
pub struct RunningEngines {
    state: Arc<Mutex<State>>,
    /// Signalled when an engine exited: its leftovers may now be ours.
    nudged: Arc<Condvar>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// The pids of the engines spawned and not yet reaped (each also its process
    /// group's id). An unreaped pid cannot be reused, so it names one engine.
    pub(super) engines: HashSet<u32>,
    /// An engine exited since the reaper last looked.
    pub(super) nudged: bool,
    /// The leftover reaper runs ([`super::contain_leftovers`]).
    pub(super) reaper_runs: bool,
}

impl RunningEngines {
    /// Waits, at most [`SHUTDOWN_CONTAIN_LIMIT`], until this process has no child left:
    /// no engine runs and every leftover got SIGTERM, SIGKILL after its grace, and was
    /// reaped; whether that happened. For shutdown: what serve leaves when it exits is
    /// no longer its to kill. Without the leftover reaper running there is nothing to
    /// wait for.
    pub fn wait_contained(&self) -> bool {
        let deadline = Instant::now() + SHUTDOWN_CONTAIN_LIMIT;
        loop {
            let mut state = self.lock();
            if !state.reaper_runs || children_of(std::process::id()).is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Look at once rather than at the next scan interval.
            state.nudged = true;
            self.nudged.notify_all();
            drop(state);
            thread::sleep(LEFTOVER_POLL);
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `command` and registers it, under the lock, so that the reaper never sees
    /// the new child before it is known as an engine.
    ///
    /// # Errors
    /// The spawn failed.
    pub(super) fn spawn(&self, command: &mut Command) -> io::Result<Child> {
        let mut state = self.lock();
        let child = command.spawn()?;
        state.engines.insert(child.id());
        Ok(child)
    }

    /// Reaps an engine that has exited and unregisters it, under the lock, so that
    /// nothing signals its pid once it can be recycled; then tells the reaper its
    /// leftovers may be waiting.
    pub(super) fn reap(&self, engine: &mut Child) -> io::Result<ExitStatus> {
        let mut state = self.lock();
        state.engines.remove(&engine.id());
        let status = engine.wait();
        drop(state);
        self.nudge();
        status
    }

    /// Tells the reaper that an engine has exited: its leftovers are ours now.
    pub(super) fn nudge(&self) {
        self.lock().nudged = true;
        self.nudged.notify_all();
    }

    /// Sends `signal` to `engine` (its pid and its group), which is not reaped yet:
    /// SIGTERM is the first step of a cancel, SIGKILL every other stop.
    pub(super) fn signal(&self, engine: &Child, signal: Signal) {
        let _state = self.lock();
        kill_tree(engine.id(), signal);
    }

    /// Waits until an engine exited ([`RunningEngines::nudge`]) or `timeout` passed.
    pub(super) fn wait_nudged(&self, timeout: Duration) {
        let state = self.lock();
        let (mut state, _) = self
            .nudged
            .wait_timeout_while(state, timeout, |s| !s.nudged)
            .unwrap_or_else(PoisonError::into_inner);
        state.nudged = false;
    }

    /// How many engine processes are running.
    pub fn count(&self) -> usize {
        self.lock().engines.len()
    }

    /// Kills every running engine, its pid and its process group (SIGKILL). Their turns
    /// then end as failures ("engine was killed by signal 9"), classified from what the
    /// engine wrote so far: `engine_cli` unless that matches a rule.
    pub fn kill_all(&self) {
        let state = self.lock();
        for pid in &state.engines {
            kill_tree(*pid, Signal::KILL);
        }
    }
}

/// Sends `signal` to the process `pid` and to the process group `pid` (when it leads
/// one). The caller makes sure `pid` is an unreaped child of ours, so it cannot have
/// been recycled; ESRCH (gone already) is ignored.
pub(super) fn kill_tree(pid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    let _ = rustix::process::kill_process(pid, signal);
    let _ = rustix::process::kill_process_group(pid, signal);
}
