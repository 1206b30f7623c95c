//! `loopbus audit`: an instance's audit.log.jsonl (and the rotated
//! audit.log.jsonl.1 before it) as a table or as its JSON lines, filtered by age, and
//! followed like `tail -f` across the writer's rotation. A line that is not JSON is
//! shown as such; nothing is written.

use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, UsageError, EXIT_OK};
use loopbus::{AuditLine, AuditLines, AUDIT_FILE, MAX_AUDIT_LINE_BYTES, ROTATED_AUDIT_FILE};
use serde_json::Value;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Help text.
pub const HELP: &str = "\
loopbus audit [NAME | --state-dir DIR] [--since DURATION] [--json] [--follow]

Show the audit log of the instance NAME (under $LOOPBUS_ROOT, else ~/.loopbus),
or of the one in DIR (--state-dir, else $LOOPBUS_STATE_DIR): audit.log.jsonl,
after the rotated audit.log.jsonl.1, one talk outcome a line, as a table of time
(UTC), outcome, caller, depth, duration, error code and detail. --since
30s|10m|2h|1d keeps the lines of that last stretch of time. --json prints the log's own lines (JSON lines) instead
of the table (on a terminal with control characters escaped, as `\\u001b`: the
same JSON values). --follow prints the last 10 lines (or those --since allows), then
each new line as it is written, like `tail -f`, across the log's rotation;
stop it with Ctrl-C. A line that is not JSON is shown as `corrupt` (with --json
it is skipped, with a warning on stderr).

Exit status: 0; 2 usage error or a log that can't be read.

Examples:
  loopbus audit worker --since 1h
  loopbus audit --state-dir ~/.loopbus/worker --follow
  loopbus audit --state-dir ~/.loopbus/worker --json | jq .outcome
";

/// How often `--follow` looks at the log for new lines, and for a rotation.
pub const FOLLOW_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How many of the last lines `--follow` prints first, without `--since`.
pub const FOLLOW_BACKLOG_LINES: usize = 10;
/// Most characters of a corrupt line quoted in its row.
const MAX_QUOTED_CHARS: usize = 80;

/// Runs `audit`.
///
/// # Errors
/// Bad arguments, no state directory, or a log that is not a regular file or can't
/// be read.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["state-dir", "since"], &["json", "follow"])?;
    if args.help {
        super::output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let named = args.positionals.first().map(String::as_str);
    let state_dir = super::instance_dir(named, args.value("state-dir"), None)?;
    let since = args.value("since").map(parse_since).transpose()?;
    // A mistyped directory is an error, not an empty log.
    if !state_dir.is_dir() {
        return Err(local(format!(
            "{}: no such state directory (create one with `loopbus init DIR`)",
            state_dir.display()
        )));
    }
    let path = state_dir.join(AUDIT_FILE);
    let rotated = state_dir.join(ROTATED_AUDIT_FILE);
    let mut printer = Printer {
        json: args.switch("json"),
        terminal: std::io::stdout().is_terminal(),
        cutoff: since.map(|since| {
            SystemTime::now()
                .checked_sub(since)
                .unwrap_or(SystemTime::UNIX_EPOCH)
        }),
    };
    let follow = args.switch("follow");
    let result = if follow {
        follow_log(&path, &rotated, since.is_some(), &mut printer)
    } else {
        show_log(&path, &rotated, &mut printer)
    };
    match result {
        Ok(()) | Err(Stop::Closed) => Ok(EXIT_OK),
        Err(Stop::Io(file, e)) => Err(local(format!("cannot read {}: {e}", file.display()))),
    }
}

/// `30s`, `10m`, `2h`, `1d` as a duration.
///
/// # Errors
/// Anything else, or one too long to count.
fn parse_since(text: &str) -> Result<Duration, UsageError> {
    let bad = || {
        usage(format!(
            "`--since` must be a number and a unit: 30s, 10m, 2h or 1d (not `{text}`)"
        ))
    };
    let unit = text.chars().last().ok_or_else(bad)?;
    let per_unit: u64 = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    let number = &text[..text.len() - unit.len_utf8()];
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let secs = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per_unit))
        .ok_or_else(bad)?;
    Ok(Duration::from_secs(secs))
}

/// Why reading stopped early.
#[derive(Debug)]
enum Stop {
    /// Stdout was closed: end quietly.
    Closed,
    /// A file could not be read.
    Io(PathBuf, io::Error),
}

impl From<CommandError> for Stop {
    /// A write to stdout failed: it was closed, or can't be written; there is nowhere
    /// left to say so.
    fn from(_: CommandError) -> Stop {
        Stop::Closed
    }
}

/// Opens a log file; `None` when it does not exist.
fn open(path: &Path) -> Result<Option<File>, Stop> {
    match loopbus::open_regular_file(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Stop::Io(path.to_path_buf(), e)),
    }
}

