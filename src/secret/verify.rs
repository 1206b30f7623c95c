//! The caller's side of the health proof: checking a server's `proof` before the
//! secret goes out on that connection (contract section 6.1).

use super::{constant_time_eq, Secret};

impl Secret {
    /// Whether `proof` is exactly [`Secret::proof`] of `message` (lowercase hex, so a
    /// malformed proof is no proof), compared in constant time ([`constant_time_eq`]).
    pub fn verify_proof(&self, message: &[u8], proof: &str) -> bool {
        constant_time_eq(proof.as_bytes(), self.proof(message).as_bytes())
    }
}
