//! The HTTP/1.1 layer: one single-threaded `mio` event loop that accepts loopback
//! connections, reads request heads (parsed by `httparse`) and bodies, writes
//! responses, and enforces every limit of the contract's HTTP table.
//!
//! This module knows nothing about the bus. It hands a [`Service`] each complete
//! request head, asks it whether to read the body, hands it the body, and writes
//! whatever [`Response`] comes back, now or later (a deferred answer arrives through
//! [`Control::respond`] after a [`mio::Waker`] woke the loop).
//!
//! Every socket is non-blocking; no callback may block. Memory per connection is
//! bounded by [`MAX_HEAD_BYTES`] plus the body length the service agreed to read, and
//! the number of connections by [`MAX_CONNECTIONS`].

pub mod client;
mod message;

use message::{parse_head, ParseOutcome};
pub use message::{parse_request_head, Head, HttpError, Response, MAX_HEADERS, MAX_HEAD_BYTES};
use mio::net::{TcpListener, TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::{BTreeSet, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time allowed for a complete head after accept, or after the previous response.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the body once the head is complete; past it 408 and close.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a keep-alive connection may sit idle (no byte of a new request) before it closes.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for writing one response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most; when full, the least recently active connection with no
/// request being handled is closed to admit the new one. Lower when the open-files
/// limit (`ulimit -n`) leaves less room; see [`RESERVED_FDS`].
pub const MAX_CONNECTIONS: usize = 1024;
/// Descriptors kept free for everything that is not a connection (listener, poll,
/// waker, signal pipe, stdio, config and registry files, engine pipes) when the
/// open-files limit caps the number of connections.
pub const RESERVED_FDS: usize = 64;
/// Body bytes all connections together may be reading at once (declared lengths). A
/// head whose body would go past it is answered 503 and the connection closes, so that
/// many connections each sending a large body slowly can't grow memory without bound.
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 8 * 1024 * 1024;
/// After answering a request whose body was never read, how long the loop keeps
/// reading and discarding what the client still sends, so that the client gets to
/// read the answer instead of a connection reset.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// The listen backlog: connections the kernel queues before the loop accepts them.
/// (The kernel caps it at `net.core.somaxconn`.)
pub const LISTEN_BACKLOG: i32 = 1024;
/// Size of the loop's one read buffer, shared by every connection.
const READ_CHUNK: usize = 64 * 1024;
/// Most request heads one connection gets served in a row, and most bytes read from
/// it, before it goes to the back of the run queue: a client pipelining without end
/// cannot monopolize the loop.
pub const STEP_MAX_HEADS: usize = 8;
/// See [`STEP_MAX_HEADS`].
pub const STEP_MAX_READ: usize = 4 * READ_CHUNK;
/// Longest stretch of connection work between two polls: new connections, timers and
/// worker results wait at most about this long, however many clients are busy.
pub const ROUND_BUDGET: Duration = Duration::from_millis(5);
/// How long to wait before accepting again after the process ran out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const INTERRUPT: Token = Token(2);
const FIRST_CONN: usize = 3;
/// A connection's token carries its slot in the low bits and its generation above
/// them, so a readiness event left over from a closed connection can never be applied
/// to the one that took its slot.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;

fn conn_token(slot: usize, generation: u64) -> Token {
    // Truncating the generation is fine: it only has to differ from the slot's
    // previous occupants, and 2^40 connections is beyond any run.
    Token(((generation as usize) << SLOT_BITS) | (slot + FIRST_CONN))
}

/// Identifies one connection for a deferred answer. A connection that closed is
/// never confused with a later one that reused its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    slot: usize,
    generation: u64,
}

/// What to do after a head.
#[derive(Debug)]
pub enum HeadAction {
    /// Answer now without reading any body. If the head announced a body, the
    /// connection closes after the answer.
    Respond(Response),
    /// Read exactly this many body bytes, then call [`Service::on_request`].
    ReadBody(usize),
}

/// Requests a service makes of the loop from inside a callback.
#[derive(Debug, Default)]
pub struct Control {
    responses: Vec<(ConnId, Response)>,
    stop_accepting: bool,
    exit: bool,
    tick_at: Option<Instant>,
}

impl Control {
    /// Answers a deferred request. Ignored if that connection has gone away.
    pub fn respond(&mut self, id: ConnId, response: Response) {
        self.responses.push((id, response));
    }

    /// Calls [`Service::on_tick`] no later than `at`.
    pub fn tick_at(&mut self, at: Instant) {
        self.tick_at = Some(self.tick_at.map_or(at, |t| t.min(at)));
    }

    /// Closes the listener: no new connection is accepted from now on.
    pub fn stop_accepting(&mut self) {
        self.stop_accepting = true;
    }

    /// Ends the loop once the responses already queued have been written (or have
    /// overstayed [`WRITE_TIMEOUT`]).
    pub fn exit(&mut self) {
        self.exit = true;
    }
}

/// The bus side of the loop. Callbacks run on the loop thread and must not block.
pub trait Service {
    /// A complete head arrived on `id`.
    fn on_head(&mut self, id: ConnId, head: &Head) -> HeadAction;

    /// The body agreed to in [`HeadAction::ReadBody`] arrived. Return `Some` to answer
    /// now, or `None` to answer later through [`Control::respond`].
    fn on_request(&mut self, id: ConnId, head: &Head, body: Vec<u8>) -> Option<Response>;

    /// The body of an error the HTTP layer answers itself, with the request's head
    /// when it got that far. `close` is forced on.
    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response;

    /// The [`Waker`] was woken (for example, a turn finished).
    fn on_wake(&mut self, control: &mut Control);

    /// The interrupt stream became readable (a signal asked the process to stop).
    fn on_interrupt(&mut self, control: &mut Control);

    /// Periodic work; return when to be called next.
    fn on_tick(&mut self, now: Instant, control: &mut Control) -> Instant;

    /// A connection whose request was deferred closed before it was answered.
    fn on_abandoned(&mut self, id: ConnId);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    ReadingHead,
    /// Reading `len` body bytes.
    ReadingBody { len: usize },
    /// The service deferred its answer.
    Waiting,
    /// Writing a response.
    Writing,
    /// Response written, body never read: discarding input until EOF or timeout.
    Lingering,
}

struct Conn {
    stream: TcpStream,
    generation: u64,
    phase: Phase,
    /// Bytes received and not yet consumed.
    inbuf: Vec<u8>,
    /// How many leading bytes of `inbuf` are known to hold no end of head.
    scanned: usize,
    /// Whether the connection is on the run queue.
    queued: bool,
    /// Whether a read may find data (see [`read_some`]).
    readable: bool,
    /// A readiness event said the peer hung up (or an error is pending).
    peer_closed: bool,
    /// The head being served (between head and response).
    head: Option<Head>,
    /// Response bytes, and how many are written.
    outbuf: Vec<u8>,
    written: usize,
    /// Close (or linger) once the current response is written.
    close_after: bool,
    linger_after: bool,
    /// Whether at least one response was completed (idle timeout applies).
    served: bool,
    /// Start of the current phase's clock.
    phase_started: Instant,
    last_active: Instant,
    deadline: Option<Instant>,
}

impl Conn {
    /// Whether the connection may be closed to admit a new one: anything but a request
    /// whose turn is running. A response stuck behind a client that does not read is
    /// fair game; its `last_active` stops at its last successful write, so the least
    /// recently active choice finds such connections before a fresh one.
    fn evictable(&self) -> bool {
        self.phase != Phase::Waiting
    }

    /// The deadline of the current phase, if it has one.
    fn compute_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::ReadingHead => {
                let head = self.phase_started + HEAD_TIMEOUT;
                if self.served && self.inbuf.is_empty() {
                    Some(head.min(self.phase_started + IDLE_TIMEOUT))
                } else {
                    Some(head)
                }
            }
            Phase::ReadingBody { .. } => Some(self.phase_started + BODY_TIMEOUT),
            Phase::Waiting => None,
            Phase::Writing => Some(self.phase_started + WRITE_TIMEOUT),
            Phase::Lingering => Some(self.phase_started + LINGER_TIMEOUT),
        }
    }
}

