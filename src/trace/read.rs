//! Reading audit logs for a trace: line by line, each line at most
//! [`MAX_AUDIT_LINE_BYTES`], so a log of any size is read in bounded memory; a line
//! that is not a talk line of the audit log's shape is skipped and counted.

use super::tree::{TraceTotals, TraceTurn};
use crate::protocol::TraceId;
use std::io::{self, BufRead, BufReader, Read};
use std::time::UNIX_EPOCH;

/// Longest audit line read, in bytes: the writer's lines are a few KiB, so a longer one
/// is not its; it is skipped and counted, never held whole.
pub const MAX_AUDIT_LINE_BYTES: usize = 64 * 1024;

/// Calls `each` with every line of `reader` (without its newline) of at most
/// [`MAX_AUDIT_LINE_BYTES`], the last one too if it has no newline; returns how many
/// longer lines were passed over. At most [`MAX_AUDIT_LINE_BYTES`] of a line and one
/// read buffer are held at a time.
///
/// # Errors
/// A read error.
pub fn for_each_line(reader: impl Read, mut each: impl FnMut(&[u8])) -> io::Result<u64> {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::with_capacity(MAX_AUDIT_LINE_BYTES);
    let mut oversized = false;
    let mut passed_over = 0;
    loop {
        let chunk = match reader.fill_buf() {
            Ok([]) => break,
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let newline = chunk.iter().position(|&b| b == b'\n');
        let part = &chunk[..newline.unwrap_or(chunk.len())];
        if line.len() + part.len() > MAX_AUDIT_LINE_BYTES {
            oversized = true;
            line.clear();
        } else if !oversized {
            line.extend_from_slice(part);
        }
        let used = newline.map_or(chunk.len(), |at| at + 1);
        reader.consume(used);
        if newline.is_some() {
            finish(&mut line, &mut oversized, &mut passed_over, &mut each);
        }
    }
    if oversized || !line.is_empty() {
        finish(&mut line, &mut oversized, &mut passed_over, &mut each);
    }
    Ok(passed_over)
}

/// Ends one line: hands it to `each`, or counts it when it was too long.
fn finish(
    line: &mut Vec<u8>,
    oversized: &mut bool,
    passed_over: &mut u64,
    each: &mut impl FnMut(&[u8]),
) {
    if std::mem::take(oversized) {
        *passed_over += 1;
    } else {
        each(line);
    }
    line.clear();
}

/// What one audit line says, as far as a trace needs it.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// A talk outcome of a turn in a trace.
    Turn(TraceId, Box<TraceTurn>),
    /// A line of the log's shape that is no turn of a trace: a retry attached to a
    /// turn, a stored answer, a cancel request, the writer's own notice, or a line
    /// without a trace id (written before trace context, or refused before its body).
    Other,
    /// Not a line of the audit log's shape (torn, foreign or not JSON).
    Skipped,
}

