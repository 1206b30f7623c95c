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

use super::output;
use crate::cli::{closest, usage, CommandError, UsageError, EXIT_OK};
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
  fan      send one prompt to several instances at once
  chain    pass a prompt through instances in order, each reply to the next
  verify   have one instance answer and another check the answer
  health   check whether an instance is alive (--wait SECS waits for it)
  list     list the registered instances, alive or not
  doctor   check an instance's files, config, engine and registration
  usage    show usage and budget per instance
  audit    show an instance's audit log as a table (or follow it)
  trace    show the tree of delegations of one trace, with what each part cost
  mcp      serve MCP on stdio, so that an agent CLI delegates with tools

Run `loopbus help <command>` or `loopbus <command> --help` for a command's options
and an example.

Exit status: 0 success, 1 failure (not retryable), 75 retryable failure,
2 usage or local configuration error.
Logging: RUST_LOG=debug|info|warn|error (default info), to stderr.
";

/// One command: its name, its help text and the function that runs it.
struct Command {
    name: &'static str,
    help: &'static str,
    run: fn(&[String]) -> Result<i32, CommandError>,
}

/// Every command, in the order `loopbus --help` lists them.
const COMMANDS: &[Command] = &[
    Command {
        name: "serve",
        help: super::serve::HELP,
        run: super::serve::run,
    },
    Command {
        name: "init",
        help: super::init::HELP,
        run: super::init::run,
    },
    Command {
        name: "talk",
        help: super::talk::HELP,
        run: super::talk::run,
    },
    Command {
        name: "fan",
        help: super::workflow::FAN_HELP,
        run: super::workflow::run_fan,
    },
    Command {
        name: "chain",
        help: super::workflow::CHAIN_HELP,
        run: super::workflow::run_chain,
    },
    Command {
        name: "verify",
        help: super::workflow::VERIFY_HELP,
        run: super::workflow::run_verify,
    },
    Command {
        name: "health",
        help: super::health::HELP,
        run: super::health::run,
    },
    Command {
        name: "list",
        help: super::list::HELP,
        run: super::list::run,
    },
    Command {
        name: "doctor",
        help: super::doctor::HELP,
        run: super::doctor::run,
    },
    Command {
        name: "usage",
        help: super::usage_report::HELP,
        run: super::usage_report::run,
    },
    Command {
        name: "audit",
        help: super::audit_log::HELP,
        run: super::audit_log::run,
    },
    Command {
        name: "trace",
        help: super::trace::HELP,
        run: super::trace::run,
    },
    Command {
        name: "mcp",
        help: super::mcp::HELP,
        run: super::mcp::run,
    },
];

/// The words besides the commands that `loopbus` takes first.
const OTHER_WORDS: [&str; 3] = ["help", "version", "--version"];

/// Runs the command named by `args` (without the program name) and returns its exit
/// status, or why it could not do its work.
///
/// # Errors
///
/// Arguments that are not UTF-8, an unknown command, or whatever the command returns.
pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<i32, CommandError> {
    let args: Vec<OsString> = args.into_iter().collect();
    let style = match args.first().and_then(|a| a.to_str()) {
        Some("serve" | "mcp") => LogStyle::Server,
        _ => LogStyle::Client,
    };
    let logging = init_logging(style);
    let result = match run_command(args) {
        // The reader of stdout went away: nothing more to say, and nothing failed.
        Err(CommandError::StdoutClosed) => Ok(EXIT_OK),
        other => other,
    };
    if let Some(logging) = logging {
        logging.flush(LOG_FLUSH_TIMEOUT);
    }
    result
}

fn run_command(args: Vec<OsString>) -> Result<i32, CommandError> {
    let args: Vec<String> = args
        .into_iter()
        .map(OsString::into_string)
        .collect::<Result<_, _>>()
        .map_err(|_| usage("arguments must be valid UTF-8"))?;
    let Some((word, rest)) = args.split_first() else {
        let _ = io::stderr().write_all(HELP.as_bytes());
        return Err(usage("no command given").into());
    };
    let code = match word.as_str() {
        "help" | "--help" | "-h" => match rest.first().map(String::as_str) {
            // `loopbus help help`: the overview says how help works.
            None | Some("help") => {
                output::print(HELP)?;
                EXIT_OK
            }
            Some(name) => {
                output::print(find(name)?.help)?;
                EXIT_OK
            }
        },
        "--version" | "-V" | "version" => {
            output::println(&format!("loopbus {}", env!("CARGO_PKG_VERSION")))?;
            EXIT_OK
        }
        name => {
            let command = find(name)?;
            if asks_for_help(rest) {
                output::print(command.help)?;
                EXIT_OK
            } else {
                (command.run)(rest)?
            }
        }
    };
    match std::io::stdout().flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(CommandError::StdoutClosed),
        _ => Ok(code),
    }
}

