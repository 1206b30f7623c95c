//! One server connection as a sans-IO state machine: it takes the bytes read and the
//! time from its caller and says what to do next ([`Action`]). The phases: `ReadingHead`
//! → `Deciding` → `ReadingBody` → `Waiting` → `Writing` → `ReadingHead` again (keep-alive),
//! `Lingering` (after an early or error answer) or closed. Every method that can move
//! time takes `now`, so the tests drive each phase with a fake clock.

use super::headers::MAX_HEAD_BYTES;
use super::message::{parse_head, Head, HttpError, Response};
use std::time::{Duration, Instant};

/// Time allowed for a complete head after accept, or after the previous response.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the body once the head is complete; past it 408 and close.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a keep-alive connection may sit idle (no byte of a new request) before it closes.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for writing one response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// After answering a request whose body was never read, how long the connection keeps
/// reading and discarding what the client still sends, so that the client gets to
/// read the answer instead of a connection reset.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// Most heads served and bytes read per turn of one connection on the run queue: a
/// client pipelining without end cannot monopolize the loop.
pub const STEP_MAX_HEADS: usize = 8;
/// See [`STEP_MAX_HEADS`].
pub const STEP_MAX_READ: usize = 256 * 1024;
/// The answer to `Expect: 100-continue`.
pub(super) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// A kept-alive connection's input buffer larger than this is released between
/// requests rather than kept for the next one.
const KEEP_INPUT_CAPACITY: usize = 4096;

/// What a connection without the head it serves does (never happens: a head is kept
/// from its arrival to the end of its answer).
const CLOSE: Action<'static> = Action::Close(CloseReason::ServerAsked);

/// Why the connection decided to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No complete head within [`HEAD_TIMEOUT`].
    HeadTimeout,
    /// A kept-alive connection sent no byte of a new request within [`IDLE_TIMEOUT`].
    IdleTimeout,
    /// A response was not written within [`WRITE_TIMEOUT`].
    WriteTimeout,
    /// The reading and discarding after an early answer ran its [`LINGER_TIMEOUT`].
    LingerTimeout,
    /// The request did not allow keep-alive (`Connection: close`, or HTTP/1.0).
    ClientAsked,
    /// The response asked to close (the service chose so, or the loop is exiting).
    ServerAsked,
}

/// What closing a connection would lose, for eviction when the connection table is
/// full. The variants are in eviction order: the loop closes a connection of the first
/// class present, and within a class the one whose phase began first
/// ([`Conn::phase_started`]). [`Class::Authorized`] is never evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// The answer is out: lingering or closing. Nothing is lost but the linger.
    Done,
    /// A head not complete yet (a new connection that sent nothing too), or one the
    /// service has not decided on.
    IncompleteHead,
    /// Writing an answer that is not authorized work (health, a refusal, an HTTP-layer
    /// error): small, so one still being written is stalled behind a client that does
    /// not read.
    Answering,
    /// A kept-alive connection between requests (longest idle first).
    Idle,
    /// Authorized work: from the service agreeing to read the body (the head passed
    /// checks 1-6) until the answer is written (a 408 or 503 instead of it too). Never
    /// evicted; a client that never reads its answer is still bounded by [`WRITE_TIMEOUT`].
    Authorized,
}

/// What happens once the current response is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    KeepAlive,
    Close(CloseReason),
    /// Half-close, then read and discard until EOF or [`LINGER_TIMEOUT`] (the request
    /// announced a body that was never read, or the HTTP layer answered an error).
    Linger,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    ReadingHead,
    /// A complete head waits for the service's decision.
    Deciding,
    /// Reading `len` body bytes; `send_continue` until [`CONTINUE`] is written (whole,
    /// or the connection closes).
    ReadingBody { len: usize, send_continue: bool },
    /// The service answers later.
    Waiting,
    /// The HTTP layer answers this error itself; the service gives the response.
    Failing(HttpError),
    /// Writing a response: `written` bytes of `out` are out.
    Writing {
        out: Vec<u8>,
        written: usize,
        after: After,
    },
    /// Response written, body never read: discarding input until EOF or timeout.
    Lingering { shut_down: bool },
    /// Decided to close.
    Closing(CloseReason),
}

