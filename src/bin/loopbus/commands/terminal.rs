//! What a peer sends never reaches a terminal raw (contract section 5, issue 10):
//! control characters other than newline and tab are shown escaped, so that escape
//! sequences in a peer's reply, error text or instance name (clipboard writes, cursor
//! moves, title changes) are seen, not obeyed.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control character (C0, DEL, C1) other than newline and tab shown
/// escaped: `\x1b` for an ASCII one, `\u{9b}` for a C1 one. Text without any is
/// returned as it is.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    escape_with(
        text,
        |c| c != '\n' && c != '\t',
        |out, c| {
            let code = u32::from(c);
            // Writing to a String cannot fail.
            let _ = if code < 0x80 {
                write!(out, "\\x{code:02x}")
            } else {
                write!(out, "\\u{{{code:x}}}")
            };
        },
    )
}

/// A JSON text with every control character left in it (serde_json leaves DEL and the
/// C1 controls as they are) written as a `\u00XX` escape: the same JSON value, safe
/// for a terminal. Newline and tab are left alone: serde_json escapes them inside
/// strings, so raw ones are the layout of pretty-printed JSON. Other control
/// characters can stand only inside strings, where the escape means the same.
pub fn escape_json_controls(json: &str) -> Cow<'_, str> {
    escape_with(
        json,
        |c| c != '\n' && c != '\t',
        |out, c| {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        },
    )
}

/// `text` with each control character for which `escape` holds written by `write`.
fn escape_with(
    text: &str,
    escape: impl Fn(char) -> bool,
    write: impl Fn(&mut String, char),
) -> Cow<'_, str> {
    let needs = |c: char| c.is_control() && escape(c);
    if !text.chars().any(needs) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs(c) {
            write(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `line` and a newline to stderr, escaped: stderr is always treated as a
/// terminal, since it usually is one even when stdout is piped. A stderr that can't
/// be written (full, closed) loses the line; it never panics (`eprintln!` would, and
/// turn any exit status into 101).
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{}", escape_controls(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_controls_table() {
        let cases = [
            ("plain text", "plain text"),
            ("two\nlines\tand a tab", "two\nlines\tand a tab"),
            ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
            ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
            ("over\rwrite", "over\\x0dwrite"),
            ("nul\0", "nul\\x00"),
            ("del\x7f", "del\\x7f"),
            ("csi\u{9b}31m", "csi\\u{9b}31m"),
            ("héllo ✓ 日本", "héllo ✓ 日本"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(escape_controls(input), want, "{input:?}");
        }
        assert!(matches!(escape_controls("calm\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn escape_json_controls_table() {
        let cases = [
            (r#"{"text":"hi\u001b"}"#, r#"{"text":"hi\u001b"}"#),
            (
                "{\"text\":\"a\u{7f}b\u{9b}c\"}",
                r#"{"text":"a\u007fb\u009bc"}"#,
            ),
            ("{\"text\":\"é\"}", "{\"text\":\"é\"}"),
            // Regression: pretty-printed JSON came out on one line of `\u000a`s.
            (
                "{\n  \"text\": \"a\\nb\u{7f}\"\n}",
                "{\n  \"text\": \"a\\nb\\u007f\"\n}",
            ),
        ];
        for (input, want) in cases {
            let got = escape_json_controls(input);
            assert_eq!(got, want, "{input:?}");
            let a: serde_json::Value = serde_json::from_str(input).unwrap();
            let b: serde_json::Value = serde_json::from_str(&got).unwrap();
            assert_eq!(a, b, "the same JSON value");
        }
    }
}
