//! `audit.log.jsonl`: one JSON object a line for every `/api/talk` outcome, refusals
//! included. Never a secret, never a prompt's text (only its length).
//!
//! The event loop never touches the file. [`AuditLog::record`] serializes the line and
//! hands it to the log's writer thread through a queue of [`AUDIT_QUEUE_LINES`]; when
//! the queue is full the line is dropped and counted, never waited for. When the writer
//! has caught up it reports the count: a warning, and an audit line of its own
//! (`"type": "audit"`, `"outcome": "dropped"`, `"detail": "N lines dropped"`). Dropping
//! the log lets the writer write what is queued, waiting at most
//! [`AUDIT_FLUSH_TIMEOUT`].
//!
//! There is one writer: the thread owns the file, the server's event loop owns the
//! instance's one `AuditLog`, and the serve lock keeps a second process off the same
//! state directory. So lines never interleave. A line is appended with `write_all` to a
//! file opened with `O_APPEND`: usually one `write(2)`, continued if the kernel takes
//! less. The file is opened without blocking and without following a symlink, and
//! refused unless it is a regular file ([`files::open_append_regular`]), so a FIFO in
//! its place cannot stall the writer either; lines that cannot be written are counted
//! and warned about (once, until a write succeeds again). A write that fails part-way
//! can leave a torn last line; the file is then closed, and reopened (appending after
//! it) at the next line.
//!
//! Before a line would take the file past [`MAX_AUDIT_BYTES`], the file is renamed to
//! `audit.log.jsonl.1` (replacing the previous one) and a new one begun, so a flood of
//! refused requests cannot fill the disk. If the rename fails (say `audit.log.jsonl.1`
//! is a directory), no line is lost: the writer warns once and keeps appending to the
//! current file, trying the rename again before each later line.
//!
//! Reading the log back: [`read_audit_log`] hands over every [`AuditRecord`] of an
//! instance's log, the rotated file first; [`AuditLines`] reads one file line by line
//! (each [`AuditLine`] at most [`MAX_AUDIT_LINE_BYTES`]), following it as it grows.
//!
//! ```no_run
//! let state_dir = std::path::Path::new("/home/me/.loopbus/worker");
//! let skipped = loopbus::read_audit_log(state_dir, |record| {
//!     println!("{} {}", record.outcome, record.metadata.duration_ms);
//! });
//! println!("{skipped} lines were not audit lines");
//! ```

use crate::protocol::TraceId;
use crate::{files, time};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The audit log's name inside the state directory.
pub const AUDIT_FILE: &str = "audit.log.jsonl";
/// The rotated log's name inside the state directory: the lines before the current
/// file's.
pub const ROTATED_AUDIT_FILE: &str = "audit.log.jsonl.1";
/// Longest audit line read, in bytes: the writer's lines are a few KiB, so a longer one
/// is not its; only its start is held, never the whole line.
pub const MAX_AUDIT_LINE_BYTES: usize = 64 * 1024;
/// Size past which the log is rotated (one previous file is kept).
pub const MAX_AUDIT_BYTES: u64 = 64 * 1024 * 1024;
/// Longest `detail` text kept in a line, in characters; the rest is cut.
pub const MAX_DETAIL_CHARS: usize = 500;
/// How many lines may wait for the writer thread. A line recorded while the queue is
/// full is dropped and counted. Lines are at most a few KiB, so this bounds the queue's
/// memory to a few MiB.
pub const AUDIT_QUEUE_LINES: usize = 1024;
/// How long dropping an [`AuditLog`] waits for its writer to write what is queued.
pub const AUDIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writer lets lines gather after the first of a batch before writing
/// them in one go: it bounds the writer's wake-ups (and writes) to a few hundred a
/// second however busy the instance is; a line reaches the file this much later.
pub const AUDIT_BATCH_PAUSE: Duration = Duration::from_millis(5);

/// The audit log of one instance: the event loop's end of the queue to the writer
/// thread. Dropping it closes the queue and waits (at most [`AUDIT_FLUSH_TIMEOUT`]) for
/// the writer to finish.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    instance: String,
    queue: Option<SyncSender<Vec<u8>>>,
    /// Lines dropped because the queue was full, not yet reported by the writer.
    dropped: Arc<AtomicU64>,
    /// Disconnected when the writer thread has finished.
    writer_done: Receiver<()>,
}

