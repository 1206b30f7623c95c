//! Running one connection: the reads and writes its sans-IO [`Conn`] asks for, on its
//! socket, the [`Service`] calls its requests need, and the body budget all
//! connections share.

use super::conn::{Action, Conn, CONTINUE};
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

/// The declared lengths of the bodies being read now, all connections together.
#[derive(Debug, Default)]
pub(super) struct BodyBudget {
    in_flight: usize,
}

impl BodyBudget {
    /// Brings `entry`'s share up to date with what its connection is reading.
    fn account(&mut self, entry: &mut Entry) {
        let now = entry.conn.body_in_flight();
        self.in_flight = self
            .in_flight
            .saturating_sub(entry.counted)
            .saturating_add(now);
        entry.counted = now;
    }

    /// Gives back `entry`'s share: its connection is closing.
    pub(super) fn release(&mut self, entry: &Entry) {
        self.in_flight = self.in_flight.saturating_sub(entry.counted);
    }

    /// Whether another body of `len` bytes fits.
    fn admits(&self, len: usize) -> bool {
        self.in_flight.saturating_add(len) <= MAX_BODY_BYTES_IN_FLIGHT
    }
}

/// One open connection: its socket, what the poll said of it, and its HTTP state.
pub(super) struct Entry {
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
    /// This connection's share of the [`BodyBudget`].
    counted: usize,
    pub(super) conn: Conn,
}

/// What running a connection as far as it can go ended with.
pub(super) enum Step {
    /// Wait for the next readiness event.
    Park,
    /// Close the connection now.
    Close,
    /// Used its share of this loop iteration; continue after the others had theirs.
    Yield,
}

/// A response as it will be written: once the loop is exiting, every connection
/// closes after its answer.
pub(super) fn finalize(mut response: Response, exiting: bool) -> Response {
    response.close |= exiting;
    response
}

impl Entry {
    /// A connection accepted at `now` on `stream`.
    pub(super) fn new(stream: TcpStream, generation: u64, now: Instant) -> Entry {
        Entry {
            stream,
            generation,
            queued: false,
            readable: true,
            peer_closed: false,
            deadline: None,
            counted: 0,
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
        bodies: &mut BodyBudget,
        exiting: bool,
    ) -> Step {
        let id = self.id(slot);
        self.conn.begin_step();
        loop {
            bodies.account(self);
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
                        let response = finalize(response, exiting);
                        self.conn.respond(response, Instant::now());
                    }
                    HeadAction::ReadBody(len) if bodies.admits(len) => {
                        self.conn.read_body(len, Instant::now());
                    }
                    HeadAction::ReadBody(_) => {
                        let response =
                            service.error_response(HttpError::Overloaded, self.conn.head());
                        self.conn.respond_error(response, Instant::now());
                    }
                },
                Action::Request(head, body) => {
                    if let Some(response) = service.on_request(id, head, body) {
                        let response = finalize(response, exiting);
                        self.conn.respond(response, Instant::now());
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