/// What a step of a connection's state machine decided.
enum Step {
    /// Wait for the next readiness event.
    Park,
    /// Close the connection now.
    Close,
    /// Used its share of this loop iteration; continue after the others had theirs.
    Yield,
}

/// The event loop: owns the listener and every connection.
pub struct EventLoop {
    poll: Poll,
    listener: Option<TcpListener>,
    local_addr: SocketAddr,
    interrupt: Option<UnixStream>,
    waker: Arc<Waker>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    open: usize,
    /// [`MAX_CONNECTIONS`], or fewer if the open-files limit is lower.
    max_connections: usize,
    /// Declared body bytes of the connections reading a body now.
    body_bytes_in_flight: usize,
    next_generation: u64,
    deadlines: BTreeSet<(Instant, usize, u64)>,
    scratch: Box<[u8]>,
    accept_paused_until: Option<Instant>,
    exiting: bool,
    /// The run queue: connections with an event or with work left, in FIFO order.
    ready: VecDeque<(usize, u64)>,
    /// When [`Service::on_tick`] is due.
    next_tick: Instant,
}

/// Binds a listener on `addr`, which must be a loopback address.
///
/// # Errors
/// `addr` is not loopback (`PermissionDenied`), or the bind failed (in use, ...).
pub fn bind_loopback(addr: SocketAddr) -> io::Result<TcpListener> {
    // Exactly the two addresses clients dial and the Host check accepts; 127.0.0.2
    // is loopback too, but nobody would find the instance there.
    let ip = addr.ip();
    if ip != std::net::Ipv4Addr::LOCALHOST && ip != std::net::Ipv6Addr::LOCALHOST {
        return Err(io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "refusing to listen on {addr}: loopbus listens on the loopback addresses 127.0.0.1 and [::1] only"
            ),
        ));
    }
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let socket = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    rustix::net::sockopt::set_socket_reuseaddr(&socket, true)?;
    rustix::net::bind(&socket, &addr)?;
    // std and mio listen with a backlog of 128; a burst of new connections larger
    // than that would be dropped by the kernel before the loop could evict idle ones.
    rustix::net::listen(&socket, LISTEN_BACKLOG)?;
    Ok(TcpListener::from_std(std::net::TcpListener::from(socket)))
}