impl AuditLog {
    /// The log in `state_dir` for `instance`, with its writer thread running. The file
    /// is opened at the first line.
    ///
    /// # Errors
    ///
    /// The OS refused to start the thread.
    pub fn start(state_dir: &Path, instance: &str) -> io::Result<AuditLog> {
        let (log, writer) = queue(state_dir, instance, AUDIT_QUEUE_LINES);
        writer.spawn()?;
        Ok(log)
    }

    /// Queues one line for the writer; never waits. `outcome` is `"success"`,
    /// `"failure"` (a turn failed), `"refused"` (a check refused it), `"cancelled"` (the
    /// caller hung up or sent a cancel request, contract 8.1), `"abandoned"` (the caller
    /// went away, `bus.cancelOnHangup` false: the turn runs on), `"attached"` (a retry
    /// joined its request id's running turn), `"duplicate"` (a retry got its request
    /// id's stored envelope, no engine ran) or `"cancel"` (a cancel request for a
    /// running turn); `detail` is cut to [`MAX_DETAIL_CHARS`]. If the queue is full, the
    /// line is dropped and counted, for the writer to report.
    pub fn record(&mut self, outcome: &str, detail: &str, metadata: &AuditMetadata) {
        let detail = match detail.char_indices().nth(MAX_DETAIL_CHARS) {
            Some((cut, _)) => &detail[..cut],
            None => detail,
        };
        let line = to_line("talk", &self.instance, outcome, detail, metadata);
        match self.queue.as_ref().map(|queue| queue.try_send(line)) {
            Some(Err(TrySendError::Full(_))) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Some(Err(TrySendError::Disconnected(_))) => {
                log::error!(
                    "{}: the audit writer has stopped; audit lines are lost",
                    self.path.display()
                );
                // Said once: the later lines have nowhere to go.
                self.queue = None;
            }
            _ => {}
        }
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        // Closing the queue tells the writer to finish once it has written the rest.
        self.queue = None;
        let done = self.writer_done.recv_timeout(AUDIT_FLUSH_TIMEOUT);
        if let Err(mpsc::RecvTimeoutError::Timeout) = done {
            log::warn!(
                "{}: the audit writer did not finish within {} s; queued lines may be lost",
                self.path.display(),
                AUDIT_FLUSH_TIMEOUT.as_secs()
            );
        }
    }
}

/// A log whose queue holds `capacity` lines, and its writer, not yet started.
fn queue(state_dir: &Path, instance: &str, capacity: usize) -> (AuditLog, Writer) {
    let (lines_in, lines) = mpsc::sync_channel(capacity);
    // Nothing is sent: the writer's end is dropped when it finishes (or panics).
    let (done, writer_done) = mpsc::channel();
    let dropped = Arc::new(AtomicU64::new(0));
    let log = AuditLog {
        path: state_dir.join(AUDIT_FILE),
        instance: instance.to_owned(),
        queue: Some(lines_in),
        dropped: Arc::clone(&dropped),
        writer_done,
    };
    let writer = Writer {
        lines,
        dropped,
        instance: instance.to_owned(),
        path: state_dir.join(AUDIT_FILE),
        file: None,
        size: 0,
        failing: false,
        rotation_failing: false,
        lost: 0,
        _done: done,
    };
    (log, writer)
}

/// The writer thread's state: the queue's far end, and the file, which only it touches.
struct Writer {
    lines: Receiver<Vec<u8>>,
    dropped: Arc<AtomicU64>,
    instance: String,
    path: PathBuf,
    file: Option<File>,
    size: u64,
    /// The last line could not be written (warned about once until one is).
    failing: bool,
    /// The last rotation failed (warned about once until one succeeds).
    rotation_failing: bool,
    /// Lines that could not be written, reported when the writer finishes.
    lost: u64,
    /// Dropped with the writer (last, after the file is closed), which tells the log
    /// it has finished.
    _done: mpsc::Sender<()>,
}

