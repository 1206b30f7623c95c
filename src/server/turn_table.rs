//! The turn table: every admitted turn, the connections waiting on it and the stored
//! answers of finished ones (contract 8.1, 8.2), with one owner. It is pure: no I/O, no
//! clock of its own (time is passed in), no thread. It says what to answer and what to
//! cancel; the bus writes the answers, audits, and takes turns out of the pool's queue.
//! Every answer to a connection that waits on a turn is an [`Ended`] that
//! [`TurnTable::finish`], [`TurnTable::refuse`] or [`TurnTable::tick`] returns, which the
//! bus writes from a loop callback through [`crate::http::Control`]: that is the one way
//! out. (A new turn the pool refuses was never submitted: the bus takes it back out
//! with [`TurnTable::refuse`], drops what that returns, and refuses its request as any
//! refusal.) Every turn submitted to the pool gets exactly one report back from it
//! (ran, panicked, or withdrawn from the queue), so a cancel's answer comes the way an
//! engine's does.
//!
//! A turn's states, and what moves it between them:
//!
//! ```text
//!            pool full: 503 server_busy, nothing kept
//!           /
//! request -+-admit-> QUEUED --a worker takes it--> RUNNING
//!                      |     (its waiters' deadline    |
//!                      |      starts: timeoutSecs      | the pool reports it
//!                      |      + WAITER_GRACE)          v
//!                      |                            FINISHED: every waiter gets the
//!                      |                               |      envelope; the turn leaves
//!                      |                               |      the table
//!                      |                               | it named an id and is not
//!                      |                               v retryable
//!                      |                            STORED --ANSWER_TTL, or evicted
//!                      |                                     oldest first--> gone
//!                      v
//!   QUEUED or RUNNING, on:
//!     a retry of its id ............. one more waiter (a KEPT turn is waited on again)
//!     a cancel request for its id ... one more waiter, then CANCELLING
//!     the last waiter hangs up, no id  CANCELLING (bus.cancelOnHangup false: ABANDONED:
//!                                     runs on, answers nobody, its answer not audited)
//!     the last waiter hangs up, an id KEPT for bus.reattachSecs (cancelOnHangup false:
//!                                     to its end); when the window closes, CANCELLING
//!     shutdown (QUEUED only) ........ every waiter 503 server_busy; gone
//!     its deadline passes, waiters .. every waiter 500 internal_error (a bug, logged);
//!                                     its engine stopped; gone
//!   CANCELLING: a queued turn is withdrawn from the queue, a running one's engine
//!     stopped; the pool reports it like any turn: FINISHED, `cancelled`.
//! ```
//!
//! Each waiter gets the turn's envelope as its own request negotiated it. The table
//! holds turns only: which turn a connection or a request id waits on is looked up
//! among them (every held turn is in the pool, running or queued: at most
//! `bus.maxConcurrentTurns` + `bus.maxQueuedTurns`, which start-up keeps under the
//! connection cap).

use super::answer::{elapsed_ms, TalkMeta};
use super::requests::{self, RequestDigest, RequestKey, RequestStore};
use super::Refusal;
use crate::config::BusConfig;
use crate::engine::{self, CancelToken, TurnOutput, TurnResult};
use crate::protocol::{self, Envelope, ErrorCode, InstanceName, TalkRequest, UsageReport};
use crate::turns::Outcome;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What a waiting connection's deadline adds to its turn's `engine.timeoutSecs`
/// (counted from when a worker took the turn; time in the queue does not count, as the
/// queue moves only when running turns end): enough for the engine's kill grace and
/// pipe drain after a timeout. Past it, the turn is lost to a bug in this crate and its
/// waiters get 500 `internal_error` rather than wait forever.
pub const WAITER_GRACE: Duration = Duration::from_secs(30);

/// Names one admitted turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TurnId(u64);

