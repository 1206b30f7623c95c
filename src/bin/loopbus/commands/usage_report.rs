//! `loopbus usage`: each instance's usage.json and budget, as a table or JSON. Costs
//! are shown rounded (4 places, like the budget refusal); nothing is written.

use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, EXIT_OK};
use loopbus::{Usage, CONFIG_FILE};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Help text.
pub const HELP: &str = "\
loopbus usage [--state-dir DIR | --root DIR] [--json]

Show usage and budget: with --state-dir, of that instance; else of every
instance under the channel root (--root, else the parent of $LOOPBUS_STATE_DIR,
else $LOOPBUS_ROOT, else ~/.loopbus),
that is every directory there with a config.json. For each: name, engine
turns recorded, input, output and cached tokens, cost, budgetUsd and what is
left of it. Costs are shown to 4 places (the budget to 2), as in the budget
refusal. --json prints {\"instances\": [{\"name\", \"stateDir\", \"requests\",
\"inputTokens\", \"outputTokens\", \"cachedTokens\", \"costUsd\", \"budgetUsd\",
\"leftUsd\", \"lastUpdatedAt\", \"problem\"}]} instead (budgetUsd and leftUsd
null without a budget; problem null unless usage.json or config.json could not
be read). Reads usage.json (or its backup) without changing it.

Only turns an engine command ran are counted: the built-in echo engine's turns
(they cost nothing) and turns refused before an engine ran are not; the table
ends with a line on stderr that says so. `loopbus audit NAME` lists every turn.

Exit status: 0; 2 usage error, or a channel root that can't be read.

Examples:
  loopbus usage
  loopbus usage --state-dir ~/.loopbus/worker --json
";

/// What the table does not count, said under it.
pub const NOT_COUNTED: &str = "REQUESTS counts the turns an engine command ran: the \
built-in echo engine's turns (free) and turns refused before an engine ran are not \
counted; `loopbus audit NAME` lists every turn";

/// Most instance directories shown from one channel root; the rest are counted.
pub const MAX_INSTANCES_SHOWN: usize = 1024;

/// One instance's line.
#[derive(Debug)]
struct Row {
    name: String,
    state_dir: PathBuf,
    usage: Usage,
    budget: Option<f64>,
    problems: Vec<String>,
}

/// Runs `usage`.
///
/// # Errors
/// Bad arguments, no state directory or root, or a root that can't be read.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["state-dir", "root"], &["json"])?;
    if args.help {
        super::output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(0)?;
    let dirs = match (args.value("state-dir"), args.value("root")) {
        (Some(_), Some(_)) => {
            return Err(usage("give --state-dir DIR or --root DIR, not both").into())
        }
        (Some(dir), None) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            // A mistyped directory is an error, not an instance with no usage.
            if !dir.is_dir() {
                return Err(local(format!(
                    "{}: no such state directory (create one with `loopbus init DIR`)",
                    dir.display()
                )));
            }
            vec![dir]
        }
        (_, root) => {
            let (root, _) = super::registry_root(root, None)?;
            instance_dirs(&root)?
        }
    };
    let rows: Vec<Row> = dirs.iter().map(|dir| row(dir)).collect();
    if args.switch("json") {
        let instances: Vec<Value> = rows.iter().map(as_json).collect();
        let text = json!({ "instances": instances }).to_string();
        let _ = output::println(&terminal::escape_for_terminal(&text));
    } else if rows.is_empty() {
        terminal::eprint_line("no instances (directories with a config.json) found");
    } else {
        for line in table(&rows) {
            if output::println(&line).is_err() {
                break;
            }
        }
        terminal::eprint_line(NOT_COUNTED);
    }
    Ok(EXIT_OK)
}

