//! What a peer sends never reaches a terminal raw (contract section 5, issue 10):
//! everything from outside is shown through the library's one rule,
//! [`escape_for_terminal`], so that escape sequences in a peer's reply, error text or
//! instance name (clipboard writes, cursor moves, title changes) are seen, not obeyed.

pub use loopbus::escape_for_terminal;

/// Writes `line` and a newline to stderr, escaped: stderr is always treated as a
/// terminal, since it usually is one even when stdout is piped. A stderr that can't
/// be written (full, closed) loses the line; it never panics (`eprintln!` would, and
/// turn any exit status into 101).
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{}", escape_for_terminal(line));
}

/// Outside text on one line of a table or a status line: escaped, newlines and tabs too,
/// so that it can neither write escape sequences nor forge a line.
pub fn escape_line(text: &str) -> String {
    escape_for_terminal(text)
        .replace('\n', "\\n")
        .replace('\t', "\\t")
}
