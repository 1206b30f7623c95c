//! Supervising one engine process: spawn it in a process group of its own, feed it the
//! prompt, drain its output within caps, enforce its deadline, kill its group and reap it.
//!
//! stdout and stderr are drained on their own threads (so a chatty engine cannot
//! deadlock), and a third thread waits for the exit. On timeout, on stdout past
//! `engine.maxOutputBytes`, on shutdown ([`RunningEngines::kill_all`]) and after every
//! normal exit, the whole process group is killed, so nothing the engine started
//! outlives its turn; the child itself is always reaped.

use crate::config::{EngineConfig, PromptMode};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// How much of the engine's stderr is kept for classification and messages; the rest
/// is read and dropped.
pub const MAX_STDERR_KEPT: usize = 64 * 1024;
/// After the engine exits (or is killed), how long its output pipes may stay open
/// (held by a process that escaped the group) before the turn stops waiting for them.
pub const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After killing an engine, how often the kill is repeated until its process is reaped.
pub const KILL_RETRY: Duration = Duration::from_millis(100);
/// How often a turn looks whether its output readers are done, during
/// [`PIPE_DRAIN_GRACE`].
pub const DRAIN_POLL: Duration = Duration::from_millis(2);
/// The size of one read from an engine's pipe.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// The process groups of engines running now, so shutdown can kill them.
#[derive(Debug, Default, Clone)]
pub struct RunningEngines {
    groups: Arc<Mutex<HashMap<u64, u32>>>,
    next: Arc<AtomicU64>,
}

impl RunningEngines {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, u32>> {
        // Nothing panics while holding this lock.
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, pgid: u32) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, pgid);
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// How many engine processes are running.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Kills every running engine's process group (SIGKILL). Their turns then end as
    /// failures ("engine was killed by signal 9"), classified from what the engine
    /// wrote so far: `engine_cli` unless that matches a rule.
    pub fn kill_all(&self) {
        for pgid in self.lock().values() {
            kill_group(*pgid);
        }
    }
}

/// Sends SIGKILL to the process group `pgid`.
fn kill_group(pgid: u32) {
    let pid = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        // ESRCH (already gone) is the normal case after a clean exit.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

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
    /// No thread could be started to wait for it; its group was killed.
    WaitFailed(io::Error),
    /// It ran past `engine.timeoutSecs`; its group was killed.
    TimedOut,
    /// Its stdout passed `engine.maxOutputBytes`; its group was killed.
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
}

/// Messages from the helper threads of one process.
enum Event {
    Exited(io::Result<ExitStatus>),
    StdoutOverflow,
}

/// Output collected by a reader thread.
#[derive(Default)]
struct Collected {
    bytes: Vec<u8>,
    done: bool,
}

type SharedOutput = Arc<Mutex<Collected>>;

fn lock(shared: &SharedOutput) -> MutexGuard<'_, Collected> {
    // Reader threads never panic while holding the lock.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `launch` to its end, tracked in `running` while it runs.
