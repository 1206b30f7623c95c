//! Checks 1-6 of the contract's table (section 3), decided from a request head alone:
//! pure functions of the head and the settings they need, so that an unauthorized
//! body is never read and every rule is tested with plain values.

use super::Refusal;
use crate::http::Head;
use crate::protocol::MAX_BODY_BYTES;
use crate::secret::Secret;

/// Content types a browser can send cross-origin without a preflight.
const BROWSER_FORM_TYPES: [&str; 3] = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
];

/// Check 1, on every request: exactly one `Host`, one of `127.0.0.1:PORT`,
/// `localhost:PORT` and `[::1]:PORT` with our `port`, and no `Origin` or `Referer` (the
/// request does not come from a browser page).
pub(crate) fn check_origin(head: &Head, port: u16) -> Result<(), Refusal> {
    let mut hosts = head.header_values("host");
    // The port as `{port}` writes it: digits without a sign or a leading zero.
    let one_allowed = |host: &[u8]| {
        let names = ["127.0.0.1:", "localhost:", "[::1]:"].map(str::as_bytes);
        let digits = names.into_iter().find_map(|name| host.strip_prefix(name));
        let digits = digits.filter(|d| matches!(d.first(), Some(b'1'..=b'9')));
        digits.and_then(|d| std::str::from_utf8(d).ok()?.parse().ok()) == Some(port)
    };
    if !matches!((hosts.next(), hosts.next()), (Some(host), None) if one_allowed(host)) {
        return Err(Refusal::BadHost);
    }
    if head.has_header("origin") || head.has_header("referer") {
        return Err(Refusal::BrowserOrigin);
    }
    Ok(())
}