impl EventLoop {
    /// Creates a loop serving `listener`. `interrupt`, when given, is a stream that
    /// becomes readable when the process is asked to stop (see `signal-hook`'s pipe).
    ///
    /// # Errors
    /// The OS refused to create the poll instance or to register a source.
    pub fn new(mut listener: TcpListener, interrupt: Option<UnixStream>) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut interrupt = interrupt;
        if let Some(stream) = interrupt.as_mut() {
            poll.registry()
                .register(stream, INTERRUPT, Interest::READABLE)?;
        }
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            local_addr,
            interrupt,
            waker,
            conns: Vec::new(),
            free: Vec::new(),
            open: 0,
            max_connections: connection_cap(),
            body_bytes_in_flight: 0,
            next_generation: 0,
            deadlines: BTreeSet::new(),
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
            accept_paused_until: None,
            exiting: false,
            ready: VecDeque::new(),
            next_tick: Instant::now(),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A waker that makes the loop call [`Service::on_wake`]; safe to use from any thread.
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// Runs until the service calls [`Control::exit`] and the pending writes are done.
    ///
    /// # Errors
    /// Only if polling itself fails; per-connection errors close that connection.
    pub fn run<S: Service>(&mut self, service: &mut S) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        self.next_tick = Instant::now();
        loop {
            let now = Instant::now();
            if now >= self.next_tick {
                let mut control = Control::default();
                self.next_tick = service.on_tick(now, &mut control);
                self.apply(service, control);
            }
            if self.exiting && !self.has_pending_writes() {
                return Ok(());
            }
            let mut wake_at = self.next_tick;
            if let Some(&(deadline, _, _)) = self.deadlines.first() {
                wake_at = wake_at.min(deadline);
            }
            if let Some(at) = self.accept_paused_until {
                wake_at = wake_at.min(at);
            }
            let mut timeout = wake_at.saturating_duration_since(Instant::now());
            if !self.ready.is_empty() {
                timeout = Duration::ZERO;
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // New connections first, so that a health check is not accepted only after
            // a round over every busy connection.
            if events.iter().any(|e| e.token() == LISTENER) {
                self.accept_all(service);
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => {}
                    WAKER => {
                        let mut control = Control::default();
                        service.on_wake(&mut control);
                        self.apply(service, control);
                    }
                    INTERRUPT => {
                        self.drain_interrupt();
                        let mut control = Control::default();
                        service.on_interrupt(&mut control);
                        self.apply(service, control);
                    }
                    Token(token) => {
                        let Some(slot) = self.event_slot(token) else {
                            continue; // left over from a connection that closed
                        };
                        if event.is_read_closed() || event.is_error() {
                            // A caller that hangs up while its request waits for a turn
                            // is gone: close now, so a queued turn can be dropped.
                            if self.close_if_waiting(service, slot) {
                                continue;
                            }
                        }
                        if let Some(Some(conn)) = self.conns.get_mut(slot) {
                            if event.is_readable() || event.is_read_closed() || event.is_error() {
                                conn.readable = true;
                            }
                            if event.is_read_closed() || event.is_error() {
                                conn.peer_closed = true;
                            }
                        }
                        self.enqueue(slot);
                    }
                }
            }
            // Serve the run queue for at most ROUND_BUDGET, then poll again, so that new
            // connections and timers are seen promptly however many clients are busy.
            let round_end = Instant::now() + ROUND_BUDGET;
            while let Some((slot, generation)) = self.ready.pop_front() {
                match self.conns.get_mut(slot) {
                    Some(Some(conn)) if conn.generation == generation => conn.queued = false,
                    _ => continue,
                }
                self.drive(service, slot);
                if Instant::now() >= round_end {
                    break;
                }
            }
            self.expire(service);
            if let Some(at) = self.accept_paused_until {
                if Instant::now() >= at {
                    self.accept_paused_until = None;
                    self.accept_all(service);
                }
            }
        }
    }

    fn has_pending_writes(&self) -> bool {
        self.conns
            .iter()
            .flatten()
            .any(|c| c.phase == Phase::Writing)
    }

    fn drain_interrupt(&mut self) {
        if let Some(stream) = self.interrupt.as_mut() {
            let mut buf = [0u8; 64];
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }
    }

    fn apply<S: Service>(&mut self, service: &mut S, control: Control) {
        for (id, response) in control.responses {
            let live = matches!(
                self.conns.get(id.slot),
                Some(Some(c)) if c.generation == id.generation && c.phase == Phase::Waiting
            );
            if live {
                self.start_response(id.slot, response);
                self.drive(service, id.slot);
            }
        }
        if control.stop_accepting {
            if let Some(mut listener) = self.listener.take() {
                let _ = self.poll.registry().deregister(&mut listener);
            }
            self.accept_paused_until = None;
            // Idle keep-alive connections will never get another answer: close them.
            let idle: Vec<usize> = self
                .conns
                .iter()
                .enumerate()
                .filter_map(|(i, c)| match c {
                    Some(c) if c.phase == Phase::ReadingHead && c.inbuf.is_empty() => Some(i),
                    _ => None,
                })
                .collect();
            for slot in idle {
                self.close(service, slot);
            }
        }
        if control.exit {
            self.exiting = true;
        }
        if let Some(at) = control.tick_at {
            self.next_tick = self.next_tick.min(at);
        }
    }

    fn accept_all<S: Service>(&mut self, service: &mut S) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            match listener.accept() {
                Ok((stream, _peer)) => self.admit(service, stream),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a transient failure: make
                    // room if we can and try again shortly; never spin.
                    log::warn!("accept failed: {e}");
                    if let Some(slot) = self.least_recently_active() {
                        self.close(service, slot);
                    }
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    fn least_recently_active(&self) -> Option<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.as_ref()
                    .filter(|c| c.evictable())
                    .map(|c| (c.last_active, i))
            })
            .min()
            .map(|(_, i)| i)
    }

    fn admit<S: Service>(&mut self, service: &mut S, mut stream: TcpStream) {
        if self.open >= self.max_connections {
            match self.least_recently_active() {
                Some(slot) => {
                    log::debug!("connection limit reached: closing the least recently active");
                    self.close(service, slot);
                }
                None => {
                    log::warn!(
                        "connection limit reached and every connection is busy; refusing one"
                    );
                    return; // dropping the stream closes it
                }
            }
        }
        let _ = stream.set_nodelay(true);
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            conn_token(slot, self.next_generation + 1),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!("cannot register a connection: {e}");
            self.free.push(slot);
            return;
        }
        let now = Instant::now();
        self.next_generation += 1;
        self.conns[slot] = Some(Conn {
            stream,
            generation: self.next_generation,
            phase: Phase::ReadingHead,
            inbuf: Vec::new(),
            scanned: 0,
            queued: false,
            readable: true,
            peer_closed: false,
            head: None,
            outbuf: Vec::new(),
            written: 0,
            close_after: false,
            linger_after: false,
            served: false,
            phase_started: now,
            last_active: now,
            deadline: None,
        });
        self.open += 1;
        self.refresh_deadline(slot);
        // The client may have sent its request already: an edge-triggered poll would
        // not report data that arrived before registration.
        self.drive(service, slot);
    }

    fn close<S: Service>(&mut self, service: &mut S, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if let Some(deadline) = conn.deadline {
            self.deadlines.remove(&(deadline, slot, conn.generation));
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if let Phase::ReadingBody { len } = conn.phase {
            self.body_bytes_in_flight = self.body_bytes_in_flight.saturating_sub(len);
        }
        if conn.phase == Phase::Waiting {
            service.on_abandoned(ConnId {
                slot,
                generation: conn.generation,
            });
        }
        self.free.push(slot);
        self.open -= 1;
    }

    fn refresh_deadline(&mut self, slot: usize) {
        let Some(Some(conn)) = self.conns.get_mut(slot) else {
            return;
        };
        let new = conn.compute_deadline();
        if new != conn.deadline {
            if let Some(old) = conn.deadline {
                self.deadlines.remove(&(old, slot, conn.generation));
            }
            if let Some(new) = new {
                self.deadlines.insert((new, slot, conn.generation));
            }
            conn.deadline = new;
        }
    }

    fn expire<S: Service>(&mut self, service: &mut S) {
        let now = Instant::now();
        while let Some(&(deadline, slot, generation)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let phase = match self.conns.get_mut(slot) {
                Some(Some(conn)) if conn.generation == generation => {
                    conn.deadline = None;
                    conn.phase
                }
                _ => continue,
            };
            match phase {
                Phase::ReadingBody { .. } => {
                    let head = self.conns.get(slot).and_then(|c| c.as_ref()?.head.as_ref());
                    let response = service.error_response(HttpError::BodyTimeout, head);
                    self.start_error(slot, response);
                    self.drive(service, slot);
                }
                _ => self.close(service, slot),
            }
        }
    }

    /// Moves a connection to `Writing` with `response`.
    fn start_response(&mut self, slot: usize, response: Response) {
        let Some(Some(conn)) = self.conns.get_mut(slot) else {
            return;
        };
        if let Phase::ReadingBody { len } = conn.phase {
            // A body timeout answers before the body is complete.
            self.body_bytes_in_flight = self.body_bytes_in_flight.saturating_sub(len);
        }
        let keep_alive = conn.head.as_ref().is_some_and(Head::wants_keep_alive);
        let close = response.close || !keep_alive || conn.linger_after || self.exiting;
        conn.close_after = close;
        conn.outbuf = response.serialize(close);
        // An answer to HEAD has the full answer's headers and no body (RFC 9110, 9.3.2).
        if conn.head.as_ref().is_some_and(|h| h.method == "HEAD") {
            conn.outbuf
                .truncate(conn.outbuf.len() - response.body.len());
        }
        conn.written = 0;
        conn.phase = Phase::Writing;
        conn.phase_started = Instant::now();
        self.refresh_deadline(slot);
    }

    /// Answers with an HTTP-layer error and closes afterwards, lingering so the
    /// client can read it.
    fn start_error(&mut self, slot: usize, mut response: Response) {
        response.close = true;
        if let Some(Some(conn)) = self.conns.get_mut(slot) {
            conn.linger_after = true;
        }
        self.start_response(slot, response);
    }

    /// Runs one connection's state machine as far as it can go without blocking.
    fn drive<S: Service>(&mut self, service: &mut S, slot: usize) {
        if !matches!(self.conns.get(slot), Some(Some(_))) {
            return;
        }
        let step = self.step(service, slot);
        match step {
            Step::Close => self.close(service, slot),
            Step::Park => self.refresh_deadline(slot),
            Step::Yield => {
                self.refresh_deadline(slot);
                self.enqueue(slot);
            }
        }
    }

    /// The slot an event's token names, if that connection is still the one open there.
    fn event_slot(&self, token: usize) -> Option<usize> {
        let slot = (token & SLOT_MASK).checked_sub(FIRST_CONN)?;
        match self.conns.get(slot) {
            Some(Some(conn)) if conn_token(slot, conn.generation).0 == token => Some(slot),
            _ => None,
        }
    }

    /// Closes the connection if its request is waiting for a turn; whether it did.
    fn close_if_waiting<S: Service>(&mut self, service: &mut S, slot: usize) -> bool {
        if matches!(self.conns.get(slot), Some(Some(c)) if c.phase == Phase::Waiting) {
            self.close(service, slot);
            return true;
        }
        false
    }

    /// Puts a connection on the run queue (once, however many events it has).
    fn enqueue(&mut self, slot: usize) {
        if let Some(Some(conn)) = self.conns.get_mut(slot) {
            if !conn.queued {
                conn.queued = true;
                self.ready.push_back((slot, conn.generation));
            }
        }
    }

    fn step<S: Service>(&mut self, service: &mut S, slot: usize) -> Step {
        let mut heads = 0usize;
        let mut read = 0usize;
        loop {
            if heads >= STEP_MAX_HEADS || read >= STEP_MAX_READ {
                return Step::Yield;
            }
            let Some(Some(conn)) = self.conns.get_mut(slot) else {
                return Step::Close;
            };
            match conn.phase {
                Phase::ReadingHead => {
                    match parse_head(&conn.inbuf, &mut conn.scanned) {
                        ParseOutcome::Complete(head, consumed) => {
                            heads += 1;
                            conn.inbuf.drain(..consumed);
                            conn.scanned = 0;
                            let announces_body = head.announces_body();
                            match service.on_head(
                                ConnId {
                                    slot,
                                    generation: conn.generation,
                                },
                                &head,
                            ) {
                                HeadAction::Respond(response) => {
                                    conn.linger_after = announces_body;
                                    conn.head = Some(head);
                                    self.start_response(slot, response);
                                }
                                HeadAction::ReadBody(len) => {
                                    if self.body_bytes_in_flight.saturating_add(len)
                                        > MAX_BODY_BYTES_IN_FLIGHT
                                    {
                                        let response = service
                                            .error_response(HttpError::Overloaded, Some(&head));
                                        conn.head = Some(head);
                                        self.start_error(slot, response);
                                    } else {
                                        if len > conn.inbuf.len() && head.expects_continue() {
                                            // Tell a waiting client (curl, for one) to send
                                            // the body now. A fresh socket's buffer takes
                                            // these bytes whole; if not, give up on it.
                                            let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
                                            if !matches!(conn.stream.write(interim), Ok(n) if n == interim.len())
                                            {
                                                return Step::Close;
                                            }
                                        }
                                        conn.head = Some(head);
                                        self.body_bytes_in_flight += len;
                                        conn.phase = Phase::ReadingBody { len };
                                        conn.phase_started = Instant::now();
                                        self.refresh_deadline(slot);
                                    }
                                }
                            }
                            continue;
                        }
                        ParseOutcome::Error(error) => {
                            let response = service.error_response(error, None);
                            self.start_error(slot, response);
                            continue;
                        }
                        ParseOutcome::Partial => {}
                    }
                    let cap = MAX_HEAD_BYTES + 1 - conn.inbuf.len().min(MAX_HEAD_BYTES);
                    match read_some(
                        &mut conn.stream,
                        &mut conn.readable,
                        conn.peer_closed,
                        &mut self.scratch[..cap],
                    ) {
                        ReadOutcome::Data(n) => {
                            read += n;
                            conn.last_active = Instant::now();
                            let was_empty = conn.inbuf.is_empty();
                            conn.inbuf.extend_from_slice(&self.scratch[..n]);
                            if was_empty && conn.served {
                                // A new request began: the idle clock gives way to the head clock.
                                self.refresh_deadline(slot);
                            }
                        }
                        ReadOutcome::WouldBlock => return Step::Park,
                        ReadOutcome::Closed => return Step::Close,
                    }
                }
                Phase::ReadingBody { len } => {
                    if conn.inbuf.len() >= len {
                        self.body_bytes_in_flight = self.body_bytes_in_flight.saturating_sub(len);
                        conn.phase = Phase::Waiting;
                        let rest = conn.inbuf.split_off(len);
                        let body = std::mem::replace(&mut conn.inbuf, rest);
                        let id = ConnId {
                            slot,
                            generation: conn.generation,
                        };
                        let Some(head) = conn.head.take() else {
                            return Step::Close;
                        };
                        let answer = service.on_request(id, &head, body);
                        let Some(Some(conn)) = self.conns.get_mut(slot) else {
                            return Step::Close;
                        };
                        conn.head = Some(head);
                        match answer {
                            Some(response) => self.start_response(slot, response),
                            None => {
                                conn.phase = Phase::Waiting;
                                self.refresh_deadline(slot);
                                return Step::Park;
                            }
                        }
                        continue;
                    }
                    let cap = (len - conn.inbuf.len()).min(READ_CHUNK);
                    match read_some(
                        &mut conn.stream,
                        &mut conn.readable,
                        conn.peer_closed,
                        &mut self.scratch[..cap],
                    ) {
                        ReadOutcome::Data(n) => {
                            read += n;
                            conn.last_active = Instant::now();
                            if conn.inbuf.capacity() == 0 {
                                conn.inbuf.reserve_exact(len);
                            }
                            conn.inbuf.extend_from_slice(&self.scratch[..n]);
                        }
                        ReadOutcome::WouldBlock => return Step::Park,
                        ReadOutcome::Closed => return Step::Close,
                    }
                }
                Phase::Waiting => return Step::Park,
                Phase::Writing => {
                    while conn.written < conn.outbuf.len() {
                        match conn.stream.write(&conn.outbuf[conn.written..]) {
                            Ok(0) => return Step::Close,
                            Ok(n) => {
                                conn.written += n;
                                conn.last_active = Instant::now();
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Park,
                            Err(e) if e.kind() == ErrorKind::Interrupted => {}
                            Err(_) => return Step::Close,
                        }
                    }
                    conn.outbuf = Vec::new();
                    conn.written = 0;
                    conn.head = None;
                    conn.served = true;
                    conn.phase_started = Instant::now();
                    if conn.linger_after {
                        let _ = conn.stream.shutdown(Shutdown::Write);
                        conn.inbuf = Vec::new();
                        conn.phase = Phase::Lingering;
                    } else if conn.close_after {
                        return Step::Close;
                    } else {
                        conn.phase = Phase::ReadingHead;
                        if conn.inbuf.is_empty() && conn.inbuf.capacity() > 4096 {
                            conn.inbuf = Vec::new();
                        }
                    }
                    self.refresh_deadline(slot);
                }
                Phase::Lingering => {
                    match read_some(
                        &mut conn.stream,
                        &mut conn.readable,
                        conn.peer_closed,
                        &mut self.scratch,
                    ) {
                        ReadOutcome::Data(n) => read += n,
                        ReadOutcome::WouldBlock => return Step::Park,
                        ReadOutcome::Closed => return Step::Close,
                    }
                }
            }
        }
    }
}

/// The connection cap this process can honour: [`MAX_CONNECTIONS`], or the soft limit
/// on open files minus [`RESERVED_FDS`] if that is lower. Otherwise accept would run out
/// of descriptors first, and new connections (health checks included) would wait behind
/// the backlog instead of evicting idle ones. Linux only; elsewhere the full cap.
fn connection_cap() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse::<usize>().ok()
        });
    match soft {
        Some(soft) if soft < MAX_CONNECTIONS + RESERVED_FDS => {
            let cap = soft.saturating_sub(RESERVED_FDS).max(8);
            log::warn!(
                "the open-files limit is {soft}: serving at most {cap} connections \
                 instead of {MAX_CONNECTIONS} (raise it with `ulimit -n`)"
            );
            cap
        }
        _ => MAX_CONNECTIONS,
    }
}

