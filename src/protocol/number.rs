//! Exact integers in JSON text. serde_json reads a number with a fraction or an
//! exponent as an `f64`, which rounds: `1e-400` becomes `0.0` and
//! `1.0000000000000000001` becomes `1.0`, and both would then pass as whole numbers.
//! Where a field must be an integer, its text decides: `1.0` and `10e-1` are integers,
//! `1e-400` is not.

/// Whether `text`, a JSON number, denotes an integer exactly (`1.0`, `1e3`, `10e-1`,
/// `-0.0` and `0e-999` do; `1.5`, `1e-400` and `1.0000000000000000001` do not). Text
/// that is not a JSON number is not an integer.
pub(super) fn is_integer_text(text: &str) -> bool {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((whole, fraction)) if digits(fraction) => (whole, fraction),
        Some(_) => return false,
        None => (mantissa, ""),
    };
    if !digits(whole) {
        return false;
    }
    let exponent = match exponent {
        None => 0,
        Some(e) => match parse_exponent(e) {
            Some(e) => e,
            None => return false,
        },
    };
    // The value is (whole and fraction digits, trailing zeros dropped) times ten to
    // the power `exponent - fraction digits + zeros dropped`: an integer when that
    // power is not negative, or when every digit is zero.
    let significant = format!("{whole}{fraction}");
    let trimmed = significant.trim_end_matches('0');
    if trimmed.trim_start_matches('0').is_empty() {
        return true;
    }
    let dropped = significant.len() - trimmed.len();
    let power = exponent
        .saturating_sub(count(fraction.len()))
        .saturating_add(count(dropped));
    power >= 0
}

/// The exponent part of a JSON number (after the `e`), saturated far beyond any
/// digit count a body can hold.
fn parse_exponent(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude = digits.bytes().fold(0i64, |n, b| {
        n.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    Some(if negative { -magnitude } else { magnitude })
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The text of the value of the top-level key `key` in `text`, a JSON object that
/// serde_json has already accepted; the last one when the key repeats (serde_json's
/// `Value` keeps the last). `None` when the key is absent or `text` is not an object.
pub(super) fn top_level_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let bytes = text.as_bytes();
    let mut at = skip_space(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut found = None;
    loop {
        at = skip_space(bytes, at);
        match bytes.get(at)? {
            b'}' => return found,
            b',' => at = skip_space(bytes, at + 1),
            _ => {}
        }
        let key_end = string_end(bytes, at)?;
        let raw_key = text.get(at..key_end)?;
        let is_key = if raw_key.contains('\\') {
            serde_json::from_str::<String>(raw_key).ok()? == key
        } else {
            raw_key.get(1..raw_key.len() - 1)? == key
        };
        at = skip_space(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(bytes, at + 1);
        let value_end = value_end(bytes, at)?;
        if is_key {
            found = Some(text.get(at..value_end)?);
        }
        at = value_end;
    }
}

/// The first index at or after `at` that is not JSON whitespace.
fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes
        .get(at)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        at += 1;
    }
    at
}

/// The index just past the string that starts (with its quote) at `at`.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index just past the value that starts at `at`. Nested arrays and objects are
/// skipped by counting brackets (outside strings), without recursion.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match bytes.get(i)? {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = at;
            while bytes
                .get(i)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_text_table() {
        let cases = [
            ("0", true),
            ("1", true),
            ("-0", true),
            ("-0.0", true),
            ("1.0", true),
            ("1.000", true),
            ("1e3", true),
            ("1E+3", true),
            ("10e-1", true),
            ("0.1e1", true),
            ("1.5e1", true),
            ("0e-400", true),
            ("0.000e-99999999999999999999999", true),
            ("1e300", true),
            ("1e99999999999999999999999", true),
            ("18446744073709551616", true),
            ("-5", true),
            ("1.5", false),
            ("1e-1", false),
            ("1e-19", false),
            ("1e-400", false),
            ("-1e-400", false),
            ("1.0000000000000000001", false),
            ("123456789012345678901e-1", false),
            ("1e-99999999999999999999999", false),
            ("", false),
            ("-", false),
            ("1.", false),
            (".5", false),
            ("1e", false),
            ("1e+", false),
            ("\"1\"", false),
            ("true", false),
        ];
        for (text, want) in cases {
            assert_eq!(is_integer_text(text), want, "{text}");
        }
    }

    #[test]
    fn top_level_value_table() {
        let cases = [
            (r#"{"depth":1}"#, Some("1")),
            (r#" { "depth" : 1e-400 , "x": 2 } "#, Some("1e-400")),
            (r#"{"a":{"depth":9},"depth":2}"#, Some("2")),
            (
                r#"{"a":[{"depth":9}, "]}", "\"depth\""],"depth":3}"#,
                Some("3"),
            ),
            (r#"{"depth":1,"depth":1.5}"#, Some("1.5")),
            (r#"{"dep\u0074h":4}"#, Some("4")),
            (r#"{"de\"pth":4}"#, None),
            (r#"{"x\\":5,"depth":"s,}"}"#, Some(r#""s,}""#)),
            (r#"{"depth":[1,2]}"#, Some("[1,2]")),
            (r#"{"depth":null}"#, Some("null")),
            (r#"{}"#, None),
            (r#"{"x":1}"#, None),
            (r#"[{"depth":1}]"#, None),
            ("1", None),
        ];
        for (text, want) in cases {
            assert_eq!(top_level_value(text, "depth"), want, "{text}");
        }
    }
}
