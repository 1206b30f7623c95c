//! The caller's side of the health proof: checking a server's `proof` before the
//! secret goes out on that connection (contract section 6.1).

use super::{constant_time_eq, Secret};

impl Secret {
    /// Whether `proof` is exactly [`Secret::proof`] of `message` (lowercase hex, so a
    /// malformed proof is no proof). The comparison is constant-time in the expected
    /// proof: the work done depends only on the length of `proof`, which the peer chose.
    pub fn verify_proof(&self, message: &[u8], proof: &str) -> bool {
        constant_time_eq(proof.as_bytes(), self.proof(message).as_bytes())
    }
}