/// Every line of the rotated log, then of the current one.
fn show_log(path: &Path, rotated: &Path, printer: &mut Printer) -> Result<(), Stop> {
    let mut any = false;
    for file in [rotated, path] {
        let Some(handle) = open(file)? else { continue };
        if !any {
            printer.header()?;
        }
        any = true;
        let mut reader = AuditLines::new(handle);
        while let Some(line) = reader
            .next_line(true)
            .map_err(|e| Stop::Io(file.to_path_buf(), e))?
        {
            printer.show(&line, file)?;
        }
    }
    if !any {
        terminal::eprint_line(&format!(
            "loopbus: no audit log at {} yet (it is written at the first talk)",
            path.display()
        ));
    }
    Ok(())
}

/// The backlog, then new lines as they come, for as long as stdout is open.
fn follow_log(path: &Path, rotated: &Path, since: bool, printer: &mut Printer) -> Result<(), Stop> {
    printer.header()?;
    if since {
        // What --since allows of the rotated file comes first.
        if let Some(handle) = open(rotated)? {
            let mut reader = AuditLines::new(handle);
            while let Some(line) = reader
                .next_line(true)
                .map_err(|e| Stop::Io(rotated.to_path_buf(), e))?
            {
                printer.show(&line, rotated)?;
            }
        }
    }
    let mut follower = Follower {
        path,
        current: None,
    };
    let mut backlog = VecDeque::new();
    follower.poll(&mut |line| {
        if since {
            return Ok(printer.show(&line, path)?);
        }
        if backlog.len() == FOLLOW_BACKLOG_LINES {
            backlog.pop_front();
        }
        backlog.push_back(line);
        Ok(())
    })?;
    for line in backlog {
        printer.show(&line, path)?;
    }
    loop {
        std::thread::sleep(FOLLOW_POLL_INTERVAL);
        follower.poll(&mut |line| Ok(printer.show(&line, path)?))?;
    }
}

/// The log file being followed: the handle open on it, and which file that is.
struct Follower<'a> {
    path: &'a Path,
    current: Option<(AuditLines<File>, FileId)>,
}

impl Follower<'_> {
    /// Hands `each` every line written since the last call. A rotation (a new file
    /// at the path) is followed after the old file is read to its end, its partial
    /// last line included (the writer writes only to the new one); a truncated file is
    /// read again from its start; a missing file is waited for.
    fn poll(&mut self, each: &mut dyn FnMut(AuditLine) -> Result<(), Stop>) -> Result<(), Stop> {
        let fail = |e| Stop::Io(self.path.to_path_buf(), e);
        if let Some((reader, id)) = &mut self.current {
            while let Some(line) = reader.next_line(false).map_err(fail)? {
                each(line)?;
            }
            match std::fs::symlink_metadata(self.path) {
                Ok(meta) if FileId::from_meta(&meta) != *id => {
                    while let Some(line) = reader.next_line(true).map_err(fail)? {
                        each(line)?;
                    }
                    self.current = None;
                }
                Ok(meta) if meta.len() < reader.position() => self.current = None,
                _ => {}
            }
        }
        if self.current.is_none() {
            if let Some(handle) = open(self.path)? {
                let id = FileId::of(&handle).map_err(fail)?;
                self.current = Some((AuditLines::new(handle), id));
            }
        }
        if let Some((reader, _)) = &mut self.current {
            while let Some(line) = reader.next_line(false).map_err(fail)? {
                each(line)?;
            }
        }
        Ok(())
    }
}

/// Which file a handle or path is (device and inode), to notice a rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId(u64, u64);

impl FileId {
    fn of(file: &File) -> io::Result<FileId> {
        Ok(FileId::from_meta(&file.metadata()?))
    }

    fn from_meta(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId(meta.dev(), meta.ino())
    }
}

/// Shows lines as a table or as JSON lines, after the `--since` cut-off.
struct Printer {
    json: bool,
    /// Whether stdout is a terminal: JSON lines are escaped for it, not for a pipe.
    terminal: bool,
    cutoff: Option<SystemTime>,
}

/// The table's columns but the last (detail), with their widths.
const COLUMNS: [(&str, usize); 6] = [
    ("TIME", 24),
    ("OUTCOME", 9),
    ("FROM", 16),
    ("DEPTH", 5),
    ("DURATION", 8),
    ("ERROR CODE", 20),
];

impl Printer {
    fn header(&self) -> Result<(), CommandError> {
        if self.json {
            return Ok(());
        }
        let mut cells: Vec<String> = COLUMNS.iter().map(|(name, _)| (*name).to_owned()).collect();
        cells.push("DETAIL".to_owned());
        output::println(&row(&cells))
    }