/// A connection waiting for a turn's envelope, and what its own request negotiated:
/// the envelope it gets is the turn's, with its own request's capabilities, and
/// `usage` only if its request listed `usage-report` (contract 4.1, 8.3).
pub(super) struct Waiter<C> {
    pub(super) conn: C,
    capabilities: Vec<String>,
    wants_usage: bool,
}

impl<C> Waiter<C> {
    /// The turn's `envelope` as this waiter's request negotiated it.
    pub(super) fn negotiate(&self, envelope: &Envelope) -> Envelope {
        let usage = envelope.usage.filter(|_| self.wants_usage);
        envelope
            .clone()
            .with_capabilities(self.capabilities.clone())
            .with_usage(usage)
    }
}

/// One admitted turn, until it ends (an [`Ended`]).
pub(super) struct TurnState<C> {
    /// The connections waiting for its envelope: the first request's, and those of
    /// retries and cancel requests attached to it.
    pub(super) waiters: Vec<Waiter<C>>,
    /// The first request, for the audit line (with the ids the bus made for the turn);
    /// its envelope's `durationMs` counts from its `received_at`.
    pub(super) meta: TalkMeta,
    /// Its (`fromInstance`, `requestId`) and what that id stands for, if it named one.
    named: Option<(RequestKey, RequestDigest)>,
    /// Stops its engine (the job holds a clone).
    cancel: CancelToken,
    /// Why it was cancelled, once it was.
    pub(super) cancelled: Option<&'static str>,
    /// `engine.timeoutSecs` (as admitted) plus [`WAITER_GRACE`].
    limit: Duration,
    /// Its waiters' deadline: `limit` after it was first seen out of the queue.
    answer_by: Option<Instant>,
    /// Its last waiter hung up at this time (it named an id: a retry may attach).
    orphaned_at: Option<Instant>,
}

/// What admitting a request that passed checks 1-9 comes to.
#[derive(Debug)]
pub(super) enum Admit {
    /// A new turn, held, to submit with the token that stops its engine; if the pool
    /// refuses it, the bus takes it back out ([`TurnTable::refuse`]).
    New(TurnId, CancelToken),
    /// A retry or a cancel request joined the running turn of its id, and waits with
    /// it; the bus cancels it for a cancel request.
    Attached(TurnId),
    /// The stored envelope of its id, as this request negotiated it; no engine runs.
    Stored(Envelope),
    /// `RequestIdReused` or `UnknownRequestId`.
    Refused(Refusal),
}

/// What a hang-up of a waiting connection comes to (contract 8.1).
pub(super) enum HangUp {
    /// Nothing changes: it waited on nothing, others still wait, or the turn is being
    /// cancelled already.
    Nothing,
    /// Kept for a retry of its id (the caller named here): cancelled by [`TurnTable::tick`]
    /// when `bus.reattachSecs` run out, never with `bus.cancelOnHangup` false.
    Kept(String),
    /// Cancel it now.
    Cancel(TurnId),
    /// `bus.cancelOnHangup` false, no id: it runs on unanswered (a queued one is taken
    /// out of the queue); the bus audits this hang-up, of this first request.
    Abandoned(TurnId, TalkMeta),
}

/// A turn that left the table, with the connections waiting on it, and its envelope
/// (each waiter gets it negotiated) or the refusal each waiter gets.
pub(super) type Ended<C> = (TurnState<C>, Result<Envelope, Refusal>);

/// What [`TurnTable::tick`] found due: the kept turns whose reattach window closed
/// (the bus cancels them); the turns past their waiters' deadline, taken out of the
/// table with a 500 for each waiter (the bus answers, logs the bug, and takes them out
/// of the pool's queue); and when the next deadline falls, if any.
pub(super) type Due<C> = (Vec<TurnId>, Vec<(TurnId, Ended<C>)>, Option<Instant>);

/// The table; `C` names a connection (the server's is `http::ConnId`).
pub(super) struct TurnTable<C> {
    /// The instance's name, for envelopes.
    name: InstanceName,
    turns: HashMap<TurnId, TurnState<C>>,
    /// The stored answers of finished turns that named an id (contract 8.2).
    requests: RequestStore,
    next_id: u64,
}

