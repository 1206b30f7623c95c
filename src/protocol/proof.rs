//! The health proof's pure parts (contract section 6.1): the nonce's format (its
//! header is `http`'s `NONCE_HEADER`), and the exact bytes the HMAC is taken over. The HMAC itself is
//! [`crate::secret`]'s; nothing here touches a key.

use std::net::{IpAddr, SocketAddr};

/// Hex digits in a nonce: 128 random bits.
pub const NONCE_HEX_DIGITS: usize = 32;

/// The first line of every proof message: the construction's version.
pub const PROOF_LABEL: &str = "loopbus-proof-v1";

/// Whether `nonce` is exactly [`NONCE_HEX_DIGITS`] lowercase hex digits. A server
/// answers a malformed nonce without `proof`.
pub fn is_valid_nonce(nonce: &[u8]) -> bool {
    nonce.len() == NONCE_HEX_DIGITS && nonce.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The bytes a proof is the HMAC of: `loopbus-proof-v1\n<instance>\n<host>:<port>\n<nonce>`,
/// where `host:port` is the address the connection arrived on, as in a Host header
/// (`127.0.0.1:7701`, `[::1]:7701`).
pub fn proof_message(instance: &str, ip: IpAddr, port: u16, nonce: &str) -> Vec<u8> {
    let address = SocketAddr::new(ip, port);
    format!("{PROOF_LABEL}\n{instance}\n{address}\n{nonce}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn nonce_format_table() {
        let good = "0123456789abcdef0123456789abcdef";
        let cases: &[(&str, bool)] = &[
            (good, true),
            ("ffffffffffffffffffffffffffffffff", true),
            (&good[..31], false),
            ("0123456789abcdef0123456789abcdef0", false),
            ("0123456789ABCDEF0123456789abcdef", false),
            ("0123456789abcdeg0123456789abcdef", false),
            (" 123456789abcdef0123456789abcdef", false),
            ("", false),
        ];
        for (nonce, want) in cases {
            assert_eq!(is_valid_nonce(nonce.as_bytes()), *want, "{nonce:?}");
        }
    }

    #[test]
    fn message_format() {
        let nonce = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            proof_message("worker", IpAddr::V4(Ipv4Addr::LOCALHOST), 7701, nonce),
            b"loopbus-proof-v1\nworker\n127.0.0.1:7701\n0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            proof_message("w", IpAddr::V6(Ipv6Addr::LOCALHOST), 1, nonce),
            b"loopbus-proof-v1\nw\n[::1]:1\n0123456789abcdef0123456789abcdef"
        );
    }
}
