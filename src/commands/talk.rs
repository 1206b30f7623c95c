//! `loopbus talk TARGET [PROMPT]`: delegate one prompt to another instance.

use super::terminal;
use crate::cli::{usage, Args, CommandError, UsageError, EXIT_FAILURE, EXIT_OK, EXIT_RETRYABLE};
use crate::client::{self, DelegateOptions, DEFAULT_TIMEOUT};
use crate::protocol::MAX_BODY_BYTES;
use crate::registry;
use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

/// Help text.
pub const HELP: &str = "\
loopbus talk TARGET [PROMPT] [--state-dir DIR] [--name NAME] [--depth N]
             [--timeout SECS] [--json | --raw]

Send PROMPT (read from stdin when absent or `-`) to the instance TARGET and print
its reply on stdout. Acts as the instance whose state directory is DIR (default:
$LOOPBUS_STATE_DIR): its config.json decides whether it may call TARGET (bus
enabled, TARGET among its peers, depth below its maxDepth) and which kinds of
peer it accepts; TARGET is looked up in DIR's parent's .bus-registry.json and
must pass a health check before the secret is sent.

Options:
  --state-dir DIR   the calling instance's state directory
  --name NAME       the calling instance's name (default: $LOOPBUS_INSTANCE when
                    DIR comes from $LOOPBUS_STATE_DIR, else DIR's last component)
  --depth N         the current delegation depth (default: $LOOPBUS_DEPTH, else 0);
                    the request carries N + 1
  --timeout SECS    how long to wait for the answer (default 1800)
  --json            print the whole envelope, also for failures: the peer's own
                    (a legacy peer's without protocolVersion and capabilities),
                    or a v1 one for a failure decided here
  --raw             print the reply's exact bytes: no escaping, no added newline

The reply is printed as it came when stdout is not a terminal. On a terminal,
control characters other than newline and tab (escape sequences a peer could
use to write the clipboard or move the cursor) are shown escaped, as `\x1b`;
the error on stderr is always escaped that way.

Exit status: 0 reply received; 1 failure that is not retryable (bus_disabled,
peer_not_allowed, max_depth_exceeded, request_too_large, or the peer's own);
75 retryable failure (instance_unavailable, timeout, invalid_response, or the
peer's own); 2 usage or local configuration error. The error goes to stderr as
`loopbus: talk to TARGET: MESSAGE [CODE, retryable|not retryable]`.

Examples:
  loopbus talk --state-dir ~/.loopbus/reviewer worker 'Please verify this answer'
  git diff | LOOPBUS_STATE_DIR=~/.loopbus/reviewer loopbus talk worker --json
";

/// Runs `talk`.
///
/// # Errors
/// Bad arguments, no state directory, a missing or invalid config.json, or a
/// prompt on stdin that is not UTF-8. Delegation failures are not errors: they map
/// to exit statuses 1 and 75.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(
        args,
        &["state-dir", "name", "depth", "timeout"],
        &["json", "raw"],
    )?;
    if args.help {
        print!("{HELP}");
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
    let prompt = match args.positionals.get(1).map(String::as_str) {
        None | Some("-") => read_prompt()?,
        Some(prompt) => prompt.to_owned(),
    };

    let options = DelegateOptions::new(
        registry::channel_root(&state_dir),
        caller.clone(),
        config.bus,
        target.clone(),
        prompt,
    )
    .with_depth(depth)
    .with_timeout(timeout);
    let started = Instant::now();
    let outcome = client::delegate(&options);
    let mut stdout = std::io::stdout().lock();
    let terminal = stdout.is_terminal();
    let json = |bytes: Vec<u8>| {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if terminal {
            terminal::escape_json_controls(&text).into_owned()
        } else {
            text
        }
    };
    // A closed stdout is the reader's choice; the exit status still tells the outcome.
    let _ = match &outcome {
        Ok(reply) if args.switch("json") => {
            writeln!(stdout, "{}", json(reply.to_envelope().to_json()))
        }
        Ok(reply) if args.switch("raw") => stdout.write_all(reply.text.as_bytes()),
        Ok(reply) if terminal => {
            let newline = if reply.text.ends_with('\n') { "" } else { "\n" };
            write!(
                stdout,
                "{}{newline}",
                terminal::escape_controls(&reply.text)
            )
        }
        Ok(reply) => stdout.write_all(reply.text.as_bytes()),
        Err(error) if args.switch("json") => {
            let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let envelope = error.to_envelope(&caller, took);
            writeln!(stdout, "{}", json(envelope.to_json()))
        }
        Err(_) => Ok(()),
    };
    let _ = stdout.flush();
    match outcome {
        Ok(_) => Ok(EXIT_OK),
        Err(error) => {
            let retryable = error.retryable();
            terminal::eprint_line(&format!(
                "loopbus: talk to {target}: {error} [{}, {}]",
                error.code(),
                if retryable {
                    "retryable"
                } else {
                    "not retryable"
                }
            ));
            Ok(if retryable {
                EXIT_RETRYABLE
            } else {
                EXIT_FAILURE
            })
        }
    }
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
