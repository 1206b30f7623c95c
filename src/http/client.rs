//! The client direction: a small blocking HTTP/1.1 client for loopback peers, over
//! `std::net::TcpStream`.
//!
//! It speaks just enough HTTP for the bus: `GET /api/health` and `POST /api/talk`,
//! one request at a time on one connection. Response heads are parsed by `httparse`
//! with the limits and the `Content-Length` rule the server side uses too
//! ([`super::content_length`]); every read is bounded (the head limits of both
//! directions, [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`], and [`MAX_RESPONSE_BODY_BYTES`])
//! and every wait has a deadline, so a peer that sends too much or nothing at all costs
//! a bounded amount of memory and time.
//!
//! Only loopback addresses are ever connected to: [`Connection::open_at`] refuses any
//! other address before a socket is created.

use super::headers::{
    self, LengthError, HEALTH_PATH, MAX_HEADERS, MAX_HEAD_BYTES, NONCE_HEADER, TALK_PATH,
};
use crate::secret::Secret;
use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest wait for a loopback connect. A live loopback listener accepts at once (the
/// kernel completes the handshake); waiting longer only means its backlog is full.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one request to be written. The server allows 10 s for a body.
pub const REQUEST_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted: 8 MiB. A reply is at most the engine's output
/// (`engine.maxOutputBytes`, 1 MiB by default), and JSON escaping can make one byte of
/// it six (`\u0001`), so this leaves room for a default engine's worst case.
pub const MAX_RESPONSE_BODY_BYTES: u64 = 8 << 20;
/// Size of each read from the socket.
const RESPONSE_READ_CHUNK: usize = 16 * 1024;

/// Why an HTTP exchange did not produce a response. Messages never contain anything
/// the caller sent (so never a secret).
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The address is not a loopback address; nothing was sent.
    NotLoopback(IpAddr),
    /// The connection could not be made (refused, nobody listening).
    Connect(io::Error),
    /// The deadline passed before the response was complete.
    Timeout,
    /// The connection broke while writing or reading.
    Io(io::Error),
    /// The peer closed the connection before a complete response.
    Closed,
    /// The response is not well-formed HTTP/1.1 within our limits; the text says how.
    Malformed(&'static str),
    /// The secret has characters a header value can't carry (control characters);
    /// nothing was sent.
    UnsendableSecret,
}

/// Whether `value` can be sent as a header value as it is: visible ASCII, spaces and
/// tabs, or non-ASCII bytes; no control characters (CR and LF above all).
fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NotLoopback(ip) => write!(f, "{ip} is not a loopback address"),
            ClientError::Connect(e) => write!(f, "cannot connect: {e}"),
            ClientError::Timeout => f.write_str("no answer in time"),
            ClientError::Io(e) => write!(f, "connection broken: {e}"),
            ClientError::Closed => f.write_str("connection closed before a complete answer"),
            ClientError::Malformed(what) => write!(f, "not a valid HTTP answer: {what}"),
            ClientError::UnsendableSecret => {
                f.write_str("the registered secret contains characters a header can't carry")
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Connect(e) | ClientError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// A complete response as the client received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedResponse {
    /// The status code.
    pub status: u16,
    /// The body, at most [`MAX_RESPONSE_BODY_BYTES`].
    pub body: Vec<u8>,
}

/// What a response head says, as far as this client cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// `Content-Length`, if present (repeats must agree).
    pub content_length: Option<u64>,
    /// HTTP/1.1 without `Connection: close`: the peer may keep the connection open.
    pub keep_alive: bool,
}

