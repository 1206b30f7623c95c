//! Running one turn: the built-in echo engine, or the configured engine command
//! (contract section 8).
//!
//! A command turn spawns `engine.command` in a process group of its own, feeds the
//! prompt (stdin or last argument), drains stdout and stderr on their own threads (so a
//! chatty engine cannot deadlock), and waits with a deadline. On timeout, on output
//! past `maxOutputBytes`, on shutdown, and after every normal exit, the whole process
//! group is killed, so nothing the engine started outlives its turn; the child itself
//! is always reaped.

use crate::config::{Config, EngineConfig, OutputMode, PromptMode};
use crate::protocol::{ErrorCode, Failure, TalkRequest};
use crate::turns::Runner;
use crate::usage::{self, TurnUsage, UsageError, UsageStore};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// How much of the engine's stderr is kept for classification and messages; the rest
/// is read and dropped.
pub const MAX_STDERR_KEPT: usize = 64 * 1024;
/// After the engine exits (or is killed), how long its output pipes may stay open
/// (held by a process that escaped the group) before the turn stops waiting for them.
pub const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After killing an engine, how often the kill is repeated until its process is reaped.
const KILL_RETRY: Duration = Duration::from_millis(100);
/// Longest engine message carried into an envelope's `error`.
pub const MAX_ENGINE_MESSAGE_CHARS: usize = 1_000;

/// One admitted `/api/talk` request, with the config in force when it was admitted.
#[derive(Debug)]
pub struct Turn {
    /// The validated request.
    pub request: TalkRequest,
    /// The configuration snapshot for this turn.
    pub config: Arc<Config>,
}

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    /// The reply text (200, success envelope).
    Reply(String),
    /// A classified failure (200, failure envelope).
    Failed(Failure),
    /// The handler produced something that is not a result (500,
    /// `invalid_handler_response`); the text says what, for the log only.
    Invalid(String),
}

/// The process groups of engines running now, so shutdown can kill them.
#[derive(Debug, Default, Clone)]
pub struct RunningEngines {
    groups: Arc<Mutex<HashMap<u64, u32>>>,
    next: Arc<AtomicU64>,
}

impl RunningEngines {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
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

    /// Kills every running engine's process group (SIGKILL). Their turns then end
    /// with `engine_cli`.
    pub fn kill_all(&self) {
        for pgid in self.lock().values() {
            kill_group(*pgid);
        }
    }
}

