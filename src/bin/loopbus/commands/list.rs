//! `loopbus list`: the registry's instances, each probed for liveness.

use super::{output, terminal};
use crate::cli::{local, Args, CommandError, EXIT_OK};
use loopbus::Listed;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

/// Help text.
pub const HELP: &str = "\
loopbus list [--root DIR | --state-dir DIR] [--json]

List the instances registered in the channel root DIR (--root), or in the parent
of --state-dir / $LOOPBUS_STATE_DIR, else in $LOOPBUS_ROOT, else in ~/.loopbus:
name, port, pid, whether it is alive (its health check answered as that
instance, status ok, an accepted kind, within 500 ms; else why not), and the age
of its registration. An alive instance whose
bus is disabled in its config.json (it refuses every talk) is marked \"bus
disabled\". Secrets are never shown. --json prints {\"instances\": [{\"name\",
\"port\", \"pid\", \"alive\", \"problem\", \"updatedAt\", \"ageSecs\",
\"busEnabled\"}]} instead (busEnabled: null when not alive, or not reported).

Exit status: 0, whether or not the instances are alive; 2 usage or local
configuration error.

Examples:
  loopbus list
  loopbus list --root /tmp/bus
  LOOPBUS_STATE_DIR=~/.loopbus/reviewer loopbus list --json
";

/// Runs `list`.
///
/// # Errors
/// Bad arguments, no way to find the registry, an unreadable registry, or an invalid
/// config.json.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["root", "state-dir"], &["json"])?;
    args.at_most(0)?;
    let (root, state_dir) = super::registry_root(args.value("root"), args.value("state-dir"))?;
    let kinds = super::accept_kinds(state_dir.as_deref())?;
    let path = loopbus::registry_path(&root);
    let listed = loopbus::list_instances(&root, Some(&kinds))
        .map_err(|e| local(format!("cannot read {}: {e}", path.display())))?;
    let now = SystemTime::now();
    // Names come from the registry, problems quote what a peer's health said.
    let terminal = std::io::stdout().is_terminal();
    if args.switch("json") {
        let instances: Vec<Value> = listed.iter().map(|l| as_json(l, now)).collect();
        let text = json!({ "instances": instances }).to_string();
        if terminal {
            output::println(&terminal::escape_for_terminal(&text))?;
        } else {
            output::println(&text)?;
        }
    } else if listed.is_empty() {
        terminal::eprint_line(&format!("no instances registered in {}", path.display()));
    } else {
        output::print(&table(&listed, now))?;
    }
    Ok(EXIT_OK)
}

/// How long ago the entry registered, if its timestamp is in the past.
fn age(listed: &Listed, now: SystemTime) -> Option<Duration> {
    let since = loopbus::parse_iso8601(&listed.entry.updated_at)?;
    Some(now.duration_since(since).unwrap_or(Duration::ZERO))
}

/// `42s`, `5m`, `3h`, `2d`.
fn short_age(age: Option<Duration>) -> String {
    let Some(age) = age else {
        return "?".to_owned();
    };
    let secs = age.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3_600 => format!("{}m", secs / 60),
        3_600..86_400 => format!("{}h", secs / 3_600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// What an alive instance's health said of its bus: `None` when it is not alive or
/// did not say.
fn bus_enabled(listed: &Listed) -> Option<bool> {
    listed
        .liveness
        .as_ref()
        .ok()
        .and_then(|answer| answer.health.bus_enabled)
}

/// The last column of the table: why an instance is not alive, or that its bus is
/// disabled.
fn note(listed: &Listed) -> String {
    match &listed.liveness {
        Err(problem) => problem.to_string(),
        Ok(_) if bus_enabled(listed) == Some(false) => DISABLED_NOTE.to_owned(),
        Ok(_) => String::new(),
    }
}

/// The note of an alive instance whose bus is disabled.
const DISABLED_NOTE: &str = "bus disabled: every talk is refused";

fn as_json(listed: &Listed, now: SystemTime) -> Value {
    json!({
        "name": listed.name,
        "port": listed.entry.port,
        "pid": listed.entry.pid,
        "alive": listed.liveness.is_ok(),
        "problem": listed.liveness.as_ref().err().map(ToString::to_string),
        "updatedAt": listed.entry.updated_at,
        "ageSecs": age(listed, now).map(|a| a.as_secs()),
        "busEnabled": bus_enabled(listed),
    })
}

/// A plain-text table, columns padded to their widest cell, every cell's control
/// characters shown escaped (a table is for people, piped or not).
fn table(listed: &[Listed], now: SystemTime) -> String {
    let mut rows = vec![[
        "NAME".to_owned(),
        "PORT".to_owned(),
        "PID".to_owned(),
        "ALIVE".to_owned(),
        "AGE".to_owned(),
        String::new(),
    ]];
    for l in listed {
        rows.push(
            [
                l.name.to_string(),
                l.entry.port.to_string(),
                l.entry.pid.to_string(),
                if l.liveness.is_ok() { "yes" } else { "no" }.to_owned(),
                short_age(age(l, now)),
                note(l),
            ]
            .map(|cell| terminal::escape_for_terminal(&cell).into_owned()),
        );
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_short() {
        let cases = [
            (None, "?"),
            (Some(0), "0s"),
            (Some(59), "59s"),
            (Some(60), "1m"),
            (Some(3_599), "59m"),
            (Some(3_600), "1h"),
            (Some(86_399), "23h"),
            (Some(86_400), "1d"),
            (Some(900_000), "10d"),
        ];
        for (secs, want) in cases {
            assert_eq!(short_age(secs.map(Duration::from_secs)), want, "{secs:?}");
        }
    }
}