/// Parses a response head from the start of `bytes`: `Ok(None)` while incomplete,
/// else the head and its length in bytes.
///
/// # Errors
/// The head is malformed, longer than `MAX_HEAD_BYTES`, has more than
/// `MAX_HEADERS` headers, uses `Transfer-Encoding`, or has a
/// `Content-Length` that is not all digits or is repeated with different values (the
/// one rule of `http::headers::content_length`).
pub fn parse_response_head(bytes: &[u8]) -> Result<Option<(ResponseHead, usize)>, ClientError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let head_len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD_BYTES => Ok(len),
        Ok(httparse::Status::Partial) if bytes.len() < MAX_HEAD_BYTES => return Ok(None),
        Ok(_) => Err("response head too large"),
        Err(httparse::Error::TooManyHeaders) => Err("too many response headers"),
        Err(_) => Err("malformed response head"),
    }
    .map_err(ClientError::Malformed)?;
    // A complete parse always sets the version and the code.
    let (Some(minor_version), Some(status)) = (response.version, response.code) else {
        return Err(ClientError::Malformed("malformed status line"));
    };
    let pairs = response.headers.iter().map(|h| (h.name, h.value));
    let content_length = match headers::content_length(pairs.clone()) {
        Ok(length) => Some(length),
        // No length: the body runs to the end of the stream.
        Err(LengthError::Missing) => None,
        Err(invalid) => return Err(ClientError::Malformed(invalid.as_str())),
    };
    let connection = pairs.filter(|(name, _)| name.eq_ignore_ascii_case("connection"));
    let keep_alive = minor_version == 1 && !headers::asks_to_close(connection.map(|(_, v)| v));
    let head = ResponseHead {
        status,
        content_length,
        keep_alive,
    };
    Ok(Some((head, head_len)))
}

/// One connection to a loopback HTTP/1.1 server.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    /// The `Host` header value for this address (`127.0.0.1:PORT`, `[::1]:PORT`).
    host: String,
    /// Bytes read but not yet consumed.
    buffer: Vec<u8>,
    /// Whether another request may be sent after the last response.
    reusable: bool,
    /// Whether the last request was written whole (so that the peer may act on it).
    sent: bool,
}

