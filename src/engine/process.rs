//! Supervising one engine process: spawn it in a process group of its own, feed it the
//! prompt, drain its output within caps, enforce its deadline, kill it and reap it.
//!
//! One thread does it all, the turn's own: a `poll` over the engine's stdin, stdout,
//! stderr and a pidfd that becomes readable when the engine exits. The exit is learned
//! without reaping (`waitid` with `WNOWAIT`), so every kill (on timeout, on stdout past
//! `engine.maxOutputBytes`, on shutdown through [`RunningEngines::kill_all`], and after
//! every exit for what is left in the group) reaches a pid that cannot have been
//! recycled: the engine's own pid and its group. Then it is reaped. The turn ends when
//! both output pipes are closed, or [`PIPE_DRAIN_GRACE`] after the exit, whichever is
//! first; our ends are closed then, so a process that escaped the group and holds the
//! pipes keeps nothing of ours (the leftover reaper kills it).

use super::running::{RunningEngines, Spawned};
use crate::config::{EngineConfig, PromptMode};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, OwnedFd};
use rustix::process::{Pid, WaitId, WaitIdOptions};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How much of the engine's stderr is kept for classification and messages; the rest
/// is read and dropped.
pub const MAX_STDERR_KEPT: usize = 64 * 1024;
/// After the engine exits, how long its output pipes may stay open (held by a process
/// that escaped the group) before the turn closes its ends and ends. One deadline for
/// both pipes.
pub const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After killing an engine, how often the kill is repeated until it has exited.
pub const KILL_RETRY: Duration = Duration::from_millis(100);
/// Where no pidfd can be had (Linux before 5.3), how often the turn looks whether the
/// engine has exited.
pub const EXIT_POLL: Duration = Duration::from_millis(20);
/// The size of one read from (or write to) an engine's pipe.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// One engine process to run.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The configured command, prompt mode, working directory, environment and limits.
    pub engine: &'a EngineConfig,
    /// The prompt, fed on stdin or as the last argument (`engine.prompt`).
    pub prompt: &'a str,
    /// Variables set on top of `engine.env`.
    pub env: Vec<(&'static str, OsString)>,
}

/// How an engine process ended.
#[derive(Debug)]
pub enum Ended {
    /// `engine.command` is empty: nothing was started.
    NoCommand,
    /// The program could not be started.
    SpawnFailed(io::Error),
    /// Its pipes or its exit could not be watched; it was killed.
    WaitFailed(io::Error),
    /// It ran past `engine.timeoutSecs`; it was killed.
    TimedOut,
    /// Its stdout passed `engine.maxOutputBytes`; it was killed.
    OutputTooLarge,
    /// Its exit status could not be learned.
    Lost,
    /// It exited by itself, having written this (stdout capped at
    /// `engine.maxOutputBytes`, stderr at [`MAX_STDERR_KEPT`]).
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote on stdout.
        stdout: Vec<u8>,
        /// What it wrote on stderr.
        stderr: Vec<u8>,
    },
}

/// Why the turn stopped the engine (the first reason wins).
#[derive(Debug, Clone, Copy)]
enum Stop {
    TimedOut,
    OutputTooLarge,
    WatchFailed,
}

/// One of the engine's pipes, our end, non-blocking.
struct Pipe {
    /// `None` once closed (end of file, all written, or the reader gone).
    fd: Option<OwnedFd>,
    /// Output: what was kept. Input: what is left to write, from `offset`.
    bytes: Vec<u8>,
    offset: usize,
    /// Output: how much to keep; past it, the rest is read and dropped.
    keep: usize,
    overflowed: bool,
}

impl Pipe {
    fn new(fd: impl Into<OwnedFd>, bytes: Vec<u8>, keep: usize) -> io::Result<Pipe> {
        let fd = fd.into();
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(Pipe {
            fd: Some(fd),
            bytes,
            offset: 0,
            keep,
            overflowed: false,
        })
    }

    fn is_open(&self) -> bool {
        self.fd.is_some()
    }

