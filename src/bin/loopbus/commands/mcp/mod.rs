//! `loopbus mcp`: a stdio MCP server through which an agent CLI (Claude Code, Codex,
//! Gemini CLI) delegates to other instances with tools instead of shell commands
//! (contract 10). It acts as the instance of `--state-dir` exactly as `loopbus talk`
//! would: its peers, its depth, no secret of its own.
//!
//! - [`framing`]: one message a line, the line limit (all revisions);
//! - [`rpc`]: JSON-RPC, and the lifecycle of 2025-06-18, 2025-11-25 and 2026-07-28;
//! - [`tools`]: the tools' schemas, arguments and results; [`answers`]: what a
//!   finished delegation answers;
//! - [`calls`]: who delegates, stdout, and each tool's call; [`job`]: the work of a
//!   delegating call, its wait, progress, pages and cancellation;
//! - [`handles`]: the handles naming work that outlives its call.
//!
//! This file reads stdin on the main thread and answers what is quick there; each
//! tool call runs on a thread of its own, up to [`MAX_CONCURRENT_CALLS`], and every
//! thread writes whole lines through one writer. At the end of stdin the process
//! cancels the work still running and exits.

mod answers;
mod calls;
mod framing;
mod handles;
mod job;
mod rpc;
mod tools;

use crate::cli::{local, on_stop_signals, stopped_by, Args, CommandError, EXIT_OK};
use calls::{Caller, Out, Shared};
use job::{CallCtl, Progress};
use rpc::{Incoming, Revision, Route, RpcError, Session};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tools::BadCall;

/// Help text.
pub const HELP: &str = "\
loopbus mcp [--state-dir DIR [--name NAME] | --as NAME] [--root ROOT] [--depth N]

Serve MCP (the Model Context Protocol) on stdin and stdout, so that an agent CLI
delegates to other instances with tools: list_instances, talk, fan, chain,
verify, result, cancel and trace (docs/agents.md has their schemas and each
CLI's setup). Speaks protocol revisions 2025-06-18, 2025-11-25 (initialize) and
2026-07-28 (server/discover). Only JSON-RPC goes to stdout; logs go to stderr.

It delegates as the instance whose state directory is DIR (default:
$LOOPBUS_STATE_DIR), under that instance's config.json (read again at each
call), or without either as the operator of the channel root, like
`loopbus talk`. A call waits at most its waitSecs (default 45) and then
returns a handle while the work goes on; `result` fetches the answer later.
When stdin closes, the work still running is cancelled and the process exits;
SIGINT, SIGTERM and SIGHUP do the same, exiting 130, 143 and 129.

Options:
  --state-dir DIR   the calling instance's state directory
  --name NAME       the calling instance's name (default: $LOOPBUS_INSTANCE when
                    DIR comes from $LOOPBUS_STATE_DIR, else DIR's last component)
  --as NAME         without a state directory: the fromInstance sent (default
                    `operator`)
  --root ROOT       the channel root (default: DIR's parent, else $LOOPBUS_ROOT,
                    else ~/.loopbus)
  --depth N         the current delegation depth (default: $LOOPBUS_DEPTH, else 0);
                    delegations carry N + 1

Exit status: 0 when stdin closed; 130, 143 and 129 on SIGINT, SIGTERM and SIGHUP;
2 usage or local configuration error.

Example (Claude Code):
  claude mcp add loopbus -- loopbus mcp --state-dir ~/.loopbus/reviewer
";

/// Most tool calls running at once; one more gets a tool error saying so.
pub const MAX_CONCURRENT_CALLS: usize = 16;

/// How long the process, at the end of stdin, waits for the work it cancels to end.
pub const EXIT_CANCEL_WAIT: Duration =
    loopbus::CANCEL_TIMEOUT.saturating_add(Duration::from_secs(1));

