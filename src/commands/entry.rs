//! The one entry the `loopbus` binary calls: sets up logging, picks the command, and
//! runs it.
//!
//! Log lines never make the caller wait for stderr: each formatted line goes into a
//! queue of [`LOG_QUEUE_LINES`] that a thread of its own writes to stderr, so a stalled
//! stderr pipe cannot stop `serve`'s event loop. A line logged while the queue is full
//! is dropped and counted, and the count is written (`N log line(s) dropped`) once the
//! thread has caught up. When the command ends, the queue gets
//! [`LOG_FLUSH_TIMEOUT`] to reach stderr. Only the binary installs this logger; the
//! library never does (embedders bring their own).

use crate::cli::{usage, CommandError, EXIT_OK};
use std::ffi::OsString;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How many log lines may wait for stderr; a line logged while the queue is full is
/// dropped and counted.
pub const LOG_QUEUE_LINES: usize = 1024;
/// Longest log line kept, in bytes; the rest is cut (so the queue's memory stays under
/// [`LOG_QUEUE_LINES`] times this).
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;
/// How long a command, when it ends, waits for its queued log lines to reach stderr.
pub const LOG_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

const HELP: &str = "\
loopbus: a local instance-to-instance bus for AI-agent instances

Usage: loopbus <command> [options]

Commands:
  serve    run an instance (see `loopbus serve --help`)
  init     write a ready config.json for a new instance
  talk     delegate a prompt to another instance and print its reply
  health   check whether an instance is alive
  list     list the registered instances, alive or not
  doctor   check an instance's files, config, engine and registration
  usage    show usage and budget per instance
  audit    show an instance's audit log as a table (or follow it)

Run `loopbus <command> --help` for a command's options and an example.

Exit status: 0 success, 1 failure (not retryable), 75 retryable failure,
2 usage or local configuration error.
Logging: RUST_LOG=debug|info|warn|error (default info), to stderr.
";

/// Runs the command named by `args` (without the program name) and returns its exit
/// status, or why it could not do its work.
///
/// # Errors
///
/// Arguments that are not UTF-8, an unknown command, or whatever the command returns.
pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<i32, CommandError> {
    let logging = init_logging();
    let result = run_command(args);
    if let Some(logging) = logging {
        logging.flush(LOG_FLUSH_TIMEOUT);
    }
    result
}

fn run_command(args: impl IntoIterator<Item = OsString>) -> Result<i32, CommandError> {
    let args: Vec<String> = args
        .into_iter()
        .map(OsString::into_string)
        .collect::<Result<_, _>>()
        .map_err(|_| usage("arguments must be valid UTF-8"))?;
    let Some((command, rest)) = args.split_first() else {
        eprint!("{HELP}");
        return Err(usage("no command given").into());
    };
    let code = match command.as_str() {
        "serve" => super::serve::run(rest)?,
        "init" => super::init::run(rest)?,
        "talk" => super::talk::run(rest)?,
        "health" => super::health::run(rest)?,
        "list" => super::list::run(rest)?,
        "doctor" => super::doctor::run(rest)?,
        "usage" => super::usage_report::run(rest)?,
        "audit" => super::audit_log::run(rest)?,
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            EXIT_OK
        }
        "--version" | "-V" | "version" => {
            println!("loopbus {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        other => {
            return Err(usage(format!("unknown command `{other}`; run `loopbus --help`")).into())
        }
    };
    let _ = std::io::stdout().flush();
    Ok(code)
}

/// `RUST_LOG` (default `info`) to stderr through the log queue, each line stamped with
/// the UTC time. Returns the queue's handle, or `None` if its thread could not be
/// started (logging then goes straight to stderr).
fn init_logging() -> Option<LogQueue> {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format(|out, record| {
        writeln!(
            out,
            "{} {:5} {}",
            crate::time::now_iso8601(),
            record.level(),
            record.args()
        )
    });
    let (queue, lines) = LogQueue::new(LOG_QUEUE_LINES);
    let drain = {
        let shared = Arc::clone(&queue.shared);
        std::thread::Builder::new()
            .name("loopbus-log".to_owned())
            .spawn(move || drain(&lines, &shared, &mut io::stderr()))
    };
    let queue = match drain {
        Ok(_) => {
            builder.target(env_logger::Target::Pipe(Box::new(queue.writer())));
            Some(queue)
        }
        Err(e) => {
            eprintln!("loopbus: cannot start the log writer ({e}); logging to stderr directly");
            None
        }
    };
    // Fails only if a logger is already installed, which only this function does.
    let _ = builder.try_init();
    queue
}

/// The queue from the logger to the thread that writes stderr.
#[derive(Debug, Clone)]
struct LogQueue {
    lines: SyncSender<Vec<u8>>,
    shared: Arc<Shared>,
}

/// What the logger and the draining thread share.
#[derive(Debug, Default)]
struct Shared {
    /// Lines dropped because the queue was full, not yet reported.
    dropped: AtomicU64,
    /// Lines queued so far.
    queued: AtomicU64,
    /// Lines the thread has handled so far (written, or failed to write).
    handled: Mutex<u64>,
    /// Signalled whenever `handled` grows.
    progress: Condvar,
}

