//! `loopbus talk TARGET [PROMPT]`: delegate one prompt to another instance, wait for
//! it (cancelling the turn on SIGINT/SIGTERM and when giving up for good, contract
//! 8.1), and print the reply.

use super::terminal;
use crate::cli::closest;
use crate::cli::{
    local, usage, Args, CommandError, UsageError, EXIT_FAILURE, EXIT_OK, EXIT_RETRYABLE,
};
use loopbus::{
    BusConfig, DelegateError, DelegateOptions, InstanceName, Reply, TraceContext, TraceId,
    UsageReport, DEFAULT_TIMEOUT, MAX_BODY_BYTES,
};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod watch;

/// Help text.
pub const HELP: &str = "\
loopbus talk TARGET [PROMPT] [--state-dir DIR [--name NAME] | --as NAME] [--root ROOT]
             [--depth N] [--timeout SECS] [--retries N] [--json | --raw] [-v]

Send PROMPT (read from stdin when absent or `-`) to the instance TARGET and print
its reply on stdout. Acts as the instance whose state directory is DIR (default:
$LOOPBUS_STATE_DIR): its config.json decides whether it may call TARGET (bus
enabled, TARGET among its peers, depth below its maxDepth) and which kinds of
peer it accepts. Without either, talk acts as the operator of the channel root,
from a plain shell: fromInstance is `operator` (or --as NAME), with no config of
its own (bus enabled, every peer, maxDepth 3); TARGET's peers still decide.
TARGET is looked up in the channel root's .bus-registry.json (ROOT, else DIR's
parent, else $LOOPBUS_ROOT, else ~/.loopbus) and must pass a health check before
the secret is sent.