/// Runs `mcp` until stdin closes.
///
/// # Errors
/// Bad arguments, or no usable config.json for `--state-dir`.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["state-dir", "name", "as", "root", "depth"], &[])?;
    if args.help {
        super::output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(0)?;
    let super::talk::Settings {
        caller: name,
        bus,
        root,
        depth,
        ..
    } = super::talk::Settings::from_args(&args)?;
    // The instance's config.json, read again at each call; `None`: the operator.
    let state_dir = super::state_dir_from(args.value("state-dir")).ok();
    log::info!(
        "mcp: serving on stdio as {name} (depth {depth}), channel root {}",
        root.display()
    );
    let shared = Arc::new(Shared {
        out: Out::stdout().map_err(|e| local(format!("cannot use stdout: {e}")))?,
        caller: Caller {
            root,
            name,
            state_dir,
            bus,
            depth,
        },
        handles: Mutex::new(handles::Handles::new()),
    });
    stop_on_signals(&shared)?;
    if std::io::stdin().is_terminal() {
        super::terminal::eprint_line(
            "loopbus: mcp speaks JSON-RPC on stdin and stdout, for an agent CLI to start \
             (docs/agents.md); Ctrl-D ends it",
        );
    }
    let mut server = Server {
        shared: Arc::clone(&shared),
        session: Session::default(),
        calls: Arc::new(Mutex::new(HashMap::new())),
    };
    let mut input = std::io::stdin().lock();
    loop {
        match framing::read_line(&mut input) {
            Ok(Some(framing::Line::Message(bytes))) => server.handle(&bytes),
            Ok(Some(framing::Line::TooLong { bytes })) => {
                let message = format!(
                    "a message of {bytes} bytes is over the limit of {} bytes",
                    framing::MAX_LINE_BYTES
                );
                let error = RpcError::new(&Value::Null, rpc::INVALID_REQUEST, message);
                shared.out.send(&error.to_json());
            }
            Ok(None) => break,
            Err(e) => {
                log::warn!("mcp: cannot read stdin: {e}");
                break;
            }
        }
    }
    log::info!("mcp: stdin closed; cancelling the work still running, then exiting");
    shared.cancel_all(EXIT_CANCEL_WAIT);
    Ok(EXIT_OK)
}

/// Makes SIGINT, SIGTERM and SIGHUP (a closed terminal) end the process as the end of
/// stdin does, the work still running cancelled first (a delegation with a request id
/// that merely hangs up runs on for its target's `reattachSecs`), then exit 130, 143
/// or 129.
///
/// # Errors
/// The handlers, their wake-up pair or their thread could not be set up.
fn stop_on_signals(shared: &Arc<Shared>) -> Result<(), CommandError> {
    let setup = |e: std::io::Error| local(format!("cannot set up the signal handlers: {e}"));
    let (wake_read, wake_write) = UnixStream::pair().map_err(setup)?;
    wake_write.set_nonblocking(true).map_err(setup)?;
    let caught = Arc::new(AtomicUsize::new(0));
    on_stop_signals(&caught, &wake_write).map_err(setup)?;
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name("mcp-signals".to_owned())
        .spawn(move || {
            let mut drain = [0u8; 16];
            let (exit, name) = loop {
                if let Some(stop) = stopped_by(caught.load(Ordering::SeqCst)) {
                    break stop;
                }
                let _ = (&wake_read).read(&mut drain);
            };
            log::info!("mcp: stopped by {name}; cancelling the work still running");
            shared.cancel_all(EXIT_CANCEL_WAIT);
            std::process::exit(exit);
        })
        .map_err(setup)?;
    Ok(())
}

/// The calls in flight, by request id (as JSON text).
type Calls = Arc<Mutex<HashMap<String, Arc<CallCtl>>>>;

/// The reading side of the server.
struct Server {
    shared: Arc<Shared>,
    session: Session,
    calls: Calls,
}

impl Server {
    /// Handles one line.
    fn handle(&mut self, bytes: &[u8]) {
        let answer = match rpc::parse(bytes) {
            Err(error) => Some(error.to_json()),
            Ok(Incoming::Response) => {
                log::debug!("mcp: ignoring a response: this server sends no requests");
                None
            }
            Ok(Incoming::Notification { method, params }) => {
                self.notification(&method, &params);
                None
            }
            Ok(Incoming::Request { id, method, params }) => self
                .request(&id, &method, &params)
                .unwrap_or_else(|error| Some(error.to_json())),
        };
        if let Some(answer) = answer {
            self.shared.out.send(&answer);
        }
    }

    fn notification(&self, method: &str, params: &Map<String, Value>) {
        match method {
            // Every revision: the request named is no longer wanted. Unknown or
            // finished ones are ignored, as the spec allows.
            "notifications/cancelled" => {
                let Some(id) = params.get("requestId") else {
                    return;
                };
                let ctl = lock(&self.calls).get(&id.to_string()).cloned();
                if let Some(ctl) = ctl {
                    log::info!("mcp: the client cancelled call {id}");
                    ctl.cancel();
                }
            }
            "notifications/initialized" => {}
            other => log::debug!("mcp: ignoring notification {other}"),
        }
    }