/// What the connection needs next from whoever owns its socket and its service.
#[derive(Debug)]
#[allow(dead_code, reason = "Close's reason: the loop closes whatever it is")]
pub enum Action<'a> {
    /// Read at most this many bytes, then pass them to [`Conn::received`].
    Read(usize),
    /// Write (a prefix of) these bytes, then report with [`Conn::wrote`].
    Write(&'a [u8]),
    /// Shut down the socket's write side: the answer is out, lingering begins.
    ShutdownWrite,
    /// A complete head: the service decides, then [`Conn::respond`],
    /// [`Conn::read_body`] or [`Conn::fail`].
    Head(&'a Head),
    /// A complete request: the service answers with [`Conn::respond`] now, or later
    /// (the connection waits meanwhile).
    Request(&'a Head, Vec<u8>),
    /// An error the HTTP layer answers itself (with the head when there is one): the
    /// service gives the response for [`Conn::respond`].
    Error(HttpError, Option<&'a Head>),
    /// Nothing to do until the service answers.
    Wait,
    /// This step's share ([`STEP_MAX_HEADS`], [`STEP_MAX_READ`]) is used; call
    /// [`Conn::begin_step`] and continue after the other connections.
    Yield,
    /// Close the connection.
    Close(CloseReason),
}

/// One connection's HTTP state, without its socket.
#[derive(Debug)]
pub struct Conn {
    phase: Phase,
    /// Bytes received and not yet consumed.
    inbuf: Vec<u8>,
    /// How many leading bytes of `inbuf` are known to hold no end of head.
    scanned: usize,
    /// The head being served (from its arrival to the end of its response).
    head: Option<Head>,
    /// Whether at least one response was completed (the idle timeout applies).
    served: bool,
    /// Whether the request being served is authorized work: the service agreed to read
    /// its body ([`Conn::read_body`]). Cleared once its answer is written.
    authorized: bool,
    /// Start of the current phase's clock, and the eviction order within a [`Class`].
    pub(super) phase_started: Instant,
    /// Heads served and bytes read in this step.
    step_heads: usize,
    step_read: usize,
}

impl Conn {
    /// A connection accepted at `now`, waiting for its first head.
    pub fn new(now: Instant) -> Conn {
        Conn {
            phase: Phase::ReadingHead,
            inbuf: Vec::new(),
            scanned: 0,
            head: None,
            served: false,
            authorized: false,
            phase_started: now,
            step_heads: 0,
            step_read: 0,
        }
    }

    /// Starts a new share of work (see [`Action::Yield`]).
    pub fn begin_step(&mut self) {
        self.step_heads = 0;
        self.step_read = 0;
    }

    /// The next thing to do; no I/O happens here. Call it again after doing each
    /// action.
    pub fn poll(&mut self, now: Instant) -> Action<'_> {
        let share_used = self.step_heads >= STEP_MAX_HEADS || self.step_read >= STEP_MAX_READ;
        match self.phase {
            // A head is always kept while deciding; without one there is nothing to
            // decide about.
            Phase::Deciding => self.head.as_ref().map_or(CLOSE, Action::Head),
            Phase::Failing(error) => Action::Error(error, self.head.as_ref()),
            Phase::Closing(reason) => Action::Close(reason),
            Phase::Waiting => Action::Wait,
            // Tell a waiting client (curl, for one) to send the body now.
            Phase::ReadingBody {
                send_continue: true,
                ..
            } => Action::Write(CONTINUE),
            Phase::Lingering { shut_down: false } => {
                self.phase = Phase::Lingering { shut_down: true };
                Action::ShutdownWrite
            }
            _ if share_used => Action::Yield,
            Phase::ReadingHead => self.poll_head(now),
            Phase::ReadingBody { len, .. } => self.poll_body(len),
            Phase::Writing {
                ref out, written, ..
            } => Action::Write(&out[written..]),
            Phase::Lingering { .. } => Action::Read(usize::MAX),
        }
    }

    /// Reading a head: parse what is there, or ask for more within the head limit.
    fn poll_head(&mut self, now: Instant) -> Action<'_> {
        match parse_head(&self.inbuf, &mut self.scanned, now) {
            Ok(Some((head, consumed))) => {
                self.step_heads += 1;
                self.inbuf.drain(..consumed);
                self.scanned = 0;
                self.phase = Phase::Deciding;
                Action::Head(self.head.insert(head))
            }
            Err(error) => {
                self.phase = Phase::Failing(error);
                Action::Error(error, self.head.as_ref())
            }
            Ok(None) => Action::Read(MAX_HEAD_BYTES + 1 - self.inbuf.len().min(MAX_HEAD_BYTES)),
        }
    }

    /// Reading a body of `len` bytes: hand it over once complete, or ask for the rest.
    fn poll_body(&mut self, len: usize) -> Action<'_> {
        if self.inbuf.len() < len {
            return Action::Read(len - self.inbuf.len());
        }
        let rest = self.inbuf.split_off(len);
        let body = std::mem::replace(&mut self.inbuf, rest);
        self.phase = Phase::Waiting;
        // A body is only read for a head that is kept.
        self.head
            .as_ref()
            .map_or(CLOSE, |head| Action::Request(head, body))
    }

    /// `bytes` were read from the socket. Reading starts no clock: a phase's deadline
    /// and its eviction order count from its start.
    pub fn received(&mut self, bytes: &[u8], _now: Instant) {
        self.step_read += bytes.len();
        if !matches!(self.phase, Phase::Lingering { .. }) {
            self.inbuf.extend_from_slice(bytes);
        }
    }

    /// `n` bytes of the [`Action::Write`] slice were written at `now`.
    pub fn wrote(&mut self, n: usize, now: Instant) {
        match &mut self.phase {
            Phase::Writing { out, written, .. } if *written + n < out.len() => *written += n,
            // The answer is out.
            Phase::Writing { after, .. } => {
                let after = *after;
                self.head = None;
                self.served = true;
                self.authorized = false;
                self.phase_started = now;
                // Lingering discards its input; an empty buffer past the keep size goes.
                let oversized =
                    self.inbuf.is_empty() && self.inbuf.capacity() > KEEP_INPUT_CAPACITY;
                if after == After::Linger || oversized {
                    self.inbuf = Vec::new();
                }
                self.phase = match after {
                    After::Linger => Phase::Lingering { shut_down: false },
                    After::Close(reason) => Phase::Closing(reason),
                    After::KeepAlive => Phase::ReadingHead,
                };
            }
            Phase::ReadingBody { send_continue, .. } if n >= CONTINUE.len() => {
                *send_continue = false;
            }
            // A fresh socket's buffer takes `100 Continue` whole; if not, give up.
            Phase::ReadingBody { .. } => self.phase = Phase::Closing(CloseReason::ServerAsked),
            _ => {}
        }
    }

    /// After [`Action::Head`]: read exactly `len` body bytes, from `now` on, into a
    /// buffer of exactly that size (the body budget counts it).
    pub fn read_body(&mut self, len: usize, now: Instant) {
        self.inbuf
            .reserve_exact(len.saturating_sub(self.inbuf.len()));
        let send_continue =
            len > self.inbuf.len() && self.head.as_ref().is_some_and(Head::expects_continue);
        self.phase = Phase::ReadingBody { len, send_continue };
        self.phase_started = now;
        self.authorized = true;
    }

    /// Starts writing `response` at `now`: the answer to a head, to a request, a
    /// deferred one, or to an HTTP-layer error ([`Action::Error`]).
    pub fn respond(&mut self, response: Response, now: Instant) {
        let linger = match self.phase {
            // After an error the connection closes, lingering so that the client can
            // read the answer.
            Phase::Failing(_) => true,
            // An answer from the head alone leaves any announced body unread.
            Phase::Deciding => self.head.as_ref().is_some_and(Head::announces_body),
            _ => false,
        };
        let keep_alive = self.head.as_ref().is_some_and(Head::wants_keep_alive);
        let after = match (linger, response.close, keep_alive) {
            (true, _, _) => After::Linger,
            (false, true, _) => After::Close(CloseReason::ServerAsked),
            (false, false, false) => After::Close(CloseReason::ClientAsked),
            (false, false, true) => After::KeepAlive,
        };
        let mut out = response.serialize(after != After::KeepAlive);
        // An answer to HEAD has the full answer's headers and no body (RFC 9110, 9.3.2).
        if self.head.as_ref().is_some_and(|h| h.method == "HEAD") {
            out.truncate(out.len() - response.body.len());
        }
        self.phase = Phase::Writing {
            out,
            written: 0,
            after,
        };
        self.phase_started = now;
    }

    /// The current phase's time limit, and the phase its passing leads to: a late body
    /// is answered 408, anything else closes.
    fn limit(&self) -> Option<(Duration, Phase)> {
        let close = |reason| Phase::Closing(reason);
        Some(match self.phase {
            Phase::ReadingHead if self.idle() => (IDLE_TIMEOUT, close(CloseReason::IdleTimeout)),
            Phase::ReadingHead => (HEAD_TIMEOUT, close(CloseReason::HeadTimeout)),
            Phase::ReadingBody { .. } => (BODY_TIMEOUT, Phase::Failing(HttpError::BodyTimeout)),
            Phase::Writing { .. } => (WRITE_TIMEOUT, close(CloseReason::WriteTimeout)),
            Phase::Lingering { .. } => (LINGER_TIMEOUT, close(CloseReason::LingerTimeout)),
            Phase::Deciding | Phase::Waiting | Phase::Failing(_) | Phase::Closing(_) => {
                return None
            }
        })
    }

    /// When the current phase times out, if it can.
    pub fn deadline(&self) -> Option<Instant> {
        self.limit().map(|(limit, _)| self.phase_started + limit)
    }

    /// Applies the current phase's timeout if its [`deadline`](Conn::deadline) has
    /// passed at `now`. Whether it had; [`poll`](Conn::poll) says what follows.
    pub fn expire(&mut self, now: Instant) -> bool {
        match self.limit() {
            Some((limit, next)) if now >= self.phase_started + limit => {
                self.phase = next;
                true
            }
            _ => false,
        }
    }

    /// A kept-alive connection between requests: served before, no byte of the next
    /// request yet.
    fn idle(&self) -> bool {
        self.served && self.inbuf.is_empty()
    }

    /// Answers `error` instead of the request: [`poll`](Conn::poll) asks for it next.
    pub fn fail(&mut self, error: HttpError) {
        self.phase = Phase::Failing(error);
    }

    /// Waiting for the service's deferred answer.
    pub fn is_waiting(&self) -> bool {
        self.phase == Phase::Waiting
    }

    /// Between requests with nothing received: closing it loses no request.
    pub fn is_between_requests(&self) -> bool {
        self.phase == Phase::ReadingHead && self.inbuf.is_empty()
    }

    /// Its eviction class.
    pub fn class(&self) -> Class {
        match self.phase {
            Phase::Lingering { .. } | Phase::Closing(_) => Class::Done,
            _ if self.authorized => Class::Authorized,
            Phase::ReadingHead if self.idle() => Class::Idle,
            Phase::ReadingHead | Phase::Deciding => Class::IncompleteHead,
            Phase::Failing(_) | Phase::Writing { .. } => Class::Answering,
            // Only an authorized request reads a body or waits for a deferred answer.
            Phase::ReadingBody { .. } | Phase::Waiting => Class::Authorized,
        }
    }

    /// Its shares of the loop's budgets: the declared length of the body being read,
    /// and the bytes of the response being written (head and body).
    pub fn in_flight(&self) -> (usize, usize) {
        match &self.phase {
            Phase::ReadingBody { len, .. } => (*len, 0),
            Phase::Writing { out, .. } => (0, out.len()),
            _ => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake clock: starts at an arbitrary instant, moves only when told.
    struct Clock(Instant);

    impl Clock {
        fn now(&self) -> Instant {
            self.0
        }
        fn advance(&mut self, by: Duration) -> Instant {
            self.0 += by;
            self.0
        }
    }

    fn clock() -> Clock {
        Clock(Instant::now())
    }

    fn answer(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            close: false,
        }
    }

    /// What the tests see of one [`Action`], owned.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Read(usize),
        Write(Vec<u8>),
        ShutdownWrite,
        Head(String, String),
        Request(String, Vec<u8>),
        Error(HttpError, bool),
        Wait,
        Yield,
        Close(CloseReason),
    }

    fn seen(conn: &mut Conn, now: Instant) -> Seen {
        match conn.poll(now) {
            Action::Read(n) => Seen::Read(n),
            Action::Write(bytes) => Seen::Write(bytes.to_vec()),
            Action::ShutdownWrite => Seen::ShutdownWrite,
            Action::Head(head) => Seen::Head(head.method.clone(), head.target.clone()),
            Action::Request(head, body) => Seen::Request(head.target.clone(), body),
            Action::Error(error, head) => Seen::Error(error, head.is_some()),
            Action::Wait => Seen::Wait,
            Action::Yield => Seen::Yield,
            Action::Close(reason) => Seen::Close(reason),
        }
    }

    /// A toy service over the connection, as the event loop runs one: heads to
    /// `/body` read their Content-Length and are answered with the body; every other
    /// head is answered `200 <target>` at once; errors get `<status> error`. Writes are
    /// taken whole. Runs until the connection wants more input, waits, yields or closes,
    /// and returns that, with everything written meanwhile.
    fn run(conn: &mut Conn, clock: &Clock) -> (Seen, Vec<u8>) {
        let mut out = Vec::new();
        loop {
            let now = clock.now();
            match conn.poll(now) {
                Action::Head(head) => {
                    if head.target == "/body" {
                        let len = head.content_length().unwrap_or(0);
                        conn.read_body(usize::try_from(len).unwrap(), now);
                    } else {
                        let body = head.target.clone();
                        conn.respond(answer(200, &body), now);
                    }
                }
                Action::Request(_, body) => {
                    let body = String::from_utf8(body).unwrap();
                    conn.respond(answer(200, &body), now);
                }
                Action::Error(error, _) => {
                    let status = match error {
                        HttpError::MalformedHead => 400,
                        HttpError::HeadTooLarge | HttpError::TooManyHeaders => 431,
                        HttpError::BodyTimeout => 408,
                        HttpError::Overloaded => 503,
                    };
                    conn.respond(answer(status, "error"), now);
                }
                Action::Write(bytes) => {
                    out.extend_from_slice(bytes);
                    let n = bytes.len();
                    conn.wrote(n, now);
                }
                Action::ShutdownWrite => {}
                other => {
                    let other = match other {
                        Action::Read(n) => Seen::Read(n),
                        Action::Wait => Seen::Wait,
                        Action::Yield => Seen::Yield,
                        Action::Close(reason) => Seen::Close(reason),
                        _ => unreachable!(),
                    };
                    return (other, out);
                }
            }
        }
    }

    /// Feeds `bytes` and runs the toy service; returns what was written.
    fn feed(conn: &mut Conn, clock: &Clock, bytes: &[u8]) -> (Seen, String) {
        conn.begin_step();
        conn.received(bytes, clock.now());
        let (next, out) = run(conn, clock);
        (next, String::from_utf8(out).unwrap())
    }

    fn statuses(out: &str) -> Vec<&str> {
        out.split("HTTP/1.1 ")
            .skip(1)
            .map(|r| r.split(' ').next().unwrap())
            .collect()
    }

    const HEAD_LIMIT_READ: usize = MAX_HEAD_BYTES + 1;

    #[test]
    fn reading_head_asks_for_at_most_the_head_limit() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        assert_eq!(seen(&mut conn, clock.now()), Seen::Read(HEAD_LIMIT_READ));
        conn.received(b"GET / HT", clock.now());
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Read(HEAD_LIMIT_READ - 8)
        );
        assert_eq!(conn.deadline(), Some(clock.now() + HEAD_TIMEOUT));
    }

    #[test]
    fn head_timeout_closes_a_head_that_never_completes() {
        let mut clock = clock();
        let mut conn = Conn::new(clock.now());
        feed(&mut conn, &clock, b"GET / HTTP/1.1\r\nHost: x\r\n");
        assert!(!conn.expire(clock.advance(HEAD_TIMEOUT - Duration::from_millis(1))));
        assert!(conn.expire(clock.advance(Duration::from_millis(1))));
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Close(CloseReason::HeadTimeout)
        );
        // A connection that never sends a byte gets the same.
        let mut silent = Conn::new(clock.now());
        assert!(silent.expire(clock.advance(HEAD_TIMEOUT)));
        assert_eq!(
            seen(&mut silent, clock.now()),
            Seen::Close(CloseReason::HeadTimeout)
        );
    }

    #[test]
    fn body_timeout_answers_408_then_lingers_and_closes() {
        let mut clock = clock();
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(
            &mut conn,
            &clock,
            b"POST /body HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345",
        );
        assert_eq!((next, out.as_str()), (Seen::Read(5), ""));
        assert_eq!(conn.in_flight().0, 10);
        assert_eq!(conn.deadline(), Some(clock.now() + BODY_TIMEOUT));
        assert!(conn.expire(clock.advance(BODY_TIMEOUT)));
        assert_eq!(conn.in_flight().0, 0);
        // The error comes with the head, so the service can tell what it was for.
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Error(HttpError::BodyTimeout, true)
        );
        let (next, out) = run(&mut conn, &clock);
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        assert!(out.contains("Connection: close\r\n"), "{out}");
        // The written answer half-closes and lingers, discarding what still comes.
        assert_eq!(next, Seen::Read(usize::MAX));
        conn.begin_step();
        conn.received(b"67890 and more", clock.now());
        assert_eq!(seen(&mut conn, clock.now()), Seen::Read(usize::MAX));
        assert_eq!(conn.deadline(), Some(clock.now() + LINGER_TIMEOUT));
        assert!(conn.expire(clock.advance(LINGER_TIMEOUT)));
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Close(CloseReason::LingerTimeout)
        );
    }

    #[test]
    fn idle_timeout_closes_a_kept_alive_connection_but_not_a_started_head() {
        let mut clock = clock();
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(&mut conn, &clock, b"GET /a HTTP/1.1\r\n\r\n");
        assert_eq!(statuses(&out), ["200"]);
        assert!(!out.contains("Connection: close"), "{out}");
        assert_eq!(next, Seen::Read(HEAD_LIMIT_READ));
        assert_eq!(conn.deadline(), Some(clock.now() + IDLE_TIMEOUT));
        assert!(conn.expire(clock.advance(IDLE_TIMEOUT)));
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Close(CloseReason::IdleTimeout)
        );

        // One byte of a next request: the head clock (from the last answer) applies.
        let mut conn = Conn::new(clock.now());
        feed(&mut conn, &clock, b"GET /a HTTP/1.1\r\n\r\n");
        let answered = clock.now();
        clock.advance(Duration::from_secs(1));
        feed(&mut conn, &clock, b"G");
        assert_eq!(conn.deadline(), Some(answered + HEAD_TIMEOUT));
        assert!(!conn.expire(clock.advance(IDLE_TIMEOUT)));
        assert!(conn.expire(answered + HEAD_TIMEOUT));
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Close(CloseReason::HeadTimeout)
        );
    }

    #[test]
    fn write_timeout_closes_a_response_the_client_does_not_read() {
        let mut clock = clock();
        let mut conn = Conn::new(clock.now());
        conn.received(b"GET /slow HTTP/1.1\r\n\r\n", clock.now());
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        conn.respond(answer(200, &"x".repeat(1000)), clock.now());
        let Action::Write(bytes) = conn.poll(clock.now()) else {
            panic!("nothing to write")
        };
        let total = bytes.len();
        // The socket takes 100 bytes, then nothing: the rest waits.
        conn.wrote(100, clock.advance(Duration::from_secs(3)));
        let Action::Write(rest) = conn.poll(clock.now()) else {
            panic!("the rest is not pending")
        };
        assert_eq!(rest.len(), total - 100);
        assert!(conn.in_flight().1 > 0, "writing");
        // The write clock runs from the start of the response, not from the last write.
        assert!(!conn.expire(
            clock.advance(WRITE_TIMEOUT - Duration::from_secs(3) - Duration::from_millis(1))
        ));
        assert!(conn.expire(clock.advance(Duration::from_millis(1))));
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Close(CloseReason::WriteTimeout)
        );
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_within_the_step_share() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        let mut all = Vec::new();
        for i in 0..20 {
            all.extend_from_slice(format!("GET /{i} HTTP/1.1\r\n\r\n").as_bytes());
        }
        all.extend_from_slice(b"POST /body HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody");
        all.extend_from_slice(b"GET /last HTTP/1.1\r\n\r\n");
        let (next, mut out) = feed(&mut conn, &clock, &all);
        // At most STEP_MAX_HEADS heads in one share, then the back of the queue; the
        // last one's answer is written first thing in the next share.
        assert_eq!(next, Seen::Yield);
        assert_eq!(out.matches("HTTP/1.1 200").count(), STEP_MAX_HEADS - 1);
        loop {
            conn.begin_step();
            let (next, more) = run(&mut conn, &clock);
            out.push_str(&String::from_utf8(more).unwrap());
            if next != Seen::Yield {
                assert_eq!(next, Seen::Read(HEAD_LIMIT_READ));
                break;
            }
        }
        let bodies: Vec<&str> = out
            .split("\r\n\r\n")
            .skip(1)
            .map(|b| b.split("HTTP/1.1").next().unwrap())
            .collect();
        let want: Vec<String> = (0..20)
            .map(|i| format!("/{i}"))
            .chain(["body".to_owned(), "/last".to_owned()])
            .collect();
        assert_eq!(bodies, want);
    }

    #[test]
    fn a_step_share_also_ends_after_enough_bytes() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        let (next, _) = feed(
            &mut conn,
            &clock,
            format!(
                "POST /body HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                2 * STEP_MAX_READ
            )
            .as_bytes(),
        );
        assert_eq!(next, Seen::Read(2 * STEP_MAX_READ));
        conn.received(&vec![b'b'; STEP_MAX_READ], clock.now());
        assert_eq!(seen(&mut conn, clock.now()), Seen::Yield);
        conn.begin_step();
        assert_eq!(seen(&mut conn, clock.now()), Seen::Read(STEP_MAX_READ));
    }

    #[test]
    fn split_and_whole_heads_get_the_same_answers() {
        let raw: &[u8] = b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nPOST /body HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /two HTTP/1.1\nHost: b\n\nGET /three HTTP/1.1\r\nConnection: close\r\n\r\n";
        let answers = |chunks: &mut dyn Iterator<Item = &[u8]>| {
            let clock = clock();
            let mut conn = Conn::new(clock.now());
            let mut out = String::new();
            let mut last = Seen::Wait;
            for chunk in chunks {
                let (next, more) = feed(&mut conn, &clock, chunk);
                out.push_str(&more);
                last = next;
            }
            (out, last)
        };
        let whole = answers(&mut std::iter::once(raw));
        assert_eq!(statuses(&whole.0), ["200", "200", "200", "200"]);
        assert_eq!(whole.1, Seen::Close(CloseReason::ClientAsked));
        for size in [1, 2, 3, 5, 7, 16, 31] {
            assert_eq!(answers(&mut raw.chunks(size)), whole, "chunks of {size}");
        }
    }

    /// Random cuts of random pipelines: the answers never depend on how the bytes
    /// arrived.
    #[test]
    fn random_segmentation_never_changes_the_answers() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let parts: [&[u8]; 5] = [
            b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /b HTTP/1.1\nX: y\n\n",
            b"HEAD /c HTTP/1.1\r\n\r\n",
            b"POST /body HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            b"POST /body HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        ];
        let answers = |chunks: &[&[u8]]| {
            let clock = clock();
            let mut conn = Conn::new(clock.now());
            let mut out = String::new();
            for chunk in chunks {
                out.push_str(&feed(&mut conn, &clock, chunk).1);
                // Finish any share that yielded before the next bytes come.
                loop {
                    conn.begin_step();
                    let (next, more) = run(&mut conn, &clock);
                    out.push_str(&String::from_utf8(more).unwrap());
                    if next != Seen::Yield {
                        break;
                    }
                }
            }
            out
        };
        for _ in 0..200 {
            let count = 1 + next() % 12;
            let raw: Vec<u8> = (0..count)
                .flat_map(|_| parts[(next() % 5) as usize].iter().copied())
                .collect();
            let whole = answers(&[&raw]);
            assert_eq!(statuses(&whole).len() as u64, count, "{whole}");
            let mut cuts: Vec<usize> = (0..next() % 8)
                .map(|_| (next() as usize) % raw.len())
                .collect();
            cuts.extend([0, raw.len()]);
            cuts.sort_unstable();
            let chunks: Vec<&[u8]> = cuts.windows(2).map(|w| &raw[w[0]..w[1]]).collect();
            assert_eq!(answers(&chunks), whole, "cuts {cuts:?}");
        }
    }

    #[test]
    fn oversized_and_malformed_heads_are_answered_then_linger() {
        type Row<'a> = (&'a str, Vec<u8>, &'a str);
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=super::super::headers::MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD_BYTES + 1, b'a');
        let cases: Vec<Row> = vec![
            ("too long, unterminated", long, "431"),
            ("too many headers", many, "431"),
            ("garbage", b"\x00\x01garbage\r\n\r\n".to_vec(), "400"),
        ];
        for (context, raw, status) in cases {
            let clock = clock();
            let mut conn = Conn::new(clock.now());
            let (next, out) = feed(&mut conn, &clock, &raw);
            assert_eq!(statuses(&out), [status], "{context}");
            assert!(out.contains("Connection: close\r\n"), "{context}");
            assert_eq!(next, Seen::Read(usize::MAX), "{context}: lingering");
        }
    }

    #[test]
    fn an_answer_from_the_head_alone_lingers_over_the_unread_body() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(
            &mut conn,
            &clock,
            b"POST /early HTTP/1.1\r\nContent-Length: 99999\r\n\r\npart of it",
        );
        assert_eq!(statuses(&out), ["200"]);
        assert!(out.contains("Connection: close\r\n"), "{out}");
        assert_eq!(next, Seen::Read(usize::MAX));
        // Without a body, the same answer keeps the connection.
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(
            &mut conn,
            &clock,
            b"POST /early HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(!out.contains("Connection: close"), "{out}");
        assert_eq!(next, Seen::Read(HEAD_LIMIT_READ));
    }

    #[test]
    fn expect_100_continue_is_answered_only_when_the_body_is_missing() {
        let clock = clock();
        let head = b"POST /body HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(&mut conn, &clock, head);
        assert_eq!(out, "HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!(next, Seen::Read(2));
        let (_, out) = feed(&mut conn, &clock, b"ok");
        assert_eq!(statuses(&out), ["200"]);
        // The body came with the head: no interim answer.
        let mut conn = Conn::new(clock.now());
        let (_, out) = feed(&mut conn, &clock, &[&head[..], b"ok"].concat());
        assert_eq!(statuses(&out), ["200"]);
        // HTTP/1.0 clients never wait for one.
        let mut conn = Conn::new(clock.now());
        let (next, out) = feed(
            &mut conn,
            &clock,
            b"POST /body HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        );
        assert_eq!((next, out.as_str()), (Seen::Read(2), ""));
    }

    #[test]
    fn head_requests_get_headers_without_the_body() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        let (_, out) = feed(
            &mut conn,
            &clock,
            b"HEAD /abc HTTP/1.1\r\n\r\nGET /abc HTTP/1.1\r\n\r\n",
        );
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n/abc"
        );
    }

    #[test]
    fn deferred_answers_wait_without_a_deadline() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        conn.received(
            b"POST /defer HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
            clock.now(),
        );
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        conn.read_body(2, clock.now());
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Request("/defer".into(), b"hi".to_vec())
        );
        assert!(conn.is_waiting());
        assert_eq!(seen(&mut conn, clock.now()), Seen::Wait);
        assert_eq!(conn.deadline(), None);
        assert!(!conn.expire(clock.now() + Duration::from_secs(3600)));
        conn.respond(answer(200, "later"), clock.now());
        assert!(conn.in_flight().1 > 0, "writing");
        assert_eq!(conn.deadline(), Some(clock.now() + WRITE_TIMEOUT));
    }

    #[test]
    fn close_reasons_after_an_answer() {
        let clock = clock();
        for (raw, close, want) in [
            (
                &b"GET /a HTTP/1.0\r\n\r\n"[..],
                false,
                Seen::Close(CloseReason::ClientAsked),
            ),
            (
                b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n",
                false,
                Seen::Close(CloseReason::ClientAsked),
            ),
            (
                b"GET /a HTTP/1.1\r\n\r\n",
                true,
                Seen::Close(CloseReason::ServerAsked),
            ),
            (
                b"GET /a HTTP/1.1\r\n\r\n",
                false,
                Seen::Read(HEAD_LIMIT_READ),
            ),
        ] {
            let mut conn = Conn::new(clock.now());
            conn.received(raw, clock.now());
            let Seen::Head(..) = seen(&mut conn, clock.now()) else {
                panic!("no head")
            };
            let mut response = answer(200, "x");
            response.close = close;
            conn.respond(response, clock.now());
            let (next, out) = run(&mut conn, &clock);
            let out = String::from_utf8(out).unwrap();
            assert_eq!(next, want, "{raw:?}");
            assert_eq!(
                out.contains("Connection: close"),
                want != Seen::Read(HEAD_LIMIT_READ)
            );
        }
    }

    #[test]
    fn between_requests() {
        let clock = clock();
        let mut conn = Conn::new(clock.now());
        assert!(conn.is_between_requests());
        feed(&mut conn, &clock, b"GET / HTTP/1.1\r\n");
        assert!(!conn.is_between_requests());
        feed(&mut conn, &clock, b"\r\n");
        assert!(conn.is_between_requests());
    }

    /// The eviction class through every phase of a request, authorized or not, with
    /// the instant each class counts from.
    #[test]
    fn eviction_class_per_phase() {
        let mut clock = clock();
        let accepted = clock.now();
        let mut conn = Conn::new(accepted);
        // A new connection that sent nothing: an incomplete head since accept.
        assert_eq!(conn.class(), Class::IncompleteHead);
        assert_eq!(conn.phase_started, accepted);
        clock.advance(Duration::from_secs(1));
        feed(
            &mut conn,
            &clock,
            b"POST /defer HTTP/1.1\r\nContent-Length: 4\r\n",
        );
        assert_eq!(
            (conn.class(), conn.phase_started),
            (Class::IncompleteHead, accepted)
        );
        // The head is complete: deciding is not authorized yet.
        conn.received(b"\r\nbo", clock.now());
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        assert_eq!(conn.class(), Class::IncompleteHead);
        // The service agreed to read the body: authorized from here until answered.
        conn.read_body(4, clock.now());
        assert_eq!(conn.class(), Class::Authorized);
        conn.received(b"dy", clock.now());
        assert_eq!(
            seen(&mut conn, clock.now()),
            Seen::Request("/defer".into(), b"body".to_vec())
        );
        assert_eq!(conn.class(), Class::Authorized);
        // Its answer, stalled behind a client that does not read: still authorized.
        conn.respond(answer(200, "later"), clock.now());
        conn.wrote(3, clock.now());
        assert_eq!(conn.class(), Class::Authorized);
        assert!(conn.in_flight().1 > 0);
        let Action::Write(rest) = conn.poll(clock.now()) else {
            panic!("nothing to write")
        };
        let rest = rest.len();
        let answered = clock.advance(Duration::from_secs(1));
        conn.wrote(rest, answered);
        assert_eq!(conn.in_flight().1, 0);
        // Kept alive: idle since the answer.
        assert_eq!((conn.class(), conn.phase_started), (Class::Idle, answered));
        // A head that is not authorized work, answered from the head alone (health,
        // a refusal): being written, it may be evicted.
        conn.received(b"GET /a HTTP/1.1\r\n\r\n", clock.now());
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        conn.respond(answer(200, "x"), clock.now());
        assert_eq!(conn.class(), Class::Answering);
        let (next, _) = run(&mut conn, &clock);
        assert_eq!(next, Seen::Read(HEAD_LIMIT_READ));
        assert_eq!(conn.class(), Class::Idle);

        // An authorized body that came late: its 408 is still authorized work.
        let mut conn = Conn::new(clock.now());
        conn.received(
            b"POST /body HTTP/1.1\r\nContent-Length: 9\r\n\r\n",
            clock.now(),
        );
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        conn.read_body(9, clock.now());
        assert!(conn.expire(clock.advance(BODY_TIMEOUT)));
        assert_eq!(conn.class(), Class::Authorized);
        // Once that answer is out, lingering loses nothing.
        let (next, _) = run(&mut conn, &clock);
        assert_eq!(next, Seen::Read(usize::MAX));
        assert_eq!(conn.class(), Class::Done);

        // A head refused before its body is read (a budget's 503): not authorized.
        let mut conn = Conn::new(clock.now());
        conn.received(
            b"POST /body HTTP/1.1\r\nContent-Length: 9\r\n\r\n",
            clock.now(),
        );
        let Seen::Head(..) = seen(&mut conn, clock.now()) else {
            panic!("no head")
        };
        conn.fail(HttpError::Overloaded);
        let Seen::Error(HttpError::Overloaded, true) = seen(&mut conn, clock.now()) else {
            panic!("no error")
        };
        conn.respond(answer(503, "busy"), clock.now());
        assert_eq!(conn.class(), Class::Answering);
        // Closing after an answer.
        let mut conn = Conn::new(clock.now());
        feed(&mut conn, &clock, b"GET /a HTTP/1.0\r\n\r\n");
        assert_eq!(conn.class(), Class::Done);
    }

    #[test]
    fn eviction_order_of_the_classes() {
        let order = [
            Class::Done,
            Class::IncompleteHead,
            Class::Answering,
            Class::Idle,
            Class::Authorized,
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]));
    }
}
