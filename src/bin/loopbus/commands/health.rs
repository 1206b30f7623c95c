//! `loopbus health TARGET`: is an instance alive?

use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, UsageError, EXIT_OK, EXIT_RETRYABLE};
use loopbus::InstanceName;
use serde_json::Value;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Help text.
pub const HELP: &str = "\
loopbus health TARGET [--root DIR | --state-dir DIR] [--port N] [--wait SECS] [--json]
loopbus health --port N

Check whether the instance TARGET is alive and print its health answer (JSON) on
stdout. TARGET is looked up in the registry of the channel root DIR (--root), or
of the parent of --state-dir / $LOOPBUS_STATE_DIR, else of $LOOPBUS_ROOT, else of
~/.loopbus. Alive means GET /api/health
answered within 500 ms with 200, status \"ok\", instance equal to TARGET, and a
kind the caller accepts (the acceptKinds of --state-dir's config.json, else
loopbus and cc-telegram-bridge). With --port N, 127.0.0.1:N is asked directly,
without the registry; TARGET, if given, must then match the answer's instance.

--wait SECS  keep asking (every 100 ms) until TARGET is registered and alive, for
             at most SECS seconds: for scripts that start `loopbus serve` in the
             background and must not talk to it before it has registered.
--json       print the health answer as JSON (what is printed anyway; accepted so
             that scripts can say so).

Exit status: 0 alive; 75 not alive or not registered (after --wait SECS, if
given; the reason goes to stderr); 2 usage or local configuration error.

Examples:
  loopbus health worker
  loopbus serve worker & loopbus health worker --wait 10
  loopbus health --port 7701
";

/// How often `--wait` asks again.
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The longest `--wait` accepted: one day.
pub const MAX_WAIT_SECS: f64 = 24.0 * 3600.0;

/// Where to ask, as the arguments say.
enum Asked<'a> {
    /// 127.0.0.1:PORT, expecting TARGET when one is given.
    Port(u16, Option<&'a InstanceName>),
    /// TARGET's registered address, in the registry of `root`.
    Registered(&'a InstanceName, PathBuf),
}

/// Runs `health`.
///
/// # Errors
/// Bad arguments, no way to find the registry, or an invalid config.json.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["root", "state-dir", "port", "wait"], &["json"])?;
    args.at_most(1)?;
    let target = args
        .positionals
        .first()
        .map(super::parse_name)
        .transpose()?;
    let port = args
        .parsed::<u16>("port", "a port number (1-65535)")?
        .map(|port| {
            if port == 0 {
                Err(usage("`--port` must be a port number (1-65535)"))
            } else {
                Ok(port)
            }
        })
        .transpose()?;
    let wait = wait(args.value("wait"))?;

    let (asked, state_dir) = match (port, &target) {
        (Some(port), _) => {
            let state_dir = super::state_dir_from(args.value("state-dir")).ok();
            (Asked::Port(port, target.as_ref()), state_dir)
        }
        (None, Some(name)) => {
            let (root, state_dir) =
                super::registry_root(args.value("root"), args.value("state-dir"))?;
            (Asked::Registered(name, root), state_dir)
        }
        (None, None) => {
            return Err(usage(
                "missing TARGET; usage: loopbus health TARGET, or loopbus health --port N",
            )
            .into())
        }
    };
    let kinds = super::accept_kinds(state_dir.as_deref())?;
    let deadline = Instant::now() + wait;
    loop {
        match ask(&asked, &kinds)? {
            Ok(answer) => {
                let json = serde_json::to_string_pretty(&answer).unwrap_or_default();
                if std::io::stdout().is_terminal() {
                    output::println(&terminal::escape_for_terminal(&json))?;
                } else {
                    output::println(&json)?;
                }
                return Ok(EXIT_OK);
            }
            Err(why) if Instant::now() >= deadline => {
                terminal::eprint_line(&format!("loopbus: {why}"));
                return Ok(EXIT_RETRYABLE);
            }
            Err(_) => std::thread::sleep(WAIT_POLL_INTERVAL),
        }
    }
}

/// Asks once: the health answer of an alive instance, else why it is not.
///
/// # Errors
/// The registry can't be read.
fn ask(asked: &Asked<'_>, kinds: &[String]) -> Result<Result<Value, String>, CommandError> {
    let probed = match asked {
        Asked::Port(port, target) => loopbus::probe_port(*port, *target, Some(kinds))
            .map_err(|e| (format!("port {port}"), e)),
        Asked::Registered(name, root) => {
            let path = loopbus::registry_path(root);
            let entry = loopbus::read_registry(root)
                .map_err(|e| local(format!("cannot read {}: {e}", path.display())))?
                .remove(*name);
            let Some(entry) = entry else {
                return Ok(Err(format!(
                    "{name} is not registered in {}",
                    path.display()
                )));
            };
            // A registered instance is probed at its own address, proof included.
            loopbus::probe_instance(name, &entry, Some(kinds))
                .map_err(|e| (format!("{name} (port {})", entry.port), e))
        }
    };
    Ok(match probed {
        Ok(answer) => Ok(answer.body),
        Err((shown, reason)) => Err(format!("{shown} is not alive: {reason}")),
    })
}

/// `--wait SECS` (a non-negative number, fractions allowed), else no wait.
fn wait(flag: Option<&str>) -> Result<Duration, UsageError> {
    let Some(text) = flag else {
        return Ok(Duration::ZERO);
    };
    text.parse::<f64>()
        .ok()
        .filter(|secs| *secs >= 0.0 && *secs <= MAX_WAIT_SECS)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            usage(format!(
                "`--wait` must be a number of seconds from 0 to {MAX_WAIT_SECS}"
            ))
        })
}
