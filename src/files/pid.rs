//! What `/proc/<pid>/stat` says of processes, read in this one place: whether a pid
//! another process wrote down (a registry entry, a lock's owner, a temp file's writer)
//! is certainly gone, the children of a process (the engine's leftover reaper), and
//! whether a process group still has a live member (a cancelled engine's grace).
//! Reading only; nothing here signals or reaps.

use rustix::io::Errno;
use rustix::process::{test_kill_process, Pid};

/// The fields of `/proc/<pid>/stat` loopbus reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// Exited and only waiting to be reaped (state `Z`), or being reaped (`X`).
    exited: bool,
    parent: u32,
    group: u32,
}

/// `/proc/<pid>/stat` of `pid`; `None` when it can't be read.
fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// "pid (comm) state ppid pgrp ...": comm may hold anything, so the fields follow the
/// last ')'.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    Some(Stat {
        exited: matches!(fields.next()?.chars().next()?, 'Z' | 'X'),
        parent: fields.next()?.parse().ok()?,
        group: fields.next()?.parse().ok()?,
    })
}

/// Every process `/proc` lists, with its stat.
fn every_process() -> impl Iterator<Item = (u32, Stat)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
}

/// Whether process `pid` certainly no longer exists: signal 0 finds no such process,
/// or it has exited and only waits to be reaped (a zombie: its parent has not
/// collected it yet, which an init that never reaps makes last). A pid this system
/// cannot have is gone; one we may not signal (another user's) exists. The rule of
/// temp-file cleanup, the registry lock and pruning.
pub fn pid_is_gone(pid: u32) -> bool {
    let raw = i32::try_from(pid).ok().and_then(Pid::from_raw);
    let no_such = |raw| test_kill_process(raw) == Err(Errno::SRCH);
    raw.is_none_or(no_such) || stat(pid).is_some_and(|stat| stat.exited)
}

/// The pids whose parent is `parent`.
pub fn children_of(parent: u32) -> Vec<u32> {
    every_process()
        .filter_map(|(pid, stat)| (stat.parent == parent).then_some(pid))
        .collect()
}

/// The parent of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat(pid).map(|stat| stat.parent)
}

/// Whether a process other than `leader` that has not exited is in the process group
/// `pgid`. A zombie is not counted: it has exited and only waits to be reaped (the
/// group's unreaped leader is one, by design).
pub fn group_has_live_member(pgid: u32, leader: u32) -> bool {
    every_process().any(|(pid, stat)| pid != leader && stat.group == pgid && !stat.exited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let stat = |exited, parent, group| {
            Some(Stat {
                exited,
                parent,
                group,
            })
        };
        assert_eq!(parse_stat("12 (sh) S 7 40 12 0"), stat(false, 7, 40));
        assert_eq!(parse_stat("12 (a) b) (c) Z 9 1"), stat(true, 9, 1));
        assert_eq!(parse_stat("12 (a) Z b) Z 9 41 1"), stat(true, 9, 41));
        assert_eq!(parse_stat("12 (sh) X 9 41 1"), stat(true, 9, 41));
        assert_eq!(parse_stat("12 (sh) S 7"), None);
        assert_eq!(parse_stat("12 (sh)"), None);
    }

    /// Waits until `pid`, a child that exits at once, is a zombie.
    fn until_zombie(pid: u32) {
        let exited = std::time::Instant::now();
        while !stat(pid).is_some_and(|stat| stat.exited) {
            assert!(exited.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// An instance killed with SIGKILL whose parent does not reap it (an init that never
    /// does) stayed "alive" as a zombie: its registry entry was never stale.
    #[test]
    fn bug_a_zombie_counted_as_a_live_process() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        until_zombie(pid);
        assert!(pid_is_gone(pid), "a zombie is gone");
        child.wait().unwrap();
        assert!(pid_is_gone(pid), "a reaped pid is gone");
        assert!(!pid_is_gone(std::process::id()), "we are not");
        assert!(pid_is_gone(u32::MAX));
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
        until_zombie(pid);
        assert!(!group_has_live_member(pid, pid));
        leader.wait().unwrap();
        // Our own group has a live member: this test's process.
        let ours = rustix::process::getpgrp().as_raw_nonzero().get() as u32;
        assert!(group_has_live_member(ours, 0));
        let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32);
        assert_eq!(parent_of(std::process::id()), parent);
    }
}