impl<C: Copy + Eq> TurnTable<C> {
    pub(super) fn new(name: InstanceName) -> TurnTable<C> {
        TurnTable {
            name,
            turns: HashMap::new(),
            requests: RequestStore::default(),
            next_id: 0,
        }
    }

    /// Admits `request` from `conn`: a cancel request, a retry of a known id, or a new
    /// turn whose engine may take `timeout`.
    pub(super) fn admit(
        &mut self,
        conn: C,
        request: &TalkRequest,
        meta: TalkMeta,
        timeout: Duration,
        now: Instant,
    ) -> Admit {
        let waiter = Waiter {
            conn,
            capabilities: protocol::negotiate(&request.capabilities),
            wants_usage: request.lists(protocol::USAGE_REPORT),
        };
        let cancel = request.ext.cancel;
        let from = &request.from_instance;
        let key = request.ext.request_id.clone().map(|id| (from.clone(), id));
        // What the id stands for; a cancel request's prompt is not compared (8.1).
        let digest =
            (key.is_some() && !cancel).then(|| requests::digest(&request.prompt, request.depth));
        if let Some(key) = &key {
            let reused = |known: &RequestDigest| digest.is_some_and(|d| d != *known);
            let mut turns = self.turns.iter_mut();
            if let Some((&turn, state)) =
                turns.find(|(_, s)| s.named.as_ref().is_some_and(|n| n.0 == *key))
            {
                if state.named.as_ref().is_some_and(|(_, known)| reused(known)) {
                    return Admit::Refused(Refusal::RequestIdReused);
                }
                state.waiters.push(waiter);
                state.orphaned_at = None;
                return Admit::Attached(turn);
            }
            if let Some((known, envelope)) = self.requests.get(key, now) {
                if reused(&known) {
                    return Admit::Refused(Refusal::RequestIdReused);
                }
                return Admit::Stored(waiter.negotiate(envelope));
            }
        }
        if cancel {
            return Admit::Refused(Refusal::UnknownRequestId);
        }
        let id = TurnId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        let cancel = CancelToken::new();
        let state = TurnState {
            waiters: vec![waiter],
            meta,
            named: key.zip(digest),
            cancel: cancel.clone(),
            cancelled: None,
            limit: timeout.saturating_add(WAITER_GRACE),
            answer_by: None,
            orphaned_at: None,
        };
        self.turns.insert(id, state);
        Admit::New(id, cancel)
    }

    /// Marks `turn` cancelled for `why` and stops its engine; the bus takes it out of
    /// the pool's queue too, and its `cancelled` envelope comes with the pool's report.
    /// The first request, the first time (for the log).
    pub(super) fn cancel(&mut self, turn: TurnId, why: &'static str) -> Option<&TalkMeta> {
        let state = self.turns.get_mut(&turn)?;
        state.cancel.cancel();
        state.orphaned_at = None;
        let first = state.cancelled.is_none();
        state.cancelled.get_or_insert(why);
        first.then_some(&state.meta)
    }

    /// `conn` closed before its answer. The turn goes on while others wait on it;
    /// otherwise (contract 8.1) it is cancelled at once without an id, after
    /// `bus.reattachSecs` with one; with `bus.cancelOnHangup` false it runs on.
    pub(super) fn hang_up(&mut self, conn: C, bus: &BusConfig, now: Instant) -> HangUp {
        let mut turns = self.turns.iter_mut();
        let Some((&turn, state)) = turns.find(|(_, s)| s.waiters.iter().any(|w| w.conn == conn))
        else {
            return HangUp::Nothing;
        };
        state.waiters.retain(|w| w.conn != conn);
        if !state.waiters.is_empty() || state.cancelled.is_some() {
            return HangUp::Nothing;
        }
        if state.named.is_some() && (bus.reattach_secs > 0 || !bus.cancel_on_hangup) {
            state.orphaned_at = Some(now);
            return HangUp::Kept(caller(&state.meta).to_owned());
        }
        if bus.cancel_on_hangup {
            return HangUp::Cancel(turn);
        }
        HangUp::Abandoned(turn, state.meta.clone())
    }