enum ReadOutcome {
    Data(usize),
    WouldBlock,
    Closed,
}

/// Reads once. `readable` is false when the last read already drained the socket and
/// no readiness event came since: then there is nothing to read, and the syscall (which
/// would only say `WouldBlock`) is skipped. With edge-triggered polling, any byte that
/// arrives after a draining read brings a new event, which sets `readable` again.
fn read_some(
    stream: &mut TcpStream,
    readable: &mut bool,
    peer_closed: bool,
    buf: &mut [u8],
) -> ReadOutcome {
    // Once the peer has hung up, the read that finds the end must still happen.
    if !*readable && !peer_closed {
        return ReadOutcome::WouldBlock;
    }
    loop {
        match stream.read(buf) {
            Ok(0) => return ReadOutcome::Closed,
            Ok(n) => {
                // A short read emptied the receive queue.
                *readable = n == buf.len();
                return ReadOutcome::Data(n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                *readable = false;
                return ReadOutcome::WouldBlock;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return ReadOutcome::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_binds() {
        for refused in ["0.0.0.0:0", "127.0.0.2:0", "[::]:0", "192.0.2.1:0"] {
            let err = bind_loopback(refused.parse().unwrap()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{refused}");
        }
        assert!(bind_loopback("127.0.0.1:0".parse().unwrap()).is_ok());
    }
}
