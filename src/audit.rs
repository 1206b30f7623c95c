//! `audit.log.jsonl`: one JSON object a line for every `/api/talk` outcome, refusals
//! included. Never a secret, never a prompt's text (only its length).
//!
//! There is one writer: [`AuditLog::record`] takes `&mut self`, the server's event loop
//! owns the instance's one `AuditLog` (every answer leaves through the loop), and the
//! serve lock keeps a second process off the same state directory. So lines never
//! interleave. A line is serialized whole, then appended with `write_all` to a file
//! opened with `O_APPEND`: usually one `write(2)`, continued if the kernel takes less.
//! A write that fails part-way can leave a torn last line; the file is then closed,
//! and reopened (appending after it) at the next record.
//!
//! Before a line would take the open file past [`MAX_AUDIT_BYTES`], the file is renamed
//! to `audit.log.jsonl.1` (replacing the previous one) and a new one begun, so a flood
//! of refused requests cannot fill the disk. The size is learned when the file is
//! opened and the first line after an open is not checked, so the file may pass the
//! cap by one line.

use crate::{files, time};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The audit log's name inside the state directory.
pub const AUDIT_FILE: &str = "audit.log.jsonl";
/// Size past which the log is rotated (one previous file is kept).
pub const MAX_AUDIT_BYTES: u64 = 64 * 1024 * 1024;
/// Longest `detail` text kept in a line, in characters; the rest is cut.
pub const MAX_DETAIL_CHARS: usize = 500;

/// One `/api/talk` outcome.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    /// `"success"`, `"failure"` (a turn failed), `"refused"` (a check refused it) or
    /// `"abandoned"` (the caller went away before its answer).
    pub outcome: &'a str,
    /// Human-readable detail (the error message, or `"ok"`); cut to
    /// [`MAX_DETAIL_CHARS`].
    pub detail: &'a str,
    /// The caller's `fromInstance`, when the body got that far.
    pub from_instance: Option<&'a str>,
    /// The request's depth, when known.
    pub depth: Option<u64>,
    /// Time from request head to answer.
    pub duration_ms: u64,
    /// The wire error code, for failures and refusals.
    pub error_code: Option<&'a str>,
    /// The prompt's length in characters, when known.
    pub prompt_chars: Option<usize>,
    /// The HTTP status answered; `None` when no answer went out (the caller left).
    pub status: Option<u16>,
}

/// The audit log of one instance.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    instance: String,
    file: Option<File>,
    size: u64,
    failing: bool,
}

impl AuditLog {
    /// The log in `state_dir` for `instance`. The file is opened on first use.
    pub fn new(state_dir: &Path, instance: &str) -> AuditLog {
        AuditLog {
            path: state_dir.join(AUDIT_FILE),
            instance: instance.to_owned(),
            file: None,
            size: 0,
            failing: false,
        }
    }

    /// The log file's path.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line, opening the file (created with [`files::PRIVATE_FILE_MODE`]) on first use and
    /// rotating it first if the line would pass [`MAX_AUDIT_BYTES`]. Failures are
    /// logged (once until the next success) and never stop the server from answering;
    /// after one, the file is reopened at the next record.
    pub fn record(&mut self, record: &Record<'_>) {
        let line = self.line(record);
        match self.append(&line) {
            Ok(()) => self.failing = false,
            Err(e) => {
                if !self.failing {
                    log::error!("cannot write {}: {e}", self.path.display());
                }
                self.failing = true;
                self.file = None;
            }
        }
    }

