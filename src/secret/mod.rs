//! The bus secret: a bearer token that never shows up in logs or `Debug` output, the
//! constant-time bearer check and the health proof a server answers with. The rule a
//! fixed secret must pass (`strength`), the OS randomness (`random`) and the caller's
//! proof check (`verify`) are in their own files: no request without the secret reaches them.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

mod random;
mod strength;
mod verify;

pub(crate) use random::random_hex;
pub use random::{nonce, random_bytes, SECRET_BYTES};
pub use strength::{Weakness, MIN_SECRET_CHARS, SAMPLE_SECRETS};

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
        (!value.is_empty()).then_some(Secret(value))
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
        constant_time_eq(header, self.bearer_header().as_bytes())
    }

    /// The HMAC-SHA256 of `message` keyed with the secret's UTF-8 bytes, as lowercase
    /// hex (32 bytes, so 64 digits): what a server answers as its health `proof`
    /// (contract section 6.1).
    pub fn proof(&self, message: &[u8]) -> String {
        // HMAC takes keys of any length (long ones are hashed), so this never fails;
        // the fallback keeps the signature total without an `expect`.
        let mac = Hmac::<Sha256>::new_from_slice(self.0.as_bytes())
            .unwrap_or_else(|_| Hmac::new(&Default::default()));
        hex(&mac.chain_update(message).finalize().into_bytes())
    }
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    // A digit table, not `format!` per byte: a turn's ids cost 40 allocations that way.
    let digit = |nibble: u8| char::from(b"0123456789abcdef"[usize::from(nibble)]);
    String::from_iter(bytes.iter().flat_map(|b| [digit(b >> 4), digit(b & 15)]))
}

/// Whether `given` equals `expected` (never empty), in constant time in `expected`:
/// the work done depends only on the length of `given`, which the peer chose, never
/// on where the first difference is or on how long `expected` is.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, byte) in given.iter().enumerate() {
        diff |= byte ^ expected[i % expected.len()];
    }
    diff == 0
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
}