/// The command called `name`.
///
/// # Errors
/// No command has that name; the message suggests the one meant when it is close.
fn find(name: &str) -> Result<&'static Command, UsageError> {
    if let Some(command) = COMMANDS.iter().find(|c| c.name == name) {
        return Ok(command);
    }
    let words = COMMANDS.iter().map(|c| c.name).chain(OTHER_WORDS);
    Err(match closest(name, words) {
        Some(meant) => usage(format!(
            "unknown command `{name}`; did you mean `{meant}`? (run `loopbus --help`)"
        )),
        None => usage(format!("unknown command `{name}`; run `loopbus --help`")),
    })
}

/// Whether `-h` or `--help` comes before any `--` in a command's arguments.
fn asks_for_help(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "-h" || a == "--help")
}

/// How log lines look on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogStyle {
    /// `serve`, a long-running process whose log is read later: each line stamped
    /// with the UTC time and its level.
    Server,
    /// The commands a person or a script runs and waits for: `loopbus: warning: ...`,
    /// like the command's own messages, no timestamp.
    Client,
}

/// One log line's text in `style`, without the newline. The message carries outside
/// text (a caller's name, a peer's or an engine's error text, a path from config), so
/// it is escaped ([`escape_for_terminal`](super::terminal::escape_for_terminal)), and
/// its further lines are indented: no outside text can start a line that reads as a
/// log line of its own.
fn format_log_line(
    style: LogStyle,
    level: log::Level,
    message: &std::fmt::Arguments<'_>,
) -> String {
    let message =
        super::terminal::escape_for_terminal(&message.to_string()).replace('\n', "\n    ");
    match style {
        LogStyle::Server => format!("{} {level:5} {message}", loopbus::now_iso8601()),
        LogStyle::Client => {
            let label = match level {
                log::Level::Error => "error: ",
                log::Level::Warn => "warning: ",
                log::Level::Info => "",
                log::Level::Debug | log::Level::Trace => "debug: ",
            };
            format!("loopbus: {label}{message}")
        }
    }
}

/// `RUST_LOG` (default `info`) to stderr through the log queue, each line in `style`.
/// Returns the queue's handle, or `None` if its thread could not be started (logging
/// then goes straight to stderr).
fn init_logging(style: LogStyle) -> Option<LogQueue> {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format(move |out, record| {
        writeln!(
            out,
            "{}",
            format_log_line(style, record.level(), record.args())
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
            let _ = writeln!(
                io::stderr(),
                "loopbus: cannot start the log writer ({e}); logging to stderr directly"
            );
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
        // Above a workflow's status lines, not among them.
        let mut shown = super::terminal::live_lines();
        let _ = out.write_all(super::terminal::erase(&mut shown).as_bytes());
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
                loopbus::now_iso8601()
            );
        }
        let _ = out.flush();
        drop(shown);
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
    fn client_warnings_have_no_timestamp() {
        let line = format_log_line(LogStyle::Client, log::Level::Warn, &format_args!("x {}", 1));
        assert_eq!(line, "loopbus: warning: x 1");
        let line = format_log_line(LogStyle::Client, log::Level::Info, &format_args!("y"));
        assert_eq!(line, "loopbus: y");
        let line = format_log_line(LogStyle::Server, log::Level::Warn, &format_args!("z"));
        assert!(line.ends_with("Z WARN  z"), "{line}");
    }

    #[test]
    fn bug_log_lines_carried_outside_text_raw() {
        let name = "mallory\u{9b}2J\x1b]0;title\x07";
        for style in [LogStyle::Server, LogStyle::Client] {
            let line = format_log_line(
                style,
                log::Level::Info,
                &format_args!("caller {name} hung up\n2026-12-01T00:00:00.000Z ERROR forged"),
            );
            assert!(
                !line.chars().any(|c| c.is_control() && c != '\n'),
                "{line:?}"
            );
            assert!(
                line.contains(r"mallory\u009b2J\u001b]0;title\u0007"),
                "{line}"
            );
            assert!(line.contains("\n    2026-12-01T"), "{line}");
        }
    }

    #[test]
    fn help_is_asked_for_before_the_end_of_options() {
        let args = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(asks_for_help(&args(&["worker", "--help"])));
        assert!(asks_for_help(&args(&["-h"])));
        assert!(!asks_for_help(&args(&["worker", "--", "--help"])));
        assert!(!asks_for_help(&args(&["worker", "hello"])));
        assert!(find("talk").is_ok());
        assert!(find("tlak").is_err_and(|e| e.0.contains("did you mean `talk`?")));
    }

    #[test]
    fn a_flush_with_nothing_draining_returns_in_time() {
        let (queue, _lines) = LogQueue::new(2);
        queue.flush(Duration::from_millis(10));
    }
}
