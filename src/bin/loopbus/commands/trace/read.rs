//! One trace read back from the audit logs of every instance under a channel root
//! (contract 8.4), through the library's reader of an instance's audit log
//! ([`loopbus::read_audit_log`]: line by line in bounded memory, a line that is not an
//! audit line skipped and counted).

use super::tree::{self, TraceNode, TraceTotals, TraceTurn};
use loopbus::{AuditRecord, InstanceName, TraceId};
use std::io;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// Most turns of one trace kept; later ones are counted in [`Trace::dropped_turns`]
/// (a real tree is a few dozen turns; this bounds the memory of a forged log).
pub const MAX_TRACE_TURNS: usize = 100_000;

/// How long a reading of the logs first waits: an instance writes a turn's audit line a
/// moment after its answer went out (`AUDIT_BATCH_PAUSE` and a thread switch), so that
/// a trace read right after its delegations answered still shows all of them.
const AUDIT_SETTLE: Duration = Duration::from_millis(100);

/// One trace read back from the audit logs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
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
    /// than [`loopbus::MAX_AUDIT_LINE_BYTES`]), skipped.
    pub skipped_lines: u64,
    /// Turns of the trace past [`MAX_TRACE_TURNS`], left out.
    pub dropped_turns: u64,
}

/// Reads the tree of `trace_id` from the audit logs (audit.log.jsonl and its rotated
/// audit.log.jsonl.1) of every instance directory under `root` (each subdirectory
/// named like an instance, registered or not), after a pause of 100 ms for the lines
/// of answers just sent to reach their logs.
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

/// Hands every turn of a trace in the logs of the instance directories under `root`
/// (subdirectories named like an instance, symlinks not followed, in name order) to
/// `each`; returns how many lines were skipped.
fn scan(root: &Path, mut each: impl FnMut(TraceId, TraceTurn)) -> io::Result<u64> {
    std::thread::sleep(AUDIT_SETTLE);
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|n| InstanceName::new(n).is_ok());
        if is_dir && named {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    let mut skipped = 0;
    for dir in dirs {
        skipped += loopbus::read_audit_log(&dir, |record| match turn_of(record) {
            Ok(Some((id, turn))) => each(id, turn),
            Ok(None) => {}
            Err(()) => skipped += 1,
        });
    }
    Ok(skipped)
}

/// The turn of a trace an audit record tells of: `None` for a record that is none (a
/// retry attached to a turn, a stored answer, a cancel request, the writer's own
/// notice, or a line without a trace id: written before trace context, or refused
/// before its body); `Err` for one whose timestamp is out of range.
fn turn_of(record: AuditRecord) -> Result<Option<(TraceId, TraceTurn)>, ()> {
    let ended_ms = record
        .timestamp
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|t| u64::try_from(t.as_millis()).ok())
        .ok_or(())?;
    let m = record.metadata;
    let turn_outcomes = ["success", "failure", "refused", "cancelled", "abandoned"];
    let Some(trace_id) = m.trace_id else {
        return Ok(None);
    };
    if record.kind != "talk" || !turn_outcomes.contains(&record.outcome.as_str()) {
        return Ok(None);
    }
    let own = TraceTotals {
        turns: 1,
        cost_usd: m.cost_usd.filter(|c| c.is_finite() && *c >= 0.0),
        input_tokens: m.input_tokens.unwrap_or(0),
        output_tokens: m.output_tokens.unwrap_or(0),
        cached_tokens: m.cached_tokens.unwrap_or(0),
    };
    let turn = TraceTurn {
        instance: record.instance_name,
        from_instance: m.from_instance.unwrap_or_default(),
        request_id: m.request_id,
        parent_request_id: m.parent_request_id,
        outcome: record.outcome,
        error_code: m.error_code,
        started_ms: ended_ms.saturating_sub(m.duration_ms),
        duration_ms: m.duration_ms,
        depth: m.depth,
        own,
    };
    Ok(Some((trace_id, turn)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::audit_log::TestDir;
    use loopbus::{AUDIT_FILE, ROTATED_AUDIT_FILE};
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

    /// Set in the process [`a_64_mib_log_is_read_in_bounded_memory_and_its_junk_counted`]
    /// starts to measure in.
    const ALONE: &str = "LOOPBUS_TEST_ALONE";

    #[test]
    fn a_64_mib_log_is_read_in_bounded_memory_and_its_junk_counted() {
        // Peak memory is the whole process's, and other tests allocate in parallel: the
        // measure runs in a test process of its own, this test alone.
        if std::env::var_os(ALONE).is_none() {
            let module = module_path!().split_once("::").unwrap().1;
            let name =
                format!("{module}::a_64_mib_log_is_read_in_bounded_memory_and_its_junk_counted");
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--test-threads=1"])
                .env(ALONE, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "{stdout}");
            assert!(stdout.contains("1 passed"), "{stdout}");
            return;
        }
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
            dir.path().join("b").join(ROTATED_AUDIT_FILE),
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

    #[test]
    fn turn_table() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let line = |kind: &str, outcome: &str, metadata: &str| {
            format!(
                r#"{{"timestamp":"2026-01-01T00:00:01.000Z","type":"{kind}","instanceName":"b","outcome":"{outcome}","detail":"ok","metadata":{metadata}}}"#
            )
        };
        let turn_in = |line: &str| {
            let dir = TestDir::new("trace-turn");
            std::fs::write(dir.path().join(AUDIT_FILE), format!("{line}\n")).unwrap();
            let mut turns = Vec::new();
            let skipped = loopbus::read_audit_log(dir.path(), |r| turns.push(turn_of(r)));
            assert_eq!(skipped + turns.len() as u64, 1, "{line}");
            turns.pop()
        };
        let full = format!(
            r#"{{"fromInstance":"a","depth":2,"durationMs":400,"errorCode":null,"requestId":"rrrrrrrrrrrrrrrr","traceId":"{t}","parentRequestId":"pppppppppppppppp","costUsd":0.5,"inputTokens":7,"outputTokens":8,"cachedTokens":9}}"#
        );
        let Some(Ok(Some((id, turn)))) = turn_in(&line("talk", "success", &full)) else {
            panic!("not a turn");
        };
        assert_eq!(id.as_str(), t);
        assert_eq!(
            (
                turn.instance.as_str(),
                turn.from_instance.as_str(),
                turn.depth
            ),
            ("b", "a", Some(2))
        );
        assert_eq!(turn.started_ms, 1_767_225_601_000 - 400);
        assert_eq!(turn.parent_request_id.as_deref(), Some("pppppppppppppppp"));
        assert_eq!(
            turn.own,
            TraceTotals {
                turns: 1,
                cost_usd: Some(0.5),
                input_tokens: 7,
                output_tokens: 8,
                cached_tokens: 9
            }
        );
        // A record that is no turn of a trace, and lines that are no record (skipped).
        let traced = format!(r#"{{"traceId":"{t}"}}"#);
        let no_turn = [
            line("talk", "attached", &traced),
            line("audit", "dropped", r#"{"droppedLines":3}"#),
            line("talk", "success", r#"{"fromInstance":"a"}"#),
        ];
        for line in no_turn {
            assert!(matches!(turn_in(&line), Some(Ok(None))), "{line}");
        }
        let skipped = [
            line("talk", "success", r#"{"traceId":"XYZ"}"#),
            line("other", "success", &traced),
            "not json".to_owned(),
        ];
        for line in skipped {
            assert!(turn_in(&line).is_none(), "{line}");
        }
    }
}
