//! What `/proc` says of processes, for the engine's containment: the children of a
//! process (the leftover reaper's view) and whether a process group still has a live
//! member (a cancelled engine's grace). Reading only; nothing here signals or reaps.

/// The pids whose parent is `parent`, from `/proc/<pid>/stat`.
pub(super) fn children_of(parent: u32) -> Vec<u32> {
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
pub(super) fn parent_of(pid: u32) -> Option<u32> {
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
