//! The tree of delegations of one trace (contract 8.4), read back from the audit logs of
//! every instance under a channel root: who delegated to whom, how each turn ended,
//! and what each turn and each subtree cost. `read` streams the logs in bounded memory;
//! `tree` builds the tree, pure.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let root = std::path::Path::new("/home/me/.loopbus");
//! if let Some(id) = loopbus::last_trace(root, "operator")? {
//!     let trace = loopbus::read_trace(root, &id)?;
//!     for node in &trace.nodes {
//!         let indent = "  ".repeat(node.level);
//!         println!("{indent}{} {} {:?}", node.turn.instance, node.turn.outcome, node.subtree.cost_usd);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod read;
mod tree;

pub use read::MAX_AUDIT_LINE_BYTES;
pub use tree::{TraceNode, TraceTotals, TraceTurn};

use crate::audit::AUDIT_FILE;
use crate::protocol::{InstanceName, TraceId};
use read::Parsed;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most turns of one trace kept; later ones are counted in [`Trace::dropped_turns`]
/// (a real tree is a few dozen turns; this bounds the memory of a forged log).
pub const MAX_TRACE_TURNS: usize = 100_000;

/// How long a reading of the logs first waits: an instance writes a turn's audit line a
/// moment after its answer went out (`audit::AUDIT_BATCH_PAUSE` and a thread switch),
/// so that a trace read right after its delegations answered still shows all of them.
const AUDIT_SETTLE: Duration = Duration::from_millis(100);

/// One trace read back from the audit logs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Trace {
    /// The trace.
    pub trace_id: TraceId,
    /// Its turns in pre-order: each followed by its subtree, roots and siblings in
    /// start order; [`TraceNode::level`] gives the indentation (`turns` in JSON).
    #[serde(rename = "turns")]
    pub nodes: Vec<TraceNode>,
    /// Every turn of the trace, summed.
    pub total: TraceTotals,
    /// Lines of the logs read that are not audit lines (torn, foreign, not JSON, longer
    /// than [`MAX_AUDIT_LINE_BYTES`]), skipped.
    pub skipped_lines: u64,
    /// Turns of the trace past [`MAX_TRACE_TURNS`], left out.
    pub dropped_turns: u64,
}

/// Reads the tree of `trace_id` from the audit logs (audit.log.jsonl and its rotated
/// audit.log.jsonl.1) of every instance directory under `root` (each subdirectory
/// named like an instance, registered or not), after a pause of 100 ms for the lines
/// of answers just sent to reach their logs. Logs are read line by line, each line
/// at most [`MAX_AUDIT_LINE_BYTES`]; a log that is missing is passed over; one that
/// cannot be read is warned about (`log`) and passed over.
///
/// # Errors
/// `root` cannot be listed.
pub fn read_trace(root: &Path, trace_id: &TraceId) -> io::Result<Trace> {
    let mut turns = Vec::new();
    let mut dropped_turns = 0;
    let skipped_lines = scan(root, |id, turn| {
        if id != *trace_id {
        } else if turns.len() < MAX_TRACE_TURNS {
            turns.push(turn);
        } else {
            dropped_turns += 1;
        }
    })?;
    let nodes = tree::build(turns);
    let mut total = TraceTotals::default();
    for node in nodes.iter().filter(|n| n.level == 0) {
        total.add(&node.subtree);
    }
    Ok(Trace {
        trace_id: trace_id.clone(),
        nodes,
        total,
        skipped_lines,
        dropped_turns,
    })
}

/// The newest trace that `caller` started: of the turns without a parent request id
/// that `caller` asked for, the one that ended last (`None` if there is none). Waits
/// first, as [`read_trace`] does.
///
/// # Errors
/// `root` cannot be listed.
pub fn last_trace(root: &Path, caller: &str) -> io::Result<Option<TraceId>> {
    let mut newest: Option<(u64, TraceId)> = None;
    scan(root, |id, turn| {
        let ended = turn.started_ms.saturating_add(turn.duration_ms);
        let root_turn = turn.parent_request_id.is_none() && turn.from_instance == caller;
        if root_turn && newest.as_ref().is_none_or(|(at, _)| ended >= *at) {
            newest = Some((ended, id));
        }
    })?;
    Ok(newest.map(|(_, id)| id))
}

