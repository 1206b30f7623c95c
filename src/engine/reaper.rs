//! Leftovers (contract 8 "Containment"): `serve` is a child subreaper (Linux
//! `PR_SET_CHILD_SUBREAPER`), so whatever an engine started and left behind (a process
//! that escaped its group with `setsid`, say) becomes our child when its parent exits.
//! Any child of ours that is not a running engine is such a leftover: it gets SIGTERM,
//! SIGKILL after [`LEFTOVER_KILL_GRACE`], and is reaped.
//!
//! At shutdown, serve waits (at most [`SHUTDOWN_CONTAIN_LIMIT`]) until the leftovers
//! are gone ([`RunningEngines::wait_contained`]): once it exits, they would be PID 1's.
//!
//! Only leftovers are ever reaped here, one pid at a time: an engine's own pid is
//! reaped by its turn ([`RunningEngines::reap`]), and spawning, reaping and looking
//! for leftovers all hold the same lock, so an engine is never taken for a leftover.

use super::running::{kill_tree, RunningEngines};
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
/// How long serve, stopping, waits for its engines' leftovers to be killed and reaped
/// (see [`RunningEngines::wait_contained`]): their [`LEFTOVER_KILL_GRACE`], and time to
/// reap them and to look again.
pub const SHUTDOWN_CONTAIN_LIMIT: Duration = Duration::from_secs(5);

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
        let mut state = running.lock();
        for pid in candidates {
            if state.is_engine(pid) || leftovers.contains_key(&pid) || parent_of(pid) != Some(me) {
                continue;
            }
            log::info!("killing process {pid}, left behind by an engine that exited");
            kill_tree(pid, Signal::TERM);
            leftovers.insert(pid, Some(Instant::now()));
        }
        running.passed(&mut state, leftovers.len());
        drop(state);
    }
}

/// Reaps the leftover `pid` if it has exited. A pid that is not our child any more
/// (reaped already) counts as gone.
fn reap(pid: u32) -> bool {
    let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return true;
    };
    match rustix::process::waitpid(Some(raw), WaitOptions::NOHANG) {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(rustix::io::Errno::INTR) => false,
        Err(_) => true,
    }
}

/// The pids whose parent is `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The parent of `pid`, from `/proc/<pid>/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    parent_in_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether a process other than `leader` that has not exited is in the process group
/// `pgid`, from `/proc/<pid>/stat`. A zombie is not counted: it has exited and only
/// waits to be reaped (the group's unreaped leader is one, by design).
pub(super) fn group_has_live_member(pgid: u32, leader: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != leader)
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| state_and_group(&stat))
        .any(|(state, group)| group == pgid && !matches!(state, 'Z' | 'X'))
}

/// The state letter and the process group in the text of a `/proc/<pid>/stat` file:
/// the first and third fields after the command.
fn state_and_group(stat: &str) -> Option<(char, u32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let group = fields.nth(1)?.parse().ok()?;
    Some((state, group))
}

/// The parent pid in the text of a `/proc/<pid>/stat` file: the second field after the
/// command, which is in parentheses and may contain anything.
fn parent_in_stat(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pid_from_stat() {
        assert_eq!(parent_in_stat("12 (sh) S 7 12 12 0"), Some(7));
        assert_eq!(parent_in_stat("12 (a) b) (c) Z 9 1"), Some(9));
        assert_eq!(parent_in_stat("12 (sh)"), None);
    }

    #[test]
    fn state_and_group_from_stat() {
        assert_eq!(state_and_group("12 (sh) S 7 40 12 0"), Some(('S', 40)));
        assert_eq!(state_and_group("12 (a) Z b) Z 9 41 1"), Some(('Z', 41)));
        assert_eq!(state_and_group("12 (sh) S 7"), None);
    }

    /// The unreaped leader of a group (a zombie) kept a cancelled engine's group
    /// "alive" for the whole grace: only live members count.
    #[test]
    fn bug_a_zombie_leader_counted_as_a_live_member_of_its_group() {
        use std::os::unix::process::CommandExt;
        let mut leader = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = leader.id();
        // Exited, not reaped: a zombie, the only member of its group.
        let exited = std::time::Instant::now();
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| state_and_group(&s))
            .is_some_and(|(state, _)| state != 'Z')
        {
            assert!(exited.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!group_has_live_member(pid, pid));
        leader.wait().unwrap();
        // Our own group has a live member: this test's process.
        let ours = rustix::process::getpgrp().as_raw_nonzero().get() as u32;
        assert!(group_has_live_member(ours, 0));
    }
}
