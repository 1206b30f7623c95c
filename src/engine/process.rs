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
//!
//! A cancelled turn ([`CancelToken`], contract 8.1) sends SIGTERM to the engine's pid
//! and group, and SIGKILL [`KILL_GRACE`] later. If the engine exits first, what is left
//! in its group keeps the rest of the grace (a nested `loopbus talk` passes the cancel
//! on to the next hop in it) while the engine stays unreaped, so its group id cannot be
//! recycled; then the group is killed and the engine reaped.

use super::cancel::CancelToken;
use super::outcome::{self, TurnOutput, TurnResult};
use super::preflight;
use super::running::RunningEngines;
use super::Turn;
use crate::config::{EngineConfig, PromptMode};
use crate::files::group_has_live_member;
use crate::protocol::ErrorCode;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, OwnedFd};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
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
/// A cancelled engine's grace between SIGTERM and SIGKILL (contract 8.1): long enough
/// for a nested `loopbus talk` to send its own cancel request to the next hop.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// While a cancelled engine's group outlives it, how often the turn looks whether the
/// group is gone (and, where no eventfd can be had, how often a running turn looks
/// whether it was cancelled).
pub const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Why the turn stopped the engine (the first reason wins).
#[derive(Debug, Clone, Copy)]
enum Stop {
    Cancelled,
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
    /// `fd` (if there is one) made non-blocking.
    fn new(fd: Option<impl Into<OwnedFd>>, bytes: Vec<u8>, keep: usize) -> io::Result<Pipe> {
        let fd = fd.map(Into::into);
        if let Some(fd) = &fd {
            let flags = rustix::fs::fcntl_getfl(fd)?;
            rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        }
        Ok(Pipe {
            fd,
            bytes,
            offset: 0,
            keep,
            overflowed: false,
        })
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

/// Runs `engine` on `turn`'s prompt (fed on stdin or as the last argument), with `env`
/// set on top of `engine.env`, to its end or `turn`'s cancel, tracked in `running` while
/// it runs, and interprets how it ended.
pub fn run(
    engine: &EngineConfig,
    turn: &Turn,
    env: Vec<(&'static str, OsString)>,
    running: &RunningEngines,
) -> TurnOutput {
    let (prompt, cancel) = (turn.request.prompt.as_str(), &turn.cancel);
    if let Some(refusal) = preflight::refusal(engine, prompt) {
        return TurnOutput::without_usage(TurnResult::Failed(refusal));
    }
    let Some(mut command) = command(engine, prompt, env) else {
        return TurnOutput::failed(ErrorCode::EngineCli, "engine.command is empty");
    };
    if cancel.is_cancelled() {
        return TurnOutput::without_usage(TurnResult::Failed(super::cancelled()));
    }
    let deadline = Instant::now().checked_add(Duration::from_secs(engine.timeout_secs));
    let mut child = match running.spawn(&mut command) {
        Ok(child) => child,
        Err(e) => {
            let failure = preflight::spawn_failure(engine, &e);
            return TurnOutput::without_usage(TurnResult::Failed(failure));
        }
    };
    let max_output = usize::try_from(engine.max_output_bytes).unwrap_or(usize::MAX);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let cancel_fd = cancel.arm();
    let stop = pipes(&mut child, prompt, max_output).and_then(|mut io| {
        let stop = supervise(
            &child,
            running,
            &mut io,
            deadline,
            cancel,
            cancel_fd.as_deref(),
        );
        (stdout, stderr) = (io.stdout.bytes, io.stderr.bytes);
        stop
    });
    cancel.disarm();
    if matches!(stop, Err(_) | Ok(Some(Stop::WatchFailed))) {
        // It may still run: it must exit before it is reaped.
        running.signal(&child, Signal::KILL);
    }
    let status = running.reap(&mut child);
    let interpret = |status| outcome::interpret(engine.output, status, &stdout, &stderr);
    match (stop, status) {
        (Err(e), _) => TurnOutput::failed(
            ErrorCode::EngineCli,
            format!("cannot wait for the engine: {e}"),
        ),
        (Ok(Some(Stop::Cancelled)), status) => {
            // An engine that ran counts as a turn, with the usage it reported before it
            // stopped.
            let ran = status.ok().map(interpret);
            TurnOutput {
                result: TurnResult::Failed(super::cancelled()),
                usage: ran.as_ref().map(|ran| ran.usage.unwrap_or_default()),
                session_id: ran.and_then(|ran| ran.session_id),
            }
        }
        (Ok(Some(Stop::TimedOut)), _) => TurnOutput::failed(
            ErrorCode::Timeout,
            format!(
                "engine did not finish within {} s (engine.timeoutSecs)",
                engine.timeout_secs
            ),
        ),
        (Ok(Some(Stop::OutputTooLarge)), _) => TurnOutput::failed(
            ErrorCode::EngineCli,
            format!(
                "engine output exceeded {} bytes (engine.maxOutputBytes); output cut",
                engine.max_output_bytes
            ),
        ),
        (Ok(Some(Stop::WatchFailed)), _) | (Ok(None), Err(_)) => {
            TurnOutput::failed(ErrorCode::EngineCli, "lost track of the engine process")
        }
        (Ok(None), Ok(status)) => interpret(status),
    }
}

/// The engine's three pipes, our ends (no stdin in `arg` mode).
struct Io {
    stdin: Pipe,
    stdout: Pipe,
    stderr: Pipe,
}

/// Takes the child's pipes: stdin with the prompt to write (none in `arg` mode),
/// stdout and stderr with what to keep of them.
fn pipes(child: &mut Child, prompt: &str, max_output: usize) -> io::Result<Io> {
    Ok(Io {
        stdin: Pipe::new(child.stdin.take(), prompt.as_bytes().to_vec(), 0)?,
        stdout: Pipe::new(child.stdout.take(), Vec::new(), max_output)?,
        stderr: Pipe::new(child.stderr.take(), Vec::new(), MAX_STDERR_KEPT)?,
    })
}

/// Feeds and drains the engine until it has exited and its output is drained (or
/// [`PIPE_DRAIN_GRACE`] passed), killing it at the deadline or on output overflow, and
/// stopping it when `cancel` is cancelled (its eventfd `cancel_fd` where the OS gave
/// one). Returns why the turn stopped it, if it did.
fn supervise(
    child: &Child,
    running: &RunningEngines,
    io: &mut Io,
    deadline: Option<Instant>,
    cancel: &CancelToken,
    cancel_fd: Option<&OwnedFd>,
) -> io::Result<Option<Stop>> {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
        .ok_or_else(|| io::Error::other("engine pid out of range"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok();
    // The exit is learned through the pidfd when there is one.
    let id = pidfd
        .as_ref()
        .map_or(WaitId::Pid(pid), |fd| WaitId::PidFd(fd.as_fd()));
    let mut stop: Option<Stop> = None;
    let mut killed_at: Option<Instant> = None;
    let mut exited_at: Option<Instant> = None;
    // When a cancel sent SIGTERM; SIGKILL follows at `+ KILL_GRACE`.
    let mut termed_at: Option<Instant> = None;
    // The engine exited within its cancel grace and its group is still there.
    let mut group_waits = false;
    loop {
        let now = Instant::now();
        if exited_at.is_none() && stop.is_none() && cancel.is_cancelled() {
            stop = Some(Stop::Cancelled);
            running.signal(child, Signal::TERM);
            termed_at = Some(now);
        }
        let kill_at = termed_at.map(|at| at + KILL_GRACE);
        if exited_at.is_none() {
            // Learned without reaping it. It never waits, so it is never interrupted.
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
            match rustix::process::waitid(id.clone(), options) {
                Ok(Some(_)) => {
                    exited_at = Some(now);
                    group_waits = kill_at.is_some_and(|k| now < k);
                    if !group_waits {
                        // Whatever the engine left running in its group goes with it;
                        // what left the group is the reaper's now.
                        running.signal(child, Signal::KILL);
                    }
                    running.nudge();
                    io.stdin.fd = None;
                }
                Ok(None) => {}
                Err(_) => return Ok(Some(stop.unwrap_or(Stop::WatchFailed))),
            }
        }
        // The engine is not reaped yet, so its group id is still its own.
        let group_gone = || !group_has_live_member(child.id(), child.id());
        if group_waits && (kill_at.is_none_or(|k| now >= k) || group_gone()) {
            running.signal(child, Signal::KILL);
            group_waits = false;
        }
        let drain_until = exited_at.map(|at| at + PIPE_DRAIN_GRACE);
        if exited_at.is_some()
            && !group_waits
            && (io.stdout.fd.is_none() && io.stderr.fd.is_none()
                || drain_until.is_some_and(|d| now >= d))
        {
            // Closes our ends: a process that escaped the group gets EPIPE.
            return Ok(stop);
        }
        if exited_at.is_none() {
            if stop.is_none() && deadline.is_some_and(|d| now >= d) {
                stop = Some(Stop::TimedOut);
            }
            let kill_due = kill_at.is_none_or(|k| now >= k);
            if stop.is_some() && kill_due && killed_at.is_none_or(|at| now >= at + KILL_RETRY) {
                running.signal(child, Signal::KILL);
                killed_at = Some(now);
            }
        }
        // Sleep until something is ready or the next thing to do.
        let watch_cancel = stop.is_none() && exited_at.is_none();
        let cancel_fd = cancel_fd.filter(|_| watch_cancel);
        let mut wake = [
            deadline.filter(|_| stop.is_none() && exited_at.is_none()),
            killed_at
                .map(|at| at + KILL_RETRY)
                .filter(|_| exited_at.is_none()),
            kill_at.filter(|_| killed_at.is_none() || group_waits),
            drain_until,
            (pidfd.is_none() && exited_at.is_none()).then(|| now + EXIT_POLL),
            (group_waits || (watch_cancel && cancel_fd.is_none())).then(|| now + CANCEL_POLL),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.saturating_duration_since(now));
        if let Some(w) = &mut wake {
            // Round up, so a wake-up never comes a moment too early and spins.
            *w += Duration::from_millis(1);
        }
        let pidfd = pidfd.as_ref().filter(|_| exited_at.is_none());
        wait_ready(io, pidfd, cancel_fd, wake)?;
        io.stdin.write_ready();
        io.stdout.read_ready()?;
        io.stderr.read_ready()?;
        if io.stdout.overflowed && stop.is_none() {
            stop = Some(Stop::OutputTooLarge);
        }
    }
}

/// Polls the pipes that are open (and the pidfd and the cancel eventfd) for at most
/// `timeout` (`None`: until one is ready).
fn wait_ready(
    io: &Io,
    pidfd: Option<&OwnedFd>,
    cancel: Option<&OwnedFd>,
    timeout: Option<Duration>,
) -> io::Result<()> {
    let pipes = [
        (io.stdin.fd.as_ref(), PollFlags::OUT),
        (io.stdout.fd.as_ref(), PollFlags::IN),
        (io.stderr.fd.as_ref(), PollFlags::IN),
        (pidfd, PollFlags::IN),
        (cancel, PollFlags::IN),
    ];
    let mut fds: Vec<PollFd<'_>> = pipes
        .into_iter()
        .filter_map(|(fd, flags)| Some(PollFd::new(fd?, flags)))
        .collect();
    // A timeout too large for a timespec waits without one: the deadline is far off.
    let timeout = timeout.and_then(|t| Timespec::try_from(t).ok());
    match rustix::event::poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The command for `engine`: its own process group, `prompt` on stdin or as the last
/// argument, `env` added, stdout and stderr piped. `None` if `engine.command` is empty.
fn command(engine: &EngineConfig, prompt: &str, env: Vec<(&str, OsString)>) -> Option<Command> {
    let (program, args) = engine.command.split_first()?;
    let mut command = Command::new(program);
    command.args(args);
    match engine.prompt {
        PromptMode::Arg => command.arg(prompt).stdin(Stdio::null()),
        PromptMode::Stdin => command.stdin(Stdio::piped()),
    };
    if let Some(cwd) = &engine.cwd {
        command.current_dir(cwd);
    }
    command
        .envs(&engine.env)
        .envs(env)
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
            preset: None,
        }
    }

    /// Runs `engine` on `prompt`, cancelled through `cancel`, with one variable of its
    /// own.
    fn run_with(
        engine: &EngineConfig,
        prompt: &str,
        cancel: CancelToken,
        running: &RunningEngines,
    ) -> TurnOutput {
        let turn = Turn {
            request: crate::protocol::TalkRequest::new("caller", prompt, 1),
            config: Default::default(),
            cancel,
            trace: None,
        };
        let env = vec![("LOOPBUS_TEST_VAR", "from-launch".into())];
        run(engine, &turn, env, running)
    }

    /// [`run_with`] a token nobody cancels.
    fn go(engine: &EngineConfig, prompt: &str, running: &RunningEngines) -> TurnOutput {
        run_with(engine, prompt, CancelToken::new(), running)
    }

    /// What the turn answered: the reply or the failure.
    fn answer(output: TurnOutput) -> Result<String, crate::protocol::Failure> {
        match output.result {
            TurnResult::Reply(text) => Ok(text),
            TurnResult::Failed(failure) => Err(failure),
        }
    }

    /// Runs `e` on a thread with a token to cancel it; cancels once `ready` exists.
    /// Also returns how long the turn took after the cancel.
    fn run_and_cancel(
        e: EngineConfig,
        ready: &std::path::Path,
    ) -> (TurnOutput, RunningEngines, Duration) {
        let running = RunningEngines::default();
        let watcher = running.clone();
        let token = CancelToken::new();
        let cancel = token.clone();
        let turn = thread::spawn(move || run_with(&e, "", token, &watcher));
        let started = Instant::now();
        while !ready.exists() {
            assert!(started.elapsed() < Duration::from_secs(30), "never ready");
            thread::sleep(Duration::from_millis(5));
        }
        let cancelled_at = Instant::now();
        cancel.cancel();
        let output = turn.join().unwrap();
        (output, running, cancelled_at.elapsed())
    }

    /// A cancelled turn that ran fails `cancelled` and counts (usage is recorded).
    fn assert_cancelled(output: &TurnOutput) {
        assert_eq!(
            output.result,
            TurnResult::Failed(crate::engine::cancelled())
        );
        assert!(output.usage.is_some(), "{output:?}");
    }

    #[test]
    fn a_cancelled_engine_gets_sigterm_and_its_turn_ends() {
        let dir = crate::files::test_support::TestDir::new("cancel-term");
        let ready = dir.path().join("ready");
        let mark = dir.path().join("mark");
        let script = "trap 'echo TERM > \"$MARK\"; exit 0' TERM; touch \"$READY\"; \
                      sleep 60 & wait";
        let mut e = engine(&["sh", "-c", script], PromptMode::Stdin);
        e.env.insert("READY".into(), ready.display().to_string());
        e.env.insert("MARK".into(), mark.display().to_string());
        let (output, running, _) = run_and_cancel(e, &ready);
        assert_cancelled(&output);
        assert_eq!(
            std::fs::read_to_string(&mark).unwrap(),
            "TERM\n",
            "SIGTERM came"
        );
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn a_cancelled_engine_that_ignores_sigterm_gets_sigkill_after_the_grace() {
        let dir = crate::files::test_support::TestDir::new("cancel-kill");
        let ready = dir.path().join("ready");
        let mut e = engine(
            &["sh", "-c", "trap '' TERM; touch \"$READY\"; sleep 60"],
            PromptMode::Stdin,
        );
        e.env.insert("READY".into(), ready.display().to_string());
        // Only SIGKILL ends it before the sleep does, and not before the grace.
        let (output, running, took) = run_and_cancel(e, &ready);
        assert_cancelled(&output);
        assert!(
            took >= KILL_GRACE && took < Duration::from_secs(60),
            "{took:?}"
        );
        assert_eq!(running.count(), 0);
    }

    /// A nested `loopbus talk` in the engine's group needs the rest of the grace to
    /// pass the cancel on: the group is not killed the moment the engine exits.
    #[test]
    fn the_group_of_a_cancelled_engine_keeps_the_grace() {
        let dir = crate::files::test_support::TestDir::new("cancel-group");
        let ready = dir.path().join("ready");
        let mark = dir.path().join("mark");
        // READY once both traps are set: the child's own, so that the cancel's SIGTERM
        // to the group cannot reach it before it ignores SIGTERM.
        let script = "trap 'exit 0' TERM; \
                      (trap '' TERM; touch \"$READY\"; sleep 0.3; echo passed > \"$MARK\") & \
                      wait";
        let mut e = engine(&["sh", "-c", script], PromptMode::Stdin);
        e.env.insert("READY".into(), ready.display().to_string());
        e.env.insert("MARK".into(), mark.display().to_string());
        let (output, running, _) = run_and_cancel(e, &ready);
        assert_cancelled(&output);
        assert_eq!(std::fs::read_to_string(&mark).unwrap(), "passed\n");
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn a_turn_cancelled_before_its_engine_starts_starts_none() {
        let dir = crate::files::test_support::TestDir::new("cancel-early");
        let mark = dir.path().join("ran");
        let e = engine(&["touch", mark.to_str().unwrap()], PromptMode::Stdin);
        let token = CancelToken::new();
        token.cancel();
        let output = run_with(&e, "", token, &Default::default());
        let cancelled = TurnResult::Failed(crate::engine::cancelled());
        assert_eq!(output, TurnOutput::without_usage(cancelled));
        assert!(!mark.exists());
    }

    #[test]
    fn prompt_on_stdin_output_and_status() {
        let running = RunningEngines::default();
        let e = engine(&["cat"], PromptMode::Stdin);
        assert_eq!(answer(go(&e, "hello", &running)), Ok("hello".into()));
        let e = engine(
            &["sh", "-c", "cat; echo oops >&2; exit 3"],
            PromptMode::Stdin,
        );
        let failure = answer(go(&e, "hello", &running)).unwrap_err();
        assert_eq!(failure.error, "engine exited with status 3: oops");
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
        let output = go(&e, "the prompt", &Default::default());
        assert_eq!(answer(output), Ok("the prompt|from-launch".into()));
    }

    #[test]
    fn stdout_past_the_cap_is_cut_and_the_group_killed() {
        let mut e = engine(
            &["sh", "-c", "head -c 100000 /dev/zero; sleep 30"],
            PromptMode::Stdin,
        );
        e.max_output_bytes = 1000;
        let running = RunningEngines::default();
        let failure = answer(go(&e, "", &running)).unwrap_err();
        assert_eq!(
            failure.error,
            "engine output exceeded 1000 bytes (engine.maxOutputBytes); output cut"
        );
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn past_the_deadline_it_is_killed() {
        let mut e = engine(&["sleep", "30"], PromptMode::Stdin);
        e.timeout_secs = 0;
        let failure = answer(go(&e, "", &Default::default())).unwrap_err();
        assert_eq!(failure.code, ErrorCode::Timeout);
    }

    #[test]
    fn kill_all_ends_a_running_engine() {
        let e = engine(&["sleep", "30"], PromptMode::Stdin);
        let running = RunningEngines::default();
        let watcher = running.clone();
        let turn = thread::spawn(move || go(&e, "", &watcher));
        while running.count() == 0 {
            thread::sleep(Duration::from_millis(5));
        }
        running.kill_all();
        let failure = answer(turn.join().unwrap()).unwrap_err();
        assert_eq!(failure.error, "engine was killed by signal 9");
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn a_large_prompt_goes_through_and_one_left_unread_blocks_nothing() {
        let prompt = "p".repeat(1024 * 1024);
        let e = engine(&["cat"], PromptMode::Stdin);
        let output = go(&e, &prompt, &Default::default());
        assert_eq!(answer(output).map(|reply| reply.len()), Ok(prompt.len()));
        // An engine that never reads its (pipe-filling) input still ends its turn.
        let e = engine(&["sh", "-c", "echo done"], PromptMode::Stdin);
        let output = go(&e, &prompt, &Default::default());
        assert_eq!(answer(output), Ok("done".into()));
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
        let failure = answer(go(&e, "", &running)).unwrap_err();
        assert_eq!(failure.code, ErrorCode::Timeout);
        assert_eq!(running.count(), 0);
    }

    #[test]
    fn nothing_to_start() {
        let e = engine(&[], PromptMode::Stdin);
        let failure = answer(go(&e, "", &Default::default())).unwrap_err();
        assert_eq!(failure.error, "engine.command is empty");
        let e = engine(&["/nonexistent/loopbus-engine"], PromptMode::Stdin);
        let failure = answer(go(&e, "", &Default::default())).unwrap_err();
        assert!(failure.error.contains("not found"), "{failure:?}");
        assert!(!failure.retryable);
    }
}