/// The time left until `deadline`, or [`ClientError::Timeout`] when none is.
fn remaining(deadline: Instant) -> Result<Duration, ClientError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or(ClientError::Timeout)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Connection {
    /// Connects to exactly `ip:port` (a registry entry's `host` and `port`), never to
    /// another address or family: a listener on 127.0.0.1 must not catch a client of
    /// an instance bound to `::1` (contract 6). Waits at most [`CONNECT_TIMEOUT`] and
    /// never past `deadline`.
    ///
    /// # Errors
    /// `ip` is not loopback ([`ClientError::NotLoopback`], before any socket is made),
    /// the connect failed, or the deadline passed.
    pub fn open_at(ip: IpAddr, port: u16, deadline: Instant) -> Result<Connection, ClientError> {
        if !ip.is_loopback() {
            return Err(ClientError::NotLoopback(ip));
        }
        let addr = SocketAddr::new(ip, port);
        let wait = remaining(deadline)?.min(CONNECT_TIMEOUT);
        let stream = match TcpStream::connect_timeout(&addr, wait) {
            Err(e) if is_timeout(&e) => return Err(ClientError::Timeout),
            connected => connected.map_err(ClientError::Connect)?,
        };
        // Small requests: send them at once rather than waiting for more to coalesce.
        stream.set_nodelay(true).map_err(ClientError::Io)?;
        Ok(Connection {
            stream,
            host: addr.to_string(),
            buffer: Vec::new(),
            reusable: true,
            sent: false,
        })
    }

    /// The server's address and this end's address of the connection.
    ///
    /// # Errors
    /// The socket is no longer connected.
    pub fn addresses(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.stream.peer_addr()?, self.stream.local_addr()?))
    }

    /// Whether another request may be sent on this connection: the last response was
    /// HTTP/1.1, framed by `Content-Length`, without `Connection: close`.
    pub fn is_reusable(&self) -> bool {
        self.reusable
    }

    /// Whether the last request went out whole: after a failure, whether the peer may
    /// have acted on it (a connection broken after this point may have run a turn).
    pub fn request_sent(&self) -> bool {
        self.sent
    }

    /// `GET /api/health`, keeping the connection open for a following request, with
    /// `X-Loopbus-Nonce: <nonce>` when `nonce` is given (contract 6.1; the nonce's
    /// format is the protocol's business, the header's is this layer's).
    ///
    /// # Errors
    /// See [`ClientError`]; also [`ClientError::Closed`] if the connection is not
    /// reusable, and [`ClientError::Malformed`] for a nonce that is no header value.
    pub fn get_health(
        &mut self,
        nonce: Option<&str>,
        deadline: Instant,
    ) -> Result<ReceivedResponse, ClientError> {
        let nonce_line = match nonce {
            Some(nonce) if is_header_value(nonce) => format!("{NONCE_HEADER}: {nonce}\r\n"),
            Some(_) => return Err(ClientError::Malformed("the proof nonce is no header value")),
            None => String::new(),
        };
        let head = format!(
            "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: loopbus/{}\r\n{nonce_line}\r\n",
            self.host,
            env!("CARGO_PKG_VERSION")
        );
        self.exchange(head.as_bytes(), &[], deadline)
    }

    /// `POST /api/talk` with a JSON `body` and `Authorization: Bearer <secret>`, asking
    /// the server to close the connection afterwards.
    ///
    /// # Errors
    /// See [`ClientError`]; also [`ClientError::Closed`] if the connection is not reusable.
    pub fn post_talk(
        &mut self,
        secret: &Secret,
        body: &[u8],
        deadline: Instant,
    ) -> Result<ReceivedResponse, ClientError> {
        if !is_header_value(secret.expose()) {
            return Err(ClientError::UnsendableSecret);
        }
        let head = format!(
            "POST {TALK_PATH} HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nUser-Agent: loopbus/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.host,
            secret.bearer_header(),
            env!("CARGO_PKG_VERSION"),
            body.len()
        );
        self.exchange(head.as_bytes(), body, deadline)
    }

    /// Writes one request and reads its response.
    fn exchange(
        &mut self,
        head: &[u8],
        body: &[u8],
        deadline: Instant,
    ) -> Result<ReceivedResponse, ClientError> {
        if !self.reusable {
            return Err(ClientError::Closed);
        }
        self.reusable = false;
        self.sent = false;
        let wait = remaining(deadline)?.min(REQUEST_WRITE_TIMEOUT);
        self.stream
            .set_write_timeout(Some(wait))
            .map_err(ClientError::Io)?;
        // One write for head and body: written apart, the server's loop wakes for the
        // head, runs its checks and sleeps again before the body comes.
        match self.stream.write_all(&[head, body].concat()) {
            Err(e) if is_timeout(&e) => Err(ClientError::Timeout),
            // The server may have answered from the head alone and closed; its answer
            // can still be waiting in our receive buffer.
            Err(e) => self.read_response(deadline).map_err(|_| ClientError::Io(e)),
            Ok(()) => {
                self.sent = true;
                self.read_response(deadline)
            }
        }
    }

    /// Reads more bytes into the buffer. `Ok(false)` at end of stream.
    fn fill(&mut self, deadline: Instant) -> Result<bool, ClientError> {
        let wait = remaining(deadline)?;
        self.stream
            .set_read_timeout(Some(wait))
            .map_err(ClientError::Io)?;
        let mut chunk = [0u8; RESPONSE_READ_CHUNK];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buffer.extend_from_slice(&chunk[..n]);
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(ClientError::Timeout),
                Err(e) => return Err(ClientError::Io(e)),
            }
        }
    }

    /// Reads one final response (skipping interim 1xx ones).
    fn read_response(&mut self, deadline: Instant) -> Result<ReceivedResponse, ClientError> {
        let head = loop {
            let Some((head, len)) = parse_response_head(&self.buffer)? else {
                if !self.fill(deadline)? {
                    return Err(ClientError::Closed);
                }
                continue;
            };
            self.buffer.drain(..len);
            match head.status {
                // 101 would switch protocols, which we never ask for.
                101 => return Err(ClientError::Malformed("unexpected 101 Switching Protocols")),
                100..=199 => {}
                _ => break head,
            }
        };
        // 204 and 304 have no body whatever the head says; without a length, the body
        // runs to the end of the stream.
        let length = match head.status {
            204 | 304 => Some(0),
            _ => head.content_length,
        };
        let too_large = ClientError::Malformed("response body too large");
        if length.is_some_and(|length| length > MAX_RESPONSE_BODY_BYTES) {
            return Err(too_large);
        }
        while length.is_none_or(|length| (self.buffer.len() as u64) < length) {
            if self.buffer.len() as u64 > MAX_RESPONSE_BODY_BYTES {
                return Err(too_large);
            }
            if !self.fill(deadline)? {
                if length.is_some() {
                    return Err(ClientError::Closed);
                }
                break;
            }
        }
        // The length is at most MAX_RESPONSE_BODY_BYTES, which fits in usize.
        let end = length.map_or(self.buffer.len(), |n| usize::try_from(n).unwrap_or(0));
        let rest = self.buffer.split_off(end);
        let body = std::mem::replace(&mut self.buffer, rest);
        self.reusable = head.keep_alive && length.is_some() && self.buffer.is_empty();
        Ok(ReceivedResponse {
            status: head.status,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn response_head_table() {
        let head = |status, content_length, keep_alive| ResponseHead {
            status,
            content_length,
            keep_alive,
        };
        // (bytes, parsed head; its length is up to the blank line)
        type Row = (&'static [u8], Option<ResponseHead>);
        let ok: &[Row] = &[
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
                Some(head(200, Some(2), true)),
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nContent-Length: 02\r\n\r\n",
                Some(head(200, Some(2), true)),
            ),
            (
                b"HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                Some(head(401, Some(0), false)),
            ),
            (
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n\r\n",
                Some(head(200, None, false)),
            ),
            (b"HTTP/1.0 200 OK\r\n\r\n", Some(head(200, None, false))),
            (
                b"HTTP/1.1 204 No Content\r\n\r\n",
                Some(head(204, None, true)),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                Some(head(200, Some(u64::MAX), true)),
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Len", None),
            (b"", None),
            (b"HTTP/1.1 2", None),
        ];
        for (bytes, want) in ok {
            let got = parse_response_head(bytes)
                .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(bytes)));
            let want = want.clone().map(|head| {
                let blank = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                (head, blank + 4)
            });
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(bytes));
        }
        let many_headers = format!("HTTP/1.1 200 OK\r\n{}\r\n", "X: y\r\n".repeat(65));
        let long_head = format!("HTTP/1.1 200 OK\r\nX: {}", "y".repeat(20_000));
        let bad: Vec<(&[u8], &str)> = vec![
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                "Transfer-Encoding",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                "conflicting",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
                "invalid Content-Length",
            ),
            (b"SSH-2.0-OpenSSH_9.6\r\n", "malformed"),
            (b"{\"success\":true}", "malformed"),
            (b"HTTP/1.1 abc OK\r\n\r\n", "malformed"),
            (many_headers.as_bytes(), "too many"),
            (long_head.as_bytes(), "too large"),
        ];
        for (bytes, want) in bad {
            match parse_response_head(bytes) {
                Err(ClientError::Malformed(what)) => {
                    assert!(
                        what.contains(want),
                        "{what} for {:?}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(60)])
                    )
                }
                other => panic!(
                    "{other:?} for {:?}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(60)])
                ),
            }
        }
    }

    #[test]
    fn only_loopback_and_only_sendable_secrets() {
        let soon = Instant::now() + Duration::from_secs(1);
        for addr in [
            "10.0.0.1:80",
            "192.168.1.1:7701",
            "[2001:db8::1]:80",
            "0.0.0.0:80",
        ] {
            let addr: std::net::SocketAddr = addr.parse().unwrap();
            let refused = Connection::open_at(addr.ip(), addr.port(), soon).unwrap_err();
            assert!(
                matches!(refused, ClientError::NotLoopback(_)),
                "{addr}: {refused}"
            );
        }
        // A listener that never answers: the secret check fails before any write.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        for bad in ["a\r\nX-Injected: 1", "nul\0", "bell\u{7}"] {
            let mut connection =
                Connection::open_at(Ipv4Addr::LOCALHOST.into(), port, soon).unwrap();
            let secret = Secret::new(bad).unwrap();
            let error = connection.post_talk(&secret, b"{}", soon).unwrap_err();
            assert!(matches!(error, ClientError::UnsendableSecret), "{error}");
            assert!(!error.to_string().contains(bad));
        }
        // Nobody listening: refused, quickly; and never another family instead.
        drop(listener);
        let error = Connection::open_at(Ipv4Addr::LOCALHOST.into(), port, soon).unwrap_err();
        assert!(matches!(error, ClientError::Connect(_)), "{error}");
        if let Ok(v4) = std::net::TcpListener::bind("127.0.0.1:0") {
            let port = v4.local_addr().unwrap().port();
            let error = Connection::open_at(Ipv6Addr::LOCALHOST.into(), port, soon).unwrap_err();
            assert!(matches!(error, ClientError::Connect(_)), "{error}");
        }
    }
}