    /// Ends `turn` as the pool reported it: its envelope for every waiter (`cancelled`
    /// if it was cancelled, even if the engine finished as the cancel came), stored for
    /// retries of its id when it is a success or a failure that is not retryable
    /// (contract 8.2); after a panic, a 500 for every waiter. `None` if the table no
    /// longer holds it (answered overdue), or if it was abandoned.
    pub(super) fn finish(
        &mut self,
        turn: TurnId,
        outcome: Outcome<TurnOutput>,
        now: Instant,
    ) -> Option<Ended<C>> {
        let output = match outcome {
            Outcome::Finished(output) => output,
            Outcome::Withdrawn => {
                TurnOutput::without_usage(TurnResult::Failed(engine::cancelled()))
            }
            Outcome::Panicked => return self.refuse(turn, Refusal::HandlerPanicked),
        };
        let mut state = self.turns.remove(&turn)?;
        // Only an abandoned turn ends with no waiter, no id and not cancelled (the
        // hang-up of its last waiter cancels it or keeps it otherwise): it answers
        // nobody, and its hang-up was audited instead.
        if state.waiters.is_empty() && state.named.is_none() && state.cancelled.is_none() {
            return None;
        }
        state.meta.session_id = output.session_id;
        let result = match state.cancelled {
            Some(_) => TurnResult::Failed(engine::cancelled()),
            None => output.result,
        };
        // Only what the engine reported (contract 8.3): a text engine reports nothing,
        // a JSON engine may report tokens without a cost.
        let usage = output
            .usage
            .filter(|u| u.is_reported())
            .map(|u| UsageReport {
                cost_usd: u.cost_reported.then_some(u.cost_usd),
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cached_tokens: u.cached_tokens,
            });
        let took = elapsed_ms(state.meta.received_at, now);
        let envelope = match result {
            TurnResult::Reply(text) => Envelope::success(&self.name, text, took),
            TurnResult::Failed(failure) => Envelope::failure(&self.name, failure, took),
        }
        .with_usage(usage);
        let failure = envelope.failure.as_ref();
        let storable = failure.is_none_or(|f| !f.retryable && f.code != ErrorCode::BudgetExhausted);
        if let Some((key, digest)) = state.named.as_ref().filter(|_| storable) {
            let size = envelope.to_json().len();
            self.requests
                .store(key, *digest, envelope.clone(), size, now);
        }
        Some((state, Ok(envelope)))
    }

    /// Ends `turn` with `refusal` for every waiter (shutdown: the pool handed it back
    /// queued; a panic; a deadline), stops its engine, and forgets its id.
    pub(super) fn refuse(&mut self, turn: TurnId, refusal: Refusal) -> Option<Ended<C>> {
        let state = self.turns.remove(&turn)?;
        state.cancel.cancel();
        Some((state, Err(refusal)))
    }

    /// The upkeep at `now`: drops stored answers past their TTL, notes the turns that
    /// left the queue (`queued` says which still wait), and returns the kept turns whose
    /// reattach window closed and the turns past their waiters' deadline.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        bus: &BusConfig,
        queued: impl Fn(TurnId) -> bool,
    ) -> Due<C> {
        self.requests.expire(now);
        let reattach = Duration::from_secs(bus.reattach_secs);
        let window = bus.cancel_on_hangup.then_some(reattach);
        let (mut expired, mut overdue, mut next) = (Vec::new(), Vec::new(), None::<Instant>);
        for (id, state) in &mut self.turns {
            if state.answer_by.is_none() && !queued(*id) {
                state.answer_by = Some(now + state.limit);
            }
            let kept_until = state.orphaned_at.zip(window).map(|(at, w)| at + w);
            let answer_by = state.answer_by.filter(|_| !state.waiters.is_empty());
            for (deadline, due) in [(kept_until, &mut expired), (answer_by, &mut overdue)] {
                match deadline {
                    Some(at) if now >= at => due.push(*id),
                    Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                    None => {}
                }
            }
        }
        let overdue = overdue
            .into_iter()
            .filter_map(|id| Some((id, self.refuse(id, Refusal::TurnOverdue)?)))
            .collect();
        (expired, overdue, next)
    }

    /// Whether no turn is held.
    pub(super) fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

