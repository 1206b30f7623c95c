//! The wait for `talk`'s answer (contract 8.1): the watcher thread that turns SIGINT,
//! SIGTERM and SIGHUP into a cancel request and exit 130/143/129, the time waited shown on a
//! terminal, and the cancel request sent when `talk` gives up for good.

use super::super::terminal;
use crate::cli::{local, on_stop_signals, stopped_by, CommandError};
use loopbus::{CancelOutcome, DelegateError, DelegateOptions, Envelope, ErrorCode, Failure};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a turn runs before a terminal shows the time waited.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

/// How often the wait wakes to update the time shown.
const PROGRESS_TICK: Duration = Duration::from_millis(250);

/// Where the wait for the answer is, shared by the delegation (on the main thread)
/// and the watcher thread, so that exactly one of them ends it.
enum Phase {
    /// Waiting; the whole seconds last shown on the terminal, if any.
    Waiting(Option<u64>),
    /// The delegation finished: the watcher does nothing more.
    Finished,
    /// A signal came first: the watcher cancels and exits.
    Stopping,
}

/// The wait's shared phase (see [`watch`]).
pub(super) struct Watch(Arc<Mutex<Phase>>);

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        // A panic while holding it left a valid phase behind.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends the wait from the delegation's side: clears the time shown, or, when a
    /// signal came first, leaves the process to the watcher's cancel and exit.
    pub(super) fn finish(&self) {
        let mut phase = self.lock();
        match *phase {
            Phase::Stopping => {
                drop(phase);
                loop {
                    std::thread::park();
                }
            }
            Phase::Waiting(shown) => {
                if shown.is_some() {
                    clear_progress();
                }
                *phase = Phase::Finished;
            }
            Phase::Finished => {}
        }
    }
}

/// Starts the watcher of the wait: a thread that sleeps until SIGINT, SIGTERM or SIGHUP
/// (woken at once through `signal_hook`'s self-pipe), then sends the cancel request
/// and exits 130/143 (contract 8.1); when stderr is a terminal it also wakes every
/// [`PROGRESS_TICK`] to show the time waited. The delegation itself runs on the
/// calling thread, so that nothing stands between its answer and the output.
///
/// # Errors
/// The signal handlers, the wake-up pair or the thread could not be set up; nothing
/// has been sent then.
pub(super) fn watch(options: &DelegateOptions, json: bool) -> Result<Watch, CommandError> {
    let setup = |e: std::io::Error| local(format!("cannot set up the wait for the answer: {e}"));
    let (wake_read, wake_write) = UnixStream::pair().map_err(setup)?;
    wake_write.set_nonblocking(true).map_err(setup)?;
    let terminal = std::io::stderr().is_terminal();
    if terminal {
        wake_read
            .set_read_timeout(Some(PROGRESS_TICK))
            .map_err(setup)?;
    }
    let caught = Arc::new(AtomicUsize::new(0));
    on_stop_signals(&caught, &wake_write).map_err(setup)?;
    let watch = Watch(Arc::new(Mutex::new(Phase::Waiting(None))));
    let shared = Watch(Arc::clone(&watch.0));
    let options = options.clone();
    let started = Instant::now();
    std::thread::Builder::new()
        .name("talk-watch".to_owned())
        .spawn(move || loop {
            // Woken by a signal, or by the tick on a terminal.
            let mut drain = [0u8; 64];
            let _ = (&wake_read).read(&mut drain);
            let signal = stopped_by(caught.load(Ordering::SeqCst));
            let mut phase = shared.lock();
            match (&mut *phase, signal) {
                (Phase::Finished | Phase::Stopping, _) => return,
                (Phase::Waiting(shown), Some((exit, name))) => {
                    if shown.is_some() {
                        clear_progress();
                    }
                    *phase = Phase::Stopping;
                    drop(phase);
                    // The main thread now waits for this exit: it must come, whatever
                    // goes wrong while cancelling and reporting.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        stopped(&options, name, json, started)
                    }));
                    std::process::exit(exit);
                }
                (Phase::Waiting(shown), None) => {
                    let waited = started.elapsed();
                    if terminal && waited >= PROGRESS_AFTER && *shown != Some(waited.as_secs()) {
                        *shown = Some(waited.as_secs());
                        let mut stderr = std::io::stderr().lock();
                        let line = progress_line(options.target.as_str(), waited);
                        let _ = write!(stderr, "\r\x1b[K{line}");
                        let _ = stderr.flush();
                    }
                }
            }
        })
        .map_err(setup)?;
    Ok(watch)
}

