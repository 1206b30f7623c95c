//! The stdio framing of MCP (the same in 2025-06-18, 2025-11-25 and 2026-07-28): one
//! JSON-RPC message per line, newline-delimited. A line longer than
//! [`MAX_LINE_BYTES`] is refused without being buffered whole: its bytes are counted
//! and dropped up to its newline.

use std::io::{self, BufRead};

/// Longest input line (one message) kept, in bytes, without its newline.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line within the limit, without its newline (nor a `\r` before it).
    Message(Vec<u8>),
    /// A line over [`MAX_LINE_BYTES`]; how long it was.
    TooLong {
        /// Its length without the newline.
        bytes: usize,
    },
}

/// The next line that is not blank, or `None` at the end of the input. A last line
/// without a newline counts.
///
/// # Errors
/// Reading failed.
pub fn read_line(input: &mut impl BufRead) -> io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut dropped = 0usize;
    loop {
        let buffer = match input.fill_buf() {
            Ok(buffer) => buffer,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let at_end = buffer.is_empty();
        let (chunk, newline) = match buffer.iter().position(|&b| b == b'\n') {
            Some(i) => (&buffer[..i], true),
            None => (buffer, false),
        };
        if dropped == 0 && line.len() + chunk.len() <= MAX_LINE_BYTES {
            line.extend_from_slice(chunk);
        } else {
            dropped = dropped.saturating_add(line.len() + chunk.len());
            line.clear();
        }
        let used = chunk.len() + usize::from(newline);
        input.consume(used);
        if !(newline || at_end) {
            continue;
        }
        if dropped > 0 {
            return Ok(Some(Line::TooLong { bytes: dropped }));
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if !line.iter().all(u8::is_ascii_whitespace) {
            return Ok(Some(Line::Message(line)));
        }
        if at_end {
            return Ok(None);
        }
        line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Cursor};

    fn lines(input: &[u8], capacity: usize) -> Vec<Line> {
        let mut reader = BufReader::with_capacity(capacity, Cursor::new(input.to_vec()));
        std::iter::from_fn(|| read_line(&mut reader).unwrap()).collect()
    }

    #[test]
    fn lines_are_split_at_newlines_whatever_the_buffer_size() {
        let input = b"{\"a\":1}\r\n\n  \n{\"b\":2}\n{\"c\":3}";
        for capacity in [1, 2, 7, 64, 8192] {
            assert_eq!(
                lines(input, capacity),
                [
                    Line::Message(b"{\"a\":1}".to_vec()),
                    Line::Message(b"{\"b\":2}".to_vec()),
                    Line::Message(b"{\"c\":3}".to_vec()),
                ],
                "{capacity}"
            );
        }
        assert_eq!(lines(b"", 8), []);
        assert_eq!(lines(b"\n\n", 8), []);
    }

    #[test]
    fn a_line_over_the_limit_is_counted_not_kept_and_the_next_one_is_read() {
        let mut input = vec![b'x'; MAX_LINE_BYTES];
        input.push(b'\n');
        input.extend(vec![b'y'; MAX_LINE_BYTES + 1]);
        input.extend_from_slice(b"\n{}\n");
        let got = lines(&input, 8192);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], Line::Message(vec![b'x'; MAX_LINE_BYTES]));
        assert_eq!(
            got[1],
            Line::TooLong {
                bytes: MAX_LINE_BYTES + 1
            }
        );
        assert_eq!(got[2], Line::Message(b"{}".to_vec()));
    }
}