    fn show(&mut self, line: &AuditLine, file: &Path) -> Result<(), CommandError> {
        let parsed = if line.cut {
            None
        } else {
            serde_json::from_slice::<Value>(&line.bytes)
                .ok()
                .filter(Value::is_object)
        };
        let Some(value) = parsed else {
            return self.corrupt(line, file);
        };
        let at = value["timestamp"].as_str().and_then(loopbus::parse_iso8601);
        if let (Some(cutoff), Some(at)) = (self.cutoff, at) {
            if at < cutoff {
                return Ok(());
            }
        }
        if self.json {
            // A line that parsed as JSON is UTF-8.
            let json = String::from_utf8_lossy(&line.bytes);
            return output::println(&match self.terminal {
                true => terminal::escape_for_terminal(&json),
                false => json,
            });
        }
        let text = |v: &Value| match v {
            Value::Null => "-".to_owned(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let meta = &value["metadata"];
        let duration = match meta["durationMs"].as_u64() {
            Some(ms) => format!("{ms}ms"),
            None => "-".to_owned(),
        };
        let cells = [
            text(&value["timestamp"]),
            text(&value["outcome"]),
            text(&meta["fromInstance"]),
            text(&meta["depth"]),
            duration,
            text(&meta["errorCode"]),
            text(&value["detail"]),
        ];
        output::println(&row(&cells))
    }

    fn corrupt(&self, line: &AuditLine, file: &Path) -> Result<(), CommandError> {
        let what = if line.cut {
            format!("longer than {MAX_AUDIT_LINE_BYTES} bytes")
        } else {
            "not a JSON object".to_owned()
        };
        if self.json {
            terminal::eprint_line(&format!(
                "loopbus: warning: {} line {} is {what}; skipped",
                file.display(),
                line.number
            ));
            return Ok(());
        }
        let quoted: String = String::from_utf8_lossy(&line.bytes)
            .chars()
            .take(MAX_QUOTED_CHARS)
            .collect();
        let mut cells: Vec<String> = vec!["-".to_owned(); COLUMNS.len()];
        cells[1] = "corrupt".to_owned();
        cells.push(format!("line {} is {what}: {quoted:?}", line.number));
        output::println(&row(&cells))
    }
}

/// One table line: each cell's control characters escaped, padded to its column.
fn row(cells: &[String]) -> String {
    let mut text = String::new();
    for (i, cell) in cells.iter().enumerate() {
        let cell = terminal::escape_for_terminal(cell);
        match COLUMNS.get(i) {
            Some((_, width)) => text.push_str(&format!("{cell:<width$}  ")),
            None => text.push_str(&cell),
        }
    }
    text.trim_end().to_owned()
}

#[cfg(test)]
pub(crate) use tests::TestDir;

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    pub(crate) struct TestDir(PathBuf);

    impl TestDir {
        pub(crate) fn new(label: &str) -> TestDir {
            static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("loopbus-bin-{label}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            TestDir(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn since_table() {
        let ok = [
            ("30s", 30),
            ("10m", 600),
            ("2h", 7_200),
            ("1d", 86_400),
            ("0s", 0),
        ];
        for (text, secs) in ok {
            assert_eq!(
                parse_since(text).unwrap(),
                Duration::from_secs(secs),
                "{text}"
            );
        }
        for bad in [
            "",
            "s",
            "10",
            "10x",
            "-1m",
            "1.5h",
            "1 h",
            "99999999999999999999d",
            "é",
        ] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn follow_reads_across_a_rotation_and_a_truncation() {
        use std::io::Write;
        let dir = TestDir::new("audit-follow");
        let path = dir.path().join(AUDIT_FILE);
        let mut follower = Follower {
            path: &path,
            current: None,
        };
        let poll = |follower: &mut Follower<'_>| {
            let mut seen = Vec::new();
            follower
                .poll(&mut |line| {
                    seen.push(String::from_utf8(line.bytes).unwrap());
                    Ok(())
                })
                .unwrap();
            seen
        };
        assert!(poll(&mut follower).is_empty(), "no file yet");
        let append = |path: &Path, text: &str| {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            file.write_all(text.as_bytes()).unwrap();
        };
        append(&path, "one\ntw");
        assert_eq!(poll(&mut follower), ["one"]);
        append(&path, "o\nthree\n");
        assert_eq!(poll(&mut follower), ["two", "three"]);
        // The writer adds a line, renames the file away, and begins a new one.
        append(&path, "four\n");
        std::fs::rename(&path, dir.path().join("audit.log.jsonl.1")).unwrap();
        append(&path, "five\n");
        assert_eq!(poll(&mut follower), ["four", "five"]);
        // Cut short in place: read again from its start.
        std::fs::write(&path, "six\n").unwrap();
        assert_eq!(poll(&mut follower), ["six"]);
        assert!(poll(&mut follower).is_empty());
    }
}
