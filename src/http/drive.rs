//! Running one connection: the reads, writes and [`Service`] calls its [`Conn`] asks
//! for, and the budgets all connections share.

use super::conn::{Action, Class, Conn, CONTINUE};
use super::message::{HttpError, Response};
use super::service::{ConnId, HeadAction, Service};
use mio::net::TcpStream;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::time::Instant;

/// Body bytes all connections together may be reading at once (declared lengths). A
/// head whose body would go past it is answered 503 and the connection closes, so that
/// many connections each sending a large body slowly can't grow memory without bound.
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 8 * 1024 * 1024;

/// Response bytes all connections together may hold while writing answers. Every
/// answer being written counts; an answer to an authorized request (its body length)
/// past it is replaced by a 503 `server_busy` and the connection closes, so clients
/// that never read can't grow memory without bound; one that finds nothing else in
/// flight is always written (the bound is this plus one answer). Answers from a head
/// alone (a few hundred bytes each, at most one per open connection) are never refused
/// by it.
pub const MAX_RESPONSE_BYTES_IN_FLIGHT: usize = 16 * 1024 * 1024;

/// What all connections hold now: body bytes being read, response bytes being written,
/// and connections holding authorized work (see [`super::conn::Class::Authorized`]).
#[derive(Debug, Default)]
pub(super) struct InFlight {
    bodies: usize,
    responses: usize,
    authorized: usize,
    /// Most connections that may hold authorized work: the connection cap less
    /// [`super::HEALTH_RESERVE`].
    max_authorized: usize,
}

/// One connection's share of [`InFlight`], as last counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Share {
    body: usize,
    response: usize,
    authorized: bool,
}

impl Share {
    fn of(conn: &Conn) -> Share {
        Share {
            body: conn.body_in_flight(),
            response: conn.response_in_flight(),
            authorized: conn.class() == Class::Authorized,
        }
    }
}

impl InFlight {
    /// Nothing in flight; at most `max_authorized` connections may hold authorized work.
    pub(super) fn new(max_authorized: usize) -> InFlight {
        InFlight {
            max_authorized,
            ..InFlight::default()
        }
    }

    /// Brings `entry`'s share up to date with what its connection holds now.
    fn account(&mut self, entry: &mut OpenConn) {
        let now = Share::of(&entry.conn);
        self.replace(entry.counted, now);
        entry.counted = now;
    }

    fn replace(&mut self, old: Share, new: Share) {
        let swap = |total: usize, old, new| total.saturating_sub(old).saturating_add(new);
        self.bodies = swap(self.bodies, old.body, new.body);
        self.responses = swap(self.responses, old.response, new.response);
        let (old_one, new_one) = (usize::from(old.authorized), usize::from(new.authorized));
        self.authorized = swap(self.authorized, old_one, new_one);
    }

    /// Gives back `entry`'s share: its connection is closing.
    pub(super) fn release(&mut self, entry: &OpenConn) {
        self.replace(entry.counted, Share::default());
    }

    /// Whether a new authorized request with a body of `len` bytes may be read: the
    /// body fits the body budget, and a connection is left outside the health reserve.
    fn admits_request(&self, len: usize) -> bool {
        self.bodies.saturating_add(len) <= MAX_BODY_BYTES_IN_FLIGHT
            && self.authorized < self.max_authorized
    }

    /// Whether an answer whose body is `len` bytes fits the response budget (always,
    /// when no other answer is in flight).
    fn admits_response(&self, len: usize) -> bool {
        self.responses == 0 || self.responses.saturating_add(len) <= MAX_RESPONSE_BYTES_IN_FLIGHT
    }
}

/// One open connection: its socket, what the poll said of it, and its HTTP state.
pub(super) struct OpenConn {
    pub(super) stream: TcpStream,
    pub(super) generation: u64,
    /// Whether the connection is on the run queue.
    pub(super) queued: bool,
    /// Whether a read may find data (see [`read_some`]).
    pub(super) readable: bool,
    /// A readiness event said the peer hung up (or an error is pending).
    pub(super) peer_closed: bool,
    /// The deadline registered in the loop's set for this connection.
    pub(super) deadline: Option<Instant>,
    /// This connection's share of [`InFlight`].
    counted: Share,
    pub(super) conn: Conn,
}

/// What running a connection as far as it can go ended with.
pub(super) enum Step {
    /// Wait for the next readiness event.
    Park,
    Close,
    /// Used its share of this loop iteration; continue after the others had theirs.
    Yield,
}

/// A response as it will be written: once the loop is stopping, it closes its
/// connection, and says so.
pub(super) fn finalize(mut response: Response, stopping: bool) -> Response {
    response.close |= stopping;
    response
}

impl OpenConn {
    /// A connection accepted at `now` on `stream`.
    pub(super) fn new(stream: TcpStream, generation: u64, now: Instant) -> OpenConn {
        OpenConn {
            stream,
            generation,
            queued: false,
            readable: true,
            peer_closed: false,
            deadline: None,
            counted: Share::default(),
            conn: Conn::new(now),
        }
    }

    /// This connection's id for the service, in `slot`.
    pub(super) fn id(&self, slot: usize) -> ConnId {
        ConnId {
            slot,
            generation: self.generation,
        }
    }