/// Reads one audit line.
pub fn parse_line(line: &[u8]) -> Parsed {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Line {
        timestamp: String,
        #[serde(rename = "type")]
        kind: String,
        instance_name: String,
        outcome: String,
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        from_instance: Option<String>,
        depth: Option<u64>,
        #[serde(default)]
        duration_ms: u64,
        error_code: Option<String>,
        request_id: Option<String>,
        trace_id: Option<String>,
        parent_request_id: Option<String>,
        cost_usd: Option<f64>,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cached_tokens: Option<u64>,
    }
    let Ok(line) = serde_json::from_slice::<Line>(line) else {
        return Parsed::Skipped;
    };
    let started = crate::time::parse_iso8601(&line.timestamp)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|t| u64::try_from(t.as_millis()).ok());
    let (Some(ended_ms), "talk" | "audit") = (started, line.kind.as_str()) else {
        return Parsed::Skipped;
    };
    let m = line.metadata;
    let trace_id = match m.trace_id.map(TraceId::new) {
        None => return Parsed::Other,
        Some(Err(_)) => return Parsed::Skipped,
        Some(Ok(id)) => id,
    };
    let turn_outcomes = ["success", "failure", "refused", "cancelled", "abandoned"];
    if line.kind != "talk" || !turn_outcomes.contains(&line.outcome.as_str()) {
        return Parsed::Other;
    }
    let usage = [m.input_tokens, m.output_tokens, m.cached_tokens];
    let own = TraceTotals {
        turns: 1,
        cost_usd: m.cost_usd.filter(|c| c.is_finite() && *c >= 0.0),
        input_tokens: usage[0].unwrap_or(0),
        output_tokens: usage[1].unwrap_or(0),
        cached_tokens: usage[2].unwrap_or(0),
    };
    let turn = TraceTurn {
        instance: line.instance_name,
        from_instance: m.from_instance.unwrap_or_default(),
        request_id: m.request_id,
        parent_request_id: m.parent_request_id,
        outcome: line.outcome,
        error_code: m.error_code,
        started_ms: ended_ms.saturating_sub(m.duration_ms),
        duration_ms: m.duration_ms,
        depth: m.depth,
        own,
    };
    Parsed::Turn(trace_id, Box::new(turn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(input: &[u8]) -> (Vec<Vec<u8>>, u64) {
        let mut lines = Vec::new();
        let over = for_each_line(input, |l| lines.push(l.to_vec())).unwrap();
        (lines, over)
    }

    #[test]
    fn lines_table() {
        let long = vec![b'x'; MAX_AUDIT_LINE_BYTES + 1];
        let max = vec![b'y'; MAX_AUDIT_LINE_BYTES];
        let mut with_long = b"a\n".to_vec();
        with_long.extend_from_slice(&long);
        with_long.extend_from_slice(b"\nb\n");
        let mut long_last = b"a\n".to_vec();
        long_last.extend_from_slice(&long);
        let mut exact = max.clone();
        exact.push(b'\n');
        type Case<'a> = (Vec<u8>, Vec<&'a [u8]>, u64);
        let cases: Vec<Case<'_>> = vec![
            (b"".to_vec(), vec![], 0),
            (b"a\nb\n".to_vec(), vec![b"a", b"b"], 0),
            (b"a\n\nb".to_vec(), vec![b"a", b"", b"b"], 0),
            (with_long, vec![b"a", b"b"], 1),
            (long_last, vec![b"a"], 1),
            (exact, vec![&max], 0),
        ];
        for (input, want, over) in cases {
            let (lines, got_over) = lines_of(&input);
            let want: Vec<Vec<u8>> = want.iter().map(|l| l.to_vec()).collect();
            assert_eq!((lines, got_over), (want, over));
        }
    }

    #[test]
    fn parse_table() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let line = |kind: &str, outcome: &str, metadata: &str| {
            format!(
                r#"{{"timestamp":"2026-01-01T00:00:01.000Z","type":"{kind}","instanceName":"b","outcome":"{outcome}","detail":"ok","metadata":{metadata}}}"#
            )
        };
        let full = format!(
            r#"{{"fromInstance":"a","depth":2,"durationMs":400,"errorCode":null,"requestId":"rrrrrrrrrrrrrrrr","traceId":"{t}","parentRequestId":"pppppppppppppppp","costUsd":0.5,"inputTokens":7,"outputTokens":8,"cachedTokens":9}}"#
        );
        let Parsed::Turn(id, turn) = parse_line(line("talk", "success", &full).as_bytes()) else {
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
        let traced = format!(r#"{{"traceId":"{t}"}}"#);
        let cases = [
            (line("talk", "attached", &traced), Parsed::Other),
            (
                line("audit", "dropped", r#"{"droppedLines":3}"#),
                Parsed::Other,
            ),
            (
                line("talk", "success", r#"{"fromInstance":"a"}"#),
                Parsed::Other,
            ),
            (
                line("talk", "success", r#"{"traceId":"XYZ"}"#),
                Parsed::Skipped,
            ),
            (line("other", "success", &traced), Parsed::Skipped),
            (
                line("talk", "success", r#"{"durationMs":-1}"#),
                Parsed::Skipped,
            ),
            (line("talk", "success", "[]"), Parsed::Skipped),
            (
                line("talk", "success", &traced)[..60].to_owned(),
                Parsed::Skipped,
            ),
            ("not json".to_owned(), Parsed::Skipped),
            (String::new(), Parsed::Skipped),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line.as_bytes()), want, "{line}");
        }
        let timeless = line("talk", "success", &traced).replace("2026-01-01T", "yesterday ");
        assert_eq!(parse_line(timeless.as_bytes()), Parsed::Skipped);
    }
}
