//! Text from outside on its way to a terminal or a log: a peer's reply, error text and
//! instance name, an engine's output, a file's contents, a path. [`escape_for_terminal`]
//! is the one escaping rule for all of it (contract section 5): escape sequences in such
//! text (clipboard writes, cursor moves, title changes) are shown, never obeyed.
//!
//! The library's own log records carry outside text as it came (a name, an error text,
//! a path); a logger that writes them to a terminal or a journal passes each message
//! through [`escape_for_terminal`], as the `loopbus` binary's does.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control character (C0, DEL and C1: [`char::is_control`]) other
/// than newline and tab written as a JSON escape, `\u001b` for ESC. Text without any is
/// returned as it is.
///
/// The escapes are valid JSON and mean the same there: in JSON that serde_json wrote, a
/// raw control character can stand only inside a string (serde_json leaves DEL and C1
/// unescaped), and raw newlines and tabs are the layout of pretty-printed JSON. So the
/// same function makes a reply, a table cell, a log line or a whole JSON document safe
/// to show.
///
/// ```
/// use loopbus::escape_for_terminal;
///
/// assert_eq!(escape_for_terminal("a\x1b]52;c;aGk=\x07b"), r"a\u001b]52;c;aGk=\u0007b");
/// assert_eq!(escape_for_terminal("two\nlines"), "two\nlines");
/// ```
pub fn escape_for_terminal(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_for_terminal_table() {
        let cases = [
            ("plain text", "plain text"),
            ("two\nlines\tand a tab", "two\nlines\tand a tab"),
            ("\x1b]52;c;aGk=\x07", r"\u001b]52;c;aGk=\u0007"),
            ("\x1b[2J\x1b[H", r"\u001b[2J\u001b[H"),
            ("over\rwrite", r"over\u000dwrite"),
            ("nul\0", r"nul\u0000"),
            ("del\x7f", r"del\u007f"),
            ("csi\u{9b}31m", r"csi\u009b31m"),
            ("c1 ends\u{9f}", r"c1 ends\u009f"),
            ("\u{a0}héllo ✓ 日本 \u{2028}", "\u{a0}héllo ✓ 日本 \u{2028}"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(escape_for_terminal(input), want, "{input:?}");
        }
        assert!(matches!(escape_for_terminal("calm\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_json_is_the_same_json_value() {
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
            let got = escape_for_terminal(input);
            assert_eq!(got, want, "{input:?}");
            let a: serde_json::Value = serde_json::from_str(input).unwrap();
            let b: serde_json::Value = serde_json::from_str(&got).unwrap();
            assert_eq!(a, b, "the same JSON value");
        }
    }
}