Options:
  --state-dir DIR   the calling instance's state directory
  --name NAME       the calling instance's name (default: $LOOPBUS_INSTANCE when
                    DIR comes from $LOOPBUS_STATE_DIR, else DIR's last component)
  --as NAME         without a state directory: the fromInstance sent (default
                    `operator`)
  --root ROOT       the channel root whose registry names TARGET (default: DIR's
                    parent, else $LOOPBUS_ROOT, else ~/.loopbus)
  --depth N         the current delegation depth (default: $LOOPBUS_DEPTH, else 0);
                    the request carries N + 1
  --timeout SECS    how long each attempt waits for the answer (default 1800)
  --retries N       retry a retryable failure up to N times (default 0), same
                    request id, jittered backoff from 250 ms doubling to 10 s; a
                    failure that may have run the turn (a timeout, ours or
                    the peer's, broken after sending, unknown) only if TARGET
                    has idempotent-requests
  --json            print the whole envelope, also for failures: the peer's own
                    (a legacy peer's without protocolVersion and capabilities),
                    or a v1 one for a failure decided here; with the turn's usage
                    when the peer reported it
  --raw             print the reply's exact bytes: no escaping, no added newline
  -v, --verbose     say on stderr which trace the delegation belongs to

The reply is printed followed by a newline when it does not end with one. When
stdout is not a terminal it is printed as it came; on a terminal, control
characters other than newline and tab (escape sequences a peer could use to
write the clipboard or move the cursor) are shown escaped, as `\\u001b`; the error
on stderr is always escaped that way. When stderr is a terminal, a turn that
takes more than 2 s shows the time waited, and the turn's cost is summed up
at the end when the peer reported it.

Every delegation belongs to a tree of delegations, its trace: the one of
$LOOPBUS_TRACE_ID (with $LOOPBUS_REQUEST_ID as the turn that makes it), as an
instance gives its engine, else the trace id of $TRACEPARENT, else a new one; a
malformed value is ignored with a warning. With --json the printed envelope gets
a top-level `traceId`; `loopbus trace ID` shows the tree.

Every delegation carries a request id. On SIGINT, SIGTERM or SIGHUP, and after its
final timeout, talk sends TARGET a cancel request for the turn when TARGET
advertises cancel-on-hangup (to any other it just closes the connection).

Exit status: 0 reply received; 1 failure that is not retryable (bus_disabled,
peer_not_allowed, max_depth_exceeded, request_too_large, or the peer's own);
75 retryable failure (instance_unavailable, timeout, invalid_response, or the
peer's own); 2 usage or local configuration error; 130 stopped by SIGINT, 143
by SIGTERM, 129 by SIGHUP (after the cancel). The error goes to stderr as
`loopbus: talk to TARGET: MESSAGE [CODE, retryable|not retryable]`.

Examples:
  loopbus talk worker 'Summarize README.md in one line'
  loopbus talk --state-dir ~/.loopbus/reviewer worker 'Please verify this answer'
  git diff | LOOPBUS_STATE_DIR=~/.loopbus/reviewer loopbus talk worker --json
";

/// The `fromInstance` of a talk from a plain shell, without `--as`.
pub const OPERATOR: &str = "operator";

/// Most retries `--retries` accepts.
pub const MAX_RETRIES: u32 = 100;

/// Runs `talk`.
///
/// # Errors
/// Bad arguments, no state directory, a missing or invalid config.json, or a
/// prompt on stdin that is not UTF-8. Delegation failures are not errors: they map
/// to exit statuses 1 and 75 (and 130/143/129 for a signal).
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &CALLER_OPTIONS, &["json", "raw", "verbose"])?;
    if args.help {
        super::output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(2)?;
    if args.switch("json") && args.switch("raw") {
        return Err(usage("`--json` and `--raw` exclude each other").into());
    }
    let target = args
        .positionals
        .first()
        .ok_or_else(|| usage("missing TARGET; usage: loopbus talk TARGET [PROMPT]"))
        .and_then(super::parse_name)?;
    let settings = Settings::from_args(&args)?;
    let prompt = prompt(args.positionals.get(1), target.as_str())?;
    let request_id =
        loopbus::new_request_id().map_err(|e| local(format!("cannot make a request id: {e}")))?;
    let Settings {
        caller,
        bus,
        root,
        depth,
        timeout,
        retries,
    } = settings;
    let (trace, warnings) =
        TraceContext::from_env().map_err(|e| local(format!("cannot make a trace id: {e}")))?;
    for warning in warnings {
        terminal::eprint_line(&format!("loopbus: {warning}"));
    }
    if args.switch("verbose") {
        terminal::eprint_line(&format!(
            "loopbus: trace {} (request {request_id}); see `loopbus trace {}`",
            trace.trace_id, trace.trace_id
        ));
    }
    let (prompt, unread) = match prompt {
        Prompt::Whole(prompt) => (prompt, 0),
        Prompt::Cut { head, unread } => (head, unread),
    };
    let options = DelegateOptions::new(root.clone(), caller.clone(), bus, target.clone(), prompt)
        .with_depth(depth)
        .with_timeout(timeout)
        .with_retries(retries)
        .with_request_id(request_id)
        .with_trace(trace);
    let started = Instant::now();
    let watch = watch::watch(&options, args.switch("json"))?;
    let outcome = match loopbus::delegate(&options) {
        // Refused on the part read: the request's real size counts the rest too.
        Err(DelegateError::TooLarge { bytes }) => Err(DelegateError::TooLarge {
            bytes: bytes.saturating_add(unread),
        }),
        outcome => outcome,
    };
    watch.finish();
    // Given up for good on a turn that may still run there: cancel it (contract 8.1).
    if let Err(error) = &outcome {
        if matches!(error.cause(), DelegateError::Timeout { .. }) {
            watch::send_cancel(&options);
        }
    }
    let trace_id = options.trace.as_ref().map(|t| &t.trace_id);
    print_outcome(&outcome, caller.as_str(), trace_id, &args, started);
    match outcome {
        Ok(reply) => {
            match &reply.usage {
                Some(usage) if std::io::stderr().is_terminal() => terminal::eprint_line(
                    &cost_line(&reply.from_instance, usage, reply.duration_ms),
                ),
                _ => {}
            }
            Ok(EXIT_OK)
        }
        Err(error) => {
            let (flag, exit) = match error.retryable() {
                true => ("retryable", EXIT_RETRYABLE),
                false => ("not retryable", EXIT_FAILURE),
            };
            let code = error.code();
            let message = match error.cause() {
                DelegateError::NotRegistered { .. } => not_registered(&target, &root),
                _ => error.to_string(),
            };
            terminal::eprint_line(&format!(
                "loopbus: talk to {target}: {message} [{code}, {flag}]"
            ));
            Ok(exit)
        }
    }
}

/// The options of every command that delegates as the caller, `talk`'s own.
pub const CALLER_OPTIONS: [&str; 7] = [
    "state-dir",
    "name",
    "as",
    "root",
    "depth",
    "timeout",
    "retries",
];

/// Who delegates, where, and how: what [`CALLER_OPTIONS`] and the environment say.
pub struct Settings {
    /// The calling instance.
    pub caller: InstanceName,
    /// Its own bus config ([`BusConfig::open`] for the operator).
    pub bus: BusConfig,
    /// The channel root.
    pub root: PathBuf,
    /// The current depth.
    pub depth: u64,
    /// Each attempt's wait for the answer.
    pub timeout: Duration,
    /// Retries of a retryable failure.
    pub retries: u32,
}

impl Settings {
    /// The settings from `--state-dir`/`--name`/`--as`/`--root`/`--depth`/`--timeout`/
    /// `--retries` and the environment, as `talk` takes them (contract section 5).
    ///
    /// # Errors
    /// A bad option, no channel root, an untrusted, missing or invalid config.json.
    pub fn from_args(args: &Args) -> Result<Settings, CommandError> {
        let (caller, bus, state_dir) = caller(args)?;
        let depth = depth(args.value("depth"))?;
        let timeout = timeout(args.value("timeout"))?;
        let retries = retries(args.value("retries"))?;
        let root = match (args.value("root"), &state_dir) {
            (Some(root), _) => PathBuf::from(root),
            (None, Some(state_dir)) => loopbus::channel_root(state_dir),
            (None, None) => super::default_root()?,
        };
        Ok(Settings {
            caller,
            bus,
            root,
            depth,
            timeout,
            retries,
        })
    }
}

/// The prompt: `given`, or stdin when it is absent or `-` (saying so on a terminal).
///
/// # Errors
/// stdin cannot be read or is not UTF-8.
pub fn prompt(given: Option<&String>, for_whom: &str) -> Result<Prompt, UsageError> {
    match given.map(String::as_str) {
        None | Some("-") => {
            if std::io::stdin().is_terminal() {
                terminal::eprint_line(&format!(
                    "loopbus: reading the prompt for {for_whom} from stdin; end it with Ctrl-D"
                ));
            }
            read_prompt()
        }
        Some(prompt) => Ok(Prompt::Whole(prompt.to_owned())),
    }
}

/// The one-line cost summary: `worker: $0.0123, 1,200 in / 340 out tokens, 3.2 s`.
pub fn cost_line(from: &str, usage: &UsageReport, duration_ms: u64) -> String {
    let cost = usage
        .cost_usd
        .map_or_else(|| "cost unknown".to_owned(), |c| format!("${c:.4}"));
    format!(
        "{from}: {cost}, {} in / {} out tokens, {:.1} s",
        thousands(usage.input_tokens),
        thousands(usage.output_tokens),
        duration_ms as f64 / 1000.0
    )
}

/// `n` with commas between thousands: `1,200`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Prints the reply or, with `--json`, the envelope with the delegation's `traceId`
/// added, on stdout.
fn print_outcome(
    outcome: &Result<Reply, DelegateError>,
    caller: &str,
    trace_id: Option<&TraceId>,
    args: &Args,
    started: Instant,
) {
    let mut stdout = std::io::stdout().lock();
    let terminal = stdout.is_terminal();
    let json = |bytes: Vec<u8>| {
        let text = String::from_utf8_lossy(&with_trace_id(bytes, trace_id)).into_owned();
        if terminal {
            terminal::escape_for_terminal(&text).into_owned()
        } else {
            text
        }
    };
    // A closed stdout is the reader's choice; the exit status still tells the outcome.
    let _ = match outcome {
        Ok(reply) if args.switch("json") => {
            writeln!(stdout, "{}", json(reply.to_envelope().to_json()))
        }
        Ok(reply) if args.switch("raw") => stdout.write_all(reply.text.as_bytes()),
        Ok(reply) => {
            let text = if terminal {
                terminal::escape_for_terminal(&reply.text)
            } else {
                std::borrow::Cow::Borrowed(reply.text.as_str())
            };
            stdout.write_all(with_final_newline(&text).as_bytes())
        }
        Err(error) if args.switch("json") => {
            let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let envelope = error.to_envelope(caller, took);
            writeln!(stdout, "{}", json(envelope.to_json()))
        }
        Err(_) => Ok(()),
    };
    let _ = stdout.flush();
}

/// The envelope's JSON object with a last member `"traceId"` (32 hex digits: nothing
/// to escape), so that its other members keep their order.
fn with_trace_id(mut json: Vec<u8>, trace_id: Option<&TraceId>) -> Vec<u8> {
    if let (Some(id), Some(b'}')) = (trace_id, json.last()) {
        json.pop();
        json.extend_from_slice(format!(r#","traceId":"{id}"}}"#).as_bytes());
    }
    json
}

/// `text` ending with a newline: as it is when it does, with one added when not.
fn with_final_newline(text: &str) -> std::borrow::Cow<'_, str> {
    if text.ends_with('\n') {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(format!("{text}\n"))
    }
}

/// `--retries N`, else 0.
fn retries(flag: Option<&str>) -> Result<u32, UsageError> {
    let Some(text) = flag else {
        return Ok(0);
    };
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= MAX_RETRIES)
        .ok_or_else(|| {
            usage(format!(
                "`--retries` must be a whole number from 0 to {MAX_RETRIES}"
            ))
        })
}

/// `--depth`, else `$LOOPBUS_DEPTH`, else 0.
fn depth(flag: Option<&str>) -> Result<u64, UsageError> {
    let (text, source) = match flag {
        Some(text) => (text.to_owned(), "--depth"),
        None => match std::env::var("LOOPBUS_DEPTH") {
            Ok(text) if !text.trim().is_empty() => (text, "LOOPBUS_DEPTH"),
            _ => return Ok(0),
        },
    };
    text.trim()
        .parse::<u64>()
        .map_err(|_| usage(format!("{source} must be a non-negative integer")))
}

/// The longest `--timeout` accepted: 30 days.
const MAX_TIMEOUT_SECS: f64 = 30.0 * 24.0 * 3600.0;

/// `--timeout SECS` (a positive number, fractions allowed), else the default.
fn timeout(flag: Option<&str>) -> Result<Duration, UsageError> {
    let Some(text) = flag else {
        return Ok(DEFAULT_TIMEOUT);
    };
    text.parse::<f64>()
        .ok()
        .filter(|secs| *secs > 0.0 && *secs <= MAX_TIMEOUT_SECS)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            usage(format!(
                "`--timeout` must be a positive number of seconds, at most {MAX_TIMEOUT_SECS}"
            ))
        })
}

/// Who talks: the instance of `--state-dir` / `$LOOPBUS_STATE_DIR` with its own
/// config's bus, else the operator of the channel root (`--as NAME` or
/// [`OPERATOR`]) with [`BusConfig::open`] (contract section 5).
fn caller(args: &Args) -> Result<(InstanceName, BusConfig, Option<PathBuf>), CommandError> {
    let Ok(state_dir) = super::state_dir_from(args.value("state-dir")) else {
        if args.value("name").is_some() {
            return Err(usage(
                "`--name` names the instance of --state-dir; from a shell, use --as NAME",
            )
            .into());
        }
        let name = super::parse_name(args.value("as").unwrap_or(OPERATOR))?;
        return Ok((name, BusConfig::open(), None));
    };
    if args.value("as").is_some() {
        return Err(usage("`--as` is for talking from a shell, without a state directory; an instance talks under its own name (--name)").into());
    }
    let name_flag = match args.value("name") {
        Some(name) => Some(name.to_owned()),
        // An engine gets both variables from its instance; they belong together.
        None if args.value("state-dir").is_none() => std::env::var("LOOPBUS_INSTANCE")
            .ok()
            .filter(|n| !n.is_empty()),
        None => None,
    };
    let caller = super::instance_name(&state_dir, name_flag.as_deref())?;
    let config = super::own_config(&state_dir)?;
    Ok((caller, config.bus, Some(state_dir)))
}

/// "not registered", with where it looked and the registered name probably meant.
fn not_registered(target: &InstanceName, root: &Path) -> String {
    let path = loopbus::registry_path(root);
    let mut message = format!(
        "instance {target} is not registered in {} (is it running?)",
        path.display()
    );
    let names = loopbus::read_registry(root).unwrap_or_default();
    if let Some(meant) = closest(target.as_str(), names.keys().map(|n| n.as_str())) {
        message.push_str(&format!("; did you mean `{meant}`?"));
    }
    message
}

/// The prompt as read.
pub enum Prompt {
    /// All of it.
    Whole(String),
    /// Longer than [`MAX_BODY_BYTES`]: the part read, and how many bytes followed it.
    Cut { head: String, unread: usize },
}

/// The prompt from stdin. Past [`MAX_BODY_BYTES`] the rest is only counted: a prompt
/// that long can't be sent, and `request_too_large` names the size with all of it.
fn read_prompt() -> Result<Prompt, UsageError> {
    let cannot = |e: std::io::Error| usage(format!("cannot read the prompt from stdin: {e}"));
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    (&mut stdin)
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_BODY_BYTES {
        let rest = std::io::copy(&mut stdin, &mut std::io::sink()).map_err(cannot)?;
        // Maybe cut inside a character: only its size matters now.
        return Ok(Prompt::Cut {
            head: String::from_utf8_lossy(&bytes).into_owned(),
            unread: usize::try_from(rest).unwrap_or(usize::MAX),
        });
    }
    String::from_utf8(bytes)
        .map(Prompt::Whole)
        .map_err(|_| usage("the prompt on stdin is not valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_the_envelopes_last_member() {
        let id = TraceId::new("ab".repeat(16)).unwrap();
        let json = with_trace_id(br#"{"success":true,"text":"}"}"#.to_vec(), Some(&id));
        let want = format!(r#"{{"success":true,"text":"}}","traceId":"{id}"}}"#);
        assert_eq!(String::from_utf8(json).unwrap(), want);
        assert_eq!(with_trace_id(b"{}".to_vec(), None), b"{}");
    }

    #[test]
    fn the_output_gets_one_final_newline() {
        let cases = [
            ("", "\n"),
            ("no newline", "no newline\n"),
            ("one\n", "one\n"),
            ("two\n\n", "two\n\n"),
            ("crlf\r\n", "crlf\r\n"),
        ];
        for (reply, printed) in cases {
            assert_eq!(with_final_newline(reply), printed, "{reply:?}");
        }
    }

    #[test]
    fn the_cost_summary_reads_like_a_sentence() {
        let usage = |cost_usd| {
            let mut usage = UsageReport::default();
            usage.cost_usd = cost_usd;
            usage.input_tokens = 1_200;
            usage.output_tokens = 340;
            usage
        };
        assert_eq!(
            cost_line("worker", &usage(Some(0.0123)), 3_210),
            "worker: $0.0123, 1,200 in / 340 out tokens, 3.2 s"
        );
        assert_eq!(
            cost_line("worker", &usage(None), 40),
            "worker: cost unknown, 1,200 in / 340 out tokens, 0.0 s"
        );
        let cases = [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ];
        for (n, shown) in cases {
            assert_eq!(thousands(n), shown);
        }
    }

    #[test]
    fn retries_are_bounded_whole_numbers() {
        assert_eq!(retries(None), Ok(0));
        assert_eq!(retries(Some("2")), Ok(2));
        assert_eq!(retries(Some("100")), Ok(MAX_RETRIES));
        for bad in ["-1", "1.5", "x", "101", ""] {
            assert!(retries(Some(bad)).is_err(), "{bad}");
        }
    }
}