/// Hands every turn of a trace in the logs under `root` to `each`; returns how many
/// lines were skipped.
fn scan(root: &Path, mut each: impl FnMut(TraceId, TraceTurn)) -> io::Result<u64> {
    std::thread::sleep(AUDIT_SETTLE);
    let mut skipped = 0;
    for path in audit_logs(root)? {
        let read = crate::files::open_regular(&path).and_then(|file| {
            read::for_each_line(file, |line| match read::parse_line(line) {
                Parsed::Turn(id, turn) => each(id, *turn),
                Parsed::Other => {}
                Parsed::Skipped => skipped += 1,
            })
        });
        match read {
            Ok(oversized) => skipped += oversized,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("cannot read {}: {e}; passed over", path.display()),
        }
    }
    Ok(skipped)
}

/// The audit logs that may exist under `root`: the rotated and the current log of
/// every subdirectory named like an instance (symlinks are not followed).
fn audit_logs(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|n| InstanceName::new(n).is_ok());
        if is_dir && named {
            let dir = entry.path();
            logs.push(dir.join(format!("{AUDIT_FILE}.1")));
            logs.push(dir.join(AUDIT_FILE));
        }
    }
    logs.sort();
    Ok(logs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;
    use std::io::Write;

    const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn line(instance: &str, from: &str, id: &str, parent: Option<&str>, at: &str) -> String {
        let parent = parent.map_or(String::new(), |p| format!(r#","parentRequestId":"{p}""#));
        format!(
            r#"{{"timestamp":"2026-01-01T00:00:{at}.000Z","type":"talk","instanceName":"{instance}","outcome":"success","detail":"ok","metadata":{{"fromInstance":"{from}","durationMs":100,"requestId":"{id}","traceId":"{T}"{parent},"costUsd":0.25}}}}"#
        ) + "\n"
    }

    /// Peak resident memory of this process, in KiB (Linux).
    fn peak_rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_64_mib_log_is_read_in_bounded_memory_and_its_junk_counted() {
        let dir = TestDir::new("trace-big");
        let a = dir.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::create_dir(dir.path().join(".not-an-instance")).unwrap();
        let mut log = std::fs::File::create(a.join(AUDIT_FILE)).unwrap();
        log.write_all(line("a", "operator", "ra0000000000000000", None, "01").as_bytes())
            .unwrap();
        // 64 MiB: one line of 60 MiB, then 1 MiB junk lines.
        const MIB: usize = 1024 * 1024;
        let block = vec![b'x'; MIB];
        for _ in 0..60 {
            log.write_all(&block).unwrap();
        }
        log.write_all(b"\n").unwrap();
        for _ in 0..4 {
            log.write_all(&block[..MIB - 1]).unwrap();
            log.write_all(b"\n").unwrap();
        }
        log.write_all(b"{\"torn\":\n").unwrap();
        drop(log);
        std::fs::write(
            dir.path().join("b").join(format!("{AUDIT_FILE}.1")),
            line(
                "b",
                "a",
                "rb0000000000000000",
                Some("ra0000000000000000"),
                "02",
            ),
        )
        .unwrap();
        assert!(std::fs::metadata(a.join(AUDIT_FILE)).unwrap().len() >= 64 * MIB as u64);
        let before = peak_rss_kib();
        let trace = read_trace(dir.path(), &TraceId::new(T).unwrap()).unwrap();
        let grown_mib = (peak_rss_kib() - before) / 1024;
        // Reading it whole, or its long line whole, would take 60 MiB or more; other
        // tests in this process allocate a little meanwhile.
        assert!(grown_mib < 40, "peak memory grew by {grown_mib} MiB");
        assert_eq!(trace.skipped_lines, 1 + 4 + 1);
        let shape: Vec<_> = trace
            .nodes
            .iter()
            .map(|n| (n.turn.instance.as_str(), n.level))
            .collect();
        assert_eq!(shape, [("a", 0), ("b", 1)]);
        assert_eq!(trace.total.cost_usd, Some(0.5));
        assert_eq!(
            last_trace(dir.path(), "operator").unwrap(),
            Some(TraceId::new(T).unwrap())
        );
        assert_eq!(last_trace(dir.path(), "b").unwrap(), None);
    }
}
