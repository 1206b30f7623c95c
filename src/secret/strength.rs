//! The rule a fixed secret must pass to be served with (contract section 2): one rule,
//! used by `serve` (which refuses to start) and `doctor` (which fails).

use super::Secret;
use std::fmt;

/// A fixed `bus.secret` shorter than this, in characters, can be guessed by another
/// local user trying bearer tokens on the port (a generated one has 64).
pub const MIN_SECRET_CHARS: usize = 16;

/// Secrets and placeholders that appear as examples in documentation (the README's
/// `"optional"` of earlier releases and its placeholder first, PROTOCOL.md's worked
/// example last), compared without case: a config that copied one is open to anyone
/// who read the same page.
pub const SAMPLE_SECRETS: [&str; 15] = [
    "optional",
    "<64 random hex digits, or leave it out>",
    "secret",
    "changeme",
    "change-me",
    "password",
    "s3cret",
    "hunter2",
    "example",
    "your-secret",
    "your-secret-here",
    "replace-me",
    "placeholder",
    "test",
    "9f2c5a0e7b1d4c3a8e6f0b2d4a6c8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d",
];

/// Why a fixed secret is too weak to serve with (contract section 2): the one rule
/// `serve` refuses to start by and `doctor` fails by. The message never quotes the
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Weakness {
    /// One of [`SAMPLE_SECRETS`].
    Sample,
    /// Fewer than [`MIN_SECRET_CHARS`] characters.
    Short {
        /// How many it has.
        chars: usize,
    },
}

impl fmt::Display for Weakness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Weakness::Sample => f.write_str("is a sample value from the documentation"),
            Weakness::Short { chars } => write!(
                f,
                "has only {chars} characters (at least {MIN_SECRET_CHARS} wanted)"
            ),
        }
    }
}

impl Secret {
    /// What makes this secret too weak to serve with, if anything: a sample value
    /// from the documentation, or under [`MIN_SECRET_CHARS`] characters.
    pub fn weakness(&self) -> Option<Weakness> {
        let chars = self.0.chars().count();
        let sample = |s: &&str| s.eq_ignore_ascii_case(&self.0);
        if SAMPLE_SECRETS.iter().any(sample) {
            return Some(Weakness::Sample);
        }
        (chars < MIN_SECRET_CHARS).then_some(Weakness::Short { chars })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve` ran with the README's own sample secret `"optional"`, or with `"a"`.
    #[test]
    fn bug_serve_accepted_a_sample_or_a_one_character_secret() {
        let cases: &[(&str, Option<Weakness>)] = &[
            ("optional", Some(Weakness::Sample)),
            ("OPTIONAL", Some(Weakness::Sample)),
            ("hunter2", Some(Weakness::Sample)),
            ("Your-Secret-Here", Some(Weakness::Sample)),
            (
                "<64 random hex digits, or leave it out>",
                Some(Weakness::Sample),
            ),
            (
                SAMPLE_SECRETS[SAMPLE_SECRETS.len() - 1],
                Some(Weakness::Sample),
            ),
            ("a", Some(Weakness::Short { chars: 1 })),
            ("short-but-mixed", Some(Weakness::Short { chars: 15 })),
            ("ééééééééééééééé", Some(Weakness::Short { chars: 15 })),
            ("0123456789abcdef", None),
            ("aaaaaaaaaaaaaaaaaaaaaaaa", None),
        ];
        for (value, want) in cases {
            assert_eq!(Secret::new(*value).unwrap().weakness(), *want, "{value}");
        }
        assert!(Secret::generate().unwrap().weakness().is_none());
        // The message never quotes the value.
        let text = Weakness::Short { chars: 1 }.to_string();
        assert_eq!(text, "has only 1 characters (at least 16 wanted)");
    }
}
