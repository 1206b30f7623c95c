//! While a workflow runs: one status line per delegation on a terminal's stderr
//! (waiting, running for N s, answered, failed), redrawn as the library's observer
//! reports and every tick; and SIGINT/SIGTERM/SIGHUP turned into the workflow's stop (every
//! delegation in flight cancelled, contract 8.1) and exit 130/143/129.

use super::super::terminal::{erase, escape_line, live_lines};
use crate::cli::{local, on_stop_signals, stopped_by, CommandError};
use loopbus::{ErrorCode, Event, InstanceName, Observer, StopHandle};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often the status lines are redrawn to update the seconds shown.
const TICK: Duration = Duration::from_millis(250);

/// How long after a signal's cancels the workflow gets to return its cancelled
/// results before the process exits without them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Where one delegation is.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Waiting,
    Running(Instant),
    Answered(Duration),
    Failed(ErrorCode),
}

/// The status lines: one per delegation, drawn on stderr when it is a terminal.
pub struct Live {
    lines: Mutex<Drawn>,
    terminal: bool,
}

struct Drawn {
    names: Vec<InstanceName>,
    states: Vec<State>,
}

impl Live {
    /// Status lines for `names`, all waiting; drawn only when stderr is a terminal.
    pub fn new(names: &[InstanceName]) -> Live {
        Live {
            lines: Mutex::new(Drawn {
                names: names.to_vec(),
                states: vec![State::Waiting; names.len()],
            }),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Drawn> {
        // Every update leaves valid lines behind.
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Draws the lines again (in place of the ones shown).
    pub fn redraw(&self) {
        if !self.terminal {
            return;
        }
        let drawn = self.lock();
        let mut shown = live_lines();
        // Auto-wrap off while drawing: a line wider than the terminal is cut, not
        // wrapped onto a row the next erase would not move up over.
        let mut out = erase(&mut shown) + "\x1b[?7l";
        for (name, state) in drawn.names.iter().zip(&drawn.states) {
            out.push_str(&status_line(name.as_str(), state, Instant::now()));
            out.push('\n');
        }
        out.push_str("\x1b[?7h");
        *shown = drawn.names.len();
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(out.as_bytes());
        let _ = stderr.flush();
    }

    /// Removes the lines from the screen, for the results that follow.
    pub fn clear(&self) {
        let mut shown = live_lines();
        if *shown > 0 {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(erase(&mut shown).as_bytes());
            let _ = stderr.flush();
        }
    }
}

impl Observer for Live {
    fn event(&self, event: Event<'_>) {
        {
            let mut drawn = self.lock();
            let (index, state) = match event {
                Event::Started { index, .. } => (index, State::Running(Instant::now())),
                Event::Finished { index, stage } => match &stage.outcome {
                    Ok(_) => (index, State::Answered(stage.elapsed)),
                    Err(e) => (index, State::Failed(e.code())),
                },
                _ => return,
            };
            if let Some(slot) = drawn.states.get_mut(index) {
                *slot = state;
            }
        }
        self.redraw();
    }
}

/// One status line: `  worker: running for 12 s`.
fn status_line(name: &str, state: &State, now: Instant) -> String {
    let what = match state {
        State::Waiting => "waiting".to_owned(),
        State::Running(since) => format!("running for {} s", now.duration_since(*since).as_secs()),
        State::Answered(took) => format!("answered in {:.1} s", took.as_secs_f64()),
        State::Failed(code) => format!("failed [{}]", escape_line(code.as_str())),
    };
    format!("  {}: {what}", escape_line(name))
}

/// Where the run is, shared by the workflow (on the main thread) and the watcher, so
/// that exactly one of them ends the process.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Running,
    Finished,
    Exiting,
}

/// The watcher of a running workflow (see [`watch`]).
pub struct Watch {
    phase: Arc<Mutex<Phase>>,
    caught: Arc<AtomicUsize>,
}

impl Watch {
    /// Ends the watch from the workflow's side: `Some(exit status)` when a signal
    /// stopped it (130, 143 or 129). If the watcher already gave up waiting, it is exiting
    /// the process: this thread then waits for that.
    pub fn finish(&self) -> Option<i32> {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if *phase == Phase::Exiting {
            drop(phase);
            loop {
                std::thread::park();
            }
        }
        *phase = Phase::Finished;
        stopped_by(self.caught.load(Ordering::SeqCst)).map(|(exit, _)| exit)
    }
}

/// Starts the watcher: a thread that redraws `live` every [`TICK`] and, on SIGINT, SIGTERM or
/// SIGHUP (woken at once through `signal_hook`'s self-pipe), calls `stop` (sending
/// every delegation in flight its cancel request) and gives the workflow
/// [`STOP_GRACE`] to return its results before exiting 130/143/129 itself.
///
/// # Errors
/// The signal handlers, the wake-up pair or the thread could not be set up; nothing
/// has been sent then.
pub fn watch(stop: StopHandle, live: Arc<Live>, what: &'static str) -> Result<Watch, CommandError> {
    let setup = |e: std::io::Error| local(format!("cannot set up the wait for the answers: {e}"));
    let (wake_read, wake_write) = UnixStream::pair().map_err(setup)?;
    wake_write.set_nonblocking(true).map_err(setup)?;
    wake_read.set_read_timeout(Some(TICK)).map_err(setup)?;
    let caught = Arc::new(AtomicUsize::new(0));
    on_stop_signals(&caught, &wake_write).map_err(setup)?;
    let watch = Watch {
        phase: Arc::new(Mutex::new(Phase::Running)),
        caught: Arc::clone(&caught),
    };
    let phase = Arc::clone(&watch.phase);
    std::thread::Builder::new()
        .name("workflow-watch".to_owned())
        .spawn(move || loop {
            let mut drain = [0u8; 64];
            let _ = (&wake_read).read(&mut drain);
            let running = || *phase.lock().unwrap_or_else(|p| p.into_inner()) == Phase::Running;
            if !running() {
                return;
            }
            let Some((exit, name)) = stopped_by(caught.load(Ordering::SeqCst)) else {
                live.redraw();
                continue;
            };
            live.clear();
            super::super::terminal::eprint_line(&format!(
                "loopbus: {what}: interrupted by {name}; cancelling every delegation in flight"
            ));
            let cancels = stop.stop();
            let deadline = Instant::now() + STOP_GRACE;
            while running() && Instant::now() < deadline {
                std::thread::sleep(TICK / 5);
            }
            let mut now = phase.lock().unwrap_or_else(|p| p.into_inner());
            if *now == Phase::Running {
                *now = Phase::Exiting;
                super::super::terminal::eprint_line(&format!(
                    "loopbus: {what}: {} cancel request(s) sent; stopped waiting",
                    cancels.len()
                ));
                std::process::exit(exit);
            }
            return;
        })
        .map_err(setup)?;
    Ok(watch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_say_where_each_delegation_is() {
        let now = Instant::now();
        let cases = [
            (State::Waiting, "  w: waiting"),
            (
                State::Running(now - Duration::from_millis(12_900)),
                "  w: running for 12 s",
            ),
            (
                State::Answered(Duration::from_millis(1_240)),
                "  w: answered in 1.2 s",
            ),
            (State::Failed(ErrorCode::Timeout), "  w: failed [timeout]"),
        ];
        for (state, line) in cases {
            assert_eq!(status_line("w", &state, now), line);
        }
        assert!(!status_line("a\x1bb", &State::Waiting, now).contains('\x1b'));
        let (mut none, mut three) = (0, 3);
        assert_eq!(erase(&mut none), "");
        assert_eq!(
            (erase(&mut three), three),
            ("\x1b[3A\r\x1b[J".to_owned(), 0)
        );
    }

    /// Regression: a peer's error code with a newline in it drew a status line of its
    /// own (and the next redraw erased one line too few).
    #[test]
    fn bug_a_peers_error_code_with_a_newline_forged_a_status_line() {
        let forged = State::Failed(ErrorCode::from_wire("x\n  w: answered\x1b[2J"));
        assert_eq!(
            status_line("w", &forged, Instant::now()),
            r"  w: failed [x\n  w: answered\u001b[2J]"
        );
    }
}