fn kill_group(pgid: u32) {
    let pid = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        // ESRCH (already gone) is the normal case after a clean exit.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Runs turns for one instance.
#[derive(Debug)]
pub struct Engine {
    /// The instance's name, for `LOOPBUS_INSTANCE`.
    pub instance: String,
    /// The instance's state directory, for `LOOPBUS_STATE_DIR`.
    pub state_dir: PathBuf,
    /// usage.json.
    pub usage: UsageStore,
    /// Engines running now.
    pub running: RunningEngines,
}

impl Engine {
    /// An engine for `instance` whose state lives in `state_dir`.
    pub fn new(instance: &str, state_dir: PathBuf) -> Engine {
        Engine {
            instance: instance.to_owned(),
            usage: UsageStore::new(&state_dir),
            state_dir,
            running: RunningEngines::default(),
        }
    }

    /// The budget refusal, if the budget is spent (or unknowable).
    fn budget_refusal(&self, budget: f64) -> Option<Failure> {
        match self.usage.current() {
            Ok(usage) if usage.total_cost_usd >= budget => Some(Failure::new(
                ErrorCode::BudgetExhausted,
                usage::budget_message(usage.total_cost_usd, budget),
            )),
            Ok(_) => None,
            Err(e @ UsageError::Corrupt(_)) => Some(Failure::new(
                ErrorCode::BudgetExhausted,
                format!("Budget unknown: {e}."),
            )),
            Err(UsageError::Io(e)) => Some(Failure::new(
                ErrorCode::InternalError,
                format!("cannot read usage: {e}"),
            )),
        }
    }

    fn record_usage(&self, turn_usage: &TurnUsage) {
        if let Err(e) = self.usage.record(turn_usage) {
            log::error!("cannot record usage: {e}");
        }
    }
}

impl Engine {
    /// The result of a turn that needs neither a process nor a file, so the event
    /// loop can answer it at once instead of handing it to a worker: the built-in echo
    /// engine when no budget is set. `None` for every other turn.
    pub fn run_inline(turn: &Turn) -> Option<TurnResult> {
        if turn.config.engine.is_none() && turn.config.budget_usd.is_none() {
            Some(TurnResult::Reply(turn.request.prompt.clone()))
        } else {
            None
        }
    }
}

impl Runner<Turn, TurnResult> for Engine {
    fn run(&self, turn: &Turn) -> TurnResult {
        if let Some(budget) = turn.config.budget_usd {
            if let Some(refusal) = self.budget_refusal(budget) {
                return TurnResult::Failed(refusal);
            }
        }
        let Some(engine) = &turn.config.engine else {
            // The built-in echo engine: no process, no cost, no usage record.
            return TurnResult::Reply(turn.request.prompt.clone());
        };
        let run = run_command(engine, self, &turn.request);
        if let Some(turn_usage) = &run.usage {
            self.record_usage(turn_usage);
        }
        run.result
    }
}

/// What running the command produced.
struct CommandRun {
    result: TurnResult,
    usage: Option<TurnUsage>,
}

impl CommandRun {
    fn failed(code: ErrorCode, message: impl Into<String>) -> CommandRun {
        CommandRun {
            result: TurnResult::Failed(Failure::new(code, message)),
            usage: None,
        }
    }
}

/// Messages from the helper threads of one turn.
enum Event {
    Exited(std::io::Result<ExitStatus>),
    StdoutOverflow,
}

/// Output collected by a reader thread.
#[derive(Default)]
struct Collected {
    bytes: Vec<u8>,
    done: bool,
}

type Shared = Arc<Mutex<Collected>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Collected> {
    // Reader threads never panic while holding the lock.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `source` to its end, keeping at most `keep` bytes; calls `overflow` once if
/// more arrive. Runs on its own thread.
fn spawn_reader(
    mut source: impl Read + Send + 'static,
    keep: usize,
    overflow: Option<mpsc::Sender<Event>>,
) -> Shared {
    let shared: Shared = Arc::default();
    let out = Arc::clone(&shared);
    let spawned = thread::Builder::new()
        .name("engine-output".into())
        .spawn(move || {
            let mut buf = [0u8; 16 * 1024];
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
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
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

fn build_command(engine: &EngineConfig, owner: &Engine, request: &TalkRequest) -> Option<Command> {
    let (program, args) = engine.command.split_first()?;
    let mut command = Command::new(program);
    command.args(args);
    if engine.prompt == PromptMode::Arg {
        command.arg(&request.prompt);
    }
    if let Some(cwd) = &engine.cwd {
        command.current_dir(cwd);
    }
    command
        .envs(&engine.env)
        .env("LOOPBUS_INSTANCE", &owner.instance)
        .env("LOOPBUS_STATE_DIR", &owner.state_dir)
        .env("LOOPBUS_FROM", &request.from_instance)
        .env("LOOPBUS_DEPTH", request.depth.to_string())
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

fn run_command(engine: &EngineConfig, owner: &Engine, request: &TalkRequest) -> CommandRun {
    let program = engine.command.first().map(String::as_str).unwrap_or("");
    let Some(mut command) = build_command(engine, owner, request) else {
        return CommandRun::failed(ErrorCode::EngineCli, "engine.command is empty");
    };
    let started = Instant::now();
    let mut child: Child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return CommandRun::failed(
                ErrorCode::EngineCli,
                format!("cannot start engine `{program}`: {e}"),
            )
        }
    };
    let pgid = child.id();
    let running_id = owner.running.add(pgid);

    let (tx, rx) = mpsc::channel();
    if let Some(mut stdin) = child.stdin.take() {
        let prompt = request.prompt.clone().into_bytes();
        let _ = thread::Builder::new()
            .name("engine-input".into())
            .spawn(move || {
                // An engine that exits without reading its input is not an error here.
                let _ = stdin.write_all(&prompt);
            });
    }
    let max_output = usize::try_from(engine.max_output_bytes).unwrap_or(usize::MAX);
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
        owner.running.remove(running_id);
        return CommandRun::failed(
            ErrorCode::EngineCli,
            format!("cannot wait for the engine: {e}"),
        );
    }
    drop(tx);

    let deadline = started.checked_add(Duration::from_secs(engine.timeout_secs));
    let mut stop: Option<(ErrorCode, String)> = None;
    let status = loop {
        let event = match (deadline, &stop) {
            // Killed already: wait for the reaper, killing again now and then in case
            // the group gained a member since.
            (_, Some(_)) => rx.recv_timeout(KILL_RETRY),
            (Some(deadline), None) => {
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            }
            (None, None) => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Exited(status)) => break status.ok(),
            Ok(Event::StdoutOverflow) => {
                if stop.is_none() {
                    stop = Some((
                        ErrorCode::EngineCli,
                        format!(
                            "engine output exceeded {} bytes (engine.maxOutputBytes); output cut",
                            engine.max_output_bytes
                        ),
                    ));
                    kill_group(pgid);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if stop.is_none() {
                    stop = Some((
                        ErrorCode::Timeout,
                        format!(
                            "engine did not finish within {} s (engine.timeoutSecs)",
                            engine.timeout_secs
                        ),
                    ));
                }
                kill_group(pgid);
            }
            Err(RecvTimeoutError::Disconnected) => break None,
        }
    };
    // Whatever the engine left running in its group goes with it.
    kill_group(pgid);
    owner.running.remove(running_id);

    let stdout = wait_collected(stdout);
    let stderr = wait_collected(stderr);
    if let Some((code, message)) = stop {
        return CommandRun::failed(code, message);
    }
    let Some(status) = status else {
        return CommandRun::failed(ErrorCode::EngineCli, "lost track of the engine process");
    };
    interpret(engine.output, status, &stdout, &stderr)
}

/// Waits (bounded) for a reader to finish and takes what it collected.
fn wait_collected(shared: Option<Shared>) -> Vec<u8> {
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
        thread::sleep(Duration::from_millis(2));
    }
}

/// Turns an engine's exit status and output into a result (pure).
fn interpret(output: OutputMode, status: ExitStatus, stdout: &[u8], stderr: &[u8]) -> CommandRun {
    let stdout_text = String::from_utf8_lossy(stdout);
    let stderr_text = String::from_utf8_lossy(stderr);
    let json = match output {
        OutputMode::Json => json_object(&stdout_text),
        OutputMode::Text => None,
    };
    let usage = json.as_ref().map(usage_of);
    if !status.success() {
        // Prefer the engine's structured message, then stderr, then stdout.
        let json_message = json
            .as_ref()
            .and_then(|v| v.get("result"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let message = json_message
            .or_else(|| last_lines(&stderr_text))
            .or_else(|| last_lines(&stdout_text))
            .unwrap_or_default();
        let code =
            classify(&format!("{stderr_text}\n{stdout_text}")).unwrap_or(ErrorCode::EngineCli);
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("engine exited with status {code}"),
            (None, Some(signal)) => format!("engine was killed by signal {signal}"),
            (None, None) => "engine failed".to_owned(),
        };
        let text = if message.is_empty() {
            how
        } else {
            format!("{how}: {message}")
        };
        return CommandRun {
            result: TurnResult::Failed(Failure::new(code, bounded(&text))),
            usage,
        };
    }
    match output {
        OutputMode::Text => {
            let Ok(text) = String::from_utf8(stdout.to_vec()) else {
                return CommandRun {
                    result: TurnResult::Failed(Failure::new(
                        ErrorCode::EngineCli,
                        "engine output is not UTF-8 (engine.output is \"text\")",
                    )),
                    usage: Some(TurnUsage::default()),
                };
            };
            let text = text
                .strip_suffix('\n')
                .map(|t| t.strip_suffix('\r').unwrap_or(t))
                .unwrap_or(&text);
            CommandRun {
                result: TurnResult::Reply(text.to_owned()),
                usage: Some(TurnUsage::default()),
            }
        }
        OutputMode::Json => {
            let Some(value) = json else {
                return CommandRun {
                    result: TurnResult::Failed(Failure::new(
                        ErrorCode::EngineCli,
                        "engine output is not a JSON object (engine.output is \"json\")",
                    )),
                    usage: Some(TurnUsage::default()),
                };
            };
            let Some(result) = value.get("result").and_then(Value::as_str) else {
                return CommandRun {
                    result: TurnResult::Failed(Failure::new(
                        ErrorCode::EngineCli,
                        "engine JSON output has no string `result`",
                    )),
                    usage,
                };
            };
            let result = if value.get("is_error").and_then(Value::as_bool) == Some(true) {
                let code = classify(result).unwrap_or(ErrorCode::Unknown);
                TurnResult::Failed(Failure::new(code, bounded(result)))
            } else {
                TurnResult::Reply(result.to_owned())
            };
            CommandRun { result, usage }
        }
    }
}

/// The engine's JSON object: the whole of stdout, or else its last non-empty line (an
/// engine may print a warning before the object).
fn json_object(stdout: &str) -> Option<Value> {
    let whole = serde_json::from_str::<Value>(stdout)
        .ok()
        .filter(Value::is_object);
    whole.or_else(|| {
        let last = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
        serde_json::from_str::<Value>(last)
            .ok()
            .filter(Value::is_object)
    })
}

/// Cost and tokens from a `claude -p --output-format json` object; absent or invalid
/// fields count as 0.
fn usage_of(value: &Value) -> TurnUsage {
    let tokens = |field: &str| {
        value
            .get("usage")
            .and_then(|u| u.get(field))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cost = value
        .get("total_cost_usd")
        .and_then(Value::as_f64)
        .filter(|c| c.is_finite() && *c >= 0.0)
        .unwrap_or(0.0);
    TurnUsage {
        input_tokens: tokens("input_tokens"),
        output_tokens: tokens("output_tokens"),
        cached_tokens: tokens("cache_read_input_tokens"),
        cost_usd: cost,
    }
}

/// The classification rules, in the order they are tried: the first rule with a
/// phrase found in the engine's output (case-insensitive) gives the code. Output that
/// matches no rule is `engine_cli` for a failed exit and `unknown` for an engine that
/// reported an error itself.
pub const CLASSIFICATION_RULES: [(ErrorCode, &[&str]); 3] = [
    (
        ErrorCode::Auth,
        &[
            "not logged in",
            "unauthorized",
            "invalid api key",
            "invalid x-api-key",
            "authentication failed",
            "authentication_error",
            "please run /login",
            "401 unauthorized",
            "status 401",
            "status code 401",
            "http 401",
            "error 401",
            "(401)",
        ],
    ),
    (
        ErrorCode::WritePermission,
        &[
            "read-only",
            "read only file system",
            "permission denied",
            "operation not permitted",
            "eacces",
            "not allowed to write",
        ],
    ),
    (
        ErrorCode::SessionState,
        &[
            "no conversation found",
            "no such session",
            "session not found",
        ],
    ),
];

/// The code of the first rule that matches `text`, if any.
pub fn classify(text: &str) -> Option<ErrorCode> {
    let lower = text.to_lowercase();
    CLASSIFICATION_RULES
        .iter()
        .find(|(_, phrases)| phrases.iter().any(|p| contains_phrase(&lower, p)))
        .map(|(code, _)| code.clone())
}

/// Whether `phrase` occurs in `text`; a numeric phrase (like `401`) must not be part of
/// a longer number.
fn contains_phrase(text: &str, phrase: &str) -> bool {
    if !phrase.bytes().all(|b| b.is_ascii_digit()) {
        return text.contains(phrase);
    }
    text.match_indices(phrase).any(|(i, _)| {
        let before = text[..i].bytes().next_back();
        let after = text[i + phrase.len()..].bytes().next();
        !before.is_some_and(|b| b.is_ascii_digit()) && !after.is_some_and(|b| b.is_ascii_digit())
    })
}

/// The last few non-empty lines of `text`, bounded.
fn last_lines(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let start = lines.len().saturating_sub(3);
    Some(bounded(&lines[start..].join(" | ")))
}

fn bounded(text: &str) -> String {
    crate::protocol::truncate_chars(text.trim().to_owned(), MAX_ENGINE_MESSAGE_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("Invalid API key · Please run /login", Some("auth")),
            ("Error: not logged in", Some("auth")),
            ("HTTP 401 from provider", Some("auth")),
            ("request failed with status code 401", Some("auth")),
            ("API Error (401) {...}", Some("auth")),
            ("file.py:401: syntax error", None),
            ("Unauthorized", Some("auth")),
            ("error at line 4011", None),
            ("EROFS: read-only file system", Some("write_permission")),
            ("open /x: Permission denied", Some("write_permission")),
            ("Operation not permitted", Some("write_permission")),
            (
                "No conversation found with session ID abc",
                Some("session_state"),
            ),
            ("error: no such session", Some("session_state")),
            ("segfault", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                classify(text).as_ref().map(ErrorCode::as_str),
                *want,
                "{text:?}"
            );
        }
    }

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn interpret_table() {
        // (mode, exit code, stdout, stderr, expected: Ok(reply) | Err(code))
        type Row = (
            OutputMode,
            i32,
            &'static str,
            &'static str,
            Result<&'static str, &'static str>,
        );
        let rows: &[Row] = &[
            (OutputMode::Text, 0, "hello\n", "", Ok("hello")),
            (
                OutputMode::Text,
                0,
                "two\nlines\n\n",
                "",
                Ok("two\nlines\n"),
            ),
            (OutputMode::Text, 0, "", "noise", Ok("")),
            (
                OutputMode::Text,
                1,
                "",
                "Invalid API key · Please run /login",
                Err("auth"),
            ),
            (OutputMode::Text, 2, "", "boom", Err("engine_cli")),
            (
                OutputMode::Text,
                1,
                "",
                "rm: Permission denied",
                Err("write_permission"),
            ),
            (
                OutputMode::Json,
                0,
                r#"{"result":"ok","total_cost_usd":0.5}"#,
                "",
                Ok("ok"),
            ),
            (
                OutputMode::Json,
                0,
                r#"{"result":"No conversation found","is_error":true}"#,
                "",
                Err("session_state"),
            ),
            (
                OutputMode::Json,
                0,
                r#"{"result":"weird","is_error":true}"#,
                "",
                Err("unknown"),
            ),
            (
                OutputMode::Json,
                1,
                r#"{"result":"Invalid API key","is_error":true}"#,
                "",
                Err("auth"),
            ),
            (OutputMode::Json, 0, "not json", "", Err("engine_cli")),
            (
                OutputMode::Json,
                0,
                r#"{"text":"no result"}"#,
                "",
                Err("engine_cli"),
            ),
            (
                OutputMode::Json,
                0,
                "warning: old\n{\"result\":\"ok\"}\n",
                "",
                Ok("ok"),
            ),
            (OutputMode::Text, 0, "caf\u{e9}", "", Ok("caf\u{e9}")),
        ];
        for (mode, code, out, err, want) in rows {
            let run = interpret(*mode, exit(*code), out.as_bytes(), err.as_bytes());
            let got = match &run.result {
                TurnResult::Reply(text) => Ok(text.as_str()),
                TurnResult::Failed(f) => Err(f.code.as_str()),
                TurnResult::Invalid(_) => Err("invalid_handler_response"),
            };
            assert_eq!(got, *want, "{mode:?} {code} {out:?} {err:?}");
        }
    }

    #[test]
    fn failure_message_carries_the_engine_text() {
        let run = interpret(
            OutputMode::Text,
            exit(1),
            b"",
            b"Invalid API key \xc2\xb7 Please run /login\n",
        );
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert_eq!(
            f.error,
            "engine exited with status 1: Invalid API key · Please run /login"
        );
        assert!(!f.retryable);
    }

    #[test]
    fn json_usage_is_read() {
        let v: Value = serde_json::from_str(
            r#"{"result":"x","total_cost_usd":0.25,"usage":{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":5}}"#,
        )
        .unwrap();
        assert_eq!(
            usage_of(&v),
            TurnUsage {
                input_tokens: 3,
                output_tokens: 4,
                cached_tokens: 5,
                cost_usd: 0.25
            }
        );
        let v: Value = serde_json::from_str(r#"{"result":"x","total_cost_usd":-1}"#).unwrap();
        assert_eq!(usage_of(&v).cost_usd, 0.0);
    }
}
