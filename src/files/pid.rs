//! The one liveness rule for a pid another process wrote down (a registry entry, a
//! lock's owner, a temp file's writer): is that process certainly gone?

/// Whether process `pid` certainly no longer exists: signal 0 finds no such process,
/// or it has exited and only waits to be reaped (a zombie, state `Z` in
/// `/proc/<pid>/stat`: its parent has not collected it yet, which an init that never
/// reaps makes last). A pid this system cannot have is gone; one we may not signal
/// (another user's) exists. The rule of temp-file cleanup, the registry lock and
/// pruning.
pub fn pid_is_gone(pid: u32) -> bool {
    let Some(raw) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return true;
    };
    match rustix::process::test_kill_process(raw) {
        Err(rustix::io::Errno::SRCH) => true,
        _ => is_zombie(pid),
    }
}

/// Whether `/proc/<pid>/stat` says the process has exited (`Z`, or `X` while it is
/// being reaped). Unreadable: not known to be one.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": comm may hold anything, so the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance killed with SIGKILL whose parent does not reap it (an init that never
    /// does) stayed "alive" as a zombie: its registry entry was never stale.
    #[test]
    fn bug_a_zombie_counted_as_a_live_process() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let exited = std::time::Instant::now();
        while !is_zombie(pid) {
            assert!(exited.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pid_is_gone(pid), "a zombie is gone");
        child.wait().unwrap();
        assert!(pid_is_gone(pid), "a reaped pid is gone");
        assert!(!pid_is_gone(std::process::id()), "we are not");
        assert!(pid_is_gone(u32::MAX));
    }
}
