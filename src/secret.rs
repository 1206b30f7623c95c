//! The bus secret: a bearer token that never shows up in logs or `Debug` output; and
//! the OS randomness that secrets, proof nonces and request ids are made of.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::sync::OnceLock;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// HMAC-SHA256, the proof's MAC (contract section 6.1).
type HmacSha256 = Hmac<Sha256>;

/// Bytes in an HMAC-SHA256 tag (written as twice as many hex digits in a proof).
pub const PROOF_BYTES: usize = 32;

/// Bytes of OS randomness in a generated secret (written as twice as many hex digits).
pub const SECRET_BYTES: usize = 32;

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

    /// A fresh random secret: [`SECRET_BYTES`] bytes from the OS, as lowercase hex.
    ///
    /// # Errors
    ///
    /// The OS's randomness could not be read.
    pub fn generate() -> io::Result<Secret> {
        let hex = random_hex(SECRET_BYTES)?;
        // `random_hex` of a non-zero count is never empty.
        Ok(Secret(hex))
    }

    /// What makes this secret too weak to serve with, if anything: a sample value
    /// from the documentation, or under [`MIN_SECRET_CHARS`] characters.
    pub fn weakness(&self) -> Option<Weakness> {
        let chars = self.0.chars().count();
        if SAMPLE_SECRETS
            .iter()
            .any(|s| s.eq_ignore_ascii_case(&self.0))
        {
            Some(Weakness::Sample)
        } else if chars < MIN_SECRET_CHARS {
            Some(Weakness::Short { chars })
        } else {
            None
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

    /// The HMAC-SHA256 of `message` keyed with the secret's UTF-8 bytes, as lowercase
    /// hex (`PROOF_BYTES` bytes, so twice as many digits): what a server answers as
    /// its health `proof` (contract section 6.1).
    pub fn proof(&self, message: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(message);
        hex(&mac.finalize().into_bytes())
    }

    /// Whether `proof` is the lowercase hex of [`Secret::proof`] of `message`. The tag
    /// comparison is constant-time (the `hmac` crate's `verify_slice`); decoding the
    /// hex depends only on `proof`, which the peer chose.
    pub fn verify_proof(&self, message: &[u8], proof: &str) -> bool {
        let Some(tag) = decode_lower_hex(proof) else {
            return false;
        };
        if tag.len() != PROOF_BYTES {
            return false;
        }
        let mut mac = self.mac();
        mac.update(message);
        mac.verify_slice(&tag).is_ok()
    }

    /// A MAC keyed with the secret.
    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length (long ones are hashed), so this never fails;
        // the fallback keeps the signature total without an `expect`.
        HmacSha256::new_from_slice(self.0.as_bytes())
            .unwrap_or_else(|_| HmacSha256::new(&Default::default()))
    }
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes of an even-length string of lowercase hex digits, or `None`.
fn decode_lower_hex(text: &str) -> Option<Vec<u8>> {
    let lower_hex = text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !lower_hex || !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
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

/// The OS's randomness device.
const RANDOM_DEVICE: &str = "/dev/urandom";

/// [`RANDOM_DEVICE`], opened once per process (close-on-exec, as std opens every
/// file) and shared by every thread: a read of it has no position to share, and
/// opening it again for each nonce cost a client a system call pair per delegation.
static RANDOM_SOURCE: OnceLock<File> = OnceLock::new();

/// Fills `buf` with random bytes from the OS.
///
/// # Errors
///
/// Any I/O error opening or reading [`RANDOM_DEVICE`].
fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let source = match RANDOM_SOURCE.get() {
        Some(source) => source,
        None => {
            let opened = File::open(RANDOM_DEVICE)?;
            // Two threads may both open it; one handle is kept, the other closed.
            RANDOM_SOURCE.get_or_init(|| opened)
        }
    };
    let mut reader: &File = source;
    reader.read_exact(buf)
}

/// `N` random bytes from the OS (`/dev/urandom`): request ids (contract 8.2) and
/// the client's retry jitter are made of them.
///
/// # Errors
///
/// Any I/O error opening or reading `/dev/urandom`.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    fill_random(&mut bytes)?;
    Ok(bytes)
}

/// `bytes` random bytes from the OS (`/dev/urandom`), as lowercase hex (`2 * bytes`
/// characters).
///
/// # Errors
///
/// Any I/O error opening or reading `/dev/urandom`.
pub(crate) fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    fill_random(&mut buf)?;
    Ok(hex(&buf))
}

/// Bytes of randomness in a proof nonce (contract section 6.1: 128 bits).
pub const NONCE_BYTES: usize = 16;

/// A fresh proof nonce: `NONCE_BYTES` random bytes as lowercase hex.
///
/// # Errors
///
/// The OS's randomness could not be read.
pub fn nonce() -> io::Result<String> {
    random_hex(NONCE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_secret_is_refused() {
        assert!(Secret::new("").is_none());
    }

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

    #[test]
    fn random_hex_is_lowercase_hex_of_the_right_length() {
        for len in [0, 1, 16, 32] {
            let hex = random_hex(len).unwrap();
            assert_eq!(hex.len(), len * 2);
            assert!(
                hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
                "{hex}"
            );
        }
        assert_ne!(random_hex(32).unwrap(), random_hex(32).unwrap());
    }

    /// RFC 4231 test case 2 (key "Jefe"), checking the HMAC-SHA256 wiring.
    #[test]
    fn proof_matches_rfc_4231_test_case_2() {
        let s = Secret::new("Jefe").unwrap();
        let message = b"what do ya want for nothing?";
        let want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(s.proof(message), want);
        assert!(s.verify_proof(message, want));
        let cases = [
            (&want[..63], "short"),
            ("", "empty"),
            (
                "5BDCC146BF60754E6A042426089575C75A003F089D2739839DEC58B964EC3843",
                "uppercase",
            ),
            (
                "6bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
                "one digit off",
            ),
            (
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec384300",
                "long",
            ),
            ("zz", "not hex"),
        ];
        for (proof, why) in cases {
            assert!(!s.verify_proof(message, proof), "{why}");
        }
        assert!(!Secret::new("jefe").unwrap().verify_proof(message, want));
        assert!(!s.verify_proof(b"what do ya want for nothing!", want));
    }

    #[test]
    fn random_bytes_differ_from_call_to_call() {
        let a: [u8; 16] = random_bytes().unwrap();
        let b: [u8; 16] = random_bytes().unwrap();
        assert_ne!(a, b);
        let from_threads: Vec<[u8; 16]> = (0..4)
            .map(|_| std::thread::spawn(|| random_bytes::<16>().unwrap()))
            .map(|t| t.join().unwrap())
            .collect();
        assert!(from_threads.iter().all(|r| *r != a && *r != b));
    }

    #[test]
    fn nonces_are_128_bits_of_fresh_hex() {
        let a = nonce().unwrap();
        assert_eq!(a.len(), 2 * NONCE_BYTES);
        assert_ne!(a, nonce().unwrap());
    }

    #[test]
    fn generated_secrets_are_fresh_hex() {
        let a = Secret::generate().unwrap();
        let b = Secret::generate().unwrap();
        assert_eq!(a.expose().len(), 2 * SECRET_BYTES);
        assert_ne!(a, b);
    }
}