impl Writer {
    fn spawn(self) -> io::Result<()> {
        std::thread::Builder::new()
            .name("loopbus-audit".to_owned())
            .spawn(move || self.run())
            .map(drop)
    }

    /// Writes lines until the queue is closed and empty, reporting dropped lines each
    /// time it has caught up.
    fn run(mut self) {
        while let Ok(first) = self.lines.recv() {
            // Let the lines of a busy moment gather: one wake-up and one write for many
            // talks, instead of a thread switch per talk on the loop's cores.
            std::thread::sleep(AUDIT_BATCH_PAUSE);
            let batch: Vec<Vec<u8>> = std::iter::once(first)
                .chain(self.lines.try_iter())
                .collect();
            self.append(&batch.concat(), batch.len() as u64);
            self.report_dropped();
        }
        // The log was dropped: the loop records nothing more, so the count is final.
        self.report_dropped();
        if self.lost > 0 {
            log::warn!(
                "{}: {} audit line(s) could not be written",
                self.path.display(),
                self.lost
            );
        }
    }

    fn report_dropped(&mut self) {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped == 0 {
            return;
        }
        log::warn!(
            "{}: the audit queue was full; {dropped} line(s) dropped",
            self.path.display()
        );
        let detail = format!("{dropped} lines dropped");
        let metadata = serde_json::json!({ "droppedLines": dropped });
        let notice = to_line("audit", &self.instance, "dropped", &detail, &metadata);
        self.append(&notice, 1);
    }

    /// Appends `lines` (`count` whole lines). A failure counts them lost, is warned
    /// about once until a write succeeds again, and the file is reopened at the next
    /// write.
    fn append(&mut self, lines: &[u8], count: u64) {
        match self.try_append(lines) {
            Ok(()) => {
                if std::mem::replace(&mut self.failing, false) {
                    log::info!("{}: audit lines are written again", self.path.display());
                }
            }
            Err(e) => {
                self.lost += count;
                if !std::mem::replace(&mut self.failing, true) {
                    log::warn!(
                        "cannot write {}: {e}; audit lines are dropped until it can be",
                        self.path.display()
                    );
                }
                self.file = None;
            }
        }
    }

    fn try_append(&mut self, lines: &[u8]) -> io::Result<()> {
        self.file()?;
        if self.size > 0 && self.size + lines.len() as u64 > MAX_AUDIT_BYTES {
            self.rotate();
        }
        self.file()?.write_all(lines)?;
        self.size += lines.len() as u64;
        Ok(())
    }

    /// The open file, opened for appending (and its size read) if it is not.
    fn file(&mut self) -> io::Result<&mut File> {
        let file = match self.file.take() {
            Some(file) => file,
            None => {
                let (file, size) =
                    files::open_append_regular(&self.path, files::PRIVATE_FILE_MODE)?;
                self.size = size;
                file
            }
        };
        Ok(self.file.insert(file))
    }

    /// Renames the file to `<file>.1`, for the next write to begin a new one. If the
    /// rename fails, the current file is kept (no line is lost) and the failure warned
    /// about once.
    fn rotate(&mut self) {
        let rotated = self.path.with_file_name(ROTATED_AUDIT_FILE);
        match std::fs::rename(&self.path, &rotated) {
            Ok(()) => {
                if std::mem::replace(&mut self.rotation_failing, false) {
                    log::info!("{}: rotated again", self.path.display());
                }
                self.file = None;
            }
            Err(e) => {
                if !std::mem::replace(&mut self.rotation_failing, true) {
                    log::warn!(
                        "cannot rotate {} to {}: {e}; appending past {MAX_AUDIT_BYTES} bytes instead",
                        self.path.display(),
                        rotated.display()
                    );
                }
            }
        }
    }
}