    /// The answer to a request, `None` when a thread answers it later.
    fn request(
        &mut self,
        id: &Value,
        method: &str,
        params: &Map<String, Value>,
    ) -> Result<Option<Value>, RpcError> {
        let (revision, result) = match rpc::route(&mut self.session, id, method, params)? {
            Route::Initialize(revision) => (None, rpc::initialize_result(revision)),
            Route::Ping => (None, json!({})),
            Route::Discover => (Some(Revision::V2026_07_28), rpc::discover_result()),
            Route::Tools(revision) if method == "tools/list" => {
                // One page: no cursor of ours exists to be given back.
                if params.get("cursor").is_some_and(|c| !c.is_null()) {
                    return Err(RpcError::new(id, rpc::INVALID_PARAMS, "invalid cursor"));
                }
                let mut result = json!({"tools": tools::definitions()});
                if revision.is_modern() {
                    result["ttlMs"] = json!(rpc::LIST_TTL_MS);
                    result["cacheScope"] = json!("public");
                }
                (Some(revision), result)
            }
            Route::Tools(revision) => return self.call(id, revision, params),
        };
        Ok(Some(rpc::complete(id, revision, result)))
    }

    /// Starts a `tools/call` on a thread of its own.
    fn call(
        &self,
        id: &Value,
        revision: Revision,
        params: &Map<String, Value>,
    ) -> Result<Option<Value>, RpcError> {
        let tool_error = |message: &str| {
            rpc::complete(id, Some(revision), tools::tool_result(message, None, true))
        };
        let call = match tools::parse_call(params) {
            Ok(call) => call,
            Err(BadCall::Arguments(message)) if revision != Revision::V2025_06_18 => {
                return Ok(Some(tool_error(&message)))
            }
            Err(BadCall::Arguments(message) | BadCall::Request(message)) => {
                return Err(RpcError::new(id, rpc::INVALID_PARAMS, message))
            }
        };
        let key = id.to_string();
        let ctl = Arc::new(CallCtl::default());
        {
            let mut calls = lock(&self.calls);
            if calls.contains_key(&key) {
                return Err(RpcError::new(
                    id,
                    rpc::INVALID_REQUEST,
                    "a call with this id is still in flight",
                ));
            }
            if calls.len() >= MAX_CONCURRENT_CALLS {
                return Ok(Some(tool_error(&format!(
                    "loopbus mcp is running {MAX_CONCURRENT_CALLS} tool calls already (its \
                     limit); try again when one has answered [server_busy, retryable]"
                ))));
            }
            calls.insert(key.clone(), Arc::clone(&ctl));
        }
        let progress = params
            .get("_meta")
            .and_then(|meta| meta.get("progressToken"))
            .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
            .map(|t| Progress::new(t.clone()));
        // Every revision's `_meta` may carry W3C trace context (named in 2026-07-28).
        let parent = params
            .get("_meta")
            .and_then(|meta| meta.get("traceparent"))
            .and_then(Value::as_str)
            .and_then(|value| {
                let parsed = loopbus::parse_traceparent(value);
                if parsed.is_none() {
                    log::warn!("mcp: ignoring a malformed _meta.traceparent");
                }
                parsed
            });
        let shared = Arc::clone(&self.shared);
        let calls = Arc::clone(&self.calls);
        let answer_id = id.clone();
        let spawned = std::thread::Builder::new()
            .name("mcp-call".to_owned())
            .spawn(move || {
                let answer = answer_call(&answer_id, revision, || {
                    shared.run(call, progress, parent, &ctl)
                });
                lock(&calls).remove(&key);
                match answer {
                    Some(answer) if !ctl.cancelled() => shared.out.send(&answer),
                    _ => {}
                }
            });
        match spawned {
            Ok(_) => Ok(None),
            Err(e) => {
                lock(&self.calls).remove(&id.to_string());
                Err(RpcError::new(
                    id,
                    rpc::INTERNAL_ERROR,
                    format!("cannot start the call: {e}"),
                ))
            }
        }
    }
}

/// Runs a call and makes its answer: its result, -32603 when it panicked (the process
/// goes on), `None` when the client cancelled it.
fn answer_call(
    id: &Value,
    revision: Revision,
    call: impl FnOnce() -> Option<Value>,
) -> Option<Value> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(result) => result.map(|result| rpc::complete(id, Some(revision), result)),
        Err(_) => Some(RpcError::new(id, rpc::INTERNAL_ERROR, "the call failed").to_json()),
    }
}

/// Locks `mutex`; the map stays valid whatever panicked while holding it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_panics_is_answered_with_an_internal_error() {
        let id = json!(7);
        let answer = answer_call(&id, Revision::V2025_11_25, || panic!("a bug"));
        let answer = answer.unwrap();
        assert_eq!(answer["error"]["code"], rpc::INTERNAL_ERROR);
        assert_eq!(answer["id"], 7);
        let fine = answer_call(&id, Revision::V2026_07_28, || Some(json!({})));
        assert_eq!(fine.unwrap()["result"]["resultType"], "complete");
        assert_eq!(answer_call(&id, Revision::V2025_06_18, || None), None);
    }
}
