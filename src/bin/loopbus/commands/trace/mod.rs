//! `loopbus trace TRACE_ID` and `loopbus trace --last`: the tree of delegations of one
//! trace, read back from the audit logs of every instance under the channel root:
//! `read` reads them, `tree` builds the tree (pure), this file prints it.

mod read;
mod tree;

pub use read::{last_trace, read_trace, Trace, MAX_TRACE_TURNS};

use super::talk::{thousands, OPERATOR};
use super::terminal::escape_line;
use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, EXIT_FAILURE, EXIT_OK};
use loopbus::TraceId;
use std::io::IsTerminal;
use tree::{TraceNode, TraceTotals};

/// Help text.
pub const HELP: &str = "\
loopbus trace TRACE_ID [--root ROOT] [--json]
loopbus trace --last [--state-dir DIR [--name NAME] | --as NAME] [--root ROOT] [--json]

Show the tree of delegations of one trace: who delegated to whom, how each turn
ended (outcome and error code), how long it took, and what it cost (dollars and
tokens) on its own and summed over its subtree, in start order. Every delegation
carries a trace id (`loopbus talk -v` prints it, `--json` has it as `traceId`);
turns of one trace are read from the audit logs (audit.log.jsonl and the rotated
audit.log.jsonl.1) of every instance directory under the channel root (ROOT,
else DIR's parent, else $LOOPBUS_ROOT, else ~/.loopbus). Trace data never
carries prompt text.

--last shows the newest trace that the caller started: the instance of DIR
(--state-dir, else $LOOPBUS_STATE_DIR), else --as NAME, else `operator`.

Options:
  --last            the caller's newest trace instead of TRACE_ID
  --state-dir DIR   with --last: the calling instance's state directory
  --name NAME       with --last: the calling instance's name (default: DIR's last
                    component)
  --as NAME         with --last, without a state directory: the caller's name
  --root ROOT       the channel root whose instances' audit logs are read
  --json            print the trace as one JSON object: traceId, turns (in the
                    order shown, each with its level, its own cost and tokens and
                    its subtree's), total, skippedLines, droppedTurns

Lines of the logs that are not audit lines (torn, foreign, not JSON, or longer
than 64 KiB) are skipped and counted on stderr.

Exit status: 0 the trace was found; 1 no turn of it in the audit logs; 2 a
malformed TRACE_ID (32 lowercase hex digits), another usage error, or a channel
root that can't be read.

Examples:
  loopbus talk worker 'Plan the release' -v
  loopbus trace 4bf92f3577b34da6a3ce929d0e0e4736
  loopbus trace --last --json | jq .total.costUsd
";

/// Runs `trace`.
///
/// # Errors
/// Bad arguments, a malformed trace id, or a channel root that can't be listed.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(
        args,
        &["state-dir", "name", "as", "root"],
        &["last", "json"],
    )?;
    if args.help {
        output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let last = args.switch("last");
    let state_dir_flag = args.value("state-dir");
    let (root, state_dir) = super::registry_root(args.value("root"), state_dir_flag)?;
    let trace_id = match (args.positionals.first(), last) {
        (Some(_), true) => return Err(usage("give a TRACE_ID or --last, not both").into()),
        (None, false) => return Err(usage("missing TRACE_ID (or --last)").into()),
        (Some(text), false) => TraceId::new(text.as_str()).map_err(|e| usage(e.to_string()))?,
        (None, true) => {
            let caller = match (&state_dir, args.value("as")) {
                (Some(_), Some(_)) => {
                    return Err(usage("`--as` is for a caller without a state directory").into())
                }
                (Some(dir), None) => super::instance_name(dir, args.value("name"))?.to_string(),
                (None, named) => super::parse_name(named.unwrap_or(OPERATOR))?.to_string(),
            };
            let found = last_trace(&root, &caller).map_err(|e| unreadable(&root, &e))?;
            let Some(id) = found else {
                terminal::eprint_line(&format!(
                    "loopbus: trace: no trace started by {caller} in the audit logs under {}",
                    root.display()
                ));
                return Ok(EXIT_FAILURE);
            };
            id
        }
    };
    let trace = read_trace(&root, &trace_id).map_err(|e| unreadable(&root, &e))?;
    if trace.skipped_lines > 0 {
        terminal::eprint_line(&format!(
            "loopbus: trace: skipped {} line(s) of the audit logs that are not audit lines \
             (torn, foreign, not JSON or too long)",
            trace.skipped_lines
        ));
    }
    if trace.dropped_turns > 0 {
        terminal::eprint_line(&format!(
            "loopbus: trace: {} turn(s) past the first {} left out",
            trace.dropped_turns, MAX_TRACE_TURNS
        ));
    }
    if trace.nodes.is_empty() {
        terminal::eprint_line(&format!(
            "loopbus: trace: no turn of trace {trace_id} in the audit logs under {}",
            root.display()
        ));
        return Ok(EXIT_FAILURE);
    }
    let text = match args.switch("json") {
        // Strings, numbers and options always serialize.
        true => serde_json::to_string(&trace).unwrap_or_default(),
        false => render(&trace),
    };
    // Names, outcomes and codes come from the logs: outside text (`render` escapes
    // each; JSON is escaped whole for a terminal, as `talk --json` is).
    let text = match std::io::stdout().is_terminal() {
        true => terminal::escape_for_terminal(&text).into_owned(),
        false => text,
    };
    output::println(text.trim_end_matches('\n'))?;
    Ok(EXIT_OK)
}