/// One line of the log, in this field order, and a newline.
fn to_line(
    kind: &str,
    instance_name: &str,
    outcome: &str,
    detail: &str,
    metadata: &impl serde::Serialize,
) -> Vec<u8> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Line<'a, M> {
        timestamp: String,
        #[serde(rename = "type")]
        kind: &'a str,
        instance_name: &'a str,
        outcome: &'a str,
        detail: &'a str,
        metadata: M,
    }
    let line = Line {
        timestamp: time::now_iso8601(),
        kind,
        instance_name,
        outcome,
        detail,
        metadata,
    };
    // Serializing strings and integers into a Vec cannot fail.
    let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// One line of an audit log, as [`AuditLines`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditLine {
    /// Its number in its file, from 1.
    pub number: u64,
    /// Its bytes without the newline: at most [`MAX_AUDIT_LINE_BYTES`], the line's start
    /// when it is `cut`.
    pub bytes: Vec<u8>,
    /// The line is longer than [`MAX_AUDIT_LINE_BYTES`].
    pub cut: bool,
}

impl AuditLine {
    /// The line as an audit record; `None` when it is no line of the log's shape: cut,
    /// torn, foreign, not JSON, without a timestamp, or of a type other than `talk` and
    /// `audit`.
    pub fn record(&self) -> Option<AuditRecord> {
        let record = serde_json::from_slice::<AuditRecord>(&self.bytes).ok()?;
        let known = !self.cut && ["talk", "audit"].contains(&record.kind.as_str());
        known.then_some(record)
    }
}

/// One line of the audit log, read back ([`AuditLine::record`]).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AuditRecord {
    /// When the line was written.
    #[serde(deserialize_with = "timestamp")]
    pub timestamp: SystemTime,
    /// `"talk"` (an `/api/talk` outcome) or `"audit"` (the writer's notice of dropped
    /// lines).
    #[serde(rename = "type")]
    pub kind: String,
    /// The instance whose log it is.
    pub instance_name: String,
    /// The outcome: `"success"`, `"failure"`, `"refused"`, `"cancelled"`,
    /// `"abandoned"`, `"attached"`, `"duplicate"` or `"cancel"` (`"dropped"` for a
    /// notice).
    pub outcome: String,
    /// Its `metadata`.
    pub metadata: AuditMetadata,
}

/// The `metadata` of a talk's line, as the writer writes it (in this field order) and
/// an [`AuditRecord`] reads it back: who asked, how the turn ended, its ids and what it
/// cost.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AuditMetadata {
    /// The caller's `fromInstance`, when the body got that far.
    pub from_instance: Option<String>,
    /// The request's depth, when known.
    pub depth: Option<u64>,
    /// Time from request head to answer (0 when absent).
    #[serde(default)]
    pub duration_ms: u64,
    /// The wire error code, for failures and refusals.
    pub error_code: Option<String>,
    /// The prompt's length in characters, when known (never its text).
    pub prompt_chars: Option<usize>,
    /// The HTTP status answered; `None` when no answer went out (the caller left).
    pub status: Option<u16>,
    /// The turn's request id: the request's `ext.requestId`, or the one the server
    /// made for a turn of a request without (contract 8.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The turn's trace id: the request's `ext.traceId`, or the one the server made
    /// for a turn of a request without (contract 8.4); a line whose `traceId` is not
    /// one is no record.
    #[serde(default, deserialize_with = "trace_id")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<TraceId>,
    /// The request's `ext.parentRequestId`, when it carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<String>,
    /// The turn's cost in US dollars, when its engine reported one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The turn's input tokens, when its engine reported usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// The turn's output tokens, when its engine reported usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// The turn's cache-read input tokens, when its engine reported usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// The agent CLI's session id for the turn, when its engine reported one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

fn timestamp<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text: String = serde::Deserialize::deserialize(d)?;
    time::parse_iso8601(&text).ok_or_else(|| serde::de::Error::custom("not a timestamp"))
}

