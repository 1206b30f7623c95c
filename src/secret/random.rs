//! The OS randomness that secrets, proof nonces and request ids are made of.

use super::{hex, Secret};
use std::fs::File;
use std::io::{self, Read};

/// Bytes of OS randomness in a generated secret (written as twice as many hex digits).
pub const SECRET_BYTES: usize = 32;

impl Secret {
    /// A fresh random secret: [`SECRET_BYTES`] bytes from the OS, as lowercase hex.
    ///
    /// # Errors
    ///
    /// The OS's randomness could not be read.
    pub fn generate() -> io::Result<Secret> {
        // `random_hex` of a non-zero count is never empty.
        random_hex(SECRET_BYTES).map(Secret)
    }
}

/// The OS's randomness device.
const RANDOM_DEVICE: &str = "/dev/urandom";

/// Fills `buf` with random bytes from the OS.
///
/// # Errors
///
/// Any I/O error opening or reading [`RANDOM_DEVICE`].
fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    File::open(RANDOM_DEVICE)?.read_exact(buf)
}

/// `N` random bytes from the OS (`/dev/urandom`): request ids (contract 8.2) and
/// the client's retry jitter are made of them.
///
/// # Errors
///
/// Any I/O error opening or reading `/dev/urandom`.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    fill_random(&mut bytes).map(|()| bytes)
}

/// `bytes` random bytes from the OS (`/dev/urandom`), as lowercase hex (`2 * bytes`
/// characters).
///
/// # Errors
///
/// Any I/O error opening or reading `/dev/urandom`.
pub(crate) fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    fill_random(&mut buf).map(|()| hex(&buf))
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