    /// Does what the connection asks, one [`Action`] at a time, until it has to wait:
    /// reads into `scratch`, writes, and calls `service`.
    pub(super) fn step<S: Service>(
        &mut self,
        service: &mut S,
        slot: usize,
        scratch: &mut [u8],
        in_flight: &mut InFlight,
        stopping: bool,
    ) -> Step {
        let id = self.id(slot);
        self.conn.begin_step();
        loop {
            in_flight.account(self);
            match self.conn.poll(Instant::now()) {
                Action::Read(wanted) => {
                    let cap = wanted.min(scratch.len());
                    let buf = &mut scratch[..cap];
                    match read_some(&mut self.stream, &mut self.readable, self.peer_closed, buf) {
                        ReadOutcome::Data(n) => self.conn.received(&buf[..n], Instant::now()),
                        ReadOutcome::WouldBlock => return Step::Park,
                        ReadOutcome::Closed => return Step::Close,
                    }
                }
                Action::Write(bytes) => match self.stream.write(bytes) {
                    Ok(0) => return Step::Close,
                    Ok(n) => self.conn.wrote(n, Instant::now()),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Park,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return Step::Close,
                },
                Action::SendContinue => {
                    // Tell a waiting client (curl, for one) to send the body now. A
                    // fresh socket's buffer takes these bytes whole; if not, give up.
                    if !matches!(self.stream.write(CONTINUE), Ok(n) if n == CONTINUE.len()) {
                        return Step::Close;
                    }
                    self.conn.continue_sent();
                }
                Action::ShutdownWrite => {
                    let _ = self.stream.shutdown(Shutdown::Write);
                }
                Action::Head(head) => match service.on_head(id, head) {
                    HeadAction::Respond(response) => {
                        self.conn
                            .respond(finalize(response, stopping), Instant::now());
                    }
                    HeadAction::ReadBody(len) if in_flight.admits_request(len) => {
                        self.conn.read_body(len, Instant::now());
                    }
                    // Past the body budget, or into the health reserve: refused the
                    // way the service refuses (and audits) an HTTP-layer error.
                    HeadAction::ReadBody(_) => self.overloaded(service),
                },
                Action::Request(head, body) => {
                    if let Some(response) = service.on_request(id, head, body) {
                        self.answer(service, response, in_flight, stopping);
                    }
                }
                Action::Error(error, head) => {
                    let response = service.error_response(error, head);
                    self.conn.respond_error(response, Instant::now());
                }
                Action::Wait => return Step::Park,
                Action::Yield => return Step::Yield,
                Action::Close(_) => return Step::Close,
            }
        }
    }

    /// Starts writing `response`, the answer to this connection's authorized request
    /// (now or deferred), if it fits the response budget; otherwise a small 503 from
    /// the service, after which the connection closes.
    pub(super) fn answer<S: Service>(
        &mut self,
        service: &mut S,
        response: Response,
        in_flight: &mut InFlight,
        stopping: bool,
    ) {
        if in_flight.admits_response(response.body.len()) {
            self.conn
                .respond(finalize(response, stopping), Instant::now());
        } else {
            log::debug!(
                "{} response bytes in flight: answering 503 instead of a {}-byte answer",
                in_flight.responses,
                response.body.len()
            );
            self.overloaded(service);
        }
        // Counted now, so that the next answer decided before this one is driven sees it.
        in_flight.account(self);
    }

    /// The service's answer to [`HttpError::Overloaded`], after which it closes.
    fn overloaded<S: Service>(&mut self, service: &mut S) {
        let response = service.error_response(HttpError::Overloaded, self.conn.head());
        self.conn.respond_error(response, Instant::now());
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

    fn share(body: usize, response: usize, authorized: bool) -> Share {
        Share {
            body,
            response,
            authorized,
        }
    }

    #[test]
    fn the_health_reserve_refuses_authorized_work_past_its_limit() {
        let mut in_flight = InFlight::new(2);
        assert!(in_flight.admits_request(10));
        in_flight.replace(Share::default(), share(10, 0, true));
        assert!(in_flight.admits_request(10));
        in_flight.replace(Share::default(), share(0, 0, true));
        // Two connections hold authorized work: the rest is the reserve.
        assert!(!in_flight.admits_request(0));
        // One of them is answered and goes idle: room again.
        in_flight.replace(share(10, 0, true), Share::default());
        assert!(in_flight.admits_request(0));
    }

    #[test]
    fn the_body_budget_refuses_a_body_past_it() {
        let mut in_flight = InFlight::new(usize::MAX);
        in_flight.replace(
            Share::default(),
            share(MAX_BODY_BYTES_IN_FLIGHT - 5, 0, true),
        );
        assert!(in_flight.admits_request(5));
        assert!(!in_flight.admits_request(6));
    }

    #[test]
    fn the_response_budget_refuses_an_answer_past_it_but_never_the_only_one() {
        let mut in_flight = InFlight::new(usize::MAX);
        // Nothing in flight: any answer goes, however large.
        assert!(in_flight.admits_response(MAX_RESPONSE_BYTES_IN_FLIGHT * 2));
        let big = share(0, MAX_RESPONSE_BYTES_IN_FLIGHT - 100, true);
        in_flight.replace(Share::default(), big);
        assert!(in_flight.admits_response(100));
        assert!(!in_flight.admits_response(101));
        // Released when that answer is written (or its connection closes).
        in_flight.replace(big, Share::default());
        assert!(in_flight.admits_response(MAX_RESPONSE_BYTES_IN_FLIGHT));
    }

    #[test]
    fn answers_close_once_the_loop_is_stopping() {
        let response = Response {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
            close: false,
        };
        assert!(!finalize(response.clone(), false).close);
        assert!(finalize(response, true).close);
    }
}
