//! The event loop: one `mio` poll over the listener and every connection's socket,
//! with generation-tagged tokens, a FIFO run queue, the deadlines, accept and
//! eviction. Running one connection is `drive`'s job.

use super::conn::{Class, Conn, STEP_MAX_READ};
use super::drive::{InFlight, OpenConn};
use super::listener::{connection_cap, max_authorized, warn_if_reduced};
use super::service::{ConnId, Control, Service};
use mio::net::{TcpListener, TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest stretch of connection work between two polls: new connections, timers and
/// worker results wait at most about this long, however many clients are busy.
pub const ROUND_BUDGET: Duration = Duration::from_millis(5);
/// The pause before accepting again after accept failed (out of descriptors, say):
/// one connection is closed at each failure, and the loop never spins on accept.
/// Short, so that health waits at most a few of these behind a full table.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// Size of the loop's one read buffer, shared by every connection: a quarter of
/// [`STEP_MAX_READ`], so a connection's share takes a few reads.
const READ_CHUNK: usize = STEP_MAX_READ / 4;
/// Readiness events taken from one poll.
const EVENTS_CAPACITY: usize = 1024;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const INTERRUPT: Token = Token(2);
const FIRST_CONN: usize = 3;
/// A connection's token carries its slot in the low bits and its generation above
/// them, so a readiness event left over from a closed connection can never be applied
/// to the one that took its slot.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;

fn conn_token(id: ConnId) -> Token {
    // Truncating the generation is fine: it only has to differ from the slot's
    // previous occupants, and 2^40 connections is beyond any run.
    Token(((id.generation as usize) << SLOT_BITS) | (id.slot + FIRST_CONN))
}

/// The connection to close to admit a new one, from each one's slot, [`Class`] and
/// when that class began: the first class in eviction order, and within it the
/// oldest, with its class. `None` when every connection holds authorized work, which is
/// never evicted.
fn eviction_victim(conns: impl Iterator<Item = (usize, Class, Instant)>) -> Option<(usize, Class)> {
    conns
        .filter(|(_, class, _)| *class != Class::Authorized)
        .min_by_key(|&(slot, class, since)| (class, since, slot))
        .map(|(slot, class, _)| (slot, class))
}

/// The connection `id` names, if it is still open.
fn live(conns: &mut [Option<OpenConn>], id: ConnId) -> Option<&mut OpenConn> {
    conns.get_mut(id.slot)?.as_mut().filter(|e| e.id == id)
}

/// The event loop: owns the listener and every connection.
pub struct EventLoop {
    poll: Poll,
    listener: Option<TcpListener>,
    interrupt: UnixStream,
    waker: Arc<Waker>,
    pub(super) conns: Vec<Option<OpenConn>>,
    /// [`super::MAX_CONNECTIONS`], or fewer if the open-files limit is lower.
    max_connections: usize,
    /// Most connections that may hold authorized work: [`max_authorized`] of the cap.
    pub(super) max_authorized: usize,
    next_generation: u64,
    pub(super) scratch: Box<[u8]>,
    accept_paused_until: Option<Instant>,
    /// Every answer closes its connection from now on (stop accepting, or exit).
    pub(super) stopping: bool,
    exiting: bool,
    /// The run queue: connections with an event or with work left, in FIFO order.
    ready: VecDeque<ConnId>,
    /// When [`Service::on_tick`] is due.
    next_tick: Instant,
}

impl EventLoop {
    /// Creates a loop serving `listener`. `interrupt` is a stream that becomes readable
    /// when the process is asked to stop (see `signal-hook`'s pipe).
    /// `concurrent_turns` engines may run at once: the connection cap leaves their
    /// descriptors free (see [`connection_cap`]).
    ///
    /// # Errors
    /// The OS refused to create the poll instance or to register a source.
    pub fn new(
        mut listener: TcpListener,
        mut interrupt: UnixStream,
        concurrent_turns: usize,
    ) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        let registry = poll.registry();
        registry.register(&mut listener, LISTENER, Interest::READABLE)?;
        registry.register(&mut interrupt, INTERRUPT, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(registry, WAKER)?);
        let max_connections = connection_cap(concurrent_turns);
        warn_if_reduced(max_connections, concurrent_turns);
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            interrupt,
            waker,
            conns: Vec::new(),
            max_connections,
            max_authorized: max_authorized(max_connections),
            next_generation: 0,
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
            accept_paused_until: None,
            stopping: false,
            exiting: false,
            ready: VecDeque::new(),
            next_tick: Instant::now(),
        })
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
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        loop {
            let now = Instant::now();
            if now >= self.next_tick {
                let mut control = Control::default();
                self.next_tick = service.on_tick(now, &mut control);
                self.apply(service, control);
            }
            if self.exiting && InFlight::of(&self.conns).responses == 0 {
                return Ok(());
            }
            let conns = self.conns.iter().flatten();
            let wake_at = conns
                .filter_map(|e| e.conn.deadline())
                .chain(self.accept_paused_until)
                // Work left on the run queue: only look for new events.
                .chain(Some(now).filter(|_| !self.ready.is_empty()))
                .fold(self.next_tick, Instant::min);
            let timeout = wake_at.saturating_duration_since(Instant::now());
            service.before_poll();
            match self.poll.poll(&mut events, Some(timeout)) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                polled => polled?,
            }
            // New connections first, so that a health check is not accepted only after
            // a round over every busy connection; and again once a backoff has passed.
            let resume = self
                .accept_paused_until
                .is_some_and(|at| Instant::now() >= at);
            if resume || events.iter().any(|e| e.token() == LISTENER) {
                self.accept_all(service);
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => {}
                    WAKER => self.call(service, S::on_wake),
                    INTERRUPT => {
                        let _ = io::copy(&mut self.interrupt, &mut io::sink()); // drain it
                        self.call(service, S::on_interrupt);
                    }
                    Token(token) => {
                        let slot = (token & SLOT_MASK).wrapping_sub(FIRST_CONN);
                        let entry = self.conns.get_mut(slot).and_then(Option::as_mut);
                        let Some(entry) = entry.filter(|e| conn_token(e.id) == Token(token)) else {
                            continue; // left over from a connection that closed
                        };
                        let hung_up = event.is_read_closed() || event.is_error();
                        // A caller that hangs up while its request waits for a turn is
                        // gone: close now, so a queued turn can be dropped.
                        if hung_up && entry.conn.is_waiting() {
                            self.close(service, slot);
                        } else {
                            self.enqueue(slot);
                        }
                    }
                }
            }
            let round_end = Instant::now() + ROUND_BUDGET;
            while let Some(id) = self.ready.pop_front() {
                if let Some(entry) = live(&mut self.conns, id) {
                    entry.queued = false;
                    self.drive(service, id.slot);
                }
                if Instant::now() >= round_end {
                    break;
                }
            }
            self.expire(service);
        }
    }

    /// Calls `callback` of `service` and does what it asked.
    fn call<S: Service>(&mut self, service: &mut S, callback: fn(&mut S, &mut Control)) {
        let mut control = Control::default();
        callback(service, &mut control);
        self.apply(service, control);
    }

    fn apply<S: Service>(&mut self, service: &mut S, control: Control) {
        // First, so that the answers given with the stop already say they close.
        self.stopping |= control.stop_accepting || control.exit;
        for (id, response) in control.responses {
            let in_flight = InFlight::of(&self.conns);
            let entry = live(&mut self.conns, id);
            if let Some(entry) = entry.filter(|e| e.conn.is_waiting()) {
                entry.answer(response, &in_flight, self.stopping);
                self.drive(service, id.slot);
            }
        }
        if control.stop_accepting {
            if let Some(mut listener) = self.listener.take() {
                let _ = self.poll.registry().deregister(&mut listener);
            }
            // Idle keep-alive connections will never get another answer: running each
            // connection once closes them (see `drive`).
            for slot in 0..self.conns.len() {
                self.drive(service, slot);
            }
        }
        self.exiting |= control.exit;
        if let Some(at) = control.tick_at {
            self.next_tick = self.next_tick.min(at);
        }
    }

    fn accept_all<S: Service>(&mut self, service: &mut S) {
        self.accept_paused_until = None;
        while let Some(accepted) = self.listener.as_ref().map(TcpListener::accept) {
            match accepted {
                Ok((stream, _peer)) => self.admit(service, stream),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a transient failure: make
                    // room if we can and try again shortly; never spin.
                    log::warn!("accept failed: {e}");
                    self.make_room(service, true);
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Closes one connection to admit a new one (see [`eviction_victim`]); whether
    /// there is room now. With `failed_accept` (accept ran out of descriptors) one is
    /// closed even below the cap, to give the next accept a descriptor. An incomplete
    /// head is read once more before it is judged: its bytes may have arrived since the
    /// last read (its readiness event waiting behind the accept), and hold a head that
    /// passes its checks, which is then authorized work. Each connection is read at
    /// most once per call, so the work is bounded by the connections open.
    fn make_room<S: Service>(&mut self, service: &mut S, failed_accept: bool) -> bool {
        let mut read_again = Vec::new();
        let open_before = self.open();
        loop {
            let open = self.open();
            if open < open_before || (!failed_accept && open < self.max_connections) {
                return true; // reading one closed it
            }
            let open = self.conns.iter().flatten();
            let open = open.map(|e| (e.id.slot, e.conn.class(), e.conn.phase_started));
            let Some((slot, class)) = eviction_victim(open) else {
                return false;
            };
            if class == Class::IncompleteHead && !read_again.contains(&slot) {
                read_again.push(slot);
                self.drive(service, slot);
                continue;
            }
            log::debug!("connection limit reached: closing one ({class:?})");
            self.close(service, slot);
            return true;
        }
    }

    fn admit<S: Service>(&mut self, service: &mut S, mut stream: TcpStream) {
        if self.open() >= self.max_connections && !self.make_room(service, false) {
            log::warn!(
                "connection limit reached and every connection holds authorized work; \
                 refusing one"
            );
            return; // dropping the stream closes it
        }
        let _ = stream.set_nodelay(true);
        let slot = self.conns.iter().position(Option::is_none);
        let slot = slot.unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        self.next_generation += 1;
        let id = ConnId {
            slot,
            generation: self.next_generation,
        };
        let interest = Interest::READABLE | Interest::WRITABLE;
        let registry = self.poll.registry();
        if let Err(e) = registry.register(&mut stream, conn_token(id), interest) {
            log::warn!("cannot register a connection: {e}");
            return;
        }
        self.conns[slot] = Some(OpenConn {
            stream,
            id,
            queued: false,
            conn: Conn::new(Instant::now()),
        });
        // The client may have sent its request already: an edge-triggered poll would
        // not report data that arrived before registration.
        self.drive(service, slot);
    }

    pub(super) fn close<S: Service>(&mut self, service: &mut S, slot: usize) {
        let Some(mut entry) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut entry.stream);
        if entry.conn.is_waiting() {
            service.on_abandoned(entry.id);
        }
    }

    /// How many connections are open.
    fn open(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// Applies every deadline that has passed: the connection answers 408 or closes.
    fn expire<S: Service>(&mut self, service: &mut S) {
        let now = Instant::now();
        for slot in 0..self.conns.len() {
            let entry = self.conns[slot].as_mut();
            if entry.is_some_and(|e| e.conn.expire(now)) {
                self.drive(service, slot);
            }
        }
    }

    /// Puts a connection on the run queue (once, however many events it has).
    pub(super) fn enqueue(&mut self, slot: usize) {
        let entry = self.conns.get_mut(slot).and_then(Option::as_mut);
        if let Some(entry) = entry.filter(|e| !e.queued) {
            entry.queued = true;
            self.ready.push_back(entry.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_incomplete_heads_oldest_first_then_idle_never_authorized() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        type Row<'a> = (&'a str, &'a [(usize, Class, u64)], Option<usize>);
        let cases: &[Row] = &[
            ("empty", &[], None),
            (
                "only authorized work",
                &[(0, Class::Authorized, 0), (1, Class::Authorized, 5)],
                None,
            ),
            (
                "an incomplete head before an older idle one",
                &[
                    (0, Class::Idle, 0),
                    (1, Class::IncompleteHead, 9),
                    (2, Class::Authorized, 0),
                ],
                Some(1),
            ),
            (
                "the oldest incomplete head",
                &[
                    (0, Class::IncompleteHead, 7),
                    (1, Class::IncompleteHead, 3),
                    (2, Class::IncompleteHead, 5),
                ],
                Some(1),
            ),
            (
                "the longest idle",
                &[
                    (0, Class::Idle, 4),
                    (1, Class::Authorized, 0),
                    (2, Class::Idle, 2),
                ],
                Some(2),
            ),
            (
                "a stalled answer that is not authorized work before idle",
                &[(0, Class::Idle, 0), (1, Class::Answering, 8)],
                Some(1),
            ),
            (
                "a lingering one first",
                &[(0, Class::IncompleteHead, 0), (1, Class::Done, 8)],
                Some(1),
            ),
            (
                "ties go to the lower slot",
                &[(4, Class::Idle, 1), (2, Class::Idle, 1)],
                Some(2),
            ),
        ];
        for (context, conns, want) in cases {
            let got = eviction_victim(conns.iter().map(|&(slot, c, s)| (slot, c, at(s))))
                .map(|(slot, _)| slot);
            assert_eq!(got, *want, "{context}");
        }
    }
}