fn trace_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TraceId>, D::Error> {
    let id: Option<String> = serde::Deserialize::deserialize(d)?;
    id.map(TraceId::new)
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// Reads an audit log line by line, holding at most [`MAX_AUDIT_LINE_BYTES`] of a line
/// and one read buffer, so that a log of any size is read in bounded memory. It can
/// follow a log as it grows: a last line without its newline waits for the rest.
#[derive(Debug)]
pub struct AuditLines<R> {
    reader: BufReader<R>,
    partial: Vec<u8>,
    cut: bool,
    number: u64,
    position: u64,
}

impl<R: Read> AuditLines<R> {
    /// Reads `reader` (a log opened with [`crate::open_regular_file`], say) from where it is.
    pub fn new(reader: R) -> AuditLines<R> {
        AuditLines {
            reader: BufReader::new(reader),
            partial: Vec::new(),
            cut: false,
            number: 0,
            position: 0,
        }
    }

    /// The next line; at the end of the input, the last line without its newline when
    /// `at_end_too` (else it waits for the rest, for a later call), then `None`.
    ///
    /// # Errors
    /// A read error.
    pub fn next_line(&mut self, at_end_too: bool) -> io::Result<Option<AuditLine>> {
        loop {
            let chunk = self.reader.fill_buf()?;
            if chunk.is_empty() {
                let last = at_end_too && (self.cut || !self.partial.is_empty());
                return Ok(last.then(|| self.take()));
            }
            let newline = chunk.iter().position(|&b| b == b'\n');
            let part = &chunk[..newline.unwrap_or(chunk.len())];
            let room = MAX_AUDIT_LINE_BYTES - self.partial.len();
            self.cut |= part.len() > room;
            self.partial
                .extend_from_slice(&part[..part.len().min(room)]);
            let used = newline.map_or(chunk.len(), |at| at + 1);
            self.reader.consume(used);
            self.position += used as u64;
            if newline.is_some() {
                return Ok(Some(self.take()));
            }
        }
    }

    /// How many bytes have been read.
    pub fn position(&self) -> u64 {
        self.position
    }

    fn take(&mut self) -> AuditLine {
        self.number += 1;
        AuditLine {
            number: self.number,
            bytes: std::mem::take(&mut self.partial),
            cut: std::mem::take(&mut self.cut),
        }
    }
}

/// Reads the audit log of the instance in `state_dir`, the rotated file
/// ([`ROTATED_AUDIT_FILE`]) first, and hands `each` every record in it; returns how
/// many lines were skipped as no record ([`AuditLine::record`]). Each file is opened
/// without following a symlink or blocking on a FIFO, and read only if it is a
/// regular file; one that does not exist is passed over, one that can't be read is
/// warned about (`log`) and passed over.
pub fn read_audit_log(state_dir: &Path, mut each: impl FnMut(AuditRecord)) -> u64 {
    let mut skipped = 0;
    for name in [ROTATED_AUDIT_FILE, AUDIT_FILE] {
        let path = state_dir.join(name);
        let read = files::open_regular(&path).and_then(|file| {
            let mut lines = AuditLines::new(file);
            while let Some(line) = lines.next_line(true)? {
                match line.record() {
                    Some(record) => each(record),
                    None => skipped += 1,
                }
            }
            Ok(())
        });
        match read {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                log::warn!("cannot read {}: {e}; passed over", path.display());
            }
            _ => {}
        }
    }
    skipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;

    fn lines_of(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn read_lines(input: &[u8]) -> (Vec<Vec<u8>>, u64) {
        let mut lines = AuditLines::new(input);
        let (mut whole, mut cut) = (Vec::new(), 0);
        while let Some(line) = lines.next_line(true).unwrap() {
            if line.cut {
                assert_eq!(line.bytes.len(), MAX_AUDIT_LINE_BYTES);
                cut += 1;
            } else {
                whole.push(line.bytes);
            }
        }
        assert_eq!(lines.position(), input.len() as u64);
        (whole, cut)
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
        for (input, want, cut) in cases {
            let want: Vec<Vec<u8>> = want.iter().map(|l| l.to_vec()).collect();
            assert_eq!(read_lines(&input), (want, cut));
        }
    }

    #[test]
    fn a_long_line_is_cut_and_the_next_still_read() {
        let mut bytes = vec![b'x'; MAX_AUDIT_LINE_BYTES * 2];
        bytes.extend_from_slice(b"\n{\"a\":1}\npartial");
        let mut lines = AuditLines::new(&bytes[..]);
        let long = lines.next_line(false).unwrap().unwrap();
        assert!(long.cut && long.bytes.len() == MAX_AUDIT_LINE_BYTES);
        let next = lines.next_line(false).unwrap().unwrap();
        assert_eq!(
            (next.number, &next.bytes[..], next.cut),
            (2, &b"{\"a\":1}"[..], false)
        );
        // A partial last line waits, unless the end is the end.
        assert!(lines.next_line(false).unwrap().is_none());
        assert_eq!(lines.next_line(true).unwrap().unwrap().bytes, b"partial");
        assert_eq!(lines.position(), bytes.len() as u64);
    }

    #[test]
    fn record_table() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let line = |kind: &str, metadata: &str| {
            format!(
                r#"{{"timestamp":"2026-01-01T00:00:01.000Z","type":"{kind}","instanceName":"b","outcome":"success","detail":"ok","metadata":{metadata}}}"#
            )
        };
        let record = |line: &str| {
            let line = AuditLine {
                number: 1,
                bytes: line.as_bytes().to_vec(),
                cut: false,
            };
            line.record()
        };
        let full = format!(
            r#"{{"fromInstance":"a","depth":2,"durationMs":400,"errorCode":null,"requestId":"rrrrrrrrrrrrrrrr","traceId":"{t}","parentRequestId":"pppppppppppppppp","costUsd":0.5,"inputTokens":7,"outputTokens":8,"cachedTokens":9}}"#
        );
        let got = record(&line("talk", &full)).unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_601);
        assert_eq!(
            (got.timestamp, got.kind.as_str(), got.instance_name.as_str()),
            (at, "talk", "b")
        );
        assert_eq!(
            got.metadata,
            AuditMetadata {
                from_instance: Some("a".to_owned()),
                depth: Some(2),
                duration_ms: 400,
                error_code: None,
                request_id: Some("rrrrrrrrrrrrrrrr".to_owned()),
                trace_id: Some(TraceId::new(t).unwrap()),
                parent_request_id: Some("pppppppppppppppp".to_owned()),
                cost_usd: Some(0.5),
                input_tokens: Some(7),
                output_tokens: Some(8),
                cached_tokens: Some(9),
                ..AuditMetadata::default()
            }
        );
        let traced = format!(r#"{{"traceId":"{t}"}}"#);
        let cases = [
            (line("talk", &traced), true),
            (line("audit", r#"{"droppedLines":3}"#), true),
            (line("talk", r#"{"fromInstance":"a"}"#), true),
            (line("talk", r#"{"traceId":"XYZ"}"#), false),
            (line("other", &traced), false),
            (line("talk", r#"{"durationMs":-1}"#), false),
            (line("talk", "[]"), false),
            (line("talk", &traced)[..60].to_owned(), false),
            (
                line("talk", &traced).replace("2026-01-01T", "yesterday "),
                false,
            ),
            ("not json".to_owned(), false),
            (String::new(), false),
        ];
        for (line, is_record) in cases {
            assert_eq!(record(&line).is_some(), is_record, "{line}");
        }
        let cut = AuditLine {
            number: 1,
            bytes: line("talk", &traced).into_bytes(),
            cut: true,
        };
        assert_eq!(cut.record(), None);
    }

    #[test]
    fn both_files_of_a_log_are_read_and_its_junk_counted() {
        let dir = TestDir::new("audit-read");
        let line = |outcome: &str| {
            format!(
                r#"{{"timestamp":"2026-01-01T00:00:01.000Z","type":"talk","instanceName":"w","outcome":"{outcome}","detail":"ok","metadata":{{}}}}"#
            ) + "\n"
        };
        std::fs::write(
            dir.path().join(ROTATED_AUDIT_FILE),
            line("refused") + "{\"torn\":\n",
        )
        .unwrap();
        let mut current = line("success");
        current.push_str(&"x".repeat(MAX_AUDIT_LINE_BYTES + 1));
        std::fs::write(dir.path().join(AUDIT_FILE), current).unwrap();
        let mut outcomes = Vec::new();
        let skipped = read_audit_log(dir.path(), |r| outcomes.push(r.outcome));
        assert_eq!(
            (outcomes, skipped),
            (vec!["refused".to_owned(), "success".to_owned()], 2)
        );
        // A symlink or a FIFO in place of a file is passed over (a FIFO without blocking).
        std::fs::remove_file(dir.path().join(AUDIT_FILE)).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join(ROTATED_AUDIT_FILE),
            dir.path().join(AUDIT_FILE),
        )
        .unwrap();
        let fifo = dir.path().join(ROTATED_AUDIT_FILE);
        std::fs::remove_file(&fifo).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        assert_eq!(read_audit_log(dir.path(), |r| panic!("{r:?}")), 0);
        assert_eq!(
            read_audit_log(&dir.path().join("missing"), |r| panic!("{r:?}")),
            0
        );
    }

    #[test]
    fn lines_have_the_contract_fields_and_no_prompt() {
        let dir = TestDir::new("audit-fields");
        let mut log = AuditLog::start(dir.path(), "worker").unwrap();
        let path = log.path.clone();
        let refused = AuditMetadata {
            error_code: Some("auth_failed".to_owned()),
            status: Some(401),
            ..AuditMetadata::default()
        };
        log.record("refused", "missing or wrong bearer secret", &refused);
        let success = AuditMetadata {
            from_instance: Some("caller".to_owned()),
            depth: Some(1),
            duration_ms: 12,
            prompt_chars: Some(5),
            status: Some(200),
            ..AuditMetadata::default()
        };
        log.record("success", "ok", &success);
        drop(log); // flushes
        let lines = lines_of(&path);
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
        // The reader reads back what the writer wrote.
        let mut read = Vec::new();
        read_audit_log(dir.path(), |r| read.push((r.outcome, r.metadata)));
        let want = [
            ("refused".to_owned(), refused),
            ("success".to_owned(), success),
        ];
        assert_eq!(read, want);
        assert_eq!(crate::files::mode_is_wider(&path, 0o600).unwrap(), None);
    }

    #[test]
    fn detail_is_cut_to_its_cap() {
        let dir = TestDir::new("audit-detail");
        let mut log = AuditLog::start(dir.path(), "w").unwrap();
        let path = log.path.clone();
        let long = "\u{e9}".repeat(MAX_DETAIL_CHARS + 10);
        log.record("failure", &long, &AuditMetadata::default());
        drop(log);
        let lines = lines_of(&path);
        let detail = lines[0]["detail"].as_str().unwrap();
        assert_eq!(detail.chars().count(), MAX_DETAIL_CHARS);
    }

    #[test]
    fn rotates_past_the_size_cap() {
        let dir = TestDir::new("audit-rotate");
        let (_log, mut file) = queue(dir.path(), "w", 1);
        file.append(b"{\"outcome\":\"success\"}\n", 1);
        file.size = MAX_AUDIT_BYTES; // pretend the file is full
        file.append(b"{\"outcome\":\"refused\"}\n", 1);
        let rotated = std::fs::read_to_string(dir.path().join("audit.log.jsonl.1")).unwrap();
        let current = std::fs::read_to_string(dir.path().join(AUDIT_FILE)).unwrap();
        assert!(rotated.contains("\"success\""));
        assert_eq!(current.lines().count(), 1);
        assert!(current.contains("\"refused\""));
        assert_eq!(file.lost, 0);
    }

    #[test]
    fn bug_a_failed_rotation_lost_half_the_lines() {
        let dir = TestDir::new("audit-rotate-fail");
        // A non-empty directory where the rotated file goes: the rename must fail.
        let rotated = dir.path().join("audit.log.jsonl.1");
        std::fs::create_dir(&rotated).unwrap();
        std::fs::write(rotated.join("inside"), b"x").unwrap();
        let (_log, mut file) = queue(dir.path(), "w", 1);
        const LINES: usize = 10;
        for i in 0..LINES {
            file.size = MAX_AUDIT_BYTES; // every line would pass the cap
            file.append(format!("{{\"n\":{i}}}\n").as_bytes(), 1);
        }
        let current = std::fs::read_to_string(dir.path().join(AUDIT_FILE)).unwrap();
        assert_eq!(current.lines().count(), LINES, "{current}");
        assert_eq!(file.lost, 0);
        assert!(file.rotation_failing);
        assert!(rotated.is_dir());

        // Once the way is clear, rotation works again.
        std::fs::remove_dir_all(&rotated).unwrap();
        file.size = MAX_AUDIT_BYTES;
        file.append(b"{\"n\":\"after\"}\n", 1);
        assert!(!file.rotation_failing);
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap().lines().count(),
            LINES
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_lines_and_the_writer_reports_them() {
        let dir = TestDir::new("audit-full");
        const CAPACITY: usize = 3;
        const RECORDED: usize = 8;
        // The writer is not running yet: the queue fills and stays full.
        let (mut log, writer) = queue(dir.path(), "w", CAPACITY);
        let path = log.path.clone();
        for _ in 0..RECORDED {
            log.record("refused", "", &AuditMetadata::default());
        }
        assert_eq!(
            log.dropped.load(Ordering::Relaxed),
            (RECORDED - CAPACITY) as u64
        );
        writer.spawn().unwrap();
        drop(log);
        let lines = lines_of(&path);
        assert_eq!(lines.len(), CAPACITY + 1, "{lines:?}");
        assert!(lines[..CAPACITY].iter().all(|l| l["type"] == "talk"));
        let notice = &lines[CAPACITY];
        assert_eq!(notice["type"], "audit");
        assert_eq!(notice["outcome"], "dropped");
        assert_eq!(notice["detail"], "5 lines dropped");
        assert_eq!(notice["metadata"]["droppedLines"], 5);
        assert_eq!(notice["instanceName"], "w");
    }

    #[test]
    fn lines_recorded_after_a_catch_up_are_written_and_counted_once() {
        let dir = TestDir::new("audit-catch-up");
        let (mut log, writer) = queue(dir.path(), "w", 1);
        let path = log.path.clone();
        log.record("success", "", &AuditMetadata::default());
        log.record("refused", "", &AuditMetadata::default()); // dropped: the queue holds one
        writer.spawn().unwrap();
        // Wait until the writer has written the first line and its report.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&path)
            .map(|t| t.lines().count())
            .unwrap_or(0)
            < 2
        {
            assert!(
                std::time::Instant::now() < deadline,
                "writer never caught up"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        log.record("failure", "", &AuditMetadata::default());
        drop(log);
        let outcomes: Vec<_> = lines_of(&path)
            .iter()
            .map(|l| l["outcome"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(outcomes, ["success", "dropped", "failure"]);
    }

    #[test]
    fn bug_a_fifo_in_place_of_the_log_blocked_the_writer() {
        let dir = TestDir::new("audit-fifo");
        let path = dir.path().join(AUDIT_FILE);
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let mut log = AuditLog::start(dir.path(), "w").unwrap();
        for _ in 0..3 {
            log.record("refused", "", &AuditMetadata::default());
        }
        // Returns (the writer never blocks on the FIFO), and the FIFO is left alone.
        drop(log);
        let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind));

        let (_log, mut file) = queue(dir.path(), "w", 1);
        file.append(b"{}\n", 1);
        file.append(b"{}\n", 1);
        assert_eq!(file.lost, 2);
        assert!(file.failing);

        // With a reader that never reads, it is refused as well (not written to, where
        // a full pipe would block).
        let _reader = rustix::fs::open(
            &path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        file.append(b"{}\n", 1);
        assert_eq!(file.lost, 3);
        assert!(file.file.is_none());
    }

    #[test]
    fn a_symlink_in_place_of_the_log_is_not_followed() {
        let dir = TestDir::new("audit-symlink");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        let path = dir.path().join(AUDIT_FILE);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let (_log, mut file) = queue(dir.path(), "w", 1);
        file.append(b"{}\n", 1);
        assert_eq!(file.lost, 1);
        assert_eq!(std::fs::read(&target).unwrap(), b"");

        // A regular file in its place is written again.
        std::fs::remove_file(&path).unwrap();
        file.append(b"{}\n", 1);
        assert!(!file.failing);
        assert_eq!(std::fs::read(&path).unwrap(), b"{}\n");
    }

    #[test]
    fn an_existing_wider_log_is_narrowed_to_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TestDir::new("audit-mode");
        let path = dir.path().join(AUDIT_FILE);
        std::fs::write(&path, b"{}\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_log, mut file) = queue(dir.path(), "w", 1);
        file.append(b"{}\n", 1);
        assert_eq!(crate::files::mode_is_wider(&path, 0o600).unwrap(), None);
        assert_eq!(file.size, 6);
    }
}