/// The directories under `root` that hold a config.json, by name, at most
/// [`MAX_INSTANCES_SHOWN`]. Symbolic links are not followed.
fn instance_dirs(root: &Path) -> Result<Vec<PathBuf>, CommandError> {
    let entries = std::fs::read_dir(root).map_err(|e| {
        local(format!(
            "cannot read the channel root {}: {e}",
            root.display()
        ))
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|dir| dir.join(CONFIG_FILE).is_file())
        .collect();
    dirs.sort();
    if dirs.len() > MAX_INSTANCES_SHOWN {
        terminal::eprint_line(&format!(
            "loopbus: warning: {} instances under {}; showing the first {MAX_INSTANCES_SHOWN}",
            dirs.len(),
            root.display()
        ));
        dirs.truncate(MAX_INSTANCES_SHOWN);
    }
    Ok(dirs)
}

fn row(state_dir: &Path) -> Row {
    let mut problems = Vec::new();
    let usage = loopbus::read_usage(state_dir).unwrap_or_else(|e| {
        problems.push(e.to_string());
        Usage::default()
    });
    let budget = match loopbus::load_config(&state_dir.join(CONFIG_FILE)) {
        Ok(config) => config.budget_usd,
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    Row {
        name: state_dir.file_name().map_or_else(
            || state_dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        state_dir: state_dir.to_path_buf(),
        usage,
        budget,
        problems,
    }
}

/// What is left of the budget, never below zero (running turns may pass it).
fn left(row: &Row) -> Option<f64> {
    row.budget
        .map(|budget| loopbus::round_cost((budget - row.usage.total_cost_usd).max(0.0)))
}

fn as_json(row: &Row) -> Value {
    let u = &row.usage;
    json!({
        "name": row.name,
        "stateDir": row.state_dir.display().to_string(),
        "requests": u.request_count,
        "inputTokens": u.total_input_tokens,
        "outputTokens": u.total_output_tokens,
        "cachedTokens": u.total_cached_tokens,
        "costUsd": loopbus::round_cost(u.total_cost_usd),
        "budgetUsd": row.budget,
        "leftUsd": left(row),
        "lastUpdatedAt": u.last_updated_at,
        "problem": (!row.problems.is_empty()).then(|| row.problems.join("; ")),
    })
}

/// A dollar amount as the table shows it: 4 places.
fn dollars(amount: f64) -> String {
    format!("${amount:.4}")
}

/// The table's lines, columns padded to their widest cell, control characters shown
/// escaped.
fn table(rows: &[Row]) -> Vec<String> {
    const COLUMNS: usize = 9;
    let mut cells: Vec<[String; COLUMNS]> = vec![[
        "NAME", "REQUESTS", "IN", "OUT", "CACHED", "COST", "BUDGET", "LEFT", "",
    ]
    .map(str::to_owned)];
    for row in rows {
        let u = &row.usage;
        cells.push(
            [
                row.name.clone(),
                u.request_count.to_string(),
                u.total_input_tokens.to_string(),
                u.total_output_tokens.to_string(),
                u.total_cached_tokens.to_string(),
                dollars(u.total_cost_usd),
                row.budget
                    .map_or_else(|| "none".to_owned(), |b| format!("${b:.2}")),
                left(row).map_or_else(|| "-".to_owned(), dollars),
                row.problems.join("; "),
            ]
            .map(|cell| terminal::escape_for_terminal(&cell).into_owned()),
        );
    }
    let mut widths = [0usize; COLUMNS];
    for line in &cells {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    cells
        .iter()
        .map(|line| {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                // Names and notes read left to right, numbers line up on the right.
                match i {
                    0 => text.push_str(&format!("{cell:<w$}  ", w = widths[i])),
                    i if i + 1 == COLUMNS => text.push_str(cell),
                    _ => text.push_str(&format!("{cell:>w$}  ", w = widths[i])),
                }
            }
            text.trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_shown_to_four_places_never_with_float_noise() {
        let mut usage = Usage::default();
        usage.total_cost_usd = 0.1 + 0.2 + 0.9000000000000002;
        usage.request_count = 3;
        let row = Row {
            name: "w".to_owned(),
            state_dir: PathBuf::from("/x/w"),
            usage,
            budget: Some(5.0),
            problems: Vec::new(),
        };
        let lines = table(std::slice::from_ref(&row));
        assert!(lines[1].contains("$1.2000"), "{lines:?}");
        assert!(lines[1].contains("$5.00"), "{lines:?}");
        assert!(lines[1].contains("$3.8000"), "{lines:?}");
        let json = as_json(&row).to_string();
        assert!(json.contains("\"costUsd\":1.2,"), "{json}");
        assert!(json.contains("\"leftUsd\":3.8,"), "{json}");
    }
}