/// Clears the time shown on the terminal.
fn clear_progress() {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[K");
    let _ = stderr.flush();
}

/// The line shown while waiting: `loopbus: waiting for worker: 12 s (Ctrl-C cancels)`.
fn progress_line(target: &str, waited: Duration) -> String {
    format!(
        "loopbus: waiting for {}: {} s (Ctrl-C cancels)",
        terminal::escape_for_terminal(target),
        waited.as_secs()
    )
}

/// Sends the cancel request for the delegation (bounded by [`loopbus::CANCEL_TIMEOUT`])
/// and says on stderr what became of it when it did not go as planned.
pub(super) fn send_cancel(options: &DelegateOptions) -> Option<CancelOutcome> {
    let target = &options.target;
    match loopbus::cancel(options) {
        Ok(outcome) => {
            let answer = match &outcome {
                CancelOutcome::Answered(e) => {
                    e.failure.as_ref().map_or("success", |f| f.code.as_str())
                }
                _ => "not sent",
            };
            // Straight to stderr, like the final line after it: a log line would
            // come through the log queue, before or after that line or not at all.
            terminal::eprint_line(&format!("loopbus: cancel request to {target}: {answer}"));
            Some(outcome)
        }
        // Sent, and the answer (which comes once the engine is gone: SIGKILL follows
        // SIGTERM after the server's grace) did not come in time: the turn is being
        // cancelled all the same.
        Err(DelegateError::Timeout { .. }) => {
            terminal::eprint_line(&format!(
                "loopbus: talk to {target}: cancel request sent; {target} had not confirmed it \
                 when talk stopped waiting (it stops the engine with SIGTERM, then SIGKILL)"
            ));
            None
        }
        Err(error) => {
            terminal::eprint_line(&format!(
                "loopbus: talk to {target}: could not cancel the turn: {error}"
            ));
            None
        }
    }
}

/// After the signal `name`: cancel, say so, and print the `--json` envelope. The
/// watcher then exits at once, without waiting for the log queue: what the user must
/// see goes to stderr directly.
fn stopped(options: &DelegateOptions, name: &str, json: bool, started: Instant) {
    let target = &options.target;
    let what = match send_cancel(options) {
        Some(CancelOutcome::Answered(envelope)) => match envelope.failure {
            Some(f) if f.code == ErrorCode::Cancelled => "the turn was cancelled".to_owned(),
            // The turn had finished, or had not arrived: nothing runs there now.
            Some(f) => format!("{target} answered the cancel request with {}", f.code),
            None => format!("{target} had already finished the turn"),
        },
        Some(CancelOutcome::NotSupported) => {
            format!("{target} does not advertise cancel-on-hangup, so the connection was closed")
        }
        Some(_) | None => "the connection was closed".to_owned(),
    };
    let message = format!("interrupted by {name}; {what}");
    if json {
        let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let envelope = Envelope::failure(
            options.caller.as_str(),
            Failure::new(ErrorCode::Cancelled, message.clone()),
            took,
        );
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{}", String::from_utf8_lossy(&envelope.to_json()));
        let _ = stdout.flush();
    }
    terminal::eprint_line(&format!("loopbus: talk to {target}: {message} [cancelled]"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_shows_whole_seconds_and_escapes_the_target() {
        assert_eq!(
            progress_line("worker", Duration::from_millis(12_900)),
            "loopbus: waiting for worker: 12 s (Ctrl-C cancels)"
        );
        assert!(!progress_line("a\x1bb", Duration::ZERO).contains('\x1b'));
    }
}
