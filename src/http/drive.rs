//! Running one connection: the reads, writes and [`Service`] calls its [`Conn`] asks
//! for, and the budgets all connections share.

use super::conn::{Action, Class, Conn};
use super::event_loop::EventLoop;
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

/// What the other connections hold now: body bytes being read, response bytes being
/// written, and connections holding authorized work (see [`Class::Authorized`]).
#[derive(Debug, Default)]
pub(super) struct InFlight {
    bodies: usize,
    pub(super) responses: usize,
    authorized: usize,
}

impl InFlight {
    /// What `conns` hold now. Summed when a budget is asked, so nothing is counted
    /// twice or left behind by a connection that closed.
    pub(super) fn of(conns: &[Option<OpenConn>]) -> InFlight {
        let mut sum = InFlight::default();
        for conn in conns.iter().flatten().map(|entry| &entry.conn) {
            let (body, response) = conn.in_flight();
            sum.bodies = sum.bodies.saturating_add(body);
            sum.responses = sum.responses.saturating_add(response);
            sum.authorized += usize::from(conn.class() == Class::Authorized);
        }
        sum
    }

    /// Whether a new authorized request with a body of `len` bytes may be read: the
    /// body fits the body budget, and fewer than `max_authorized` connections (the
    /// connection cap less [`super::HEALTH_RESERVE`]) hold authorized work.
    fn admits_request(&self, len: usize, max_authorized: usize) -> bool {
        self.bodies.saturating_add(len) <= MAX_BODY_BYTES_IN_FLIGHT
            && self.authorized < max_authorized
    }

    /// Whether an answer whose body is `len` bytes fits the response budget (always,
    /// when no other answer is in flight).
    fn admits_response(&self, len: usize) -> bool {
        self.responses == 0 || self.responses.saturating_add(len) <= MAX_RESPONSE_BYTES_IN_FLIGHT
    }
}

/// One open connection: its socket, its place on the run queue, and its HTTP state.
pub(super) struct OpenConn {
    pub(super) stream: TcpStream,
    pub(super) id: ConnId,
    /// Whether the connection is on the run queue.
    pub(super) queued: bool,
    pub(super) conn: Conn,
}

/// What running a connection as far as it can go ended with.
enum Step {
    /// Wait for the next readiness event.
    Park,
    Close,
    /// Used its share of this loop iteration; continue after the others had theirs.
    Yield,
}

/// A response as it will be written: once the loop is stopping, it closes its
/// connection, and says so.
fn finalize(mut response: Response, stopping: bool) -> Response {
    response.close |= stopping;
    response
}

impl EventLoop {
    /// Runs the connection in `slot` as far as it can go without blocking: does what
    /// it asks, one [`Action`] at a time, until it has to wait (reads into the loop's
    /// one buffer, writes, and calls `service`). The budgets count the shares of the
    /// other connections, those in their slots.
    pub(super) fn drive<S: Service>(&mut self, service: &mut S, slot: usize) {
        // Out of its slot while it runs; no callback of the service can reach it there.
        let Some(mut entry) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let (id, stopping) = (entry.id, self.stopping);
        entry.conn.begin_step();
        let step = loop {
            match entry.conn.poll(Instant::now()) {
                Action::Read(wanted) => {
                    let (buf, _) = self.scratch.split_at_mut(wanted.min(self.scratch.len()));
                    match entry.stream.read(buf) {
                        Ok(n) if n > 0 => entry.conn.received(&buf[..n], Instant::now()),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break Step::Park,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        _ => break Step::Close, // the peer hung up, or the socket failed
                    }
                }
                Action::Write(bytes) => match entry.stream.write(bytes) {
                    Ok(n) if n > 0 => entry.conn.wrote(n, Instant::now()),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break Step::Park,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    _ => break Step::Close,
                },
                Action::ShutdownWrite => {
                    let _ = entry.stream.shutdown(Shutdown::Write);
                }
                Action::Head(head) => match service.on_head(id, head) {
                    HeadAction::Respond(response) => {
                        entry
                            .conn
                            .respond(finalize(response, stopping), Instant::now());
                    }
                    HeadAction::ReadBody(len)
                        if InFlight::of(&self.conns).admits_request(len, self.max_authorized) =>
                    {
                        entry.conn.read_body(len, Instant::now());
                    }
                    // Past the body budget, or into the health reserve: refused the
                    // way the service refuses (and audits) an HTTP-layer error.
                    HeadAction::ReadBody(_) => entry.conn.fail(HttpError::Overloaded),
                },
                Action::Request(head, body) => {
                    if let Some(response) = service.on_request(id, head, body) {
                        entry.answer(response, &InFlight::of(&self.conns), stopping);
                    }
                }
                Action::Error(error, head) => {
                    let response = service.error_response(error, head);
                    entry.conn.respond(response, Instant::now());
                }
                Action::Wait => break Step::Park,
                Action::Yield => break Step::Yield,
                Action::Close(_) => break Step::Close,
            }
        };
        // An answer begun before the stop, now written, leaves a kept-alive connection
        // that will never get another: close it too.
        let closes = matches!(step, Step::Close) || stopping && entry.conn.is_between_requests();
        self.conns[slot] = Some(entry);
        match step {
            _ if closes => self.close(service, slot),
            Step::Yield => self.enqueue(slot),
            Step::Park | Step::Close => {}
        }
    }
}

impl OpenConn {
    /// Starts writing `response`, the answer to this connection's authorized request
    /// (now or deferred), if it fits the response budget beside what is `in_flight`;
    /// otherwise [`HttpError::Overloaded`] (a small 503 from the service), after which
    /// the connection closes.
    pub(super) fn answer(&mut self, response: Response, in_flight: &InFlight, stopping: bool) {
        if in_flight.admits_response(response.body.len()) {
            self.conn
                .respond(finalize(response, stopping), Instant::now());
        } else {
            log::debug!(
                "{} response bytes in flight: answering 503 instead of a {}-byte answer",
                in_flight.responses,
                response.body.len()
            );
            self.conn.fail(HttpError::Overloaded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_flight(bodies: usize, responses: usize, authorized: usize) -> InFlight {
        InFlight {
            bodies,
            responses,
            authorized,
        }
    }

    #[test]
    fn the_health_reserve_refuses_authorized_work_past_its_limit() {
        // At most two connections may hold authorized work.
        assert!(in_flight(0, 0, 0).admits_request(10, 2));
        assert!(in_flight(10, 0, 1).admits_request(10, 2));
        // Two connections hold authorized work: the rest is the reserve.
        assert!(!in_flight(10, 0, 2).admits_request(0, 2));
        // One of them is answered and goes idle: room again.
        assert!(in_flight(0, 0, 1).admits_request(0, 2));
        // Nothing in flight counts what no open connection holds.
        assert_eq!(InFlight::of(&[None, None]).authorized, 0);
    }

    #[test]
    fn the_body_budget_refuses_a_body_past_it() {
        let in_flight = in_flight(MAX_BODY_BYTES_IN_FLIGHT - 5, 0, 1);
        assert!(in_flight.admits_request(5, usize::MAX));
        assert!(!in_flight.admits_request(6, usize::MAX));
    }

    #[test]
    fn the_response_budget_refuses_an_answer_past_it_but_never_the_only_one() {
        // Nothing in flight: any answer goes, however large.
        assert!(in_flight(0, 0, 0).admits_response(MAX_RESPONSE_BYTES_IN_FLIGHT * 2));
        let big = in_flight(0, MAX_RESPONSE_BYTES_IN_FLIGHT - 100, 1);
        assert!(big.admits_response(100));
        assert!(!big.admits_response(101));
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