impl LogQueue {
    fn new(capacity: usize) -> (LogQueue, Receiver<Vec<u8>>) {
        let (lines, receiver) = mpsc::sync_channel(capacity);
        let queue = LogQueue {
            lines,
            shared: Arc::new(Shared::default()),
        };
        (queue, receiver)
    }

    /// The `Write` that env_logger writes each formatted line to.
    fn writer(&self) -> QueueWriter {
        QueueWriter {
            line: Vec::new(),
            queue: self.clone(),
        }
    }

    /// Queues `line`, or drops and counts it if the queue is full; never waits.
    fn push(&self, line: Vec<u8>) {
        match self.lines.try_send(line) {
            Ok(()) => {
                self.shared.queued.fetch_add(1, Ordering::SeqCst);
            }
            Err(_) => {
                self.shared.dropped.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Waits, at most `limit`, until every line queued so far has been handled and the
    /// count of dropped lines reported.
    fn flush(&self, limit: Duration) {
        // An empty line writes nothing, but the thread reports drops after it. If the
        // queue is full, the thread reports them after the lines already queued.
        if self.lines.try_send(Vec::new()).is_ok() {
            self.shared.queued.fetch_add(1, Ordering::SeqCst);
        }
        let target = self.shared.queued.load(Ordering::SeqCst);
        let handled = self
            .shared
            .handled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .shared
            .progress
            .wait_timeout_while(handled, limit, |handled| *handled < target);
    }
}

/// Collects one formatted line (env_logger writes a whole line, then flushes) and
/// queues it at `flush`.
struct QueueWriter {
    line: Vec<u8>,
    queue: LogQueue,
}

impl Write for QueueWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = MAX_LOG_LINE_BYTES.saturating_sub(self.line.len());
        self.line
            .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.line.is_empty() {
            return Ok(());
        }
        let mut line = std::mem::take(&mut self.line);
        if line.last() != Some(&b'\n') {
            line.push(b'\n'); // it was cut
        }
        self.queue.push(line);
        Ok(())
    }
}

/// Writes queued lines to `out` for as long as the logger lives; each time it has
/// caught up, it reports the lines dropped meanwhile.
fn drain(lines: &Receiver<Vec<u8>>, shared: &Shared, out: &mut impl Write) {
    // Write errors (stderr closed) are ignored: there is nowhere else to say so.
    while let Ok(line) = lines.recv() {
        let _ = out.write_all(&line);
        let mut handled = 1;
        while let Ok(line) = lines.try_recv() {
            let _ = out.write_all(&line);
            handled += 1;
        }
        let dropped = shared.dropped.swap(0, Ordering::SeqCst);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "{} WARN  {dropped} log line(s) dropped: stderr was not keeping up",
                crate::time::now_iso8601()
            );
        }
        let _ = out.flush();
        *shared
            .handled
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += handled;
        shared.progress.notify_all();
    }
}

/// Writes why a command failed to stderr as `loopbus: MESSAGE`, control characters
/// escaped (a path or a peer's text may carry them).
pub fn report(error: &CommandError) {
    super::terminal::eprint_line(&format!("loopbus: {error}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` whose bytes the test can read while the thread holds it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn log_line(writer: &mut QueueWriter, text: &str) {
        // As env_logger does: one write_all of the whole line, then a flush.
        writer.write_all(format!("{text}\n").as_bytes()).unwrap();
        writer.flush().unwrap();
    }

    #[test]
    fn bug_a_stalled_stderr_stopped_the_logger() {
        const CAPACITY: usize = 4;
        const LOGGED: usize = 10;
        // No thread drains yet, as if stderr were stalled: logging still never waits.
        let (queue, lines) = LogQueue::new(CAPACITY);
        let mut writer = queue.writer();
        for i in 0..LOGGED {
            log_line(&mut writer, &format!("line {i}"));
        }
        assert_eq!(
            queue.shared.dropped.load(Ordering::SeqCst),
            (LOGGED - CAPACITY) as u64
        );
        // The thread catches up, and the count is reported after the lines it kept.
        let sink = Sink::default();
        let shared = Arc::clone(&queue.shared);
        let mut out = sink.clone();
        std::thread::spawn(move || drain(&lines, &shared, &mut out));
        queue.flush(Duration::from_secs(10));
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..CAPACITY], ["line 0", "line 1", "line 2", "line 3"]);
        assert_eq!(lines.len(), CAPACITY + 1, "{text}");
        assert!(
            lines[CAPACITY].ends_with("WARN  6 log line(s) dropped: stderr was not keeping up"),
            "{text}"
        );
        // Counted once: a later flush reports nothing new.
        log_line(&mut writer, "after");
        queue.flush(Duration::from_secs(10));
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert!(text.ends_with("not keeping up\nafter\n"), "{text}");
    }

    #[test]
    fn a_long_line_is_cut_and_still_ends_the_line() {
        let (queue, lines) = LogQueue::new(2);
        let mut writer = queue.writer();
        log_line(&mut writer, &"x".repeat(MAX_LOG_LINE_BYTES * 2));
        let line = lines.try_recv().unwrap();
        assert_eq!(line.len(), MAX_LOG_LINE_BYTES + 1);
        assert_eq!(line.last(), Some(&b'\n'));
    }

    #[test]
    fn a_flush_with_nothing_draining_returns_in_time() {
        let (queue, _lines) = LogQueue::new(2);
        queue.flush(Duration::from_millis(10));
    }
}
