//! What a peer sends never reaches a terminal raw (contract section 5, issue 10):
//! everything from outside is shown through the library's one rule,
//! [`escape_for_terminal`], so that escape sequences in a peer's reply, error text or
//! instance name (clipboard writes, cursor moves, title changes) are seen, not obeyed.

pub use loopbus::escape_for_terminal;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many status lines a running workflow shows at the bottom of stderr
/// (`workflow::live`). Whatever else writes to stderr meanwhile holds this lock and
/// first erases them ([`erase`]); the next redraw puts them back below what it wrote.
static LIVE_LINES: Mutex<usize> = Mutex::new(0);

/// The lock on the count of status lines shown (see [`LIVE_LINES`]).
pub fn live_lines() -> MutexGuard<'static, usize> {
    // A count is always valid: a panic while holding it changes nothing.
    LIVE_LINES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The escape sequence that moves up over the `shown` status lines and erases them to
/// the end of the screen; none are shown after it.
pub fn erase(shown: &mut usize) -> String {
    match std::mem::take(shown) {
        0 => String::new(),
        n => format!("\x1b[{n}A\r\x1b[J"),
    }
}

/// Writes `line` and a newline to stderr, escaped: stderr is always treated as a
/// terminal, since it usually is one even when stdout is piped. A stderr that can't
/// be written (full, closed) loses the line; it never panics (`eprintln!` would, and
/// turn any exit status into 101).
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let mut shown = live_lines();
    let erased = erase(&mut shown);
    let _ = writeln!(
        std::io::stderr().lock(),
        "{erased}{}",
        escape_for_terminal(line)
    );
}

/// Outside text on one line of a table or a status line: escaped, newlines and tabs too,
/// so that it can neither write escape sequences nor forge a line.
pub fn escape_line(text: &str) -> String {
    escape_for_terminal(text)
        .replace('\n', "\\n")
        .replace('\t', "\\t")
}
