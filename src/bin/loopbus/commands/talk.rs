//! `loopbus talk TARGET [PROMPT]`: delegate one prompt to another instance, wait for
//! it (cancelling the turn on SIGINT/SIGTERM and when giving up for good, contract
//! 8.1), and print the reply.

use super::terminal;
use crate::cli::{
    local, usage, Args, CommandError, UsageError, EXIT_FAILURE, EXIT_OK, EXIT_RETRYABLE,
};
use loopbus::{
    DelegateError, DelegateOptions, Reply, UsageReport, DEFAULT_TIMEOUT, MAX_BODY_BYTES,
};
use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

mod watch;

/// Help text.
pub const HELP: &str = "\
loopbus talk TARGET [PROMPT] [--state-dir DIR] [--name NAME] [--root ROOT]
             [--depth N] [--timeout SECS] [--retries N] [--json | --raw]

Send PROMPT (read from stdin when absent or `-`) to the instance TARGET and print
its reply on stdout. Acts as the instance whose state directory is DIR (default:
$LOOPBUS_STATE_DIR): its config.json decides whether it may call TARGET (bus
enabled, TARGET among its peers, depth below its maxDepth) and which kinds of
peer it accepts; TARGET is looked up in DIR's parent's .bus-registry.json (or
ROOT's) and must pass a health check before the secret is sent.

Options:
  --state-dir DIR   the calling instance's state directory
  --name NAME       the calling instance's name (default: $LOOPBUS_INSTANCE when
                    DIR comes from $LOOPBUS_STATE_DIR, else DIR's last component)
  --root ROOT       the channel root whose registry names TARGET (default: DIR's
                    parent)
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

The reply is printed followed by a newline when it does not end with one. When
stdout is not a terminal it is printed as it came; on a terminal, control
characters other than newline and tab (escape sequences a peer could use to
write the clipboard or move the cursor) are shown escaped, as `\\u001b`; the error
on stderr is always escaped that way. When stderr is a terminal, a turn that
takes more than 2 s shows the time waited, and the turn's cost is summed up
at the end when the peer reported it.

Every delegation carries a request id. On SIGINT or SIGTERM, and after its
final timeout, talk sends TARGET a cancel request for the turn when TARGET
advertises cancel-on-hangup (to any other it just closes the connection).

Exit status: 0 reply received; 1 failure that is not retryable (bus_disabled,
peer_not_allowed, max_depth_exceeded, request_too_large, or the peer's own);
75 retryable failure (instance_unavailable, timeout, invalid_response, or the
peer's own); 2 usage or local configuration error; 130 stopped by SIGINT, 143
by SIGTERM (after the cancel). The error goes to stderr as
`loopbus: talk to TARGET: MESSAGE [CODE, retryable|not retryable]`.

Examples:
  loopbus talk --state-dir ~/.loopbus/reviewer worker 'Please verify this answer'
  git diff | LOOPBUS_STATE_DIR=~/.loopbus/reviewer loopbus talk worker --json
";

/// Most retries `--retries` accepts.
pub const MAX_RETRIES: u32 = 100;

/// Runs `talk`.
///
/// # Errors
/// Bad arguments, no state directory, a missing or invalid config.json, or a
/// prompt on stdin that is not UTF-8. Delegation failures are not errors: they map
/// to exit statuses 1 and 75 (and 130/143 for a signal).
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(
        args,
        &["state-dir", "name", "root", "depth", "timeout", "retries"],
        &["json", "raw"],
    )?;
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
    let state_dir = super::state_dir_from(args.value("state-dir"))?;
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
    let depth = depth(args.value("depth"))?;
    let timeout = timeout(args.value("timeout"))?;
    let retries = retries(args.value("retries"))?;
    let prompt = match args.positionals.get(1).map(String::as_str) {
        None | Some("-") => {
            if std::io::stdin().is_terminal() {
                terminal::eprint_line(&format!(
                    "loopbus: reading the prompt for {target} from stdin; end it with Ctrl-D"
                ));
            }
            read_prompt()?
        }
        Some(prompt) => prompt.to_owned(),
    };
    let request_id =
        loopbus::new_request_id().map_err(|e| local(format!("cannot make a request id: {e}")))?;

    let root = match args.value("root") {
        Some(root) => std::path::PathBuf::from(root),
        None => loopbus::channel_root(&state_dir),
    };
    let options = DelegateOptions::new(root, caller.clone(), config.bus, target.clone(), prompt)
        .with_depth(depth)
        .with_timeout(timeout)
        .with_retries(retries)
        .with_request_id(request_id);
    let started = Instant::now();
    let watch = watch::watch(&options, args.switch("json"))?;
    let outcome = loopbus::delegate(&options);
    watch.finish();
    // Given up for good on a turn that may still run there: cancel it (contract 8.1).
    if let Err(error) = &outcome {
        if matches!(error.cause(), DelegateError::Timeout { .. }) {
            watch::send_cancel(&options);
        }
    }
    print_outcome(&outcome, caller.as_str(), &args, started);
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
            terminal::eprint_line(&format!(
                "loopbus: talk to {target}: {error} [{code}, {flag}]"
            ));
            Ok(exit)
        }
    }
}

/// The one-line cost summary: `worker: $0.0123, 1,200 in / 340 out tokens, 3.2 s`.
fn cost_line(from: &str, usage: &UsageReport, duration_ms: u64) -> String {
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
fn thousands(n: u64) -> String {
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

/// Prints the reply or, with `--json`, the envelope, on stdout.
fn print_outcome(
    outcome: &Result<Reply, DelegateError>,
    caller: &str,
    args: &Args,
    started: Instant,
) {
    let mut stdout = std::io::stdout().lock();
    let terminal = stdout.is_terminal();
    let json = |bytes: Vec<u8>| {
        let text = String::from_utf8_lossy(&bytes).into_owned();
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

/// The prompt from stdin. Reading stops one byte past [`MAX_BODY_BYTES`]: a prompt
/// that long can't be sent anyway, and `delegate` says so with `request_too_large`.
fn read_prompt() -> Result<String, UsageError> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| usage(format!("cannot read the prompt from stdin: {e}")))?;
    if bytes.len() as u64 > MAX_BODY_BYTES {
        // Too long to send, and maybe cut inside a character: only its size matters now.
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    String::from_utf8(bytes).map_err(|_| usage("the prompt on stdin is not valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
