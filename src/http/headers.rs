//! What both directions of the HTTP layer share: the head limits, the endpoint paths,
//! the `Content-Length` rule and the comma-separated token scan of `Connection`.

/// Largest head (request or status line plus headers) read in either direction; past
/// it a request is answered 431 and a response is refused as invalid.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most headers in one head, in either direction; past it a request is answered 431
/// and a response is refused as invalid.
pub const MAX_HEADERS: usize = 64;

/// The bus's talk endpoint.
pub const TALK_PATH: &str = "/api/talk";
/// The bus's health endpoint.
pub const HEALTH_PATH: &str = "/api/health";
/// The request header that carries a health probe's proof nonce (contract 6.1).
pub const NONCE_HEADER: &str = "X-Loopbus-Nonce";

/// Why a head has no usable `Content-Length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthError {
    /// No `Content-Length` header.
    Missing,
    /// A `Content-Length` value is not all ASCII digits (empty, signed, a list...).
    Invalid,
    /// `Content-Length` is repeated with different values.
    Conflict,
    /// `Transfer-Encoding` is present: only `Content-Length` framing is accepted.
    TransferEncoding,
}

impl LengthError {
    /// What is wrong, in a few words (the client's `Malformed` reason).
    pub fn as_str(self) -> &'static str {
        match self {
            LengthError::Missing => "no Content-Length",
            LengthError::Invalid => "invalid Content-Length",
            LengthError::Conflict => "conflicting Content-Length headers",
            LengthError::TransferEncoding => "Transfer-Encoding is not supported",
        }
    }
}

/// The body length a head declares, from its headers as `(name, value)` pairs in order
/// (names case-insensitive, values as received).
///
/// The one rule for both directions: any `Transfer-Encoding` is refused; every
/// `Content-Length` value must be ASCII digits only (no sign, no whitespace: `httparse`
/// already strips the optional whitespace around a value); repeats must agree on the
/// number (`5` and `005` do); an absurdly long number saturates at `u64::MAX`, which
/// is still a length, refused later as too large.
///
/// # Errors
/// See [`LengthError`]; `Transfer-Encoding` wins over any `Content-Length` problem.
pub fn content_length<'a>(
    headers: impl Iterator<Item = (&'a str, &'a [u8])> + Clone,
) -> Result<u64, LengthError> {
    if headers
        .clone()
        .any(|(name, _)| name.eq_ignore_ascii_case("transfer-encoding"))
    {
        return Err(LengthError::TransferEncoding);
    }
    let mut length: Option<u64> = None;
    for (_, value) in headers.filter(|(name, _)| name.eq_ignore_ascii_case("content-length")) {
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return Err(LengthError::Invalid);
        }
        let parsed = value.iter().fold(0u64, |n, digit| {
            n.saturating_mul(10).saturating_add(u64::from(digit - b'0'))
        });
        match length {
            Some(previous) if previous != parsed => return Err(LengthError::Conflict),
            _ => length = Some(parsed),
        }
    }
    length.ok_or(LengthError::Missing)
}

/// Whether any of the `Connection` header values asks to close after this message: a
/// comma-separated list item `close` (case-insensitive, spaces around items ignored).
pub fn asks_to_close<'a>(connection_values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    connection_values.into_iter().any(|value| {
        value
            .split(|b| *b == b',')
            .any(|part| part.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn length(headers: &[(&str, &str)]) -> Result<u64, LengthError> {
        content_length(headers.iter().map(|(n, v)| (*n, v.as_bytes())))
    }

    #[test]
    fn content_length_table() {
        type Row<'a> = (&'a [(&'a str, &'a str)], Result<u64, LengthError>);
        let cases: &[Row] = &[
            (&[("Content-Length", "10")], Ok(10)),
            (&[("Content-Length", "0")], Ok(0)),
            (&[("Content-Length", "007")], Ok(7)),
            (&[("Content-Length", "5"), ("content-length", "5")], Ok(5)),
            (&[("Content-Length", "5"), ("content-length", "005")], Ok(5)),
            (&[("Host", "x"), ("CONTENT-LENGTH", "3")], Ok(3)),
            (
                &[("Content-Length", "99999999999999999999999")],
                Ok(u64::MAX),
            ),
            (&[], Err(LengthError::Missing)),
            (&[("Content-Type", "a/b")], Err(LengthError::Missing)),
            (&[("Content-Length", "")], Err(LengthError::Invalid)),
            (&[("Content-Length", "-1")], Err(LengthError::Invalid)),
            (&[("Content-Length", "+1")], Err(LengthError::Invalid)),
            (&[("Content-Length", "1 ")], Err(LengthError::Invalid)),
            (&[("Content-Length", " 1")], Err(LengthError::Invalid)),
            (&[("Content-Length", "1,1")], Err(LengthError::Invalid)),
            (&[("Content-Length", "0x10")], Err(LengthError::Invalid)),
            (
                &[("Content-Length", "5"), ("Content-Length", "x")],
                Err(LengthError::Invalid),
            ),
            (
                &[("Content-Length", "5"), ("Content-Length", "6")],
                Err(LengthError::Conflict),
            ),
            (
                &[("Transfer-Encoding", "chunked")],
                Err(LengthError::TransferEncoding),
            ),
            (
                &[("Content-Length", "x"), ("transfer-encoding", "identity")],
                Err(LengthError::TransferEncoding),
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(&length(headers), want, "{headers:?}");
        }
    }

    #[test]
    fn connection_tokens() {
        let cases: &[(&[&str], bool)] = &[
            (&["close"], true),
            (&["Close"], true),
            (&["keep-alive, Close"], true),
            (&[" close ,x"], true),
            (&["a, b ,CLOSE"], true),
            (&["aclose"], false),
            (&["keep-alive", "close"], true),
            (&["keep-alive"], false),
            (&["closed"], false),
            (&["x-close"], false),
            (&[""], false),
            (&[], false),
        ];
        for (values, want) in cases {
            let got = asks_to_close(values.iter().map(|v| v.as_bytes()));
            assert_eq!(got, *want, "{values:?}");
        }
    }
}
