//! Leftovers (contract 8 "Containment"): `serve` is a child subreaper (Linux
//! `PR_SET_CHILD_SUBREAPER`), so whatever an engine started and left behind (a process
//! that escaped its group with `setsid`, say) becomes our child when its parent exits.
//! Any child of ours that is not a running engine is such a leftover: it gets SIGTERM,
//! SIGKILL after [`LEFTOVER_KILL_GRACE`], and is reaped.
//!
//! At shutdown, serve waits (at most [`super::running::SHUTDOWN_CONTAIN_LIMIT`]) until the leftovers
//! are gone ([`RunningEngines::wait_contained`]): once it exits, they would be PID 1's.
//!
//! Only leftovers are ever reaped here, one pid at a time: an engine's own pid is
//! reaped by its turn ([`RunningEngines::reap`]), and spawning, reaping and looking
//! for leftovers all hold the same lock, so an engine is never taken for a leftover.

use super::running::{kill_tree, RunningEngines};
use crate::files::{children_of, parent_of};
use rustix::process::{Pid, Signal, WaitOptions};
use std::collections::HashMap;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

/// How long a leftover has between SIGTERM and SIGKILL.
pub const LEFTOVER_KILL_GRACE: Duration = Duration::from_secs(2);
/// While leftovers are being killed, how often the reaper looks whether they are gone.
pub const LEFTOVER_POLL: Duration = Duration::from_millis(20);
/// With no leftover known, how often the reaper looks for one anyway (it looks at once
/// whenever an engine is reaped).
pub const LEFTOVER_SCAN_INTERVAL: Duration = Duration::from_secs(10);

/// Makes this process a child subreaper and starts the thread that kills and reaps
/// leftovers. For a process that is the instance (`loopbus serve`): every child that
/// is not a running engine is killed.
///
/// # Errors
/// The kernel refused `PR_SET_CHILD_SUBREAPER`, or the thread could not start.
pub fn contain_leftovers(running: &RunningEngines) -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    let reaper = running.clone();
    thread::Builder::new()
        .name("engine-reaper".into())
        .spawn(move || reap_forever(&reaper))?;
    running.lock().reaper_runs = true;
    Ok(())
}

fn reap_forever(running: &RunningEngines) {
    let me = std::process::id();
    // Leftover pid -> when it got SIGTERM (None once it got SIGKILL too). Only this
    // thread reaps them, so until it does, their pids cannot be recycled.
    let mut leftovers: HashMap<u32, Option<Instant>> = HashMap::new();
    loop {
        running.wait_nudged(if leftovers.is_empty() {
            LEFTOVER_SCAN_INTERVAL
        } else {
            LEFTOVER_POLL
        });
        leftovers.retain(|pid, termed| {
            if reap(*pid) {
                return false;
            }
            if termed.is_some_and(|at| at.elapsed() >= LEFTOVER_KILL_GRACE) {
                kill_tree(*pid, Signal::KILL);
                *termed = None;
            }
            true
        });
        // Look after reaping: a reaped leftover's own children are ours now. The scan
        // runs without the lock; each candidate is checked again under it, where an
        // unreaped child of ours that is not an engine cannot change.
        let candidates = children_of(me);
        let state = running.lock();
        for pid in candidates {
            if state.engines.contains(&pid)
                || leftovers.contains_key(&pid)
                || parent_of(pid) != Some(me)
            {
                continue;
            }
            log::info!("killing process {pid}, left behind by an engine that exited");
            kill_tree(pid, Signal::TERM);
            leftovers.insert(pid, Some(Instant::now()));
        }
    }
}

/// Reaps the leftover `pid` if it has exited. A pid that is not our child any more
/// (reaped already) counts as gone.
fn reap(pid: u32) -> bool {
    let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return true;
    };
    // Still running, or interrupted: look again at the next pass.
    let pending = rustix::process::waitpid(Some(raw), WaitOptions::NOHANG);
    !matches!(pending, Ok(None) | Err(rustix::io::Errno::INTR))
}