/// A channel root that can't be listed, as a local error.
fn unreadable(root: &std::path::Path, e: &std::io::Error) -> CommandError {
    local(format!(
        "cannot read the channel root {}: {e}",
        root.display()
    ))
}

/// The tree as text: a header with the totals, then one line a turn, indented by its
/// level, `caller -> instance`, outcome and code, duration, its own cost, and its
/// subtree's when it has children.
pub(crate) fn render(trace: &Trace) -> String {
    let mut out = format!("trace {}: {}\n", trace.trace_id, totals(&trace.total));
    for (at, node) in trace.nodes.iter().enumerate() {
        out.push_str(&node_line(node, trace.nodes.get(at + 1)));
        out.push('\n');
    }
    out
}

/// One turn's line; `next` is the node after it, a child when its level is deeper.
fn node_line(node: &TraceNode, next: Option<&TraceNode>) -> String {
    let turn = &node.turn;
    let code = turn
        .error_code
        .as_ref()
        .map_or(String::new(), |c| format!(" {}", escape_line(c)));
    let mut line = format!(
        "{}{} -> {}  {}{code}  {:.1} s  {}",
        "  ".repeat(node.level),
        escape_line(&turn.from_instance),
        escape_line(&turn.instance),
        escape_line(&turn.outcome),
        turn.duration_ms as f64 / 1000.0,
        cost(&turn.own),
    );
    if next.is_some_and(|n| n.level > node.level) {
        line.push_str(&format!("  [subtree: {}]", totals(&node.subtree)));
    }
    line
}

/// `3 turns, $0.1234, 1,200 in / 340 out tokens`.
fn totals(totals: &TraceTotals) -> String {
    let turns = match totals.turns {
        1 => "1 turn".to_owned(),
        n => format!("{n} turns"),
    };
    format!("{turns}, {}", cost(totals))
}

/// `$0.1234, 1,200 in / 340 out tokens` (`cost unknown` when none was reported).
fn cost(totals: &TraceTotals) -> String {
    let dollars = totals
        .cost_usd
        .map_or_else(|| "cost unknown".to_owned(), |c| format!("${c:.4}"));
    format!(
        "{dollars}, {} in / {} out tokens",
        thousands(totals.input_tokens),
        thousands(totals.output_tokens)
    )
}