pub fn run(launch: &Launch<'_>, running: &RunningEngines) -> Ended {
    let Some(mut command) = command(launch) else {
        return Ended::NoCommand;
    };
    let started = Instant::now();
    let mut child: Child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Ended::SpawnFailed(e),
    };
    // The child leads its own group (`process_group(0)`), so its pid is the group's id.
    let pgid = child.id();
    let running_id = running.add(pgid);

    let (tx, rx) = mpsc::channel();
    if let Some(mut stdin) = child.stdin.take() {
        let prompt = launch.prompt.as_bytes().to_vec();
        let _ = thread::Builder::new()
            .name("engine-input".into())
            .spawn(move || {
                // An engine that exits without reading its input is not an error here.
                let _ = stdin.write_all(&prompt);
            });
    }
    let max_output = usize::try_from(launch.engine.max_output_bytes).unwrap_or(usize::MAX);
    let stdout = child
        .stdout
        .take()
        .map(|s| spawn_reader(s, max_output, Some(tx.clone())));
    let stderr = child
        .stderr
        .take()
        .map(|s| spawn_reader(s, MAX_STDERR_KEPT, None));
    let waiter_tx = tx.clone();
    let waiter = thread::Builder::new()
        .name("engine-wait".into())
        .spawn(move || {
            let status = child.wait();
            let _ = waiter_tx.send(Event::Exited(status));
        });
    if let Err(e) = waiter {
        kill_group(pgid);
        running.remove(running_id);
        return Ended::WaitFailed(e);
    }
    drop(tx);

    let deadline = started.checked_add(Duration::from_secs(launch.engine.timeout_secs));
    let (status, stop) = supervise(&rx, deadline, pgid);
    // Whatever the engine left running in its group goes with it.
    kill_group(pgid);
    running.remove(running_id);

    let stdout = wait_collected(stdout);
    let stderr = wait_collected(stderr);
    match (stop, status) {
        (Some(Stop::TimedOut), _) => Ended::TimedOut,
        (Some(Stop::OutputTooLarge), _) => Ended::OutputTooLarge,
        (None, None) => Ended::Lost,
        (None, Some(status)) => Ended::Exited {
            status,
            stdout,
            stderr,
        },
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

/// Waits for the process to be reaped, killing its group at the deadline or on output
/// overflow (and again every [`KILL_RETRY`] until it is reaped, in case the group
/// gained a member since). Returns the exit status (`None` if it was lost) and why the
/// turn stopped it, if it did.
fn supervise(
    rx: &mpsc::Receiver<Event>,
    deadline: Option<Instant>,
    pgid: u32,
) -> (Option<ExitStatus>, Option<Stop>) {
    let mut stop: Option<Stop> = None;
    loop {
        let event = match (deadline, stop) {
            // Killed already: wait for the reaper.
            (_, Some(_)) => rx.recv_timeout(KILL_RETRY),
            (Some(deadline), None) => {
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            }
            (None, None) => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Exited(status)) => return (status.ok(), stop),
            Ok(Event::StdoutOverflow) => {
                if stop.is_none() {
                    stop = Some(Stop::OutputTooLarge);
                    kill_group(pgid);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                stop = stop.or(Some(Stop::TimedOut));
                kill_group(pgid);
            }
            Err(RecvTimeoutError::Disconnected) => return (None, stop),
        }
    }
}

/// Reads `source` to its end on a thread of its own, keeping at most `keep` bytes;
/// sends [`Event::StdoutOverflow`] on `overflow` once if more arrive.
fn spawn_reader(
    mut source: impl Read + Send + 'static,
    keep: usize,
    overflow: Option<mpsc::Sender<Event>>,
) -> SharedOutput {
    let shared: SharedOutput = Arc::default();
    let out = Arc::clone(&shared);
    let spawned = thread::Builder::new()
        .name("engine-output".into())
        .spawn(move || {
            let mut buf = [0u8; READ_CHUNK_BYTES];
            let mut overflowed = false;
            loop {
                match source.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut collected = lock(&out);
                        let room = keep.saturating_sub(collected.bytes.len());
                        collected.bytes.extend_from_slice(&buf[..n.min(room)]);
                        if n > room && !overflowed {
                            overflowed = true;
                            if let Some(tx) = &overflow {
                                let _ = tx.send(Event::StdoutOverflow);
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            lock(&out).done = true;
        });
    if spawned.is_err() {
        lock(&shared).done = true;
    }
    shared
}

/// Waits (at most [`PIPE_DRAIN_GRACE`]) for a reader to finish and takes what it
/// collected.
fn wait_collected(shared: Option<SharedOutput>) -> Vec<u8> {
    let Some(shared) = shared else {
        return Vec::new();
    };
    let deadline = Instant::now() + PIPE_DRAIN_GRACE;
    loop {
        {
            let mut collected = lock(&shared);
            if collected.done || Instant::now() >= deadline {
                return std::mem::take(&mut collected.bytes);
            }
        }
        thread::sleep(DRAIN_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutputMode;
    use std::os::unix::process::ExitStatusExt;

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