/// Checks 2-6 on a talk head, in order: content type, framing, size, bus enabled,
/// bearer secret. On success, the body length to read.
pub(crate) fn check_talk_head(
    head: &Head,
    bus_enabled: bool,
    secret: &Secret,
) -> Result<usize, Refusal> {
    for value in head.header_values("content-type") {
        let end = value.iter().position(|b| *b == b';').unwrap_or(value.len());
        let media = value[..end].trim_ascii();
        if BROWSER_FORM_TYPES
            .iter()
            .any(|t| t.as_bytes().eq_ignore_ascii_case(media))
        {
            return Err(Refusal::BrowserContentType);
        }
    }
    let length = head.content_length().map_err(Refusal::Length)?;
    if length > MAX_BODY_BYTES {
        return Err(Refusal::TooLarge);
    }
    if !bus_enabled {
        return Err(Refusal::BusDisabled);
    }
    let mut auth = head.header_values("authorization");
    if !matches!((auth.next(), auth.next()), (Some(value), None) if secret.matches_bearer(value)) {
        return Err(Refusal::Unauthorized);
    }
    // `length` is at most MAX_BODY_BYTES, which fits in usize.
    Ok(usize::try_from(length).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::LengthError;
    use std::time::Instant;

    fn head(headers: &[(&str, &str)]) -> Head {
        Head {
            method: "POST".into(),
            target: "/api/talk".into(),
            minor_version: 1,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            received_at: Instant::now(),
        }
    }

    /// The framing rule itself is tabled in `http::headers`; here, that a talk head
    /// failing it is refused with its reason, 411 when the length is missing and 400
    /// otherwise.
    #[test]
    fn content_length_failures_map_to_their_refusals() {
        let secret = Secret::new("s3cret").unwrap();
        type Row<'a> = (&'a [(&'a str, &'a str)], Result<usize, (LengthError, u16)>);
        let cases: &[Row] = &[
            (&[("Content-Length", "10")], Ok(10)),
            (&[], Err((LengthError::Missing, 411))),
            (
                &[("Content-Length", "1 ")],
                Err((LengthError::Invalid, 400)),
            ),
            (
                &[("Content-Length", "5"), ("Content-Length", "6")],
                Err((LengthError::Conflict, 400)),
            ),
            (
                &[("Transfer-Encoding", "identity"), ("Content-Length", "5")],
                Err((LengthError::TransferEncoding, 400)),
            ),
        ];
        for (headers, want) in cases {
            let mut headers = headers.to_vec();
            headers.push(("Authorization", "Bearer s3cret"));
            let got = check_talk_head(&head(&headers), true, &secret).map_err(|refusal| {
                let Refusal::Length(error) = refusal else {
                    panic!("{headers:?}: {refusal:?}")
                };
                (error, Refusal::Length(error).status_and_code().0)
            });
            assert_eq!(&got, want, "{headers:?}");
        }
    }

    #[test]
    fn origin_table() {
        type Row<'a> = (&'a [(&'a str, &'a str)], Result<(), Refusal>);
        let cases: &[Row] = &[
            (&[("Host", "127.0.0.1:7701")], Ok(())),
            (&[("Host", "localhost:7701")], Ok(())),
            (&[("Host", "[::1]:7701")], Ok(())),
            (&[], Err(Refusal::BadHost)),
            (&[("Host", "127.0.0.1:7702")], Err(Refusal::BadHost)),
            (&[("Host", "127.0.0.1")], Err(Refusal::BadHost)),
            (&[("Host", "127.0.0.1:07701")], Err(Refusal::BadHost)),
            (&[("Host", "127.0.0.1:+7701")], Err(Refusal::BadHost)),
            (&[("Host", "localhost:7701 ")], Err(Refusal::BadHost)),
            (&[("Host", "[::1]:77010")], Err(Refusal::BadHost)),
            (&[("Host", "[::1]:")], Err(Refusal::BadHost)),
            (&[("Host", "evil.example:7701")], Err(Refusal::BadHost)),
            (
                &[("Host", "127.0.0.1:7701"), ("Host", "127.0.0.1:7701")],
                Err(Refusal::BadHost),
            ),
            (
                &[("Host", "127.0.0.1:7701"), ("Origin", "null")],
                Err(Refusal::BrowserOrigin),
            ),
            (
                &[("Host", "127.0.0.1:7701"), ("Referer", "http://x/")],
                Err(Refusal::BrowserOrigin),
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(&check_origin(&head(headers), 7701), want, "{headers:?}");
        }
    }

    /// Checks 2-6 in the contract's order: each row breaks one rule and every rule
    /// after it, and must be refused for the first.
    #[test]
    fn talk_head_checks_in_order() {
        let secret = Secret::new("s3cret").unwrap();
        let good: &[(&str, &str)] = &[
            ("Content-Type", "application/json"),
            ("Content-Length", "2"),
            ("Authorization", "Bearer s3cret"),
        ];
        assert_eq!(check_talk_head(&head(good), true, &secret), Ok(2));
        let too_long = (MAX_BODY_BYTES + 1).to_string();
        type Row<'a> = (&'a [(&'a str, &'a str)], bool, Refusal);
        let cases: &[Row] = &[
            (
                &[
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Transfer-Encoding", "chunked"),
                ],
                false,
                Refusal::BrowserContentType,
            ),
            (
                &[
                    ("Content-Type", "Multipart/Form-Data"),
                    ("Content-Length", "2"),
                ],
                true,
                Refusal::BrowserContentType,
            ),
            (
                &[("Transfer-Encoding", "chunked")],
                false,
                Refusal::Length(LengthError::TransferEncoding),
            ),
            (
                &[("Content-Length", too_long.as_str())],
                false,
                Refusal::TooLarge,
            ),
            (&[("Content-Length", "2")], false, Refusal::BusDisabled),
            (&[("Content-Length", "2")], true, Refusal::Unauthorized),
            (
                &[("Content-Length", "2"), ("Authorization", "Bearer wrong")],
                true,
                Refusal::Unauthorized,
            ),
            (
                &[
                    ("Content-Length", "2"),
                    ("Authorization", "Bearer s3cret"),
                    ("Authorization", "Bearer s3cret"),
                ],
                true,
                Refusal::Unauthorized,
            ),
        ];
        for (headers, enabled, want) in cases {
            assert_eq!(
                check_talk_head(&head(headers), *enabled, &secret),
                Err(want.clone()),
                "{headers:?}"
            );
        }
    }
}
