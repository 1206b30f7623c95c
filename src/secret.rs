//! The bus secret: a bearer token that never shows up in logs or `Debug` output.

use std::fmt;

/// A bus secret. `Debug` and `Display` print `[redacted]`; the only ways to see the
/// value are [`Secret::expose`] (for writing the registry or an `Authorization`
/// header) and [`Secret::matches_bearer`] (for checking one).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value. Returns `None` for an empty string: an empty secret is
    /// no secret, and auth is never off.
    pub fn new(value: impl Into<String>) -> Option<Secret> {
        let value = value.into();
        if value.is_empty() {
            None
        } else {
            Some(Secret(value))
        }
    }

    /// The raw value, for the registry file and the client's `Authorization` header.
    /// Never log what this returns.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The exact `Authorization` header value a caller must send.
    pub fn bearer_header(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `header` is exactly `Bearer <secret>`.
    ///
    /// The comparison is constant-time in the secret: the work done depends only on the
    /// length of `header`, which the caller chose, never on where the first difference
    /// is or on how long the secret is.
    pub fn matches_bearer(&self, header: &[u8]) -> bool {
        let expected = self.bearer_header();
        let expected = expected.as_bytes();
        // `expected` is never empty ("Bearer " alone is 7 bytes), so the modulo is safe.
        let mut diff = u8::from(header.len() != expected.len());
        for (i, byte) in header.iter().enumerate() {
            diff |= byte ^ expected[i % expected.len()];
        }
        diff == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_secret_is_refused() {
        assert!(Secret::new("").is_none());
    }

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new("hunter2").unwrap();
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn bearer_matching() {
        let s = Secret::new("abc123").unwrap();
        let cases: &[(&[u8], bool)] = &[
            (b"Bearer abc123", true),
            (b"Bearer abc124", false),
            (b"Bearer abc12", false),
            (b"Bearer abc1234", false),
            (b"bearer abc123", false),
            (b"Bearer  abc123", false),
            (b"abc123", false),
            (b"", false),
            (b"Bearer abc123Bearer abc123", false),
        ];
        for (header, want) in cases {
            assert_eq!(
                s.matches_bearer(header),
                *want,
                "{:?}",
                String::from_utf8_lossy(header)
            );
        }
    }
}
