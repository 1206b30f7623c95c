//! The interface between the event loop and the service it serves: the [`Service`]
//! callbacks, what a service may ask of the loop ([`Control`], [`HeadAction`]), and the
//! [`ConnId`] that names a connection across a deferred answer.

use super::message::{Head, HttpError, Response};
use std::time::Instant;

/// Identifies one connection for a deferred answer. A connection that closed is
/// never confused with a later one that reused its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub(super) slot: usize,
    pub(super) generation: u64,
}

/// What to do after a head.
#[derive(Debug)]
pub enum HeadAction {
    /// Answer now without reading any body. If the head announced a body, the
    /// connection closes after the answer.
    Respond(Response),
    /// Read exactly this many body bytes, then call [`Service::on_request`]. Only for a
    /// head that passed the service's checks (the bus's 1-6): the connection then holds
    /// authorized work, never evicted. The loop answers [`HttpError::Overloaded`]
    /// instead past the body budget or into [`super::HEALTH_RESERVE`].
    ReadBody(usize),
}

/// Requests a service makes of the loop from inside a callback.
#[derive(Debug, Default)]
pub struct Control {
    pub(super) responses: Vec<(ConnId, Response)>,
    pub(super) stop_accepting: bool,
    pub(super) exit: bool,
    pub(super) tick_at: Option<Instant>,
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

    /// Closes the listener and idle keep-alive connections; every answer from now on
    /// (those given with this call too) closes its connection.
    pub fn stop_accepting(&mut self) {
        self.stop_accepting = true;
    }

    /// Ends the loop once the responses already queued have been written (or have
    /// overstayed [`super::WRITE_TIMEOUT`]).
    pub fn exit(&mut self) {
        self.exit = true;
    }
}

/// The bus side of the loop. Callbacks run on the loop thread and must not block.
pub trait Service {
    /// A complete head arrived on `id`.
    fn on_head(&mut self, id: ConnId, head: &Head) -> HeadAction;

    /// The body agreed to in [`HeadAction::ReadBody`] arrived. Return `Some` to answer
    /// now, or `None` to answer later through [`Control::respond`]. Either answer is
    /// replaced by [`Service::error_response`] with [`HttpError::Overloaded`] when it
    /// would go past the response budget.
    fn on_request(&mut self, id: ConnId, head: &Head, body: Vec<u8>) -> Option<Response>;

    /// The body of an error the HTTP layer answers itself, with the request's head
    /// when it got that far. `close` is forced on.
    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response;

    /// The [`mio::Waker`] was woken (for example, a turn finished).
    fn on_wake(&mut self, control: &mut Control);

    /// The interrupt stream became readable (a signal asked the process to stop).
    fn on_interrupt(&mut self, control: &mut Control);

    /// Periodic work; return when to be called next.
    fn on_tick(&mut self, now: Instant, control: &mut Control) -> Instant;

    /// A connection whose request was deferred closed before it was answered.
    fn on_abandoned(&mut self, id: ConnId);

    /// The loop is about to wait for events: the end of a round of callbacks. Work the
    /// round deferred starts here, once for all of it (the bus wakes its turn workers).
    fn before_poll(&mut self);
}