/// The caller's name for a log line.
pub(super) fn caller(meta: &TalkMeta) -> &str {
    meta.from_instance.as_deref().unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::RequestId;

    const SECS: Duration = Duration::from_secs(1);

    /// A request from `alice`, with the id numbered `id` if given.
    fn request(prompt: &str, id: Option<u128>, cancel: bool) -> TalkRequest {
        let mut request = TalkRequest::new("alice", prompt, 1);
        request.ext.request_id = id.map(|n| RequestId::new(format!("{n:032x}")).unwrap());
        request.ext.cancel = cancel;
        request
    }

    fn table() -> TurnTable<u32> {
        TurnTable::new(InstanceName::new("worker").unwrap())
    }

    /// Admits `request` from `conn` as a new turn.
    fn start(table: &mut TurnTable<u32>, conn: u32, request: &TalkRequest, t: Instant) -> TurnId {
        let meta = TalkMeta::of(Some(request), t);
        match table.admit(conn, request, meta, 60 * SECS, t) {
            Admit::New(id, _) => id,
            other => panic!("not a new turn: {other:?}"),
        }
    }

    fn reply(text: &str) -> Outcome<TurnOutput> {
        Outcome::Finished(TurnOutput::without_usage(TurnResult::Reply(text.into())))
    }

    /// Each waiter's connection and its answer's error code (`ok`: a success), as
    /// `1 ok, 2 ok`.
    fn answers(ended: &Ended<u32>) -> String {
        let code = match &ended.1 {
            Ok(envelope) => envelope.failure.as_ref().map(|f| f.code.clone()),
            Err(refusal) => Some(refusal.status_and_code().1),
        };
        let code = code.as_ref().map_or("ok", |c| c.as_str());
        let each: Vec<String> = ended
            .0
            .waiters
            .iter()
            .map(|w| format!("{} {code}", w.conn))
            .collect();
        each.join(", ")
    }

    fn bus(cancel_on_hangup: bool, reattach_secs: u64) -> BusConfig {
        BusConfig {
            cancel_on_hangup,
            reattach_secs,
            ..BusConfig::open()
        }
    }

    #[test]
    fn a_turn_is_answered_stored_and_found_by_a_retry() {
        let t0 = Instant::now();
        let mut table = table();
        let first = request("p", Some(1), false);
        let turn = start(&mut table, 1, &first, t0);
        // A retry attaches; the same id for another prompt is refused.
        let meta = TalkMeta::of(Some(&first), t0);
        assert!(matches!(
            table.admit(2, &first, meta.clone(), SECS, t0),
            Admit::Attached(_)
        ));
        let other = request("q", Some(1), false);
        assert!(matches!(
            table.admit(3, &other, meta.clone(), SECS, t0),
            Admit::Refused(Refusal::RequestIdReused)
        ));
        let ended = table.finish(turn, reply("done"), t0 + SECS).unwrap();
        assert_eq!(answers(&ended), "1 ok, 2 ok");
        assert_eq!(ended.1.unwrap().duration_ms, 1000);
        assert!(table.is_empty());
        // A late retry gets the stored envelope; no turn starts.
        match table.admit(4, &first, meta, SECS, t0 + 2 * SECS) {
            Admit::Stored(envelope) => assert_eq!(envelope.text, "done"),
            other => panic!("{other:?}"),
        }
        // The pool's report of a turn the table no longer holds is ignored.
        assert!(table.finish(turn, reply("again"), t0).is_none());
    }

    #[test]
    fn a_cancel_request_joins_its_turn_and_both_get_cancelled() {
        let t0 = Instant::now();
        let mut table = table();
        let turn = start(&mut table, 1, &request("p", Some(7), false), t0);
        let cancel = request("", Some(7), true);
        let meta = TalkMeta::of(Some(&cancel), t0);
        assert!(matches!(
            table.admit(2, &cancel, meta.clone(), SECS, t0),
            Admit::Attached(t) if t == turn
        ));
        assert!(table.cancel(turn, "a cancel request").is_some());
        assert!(table.cancel(turn, "again").is_none(), "logged once");
        // The engine finished as the cancel came: cancelled is cancelled.
        let ended = table.finish(turn, reply("late"), t0).unwrap();
        assert_eq!(answers(&ended), "1 cancelled, 2 cancelled");
        assert_eq!(ended.0.cancelled, Some("a cancel request"));
        // `cancelled` is not retryable: stored, a second cancel request gets it.
        assert!(matches!(
            table.admit(3, &cancel, meta.clone(), SECS, t0),
            Admit::Stored(_)
        ));
        let unknown = request("", Some(8), true);
        assert!(matches!(
            table.admit(4, &unknown, meta, SECS, t0),
            Admit::Refused(Refusal::UnknownRequestId)
        ));
    }

    #[test]
    fn a_withdrawn_turn_is_answered_cancelled() {
        let t0 = Instant::now();
        let mut table = table();
        let turn = start(&mut table, 1, &request("p", None, false), t0);
        table.cancel(turn, "the caller hung up");
        let ended = table.finish(turn, Outcome::Withdrawn, t0).unwrap();
        assert_eq!(answers(&ended), "1 cancelled");
    }

    #[test]
    fn hang_ups_cancel_keep_or_abandon() {
        let t0 = Instant::now();
        let mut table = table();
        let unnamed = request("p", None, false);
        let named = request("p", Some(3), false);
        // Another waiter still waits: nothing changes.
        let turn = start(&mut table, 1, &named, t0);
        let meta = TalkMeta::of(Some(&named), t0);
        assert!(matches!(
            table.admit(2, &named, meta, SECS, t0),
            Admit::Attached(_)
        ));
        assert!(matches!(
            table.hang_up(1, &bus(true, 15), t0),
            HangUp::Nothing
        ));
        // The last one: kept for the reattach window, then due for a cancel.
        assert!(matches!(table.hang_up(2, &bus(true, 15), t0), HangUp::Kept(c) if c == "alice"));
        let due = table.tick(t0 + 14 * SECS, &bus(true, 15), |_| true);
        assert_eq!((due.0.len(), due.2), (0, Some(t0 + 15 * SECS)));
        let due = table.tick(t0 + 15 * SECS, &bus(true, 15), |_| true);
        assert_eq!(due.0, [turn]);
        table.cancel(turn, "no retry came");
        assert!(table
            .tick(t0 + 16 * SECS, &bus(true, 15), |_| true)
            .0
            .is_empty());
        // Without an id: cancelled at once, or abandoned with cancelOnHangup false.
        let turn = start(&mut table, 3, &unnamed, t0);
        assert!(matches!(table.hang_up(3, &bus(true, 15), t0), HangUp::Cancel(t) if t == turn));
        let turn = start(&mut table, 4, &unnamed, t0);
        assert!(matches!(
            table.hang_up(4, &bus(false, 15), t0),
            HangUp::Abandoned(t, _) if t == turn
        ));
        // It answers nobody, and leaves the table.
        assert!(table.finish(turn, reply("x"), t0).is_none());
        assert!(!table.turns.contains_key(&turn));
        // A connection that waited on nothing.
        assert!(matches!(
            table.hang_up(9, &bus(true, 15), t0),
            HangUp::Nothing
        ));
    }

    #[test]
    fn a_retry_within_the_window_attaches_to_the_kept_turn() {
        let t0 = Instant::now();
        let mut table = table();
        let named = request("p", Some(4), false);
        let turn = start(&mut table, 1, &named, t0);
        assert!(matches!(
            table.hang_up(1, &bus(true, 15), t0),
            HangUp::Kept(_)
        ));
        let meta = TalkMeta::of(Some(&named), t0);
        assert!(matches!(
            table.admit(2, &named, meta, SECS, t0 + SECS),
            Admit::Attached(_)
        ));
        assert!(table
            .tick(t0 + 60 * SECS, &bus(true, 15), |_| false)
            .0
            .is_empty());
        let ended = table.finish(turn, reply("x"), t0).unwrap();
        assert_eq!(answers(&ended), "2 ok");
    }

    /// The waiters' deadline: `engine.timeoutSecs` plus the grace, from when the turn
    /// left the queue; past it, a 500 for each waiter, and the turn is forgotten.
    #[test]
    fn a_turn_past_its_deadline_answers_its_waiters_500() {
        let t0 = Instant::now();
        let mut table = table();
        let named = request("p", Some(5), false);
        let turn = start(&mut table, 1, &named, t0);
        let limit = 60 * SECS + WAITER_GRACE;
        // Queued for an hour: no deadline yet.
        let due = table.tick(t0 + 3600 * SECS, &bus(true, 15), |_| true);
        assert!(due.1.is_empty() && due.2.is_none());
        // Seen running from here on.
        let started = t0 + 3601 * SECS;
        let due = table.tick(started, &bus(true, 15), |_| false);
        assert_eq!(due.2, Some(started + limit));
        let just_before = started + limit - SECS;
        assert!(table
            .tick(just_before, &bus(true, 15), |_| false)
            .1
            .is_empty());
        let mut due = table.tick(started + limit, &bus(true, 15), |_| false);
        let (id, ended) = due.1.pop().unwrap();
        assert_eq!(id, turn);
        assert_eq!(answers(&ended), "1 internal_error");
        assert_eq!(Refusal::TurnOverdue.status_and_code().0, 500);
        assert!(table.is_empty());
        // Its id is forgotten: a retry runs again.
        let meta = TalkMeta::of(Some(&named), t0);
        assert!(matches!(
            table.admit(2, &named, meta, SECS, t0),
            Admit::New(..)
        ));
        // The pool's late report finds nothing.
        assert!(table.finish(turn, reply("x"), t0).is_none());
    }

    /// A retryable failure is not stored: a retry of its id runs again, and its
    /// answer is stored then.
    #[test]
    fn a_retryable_failure_forgets_the_id() {
        let t0 = Instant::now();
        let mut table = table();
        let named = request("p", Some(9), false);
        let turn = start(&mut table, 1, &named, t0);
        let failure = protocol::Failure::new(ErrorCode::Timeout, "slow");
        assert!(failure.retryable);
        let outcome = TurnOutput::without_usage(TurnResult::Failed(failure));
        let ended = table.finish(turn, Outcome::Finished(outcome), t0).unwrap();
        assert_eq!(answers(&ended), "1 timeout");
        let turn = start(&mut table, 2, &named, t0);
        assert!(table.finish(turn, reply("ok"), t0).unwrap().1.is_ok());
        let meta = TalkMeta::of(Some(&named), t0);
        assert!(matches!(
            table.admit(3, &named, meta, SECS, t0),
            Admit::Stored(_)
        ));
    }

    #[test]
    fn a_panic_answers_500_and_forgets_the_id() {
        let t0 = Instant::now();
        let mut table = table();
        let named = request("p", Some(6), false);
        let turn = start(&mut table, 1, &named, t0);
        let ended = table.finish(turn, Outcome::Panicked, t0).unwrap();
        assert_eq!(answers(&ended), "1 internal_error");
        let meta = TalkMeta::of(Some(&named), t0);
        assert!(matches!(
            table.admit(2, &named, meta, SECS, t0),
            Admit::New(..)
        ));
    }
}
