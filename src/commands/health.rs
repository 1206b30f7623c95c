//! `loopbus health TARGET`: is an instance alive?

use super::terminal;
use crate::cli::{local, usage, Args, CommandError, EXIT_OK, EXIT_RETRYABLE};
use crate::registry::{self, Probed};
use std::io::IsTerminal;

/// Help text.
pub const HELP: &str = "\
loopbus health TARGET [--root DIR | --state-dir DIR] [--port N]
loopbus health --port N

Check whether the instance TARGET is alive and print its health answer (JSON) on
stdout. TARGET is looked up in the registry of the channel root DIR (--root), or
of the parent of --state-dir / $LOOPBUS_STATE_DIR. Alive means GET /api/health
answered within 500 ms with 200, status \"ok\", instance equal to TARGET, and a
kind the caller accepts (the acceptKinds of --state-dir's config.json, else
loopbus and cc-telegram-bridge). With --port N, 127.0.0.1:N is asked directly,
without the registry; TARGET, if given, must then match the answer's instance.

Exit status: 0 alive; 75 not alive or not registered (the reason goes to
stderr); 2 usage or local configuration error.

Examples:
  loopbus health worker --root ~/.loopbus
  loopbus health --port 7701
";

/// Runs `health`.
///
/// # Errors
/// Bad arguments, no way to find the registry, or an invalid config.json.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["root", "state-dir", "port"], &[])?;
    if args.help {
        print!("{HELP}");
        return Ok(EXIT_OK);
    }
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

    let (port, entry, state_dir, shown) = match (port, &target) {
        (Some(port), _) => {
            let state_dir = super::state_dir_from(args.value("state-dir")).ok();
            (port, None, state_dir, format!("port {port}"))
        }
        (None, Some(name)) => {
            let (root, state_dir) =
                super::registry_root(args.value("root"), args.value("state-dir"))?;
            let entry = registry::lookup(&root, name).map_err(|e| {
                local(format!(
                    "cannot read {}: {e}",
                    registry::registry_path(&root).display()
                ))
            })?;
            let Some(entry) = entry else {
                terminal::eprint_line(&format!(
                    "loopbus: {name} is not registered in {}",
                    registry::registry_path(&root).display()
                ));
                return Ok(EXIT_RETRYABLE);
            };
            (
                entry.port,
                Some((name, entry.clone())),
                state_dir,
                format!("{name} (port {})", entry.port),
            )
        }
        (None, None) => {
            return Err(usage(
                "missing TARGET; usage: loopbus health TARGET, or loopbus health --port N",
            )
            .into())
        }
    };
    let kinds = super::accept_kinds(state_dir.as_deref())?;
    // A registered instance is probed at its own address, proof included.
    let probed = match &entry {
        Some((name, entry)) => registry::probe_entry(name, entry, Some(&kinds)),
        None => registry::probe_port(port, target.as_ref(), Some(&kinds)),
    };
    match probed {
        Ok(Probed { answer, .. }) => {
            let json = serde_json::to_string_pretty(&answer.body).unwrap_or_default();
            if std::io::stdout().is_terminal() {
                println!("{}", terminal::escape_json_controls(&json));
            } else {
                println!("{json}");
            }
            Ok(EXIT_OK)
        }
        Err(reason) => {
            terminal::eprint_line(&format!("loopbus: {shown} is not alive: {reason}"));
            Ok(EXIT_RETRYABLE)
        }
    }
}
