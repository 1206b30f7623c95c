//! Lines to stdout for the report commands (`doctor`, `usage`, `audit`): a closed
//! stdout (`loopbus audit | head -1`) ends the output quietly instead of a panic.

use std::io::{self, Write};

/// Stdout went away (its reader closed the pipe): the command stops writing and ends
/// quietly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// Writes `text` and a newline to stdout, flushed (so that `--follow` output shows at
/// once in a pipe).
///
/// # Errors
/// [`Closed`] when stdout is closed or can't be written; there is nowhere left to say
/// so.
pub fn line(text: &str) -> Result<(), Closed> {
    let mut out = io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|_| Closed)
}
