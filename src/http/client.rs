//! A small blocking HTTP/1.1 client for loopback peers, over `std::net::TcpStream`.
//!
//! It speaks just enough HTTP for the bus: `GET /api/health` and `POST /api/talk`,
//! one request at a time on one connection. Response heads are parsed by `httparse`;
//! every read is bounded ([`MAX_RESPONSE_HEAD_BYTES`], [`MAX_RESPONSE_HEADERS`],
//! [`MAX_RESPONSE_BODY_BYTES`]) and every wait has a deadline, so a peer that sends
//! too much or nothing at all costs a bounded amount of memory and time.
//!
//! Only loopback addresses are ever connected to: [`Connection::open`] refuses any
//! other address before a socket is created.

use crate::secret::Secret;
use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest wait for a loopback connect. A live loopback listener accepts at once (the
/// kernel completes the handshake); waiting longer only means its backlog is full.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one request to be written. The server allows 10 s for a body.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response status line plus headers accepted (the server's own head limit).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 16 * 1024;
/// Most headers accepted in one response.
pub const MAX_RESPONSE_HEADERS: usize = 64;
/// Largest response body accepted: 8 MiB. A reply is at most the engine's output
/// (`engine.maxOutputBytes`, 1 MiB by default), and JSON escaping can make one byte of
/// it six (`\u0001`), so this leaves room for a default engine's worst case.
pub const MAX_RESPONSE_BODY_BYTES: u64 = 8 << 20;
/// Size of each read from the socket.
const READ_CHUNK: usize = 16 * 1024;

/// The bus's health endpoint.
pub const HEALTH_PATH: &str = "/api/health";
/// The bus's talk endpoint.
pub const TALK_PATH: &str = "/api/talk";

/// Why an HTTP exchange did not produce a response. Messages never contain anything
/// the caller sent (so never a secret).
#[derive(Debug)]
pub enum HttpError {
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

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::NotLoopback(ip) => write!(f, "{ip} is not a loopback address"),
            HttpError::Connect(e) => write!(f, "cannot connect: {e}"),
            HttpError::Timeout => f.write_str("no answer in time"),
            HttpError::Io(e) => write!(f, "connection broken: {e}"),
            HttpError::Closed => f.write_str("connection closed before a complete answer"),
            HttpError::Malformed(what) => write!(f, "not a valid HTTP answer: {what}"),
            HttpError::UnsendableSecret => {
                f.write_str("the registered secret contains characters a header can't carry")
            }
        }
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpError::Connect(e) | HttpError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
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
    /// The minor HTTP version (1 for HTTP/1.1).
    pub minor_version: u8,
    /// `Content-Length`, if present (repeats must agree).
    pub content_length: Option<u64>,
    /// The peer said `Connection: close`.
    pub close: bool,
}

impl ResponseHead {
    /// Whether this response has no body whatever its headers say (1xx, 204, 304).
    fn bodiless(&self) -> bool {
        matches!(self.status, 100..=199 | 204 | 304)
    }
}

