//! The one way commands write to stdout. A reader that closes the pipe early
//! (`loopbus list | head -1`) is the reader's choice, not a failure: the write reports
//! [`CommandError::StdoutClosed`], and the command stops quietly with status 0 instead
//! of the panic `println!` ends in.

use crate::cli::CommandError;
use std::io::{self, Write};

/// Writes `text` to stdout and flushes it.
///
/// # Errors
/// [`CommandError::StdoutClosed`] when the reader has gone (a broken pipe); any other
/// write error as a local error naming stdout.
pub fn print(text: &str) -> Result<(), CommandError> {
    let mut stdout = io::stdout().lock();
    write_to(&mut stdout, text.as_bytes())
}

/// [`print`] with a newline after `text`.
///
/// # Errors
/// As [`print`].
pub fn println(text: &str) -> Result<(), CommandError> {
    let mut stdout = io::stdout().lock();
    write_to(&mut stdout, text.as_bytes())?;
    write_to(&mut stdout, b"\n")
}

/// Writes `bytes` to `out` and flushes it, mapping a broken pipe to
/// [`CommandError::StdoutClosed`].
fn write_to(out: &mut impl Write, bytes: &[u8]) -> Result<(), CommandError> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => CommandError::StdoutClosed,
            _ => crate::cli::local(format!("cannot write to stdout: {e}")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_broken_pipe_is_a_quiet_stop() {
        assert!(matches!(
            write_to(&mut Closed, b"x"),
            Err(CommandError::StdoutClosed)
        ));
        let mut out = Vec::new();
        assert!(write_to(&mut out, b"x").is_ok());
        assert_eq!(out, b"x");
    }
}