    fn line(&self, r: &Record<'_>) -> Vec<u8> {
        let detail = match r.detail.char_indices().nth(MAX_DETAIL_CHARS) {
            Some((cut, _)) => &r.detail[..cut],
            None => r.detail,
        };
        let timestamp = time::now_iso8601();
        let line = Line {
            timestamp: &timestamp,
            kind: "talk",
            instance_name: &self.instance,
            outcome: r.outcome,
            detail,
            metadata: Metadata {
                from_instance: r.from_instance,
                depth: r.depth,
                duration_ms: r.duration_ms,
                error_code: r.error_code,
                prompt_chars: r.prompt_chars,
                status: r.status,
            },
        };
        // Serializing strings and integers into a Vec cannot fail.
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    fn append(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size + line.len() as u64 > MAX_AUDIT_BYTES && self.file.is_some() {
            self.rotate()?;
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(files::PRIVATE_FILE_MODE)
                    .open(&self.path)?;
                self.size = file.metadata()?.len();
                self.file.insert(file)
            }
        };
        file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, PathBuf::from(old))?;
        self.size = 0;
        Ok(())
    }
}

/// One line of the log, in the contract's field order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    timestamp: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    instance_name: &'a str,
    outcome: &'a str,
    detail: &'a str,
    metadata: Metadata<'a>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    from_instance: Option<&'a str>,
    depth: Option<u64>,
    duration_ms: u64,
    error_code: Option<&'a str>,
    prompt_chars: Option<usize>,
    status: Option<u16>,
}

/// Parses one audit line (for tests).
#[cfg(test)]
pub fn parse_line(line: &str) -> Option<serde_json::Value> {
    serde_json::from_str(line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;

    #[test]
    fn lines_have_the_contract_fields_and_no_prompt() {
        let dir = TestDir::new("audit-fields");
        let mut log = AuditLog::new(dir.path(), "worker");
        log.record(&Record {
            outcome: "refused",
            detail: "missing or wrong bearer secret",
            error_code: Some("auth_failed"),
            status: Some(401),
            ..Record::default()
        });
        log.record(&Record {
            outcome: "success",
            detail: "ok",
            from_instance: Some("caller"),
            depth: Some(1),
            duration_ms: 12,
            prompt_chars: Some(5),
            status: Some(200),
            ..Record::default()
        });
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| parse_line(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        for line in &lines {
            for field in [
                "timestamp",
                "type",
                "instanceName",
                "outcome",
                "detail",
                "metadata",
            ] {
                assert!(line.get(field).is_some(), "{field}");
            }
            for field in [
                "fromInstance",
                "depth",
                "durationMs",
                "errorCode",
                "promptChars",
            ] {
                assert!(line["metadata"].get(field).is_some(), "{field}");
            }
            assert_eq!(line["instanceName"], "worker");
        }
        assert_eq!(lines[0]["metadata"]["errorCode"], "auth_failed");
        assert_eq!(lines[1]["metadata"]["promptChars"], 5);
        assert_eq!(
            crate::files::mode_is_wider(log.path(), 0o600).unwrap(),
            None
        );
    }

    #[test]
    fn detail_is_cut_to_its_cap() {
        let dir = TestDir::new("audit-detail");
        let mut log = AuditLog::new(dir.path(), "w");
        let long = "\u{e9}".repeat(MAX_DETAIL_CHARS + 10);
        log.record(&Record {
            outcome: "failure",
            detail: &long,
            ..Record::default()
        });
        let text = std::fs::read_to_string(log.path()).unwrap();
        let line = parse_line(text.trim_end()).unwrap();
        let detail = line["detail"].as_str().unwrap();
        assert_eq!(detail.chars().count(), MAX_DETAIL_CHARS);
    }

    #[test]
    fn rotates_past_the_size_cap() {
        let dir = TestDir::new("audit-rotate");
        let mut log = AuditLog::new(dir.path(), "w");
        log.record(&Record {
            outcome: "success",
            ..Record::default()
        });
        log.size = MAX_AUDIT_BYTES; // pretend the file is full
        log.record(&Record {
            outcome: "refused",
            ..Record::default()
        });
        let rotated = std::fs::read_to_string(dir.path().join("audit.log.jsonl.1")).unwrap();
        let current = std::fs::read_to_string(log.path()).unwrap();
        assert!(rotated.contains("\"success\""));
        assert_eq!(current.lines().count(), 1);
        assert!(current.contains("\"refused\""));
    }
}