/// Parses a response head from the start of `bytes`: `Ok(None)` while incomplete,
/// else the head and its length in bytes.
///
/// # Errors
/// The head is malformed, longer than [`MAX_RESPONSE_HEAD_BYTES`], has more than
/// [`MAX_RESPONSE_HEADERS`] headers, uses `Transfer-Encoding`, or has a
/// `Content-Length` that is not all digits or is repeated with different values.
pub fn parse_head(bytes: &[u8]) -> Result<Option<(ResponseHead, usize)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if bytes.len() >= MAX_RESPONSE_HEAD_BYTES => {
            return Err(HttpError::Malformed("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::Malformed("too many response headers"))
        }
        Err(_) => return Err(HttpError::Malformed("malformed response head")),
    };
    if head_len > MAX_RESPONSE_HEAD_BYTES {
        return Err(HttpError::Malformed("response head too large"));
    }
    // A complete parse always sets the version and the code.
    let (Some(minor_version), Some(status)) = (response.version, response.code) else {
        return Err(HttpError::Malformed("malformed status line"));
    };
    let mut content_length = None;
    let mut close = false;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Malformed("Transfer-Encoding is not supported"));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let value = header.value.trim_ascii();
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                return Err(HttpError::Malformed("invalid Content-Length"));
            }
            let parsed = value.iter().fold(0u64, |n, d| {
                n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
            });
            if content_length.is_some_and(|previous| previous != parsed) {
                return Err(HttpError::Malformed("conflicting Content-Length headers"));
            }
            content_length = Some(parsed);
        } else if header.name.eq_ignore_ascii_case("connection") {
            close |= header
                .value
                .split(|b| *b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    Ok(Some((
        ResponseHead {
            status,
            minor_version,
            content_length,
            close,
        },
        head_len,
    )))
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
}

/// The time left until `deadline`, or [`HttpError::Timeout`] when none is.
fn remaining(deadline: Instant) -> Result<Duration, HttpError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or(HttpError::Timeout)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Connection {
    /// Connects to `addr`, waiting at most [`CONNECT_TIMEOUT`] and never past
    /// `deadline`.
    ///
    /// # Errors
    /// `addr` is not loopback ([`HttpError::NotLoopback`], before any socket is made),
    /// the connect failed, or the deadline passed.
    pub fn open(addr: SocketAddr, deadline: Instant) -> Result<Connection, HttpError> {
        if !addr.ip().is_loopback() {
            return Err(HttpError::NotLoopback(addr.ip()));
        }
        let wait = remaining(deadline)?.min(CONNECT_TIMEOUT);
        let stream = TcpStream::connect_timeout(&addr, wait).map_err(|e| {
            if is_timeout(&e) {
                HttpError::Timeout
            } else {
                HttpError::Connect(e)
            }
        })?;
        // Small requests: send them at once rather than waiting for more to coalesce.
        stream.set_nodelay(true).map_err(HttpError::Io)?;
        let host = match addr {
            SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
            SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        };
        Ok(Connection {
            stream,
            host,
            buffer: Vec::new(),
            reusable: true,
        })
    }

    /// Connects to `127.0.0.1:port`, or to `[::1]:port` when nothing listens on the
    /// former (an instance started with `--bind ::1`; the registry holds only ports).
    ///
    /// # Errors
    /// As [`Connection::open`]; when both addresses refuse, the IPv4 error.
    pub fn open_local(port: u16, deadline: Instant) -> Result<Connection, HttpError> {
        match Connection::open(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), deadline) {
            Err(HttpError::Connect(refused)) => {
                Connection::open(SocketAddr::from((Ipv6Addr::LOCALHOST, port)), deadline)
                    .map_err(|_| HttpError::Connect(refused))
            }
            other => other,
        }
    }

    /// Whether another request may be sent on this connection: the last response was
    /// HTTP/1.1, framed by `Content-Length`, without `Connection: close`.
    pub fn is_reusable(&self) -> bool {
        self.reusable
    }

    /// `GET /api/health`, keeping the connection open for a following request.
    ///
    /// # Errors
    /// See [`HttpError`]; also [`HttpError::Closed`] if the connection is not reusable.
    pub fn get_health(&mut self, deadline: Instant) -> Result<Response, HttpError> {
        let head = format!(
            "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: loopbus/{}\r\n\r\n",
            self.host,
            env!("CARGO_PKG_VERSION")
        );
        self.exchange(head.as_bytes(), &[], deadline)
    }

    /// `POST /api/talk` with a JSON `body` and `Authorization: Bearer <secret>`, asking
    /// the server to close the connection afterwards.
    ///
    /// # Errors
    /// See [`HttpError`]; also [`HttpError::Closed`] if the connection is not reusable.
    pub fn post_talk(
        &mut self,
        secret: &Secret,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Response, HttpError> {
        if !is_header_value(secret.expose()) {
            return Err(HttpError::UnsendableSecret);
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
    ) -> Result<Response, HttpError> {
        if !self.reusable {
            return Err(HttpError::Closed);
        }
        self.reusable = false;
        let wait = remaining(deadline)?.min(WRITE_TIMEOUT);
        self.stream
            .set_write_timeout(Some(wait))
            .map_err(HttpError::Io)?;
        let written = self
            .stream
            .write_all(head)
            .and_then(|()| self.stream.write_all(body));
        if let Err(e) = written {
            if is_timeout(&e) {
                return Err(HttpError::Timeout);
            }
            // The server may have answered from the head alone and closed; its answer
            // can still be waiting in our receive buffer.
            return self.read_response(deadline).map_err(|_| HttpError::Io(e));
        }
        self.read_response(deadline)
    }

    /// Reads more bytes into the buffer. `Ok(false)` at end of stream.
    fn fill(&mut self, deadline: Instant) -> Result<bool, HttpError> {
        let wait = remaining(deadline)?;
        self.stream
            .set_read_timeout(Some(wait))
            .map_err(HttpError::Io)?;
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buffer.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(HttpError::Timeout),
                Err(e) => return Err(HttpError::Io(e)),
            }
        }
    }

    /// Reads one final response (skipping interim 1xx ones).
    fn read_response(&mut self, deadline: Instant) -> Result<Response, HttpError> {
        let head = loop {
            match parse_head(&self.buffer)? {
                Some((head, len)) => {
                    self.buffer.drain(..len);
                    // 101 would switch protocols, which we never ask for.
                    if head.status / 100 == 1 && head.status != 101 {
                        continue;
                    }
                    break head;
                }
                None => {
                    if !self.fill(deadline)? {
                        return Err(HttpError::Closed);
                    }
                }
            }
        };
        if head.status == 101 {
            return Err(HttpError::Malformed("unexpected 101 Switching Protocols"));
        }
        let body = if head.bodiless() {
            Vec::new()
        } else if let Some(length) = head.content_length {
            if length > MAX_RESPONSE_BODY_BYTES {
                return Err(HttpError::Malformed("response body too large"));
            }
            // `length` is at most MAX_RESPONSE_BODY_BYTES, which fits in usize.
            let length = usize::try_from(length).unwrap_or(usize::MAX);
            while self.buffer.len() < length {
                if !self.fill(deadline)? {
                    return Err(HttpError::Closed);
                }
            }
            let rest = self.buffer.split_off(length);
            std::mem::replace(&mut self.buffer, rest)
        } else {
            // No length: the body runs to the end of the stream.
            loop {
                if self.buffer.len() as u64 > MAX_RESPONSE_BODY_BYTES {
                    return Err(HttpError::Malformed("response body too large"));
                }
                if !self.fill(deadline)? {
                    break std::mem::take(&mut self.buffer);
                }
            }
        };
        self.reusable = head.minor_version == 1
            && !head.close
            && (head.content_length.is_some() || head.bodiless())
            && self.buffer.is_empty();
        Ok(Response {
            status: head.status,
            body,
        })
    }
}
