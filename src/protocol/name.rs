//! [`InstanceName`]: the validated name of an instance, `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
//!
//! Every name that reaches the registry, the client or a command is parsed into this
//! type once; nothing downstream re-checks strings. (`fromInstance` in a request is
//! not an instance name: any non-empty string is accepted there.)

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

/// Longest instance name, in bytes.
pub const MAX_INSTANCE_NAME_LEN: usize = 64;

/// A valid instance name: an ASCII letter or digit, then up to 63 ASCII letters,
/// digits, `.`, `_` or `-`. It dereferences to `str` and serializes as a string.
///
/// ```
/// use loopbus::InstanceName;
///
/// let name: InstanceName = "worker-1".parse().unwrap();
/// assert_eq!(name.as_str(), "worker-1");
/// assert!(InstanceName::new("-worker").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct InstanceName(String);

/// A string that is not a valid [`InstanceName`]. `Display` quotes it and states the
/// pattern; the rejected text is available through [`InvalidInstanceName::text`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidInstanceName(String);

impl InstanceName {
    /// Parses `name`.
    ///
    /// # Errors
    ///
    /// `name` does not match `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
    pub fn new(name: impl Into<String>) -> Result<InstanceName, InvalidInstanceName> {
        let name = name.into();
        let bytes = name.as_bytes();
        let in_set = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
        let valid = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.len() <= MAX_INSTANCE_NAME_LEN
            && bytes.iter().all(in_set);
        if valid {
            Ok(InstanceName(name))
        } else {
            Err(InvalidInstanceName(name))
        }
    }
}

string_type!(InstanceName);

impl InvalidInstanceName {
    /// The text that was refused.
    pub fn text(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InvalidInstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid instance name {:?}: it must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}",
            self.0
        )
    }
}

impl std::error::Error for InvalidInstanceName {}

impl FromStr for InstanceName {
    type Err = InvalidInstanceName;

    fn from_str(s: &str) -> Result<InstanceName, InvalidInstanceName> {
        InstanceName::new(s)
    }
}

impl Deref for InstanceName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// Lets maps keyed by name be searched with a `&str`: ordering and hashing are the
/// inner string's.
impl Borrow<str> for InstanceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for InstanceName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for InstanceName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        let long_ok = "a".repeat(64);
        let too_long = "a".repeat(65);
        let cases = [
            ("a", true),
            ("Z9", true),
            ("worker-1", true),
            ("my.bot_2", true),
            ("0", true),
            (long_ok.as_str(), true),
            (too_long.as_str(), false),
            ("", false),
            ("-a", false),
            (".hidden", false),
            ("_a", false),
            ("a b", false),
            ("a/b", false),
            ("é", false),
            ("a\n", false),
            // Controls of every range, C1 included, like C0.
            ("a\u{7f}", false),
            ("a\u{85}", false),
            ("\u{9b}a", false),
        ];
        for (name, want) in cases {
            assert_eq!(InstanceName::new(name).is_ok(), want, "{name:?}");
        }
    }

    #[test]
    fn the_one_message_quotes_the_name_and_states_the_pattern() {
        let err = InstanceName::new("a b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid instance name \"a b\": it must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}"
        );
        assert_eq!(err.text(), "a b");
    }

    #[test]
    fn conversions_and_lookups_by_str() {
        let name: InstanceName = "w".parse().unwrap();
        assert_eq!(name, "w");
        assert_eq!(name.to_string(), "w");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"w\"");
        let mut map = std::collections::BTreeMap::new();
        map.insert(name.clone(), 1);
        assert_eq!(map.get("w"), Some(&1));
    }
}
