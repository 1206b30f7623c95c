//! The caller's side of the health proof: checking a server's `proof` before the
//! secret goes out on that connection (contract section 6.1).

use super::{Secret, PROOF_BYTES};
use hmac::Mac;

impl Secret {
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