    /// Reads what is there; closes the pipe at end of file.
    fn read_ready(&mut self) -> io::Result<()> {
        let mut buf = [0u8; READ_CHUNK_BYTES];
        while let Some(fd) = &self.fd {
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => self.fd = None,
                Ok(n) => {
                    let room = self.keep.saturating_sub(self.bytes.len());
                    self.bytes.extend_from_slice(&buf[..n.min(room)]);
                    self.overflowed |= n > room;
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes what it can; closes the pipe when all is written or the reader is gone
    /// (an engine that exits without reading its input is not an error here).
    fn write_ready(&mut self) {
        while let Some(fd) = &self.fd {
            if self.offset >= self.bytes.len() {
                self.fd = None;
                break;
            }
            let end = self.bytes.len().min(self.offset + READ_CHUNK_BYTES);
            match rustix::io::write(fd, &self.bytes[self.offset..end]) {
                Ok(n) => self.offset += n,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => self.fd = None,
            }
        }
    }
}

/// Runs `launch` to its end, tracked in `running` while it runs.
pub fn run(launch: &Launch<'_>, running: &RunningEngines) -> Ended {
    let Some(mut command) = command(launch) else {
        return Ended::NoCommand;
    };
    let started = Instant::now();
    let mut spawned = match running.spawn(&mut command) {
        Ok(spawned) => spawned,
        Err(e) => return Ended::SpawnFailed(e),
    };
    let deadline = started.checked_add(Duration::from_secs(launch.engine.timeout_secs));
    let max_output = usize::try_from(launch.engine.max_output_bytes).unwrap_or(usize::MAX);
    let (stop, stdout, stderr) = match pipes(&mut spawned, launch.prompt, max_output) {
        Ok([stdin, stdout, stderr]) => {
            let mut io = Io {
                stdin,
                stdout,
                stderr,
            };
            let stop = supervise(&spawned, running, &mut io, deadline);
            if matches!(stop, Err(_) | Ok(Some(Stop::WatchFailed))) {
                // It may still run: it must exit before it is reaped.
                running.kill(&spawned);
            }
            let output = |p: Option<Pipe>| p.map(|p| p.bytes).unwrap_or_default();
            (stop, output(io.stdout), output(io.stderr))
        }
        Err(e) => {
            running.kill(&spawned);
            let _ = exited(&spawned, None, true);
            (Err(e), Vec::new(), Vec::new())
        }
    };
    let status = running.reap(&mut spawned);
    match (stop, status) {
        (Err(e), _) => Ended::WaitFailed(e),
        (Ok(Some(Stop::TimedOut)), _) => Ended::TimedOut,
        (Ok(Some(Stop::OutputTooLarge)), _) => Ended::OutputTooLarge,
        (Ok(Some(Stop::WatchFailed)), _) | (Ok(None), Err(_)) => Ended::Lost,
        (Ok(None), Ok(status)) => Ended::Exited {
            status,
            stdout,
            stderr,
        },
    }
}

/// The engine's three pipes, our ends.
struct Io {
    stdin: Option<Pipe>,
    stdout: Option<Pipe>,
    stderr: Option<Pipe>,
}

/// Takes the child's pipes: stdin with the prompt to write (none in `arg` mode),
/// stdout and stderr with what to keep of them.
fn pipes(spawned: &mut Spawned, prompt: &str, max_output: usize) -> io::Result<[Option<Pipe>; 3]> {
    let child = &mut spawned.child;
    let stdin = child
        .stdin
        .take()
        .map(|s| Pipe::new(s, prompt.as_bytes().to_vec(), 0));
    let stdout = child
        .stdout
        .take()
        .map(|s| Pipe::new(s, Vec::new(), max_output));
    let stderr = child
        .stderr
        .take()
        .map(|s| Pipe::new(s, Vec::new(), MAX_STDERR_KEPT));
    Ok([stdin.transpose()?, stdout.transpose()?, stderr.transpose()?])
}

/// Feeds and drains the engine until it has exited and its output is drained (or
/// [`PIPE_DRAIN_GRACE`] passed), killing it at the deadline or on output overflow.
/// Returns why the turn stopped it, if it did.
fn supervise(
    spawned: &Spawned,
    running: &RunningEngines,
    io: &mut Io,
    deadline: Option<Instant>,
) -> io::Result<Option<Stop>> {
    let pidfd = Pid::from_raw(i32::try_from(spawned.pid).unwrap_or(0)).and_then(|pid| {
        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
    });
    let mut stop: Option<Stop> = None;
    let mut killed_at: Option<Instant> = None;
    let mut exited_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if exited_at.is_none() {
            match exited(spawned, pidfd.as_ref(), false) {
                Ok(true) => {
                    exited_at = Some(now);
                    // Whatever the engine left running in its group goes with it;
                    // what left the group is the reaper's now.
                    running.kill(spawned);
                    running.nudge();
                    io.stdin = None;
                }
                Ok(false) => {}
                Err(_) => return Ok(Some(stop.unwrap_or(Stop::WatchFailed))),
            }
        }
        let drain_until = exited_at.map(|at| at + PIPE_DRAIN_GRACE);
        if exited_at.is_some()
            && (!(open(&io.stdout) || open(&io.stderr)) || drain_until.is_some_and(|d| now >= d))
        {
            // Closes our ends: a process that escaped the group gets EPIPE.
            return Ok(stop);
        }
        if exited_at.is_none() {
            if stop.is_none() && deadline.is_some_and(|d| now >= d) {
                stop = Some(Stop::TimedOut);
            }
            if stop.is_some() && killed_at.is_none_or(|at| now >= at + KILL_RETRY) {
                running.kill(spawned);
                killed_at = Some(now);
            }
        }
        // Sleep until something is ready or the next thing to do.
        let mut wake = [
            deadline.filter(|_| stop.is_none() && exited_at.is_none()),
            killed_at
                .map(|at| at + KILL_RETRY)
                .filter(|_| exited_at.is_none()),
            drain_until,
            (pidfd.is_none() && exited_at.is_none()).then(|| now + EXIT_POLL),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.saturating_duration_since(now));
        if let Some(w) = &mut wake {
            // Round up, so a wake-up never comes a moment too early and spins.
            *w += Duration::from_millis(1);
        }
        wait_ready(io, pidfd.as_ref().filter(|_| exited_at.is_none()), wake)?;
        if let Some(pipe) = &mut io.stdin {
            pipe.write_ready();
        }
        for pipe in [&mut io.stdout, &mut io.stderr].into_iter().flatten() {
            pipe.read_ready()?;
        }
        if io.stdout.as_ref().is_some_and(|p| p.overflowed) && stop.is_none() {
            stop = Some(Stop::OutputTooLarge);
        }
    }
}

/// Whether `pipe` is there and open.
fn open(pipe: &Option<Pipe>) -> bool {
    pipe.as_ref().is_some_and(Pipe::is_open)
}

/// Polls the pipes that are open (and the pidfd) for at most `timeout` (`None`:
/// until one is ready).
fn wait_ready(io: &Io, pidfd: Option<&OwnedFd>, timeout: Option<Duration>) -> io::Result<()> {
    let mut fds = Vec::with_capacity(4);
    if let Some(fd) = io.stdin.as_ref().and_then(|p| p.fd.as_ref()) {
        fds.push(PollFd::new(fd, PollFlags::OUT));
    }
    for p in [&io.stdout, &io.stderr].into_iter().flatten() {
        if let Some(fd) = &p.fd {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
    }
    if let Some(fd) = pidfd {
        fds.push(PollFd::new(fd, PollFlags::IN));
    }
    // A timeout too large for a timespec waits without one: the deadline is far off.
    let timeout = timeout.and_then(|t| Timespec::try_from(t).ok());
    match rustix::event::poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether the engine has exited, learned without reaping it (through the pidfd when
/// there is one); with `block`, waits until it has.
fn exited(spawned: &Spawned, pidfd: Option<&OwnedFd>, block: bool) -> io::Result<bool> {
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT;
    let id = match pidfd {
        Some(fd) => WaitId::PidFd(fd.as_fd()),
        None => match Pid::from_raw(i32::try_from(spawned.pid).unwrap_or(0)) {
            Some(pid) => WaitId::Pid(pid),
            None => return Err(io::Error::other("engine pid out of range")),
        },
    };
    let options = if block {
        options
    } else {
        options | WaitIdOptions::NOHANG
    };
    loop {
        match rustix::process::waitid(id.clone(), options) {
            Ok(status) => return Ok(status.is_some()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The command for `launch`: its own process group, the prompt on stdin or as the last
/// argument, stdout and stderr piped. `None` if `engine.command` is empty.
fn command(launch: &Launch<'_>) -> Option<Command> {
    let engine = launch.engine;
    let (program, args) = engine.command.split_first()?;
    let mut command = Command::new(program);
    command.args(args);
    if engine.prompt == PromptMode::Arg {
        command.arg(launch.prompt);
    }
    if let Some(cwd) = &engine.cwd {
        command.current_dir(cwd);
    }
    command
        .envs(&engine.env)
        .envs(launch.env.iter().map(|(k, v)| (*k, v)))
        .stdin(if engine.prompt == PromptMode::Stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A group of its own, so timeouts and shutdown can kill everything it started.
        .process_group(0);
    Some(command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutputMode;
    use std::os::unix::process::ExitStatusExt;
    use std::thread;

    fn engine(command: &[&str], prompt: PromptMode) -> EngineConfig {
        EngineConfig {
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            prompt,
            output: OutputMode::Text,
            timeout_secs: 30,
            max_output_bytes: 1024 * 1024,
            max_turn_cost_usd: None,
            cwd: None,
            env: Default::default(),
        }
    }

    fn launch<'a>(engine: &'a EngineConfig, prompt: &'a str) -> Launch<'a> {
        Launch {
            engine,
            prompt,
            env: vec![("LOOPBUS_TEST_VAR", "from-launch".into())],
        }
    }

    #[test]
    fn prompt_on_stdin_output_and_status() {
        let e = engine(
            &["sh", "-c", "cat; echo oops >&2; exit 3"],
            PromptMode::Stdin,
        );
        let running = RunningEngines::default();
        let Ended::Exited {
            status,
            stdout,
            stderr,
        } = run(&launch(&e, "hello"), &running)
        else {
            panic!("did not exit")
        };
        assert_eq!(status.code(), Some(3));
        assert_eq!(stdout, b"hello");
        assert_eq!(stderr, b"oops\n");
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn prompt_as_last_argument_and_environment() {
        let e = engine(
            &[
                "sh",
                "-c",
                "printf '%s|%s' \"$1\" \"$LOOPBUS_TEST_VAR\"",
                "sh",
            ],
            PromptMode::Arg,
        );
        let Ended::Exited { stdout, .. } = run(&launch(&e, "the prompt"), &Default::default())
        else {
            panic!("did not exit")
        };
        assert_eq!(stdout, b"the prompt|from-launch");
    }

    #[test]
    fn stdout_past_the_cap_is_cut_and_the_group_killed() {
        let mut e = engine(
            &["sh", "-c", "head -c 100000 /dev/zero; sleep 30"],
            PromptMode::Stdin,
        );
        e.max_output_bytes = 1000;
        let running = RunningEngines::default();
        assert!(matches!(
            run(&launch(&e, ""), &running),
            Ended::OutputTooLarge
        ));
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn past_the_deadline_it_is_killed() {
        let mut e = engine(&["sleep", "30"], PromptMode::Stdin);
        e.timeout_secs = 0;
        assert!(matches!(
            run(&launch(&e, ""), &Default::default()),
            Ended::TimedOut
        ));
    }

    #[test]
    fn kill_all_ends_a_running_engine() {
        let e = engine(&["sleep", "30"], PromptMode::Stdin);
        let running = RunningEngines::default();
        let watcher = running.clone();
        let turn = thread::spawn(move || run(&launch(&e, ""), &watcher));
        while running.count() == 0 {
            thread::sleep(Duration::from_millis(5));
        }
        running.kill_all();
        let Ended::Exited { status, .. } = turn.join().unwrap() else {
            panic!("did not exit")
        };
        assert_eq!(status.signal(), Some(9));
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn a_large_prompt_goes_through_and_one_left_unread_blocks_nothing() {
        let prompt = "p".repeat(1024 * 1024);
        let e = engine(&["cat"], PromptMode::Stdin);
        let Ended::Exited { stdout, .. } = run(&launch(&e, &prompt), &Default::default()) else {
            panic!("did not exit")
        };
        assert_eq!(stdout.len(), prompt.len());
        // An engine that never reads its (pipe-filling) input still ends its turn.
        let e = engine(&["sh", "-c", "echo done"], PromptMode::Stdin);
        let Ended::Exited { stdout, .. } = run(&launch(&e, &prompt), &Default::default()) else {
            panic!("did not exit")
        };
        assert_eq!(stdout, b"done\n");
    }

    #[test]
    fn bug_an_engine_that_leaves_its_process_group_was_never_killed() {
        // The engine moves itself into our own process group: only a kill of its pid
        // reaches it.
        let script = "import os, sys, time\n\
                      os.setpgid(0, os.getpgid(os.getppid()))\n\
                      print('moved', flush=True)\n\
                      time.sleep(60)\n";
        if Command::new("python3").arg("-c").arg("").status().is_err() {
            eprintln!("skipped: no python3 to leave a process group with");
            return;
        }
        let mut e = engine(&["python3", "-c", script], PromptMode::Stdin);
        e.timeout_secs = 1;
        let running = RunningEngines::default();
        assert!(matches!(run(&launch(&e, ""), &running), Ended::TimedOut));
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn nothing_to_start() {
        let e = engine(&[], PromptMode::Stdin);
        assert!(matches!(
            run(&launch(&e, ""), &Default::default()),
            Ended::NoCommand
        ));
        let e = engine(&["/nonexistent/loopbus-engine"], PromptMode::Stdin);
        assert!(matches!(
            run(&launch(&e, ""), &Default::default()),
            Ended::SpawnFailed(_)
        ));
    }
}
