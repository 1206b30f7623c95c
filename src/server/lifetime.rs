//! A turn's lifetime on the server (contract 8.1, 8.2): admitted, attached to by
//! retries of its request id, cancelled by a hang-up or a cancel request, kept for
//! `bus.reattachSecs` after a hang-up of a caller that named an id, and finished with
//! one envelope for every connection waiting on it, which is stored for later retries.
//!
//! A turn is keyed by its own [`TurnId`]; connections wait on it. Answers for
//! connections other than the one being served now go through the bus's outbox, which
//! the next wake-up of the loop delivers.

use super::answer::{elapsed_ms, TalkMeta, Waiter};
use super::requests::{self, RequestKey, Seen};
use super::{Bus, Refusal};
use crate::engine::{self, CancelToken, Engine, Turn, TurnOutput, TurnResult};
use crate::http::{ConnId, Response};
use crate::protocol::{ErrorCode, TalkRequest, UsageReport};
use crate::turns::{Busy, Outcome};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Names one admitted turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TurnId(u64);

/// What the server keeps of one admitted turn until it is answered.
#[derive(Debug)]
pub(super) struct TurnState {
    /// The connections waiting for its envelope (the first request's and those of
    /// retries and cancel requests attached to it).
    waiters: Vec<Waiter>,
    /// When its first request arrived: its envelope's `durationMs` counts from here.
    received_at: Instant,
    /// The first request, for the audit line.
    meta: TalkMeta,
    /// Its (`fromInstance`, `requestId`), if it named an id.
    key: Option<RequestKey>,
    /// Cancels its engine.
    cancel: CancelToken,
    /// Why it was cancelled, once it was.
    cancelled: Option<&'static str>,
    /// Its last caller hung up at this time (it named an id: a retry may attach).
    orphaned_at: Option<Instant>,
    /// Its last caller hung up and the turn runs on (`bus.cancelOnHangup` false); the
    /// hang-up was audited, its answer is not.
    abandoned: bool,
}

impl Bus {
    /// Admits a request that passed checks 1-9: a cancel request, a retry of a known
    /// id, or a new turn. `Some` answers `conn` now; `None` answers it later.
    pub(super) fn admit(
        &mut self,
        conn: ConnId,
        request: TalkRequest,
        received_at: Instant,
        meta: TalkMeta,
    ) -> Option<Response> {
        let key = request.ext.request_id.clone().map(|id| RequestKey {
            from_instance: request.from_instance.clone(),
            id,
        });
        let now = Instant::now();
        let waiter = Waiter::new(conn, &request);
        if request.ext.cancel {
            // The parser allows `cancel` only with a request id.
            let key = key?;
            return self.cancel_request(waiter, &key, received_at, &meta, now);
        }
        // What the id stands for; only a request that names one needs it.
        let digest = key
            .as_ref()
            .map(|_| requests::digest(&request.prompt, request.depth));
        if let (Some(key), Some(digest)) = (&key, &digest) {
            match self.requests.look(key, Some(digest), now) {
                Seen::New => {}
                Seen::Mismatch => {
                    return Some(self.refuse_talk(&Refusal::RequestIdReused, received_at, &meta))
                }
                // A turn the store names is always one being served; should that
                // ever not hold, the request runs as a new turn rather than wait on
                // nothing.
                Seen::Running(turn) if !self.turns.contains_key(&turn) => {
                    self.requests.forget(key);
                }
                Seen::Running(turn) => {
                    self.attach(waiter, turn);
                    self.audit_request(
                        "attached",
                        "a retry joined the running turn of its request id",
                        &meta,
                        received_at,
                        None,
                    );
                    return None;
                }
                Seen::Answered(envelope) => {
                    self.audit_request(
                        "duplicate",
                        "a retry got the stored envelope of its request id; no engine ran",
                        &meta,
                        received_at,
                        Some(200),
                    );
                    return Some(waiter.answer(&envelope));
                }
            }
        }
        let turn = Turn {
            request,
            config: Arc::clone(&self.config),
            cancel: CancelToken::new(),
        };
        let inline = match (Engine::run_inline(&turn), &key) {
            // Echo without a budget and without a request id: nothing to run, wait
            // for, cancel or store; answered at once.
            (Some(result), None) => {
                let envelope = self.envelope(result, None, received_at);
                self.audit_answer(&meta, &envelope, None, Some(200));
                return Some(waiter.into_answer(envelope));
            }
            (inline, _) => inline,
        };
        let id = TurnId(self.next_turn);
        self.next_turn = self.next_turn.wrapping_add(1);
        let state = TurnState {
            waiters: vec![waiter],
            received_at,
            key: key.clone(),
            cancel: turn.cancel.clone(),
            cancelled: None,
            orphaned_at: None,
            abandoned: false,
            meta,
        };
        if inline.is_none() {
            if let Err(Busy(_turn)) = self.pool.submit(id, turn) {
                return Some(self.refuse_talk(&Refusal::Busy, received_at, &state.meta));
            }
        }
        if let (Some(key), Some(digest)) = (key, digest) {
            self.requests.running(key, digest, id);
        }
        self.turns.insert(id, state);
        self.conns.insert(conn, id);
        match inline {
            // Echo without a budget: no process, no file, nothing to wait for.
            Some(result) => {
                let answers =
                    self.complete(id, Outcome::Finished(TurnOutput::without_usage(result)));
                self.deliver(conn, answers)
            }
            None => None,
        }
    }

    /// A cancel request for `key` (contract 8.1): a running turn is cancelled and the
    /// request waits for its `cancelled` envelope; a finished one's stored envelope
    /// answers it; an unknown id is `invalid_request`.
    fn cancel_request(
        &mut self,
        waiter: Waiter,
        key: &RequestKey,
        received_at: Instant,
        meta: &TalkMeta,
        now: Instant,
    ) -> Option<Response> {
        match self.requests.look(key, None, now) {
            Seen::Running(turn) => {
                self.audit_request(
                    "cancel",
                    "a cancel request for the running turn of its request id",
                    meta,
                    received_at,
                    None,
                );
                let conn = waiter.conn;
                self.attach(waiter, turn);
                let answers = self.cancel_turn(turn, "cancelled by a cancel request");
                self.deliver(conn, answers)
            }
            Seen::Answered(envelope) => {
                self.audit_request(
                    "duplicate",
                    "a cancel request for a finished turn got its stored envelope",
                    meta,
                    received_at,
                    Some(200),
                );
                Some(waiter.answer(&envelope))
            }
            Seen::New | Seen::Mismatch => {
                Some(self.refuse_talk(&Refusal::UnknownRequestId, received_at, meta))
            }
        }
    }

    /// Makes `waiter` wait on `turn` too.
    fn attach(&mut self, waiter: Waiter, turn: TurnId) {
        if let Some(state) = self.turns.get_mut(&turn) {
            self.conns.insert(waiter.conn, turn);
            state.waiters.push(waiter);
            state.orphaned_at = None;
            state.abandoned = false;
        }
    }

    /// Cancels `turn`: a queued one is taken out of the queue and answered now (the
    /// answers are returned); a running one's engine is stopped, and its answer comes
    /// when the worker reports it.
    pub(super) fn cancel_turn(
        &mut self,
        turn: TurnId,
        why: &'static str,
    ) -> Vec<(ConnId, Response)> {
        let Some(state) = self.turns.get_mut(&turn) else {
            return Vec::new();
        };
        if state.cancelled.is_none() {
            state.cancelled = Some(why);
            log::info!(
                "cancelling the turn of {}: {why}",
                state.meta.from_instance.as_deref().unwrap_or("?")
            );
        }
        state.cancel.cancel();
        if self.pool.cancel(turn).is_some() {
            let cancelled = TurnResult::Failed(engine::cancelled());
            return self.complete(
                turn,
                Outcome::Finished(TurnOutput::without_usage(cancelled)),
            );
        }
        Vec::new()
    }

    /// The connection `conn` closed before its answer. The turn goes on while others
    /// wait on it; otherwise it is cancelled (contract 8.1), at once without a request
    /// id, after `bus.reattachSecs` with one; with `bus.cancelOnHangup` false it runs
    /// on, and a queued turn without an id is dropped.
    pub(super) fn hung_up(&mut self, conn: ConnId) {
        let Some(turn) = self.conns.remove(&conn) else {
            return;
        };
        let cancel_on_hangup = self.config.bus.cancel_on_hangup;
        let reattach = self.config.bus.reattach_secs;
        let Some(state) = self.turns.get_mut(&turn) else {
            return;
        };
        state.waiters.retain(|w| w.conn != conn);
        // Others still wait, or it is being cancelled already (a caller that sent a
        // cancel request hangs up before its answer): nothing to decide.
        if !state.waiters.is_empty() || state.cancelled.is_some() {
            return;
        }
        let named = state.key.is_some();
        if named && (reattach > 0 || !cancel_on_hangup) {
            // Kept for a retry to attach; the tick cancels it when the window closes
            // (with `bus.cancelOnHangup` false, never: it runs to its end).
            state.orphaned_at = Some(Instant::now());
            let caller = state.meta.from_instance.as_deref().unwrap_or("?");
            if cancel_on_hangup {
                log::info!(
                    "caller {caller} hung up; its turn waits {reattach} s for a retry of its request id"
                );
            } else {
                log::info!(
                    "caller {caller} hung up; its turn runs to its end (bus.cancelOnHangup is false), and a retry of its request id gets its answer"
                );
            }
            return;
        }
        if cancel_on_hangup {
            let answers = self.cancel_turn(turn, "the caller hung up");
            self.outbox.extend(answers);
            return;
        }
        // `bus.cancelOnHangup` false: a queued turn is dropped; a running one finishes
        // (its usage counts) and its answer is discarded.
        let dropped = self.pool.cancel(turn).is_some();
        let detail = if dropped {
            "the caller went away while its turn was queued; it will not run"
        } else {
            "the caller went away while its turn ran; the answer is dropped"
        };
        state.abandoned = true;
        let meta = state.meta.clone();
        let received_at = state.received_at;
        if dropped {
            self.turns.remove(&turn);
        }
        log::info!(
            "caller {}: {detail}",
            meta.from_instance.as_deref().unwrap_or("?")
        );
        self.audit_request("abandoned", detail, &meta, received_at, None);
    }

    /// Cancels the kept turns whose callers did not come back within
    /// `bus.reattachSecs`; returns when the next one is due, if any.
    pub(super) fn reap_orphans(&mut self, now: Instant) -> Option<Instant> {
        if !self.config.bus.cancel_on_hangup {
            return None;
        }
        let window = Duration::from_secs(self.config.bus.reattach_secs);
        let mut next: Option<Instant> = None;
        let mut due = Vec::new();
        for (id, state) in &self.turns {
            if let Some(at) = state.orphaned_at {
                let deadline = at + window;
                if now >= deadline {
                    due.push(*id);
                } else {
                    next = Some(next.map_or(deadline, |n| n.min(deadline)));
                }
            }
        }
        for id in due {
            let answers = self.cancel_turn(
                id,
                "the caller hung up and no retry came within bus.reattachSecs",
            );
            self.outbox.extend(answers);
        }
        next
    }

    /// Answers every connection waiting on `turn` with one envelope (or, after a
    /// panic, with a 500 each), audits it, and stores it for retries of its id when it
    /// is a success or a failure that is not retryable (contract 8.2). Returns the
    /// answers to write.
    pub(super) fn complete(
        &mut self,
        turn: TurnId,
        outcome: Outcome<TurnOutput>,
    ) -> Vec<(ConnId, Response)> {
        let Some(state) = self.turns.remove(&turn) else {
            return Vec::new();
        };
        for waiter in &state.waiters {
            self.conns.remove(&waiter.conn);
        }
        let output = match outcome {
            Outcome::Finished(output) => output,
            Outcome::Panicked => {
                log::error!("turn handler panicked");
                if let Some(key) = &state.key {
                    self.requests.forget(key);
                }
                let mut answers = Vec::new();
                for waiter in &state.waiters {
                    let refusal = Refusal::HandlerPanicked;
                    answers.push((
                        waiter.conn,
                        self.refuse_talk(&refusal, state.received_at, &state.meta),
                    ));
                }
                return answers;
            }
        };
        let result = match state.cancelled {
            // Cancelled is cancelled, even if the engine finished as the cancel came.
            Some(_) => TurnResult::Failed(engine::cancelled()),
            None => output.result,
        };
        // Only what the engine reported (contract 8.3): a text engine reports nothing,
        // a JSON engine may report tokens without a cost. Each waiter gets it if its
        // request asked.
        let usage = output
            .usage
            .filter(|u| u.is_reported())
            .map(|u| UsageReport {
                cost_usd: u.cost_reported.then_some(u.cost_usd),
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cached_tokens: u.cached_tokens,
            });
        let envelope = self.envelope(result, usage, state.received_at);
        if !state.abandoned {
            let status = (!state.waiters.is_empty()).then_some(200);
            self.audit_answer(&state.meta, &envelope, state.cancelled, status);
        }
        let envelope = Arc::new(envelope);
        if let Some(key) = &state.key {
            let storable = match &envelope.failure {
                None => true,
                Some(f) => !f.retryable && f.code != ErrorCode::BudgetExhausted,
            };
            if storable {
                let size = envelope.to_json().len();
                self.requests
                    .answered(key, Arc::clone(&envelope), size, Instant::now());
            } else {
                self.requests.forget(key);
            }
        }
        state
            .waiters
            .iter()
            .map(|waiter| (waiter.conn, waiter.answer(&envelope)))
            .collect()
    }

    /// Answers every connection waiting on the queued `turn` with `refusal` (shutdown:
    /// the pool handed the turn back) and forgets it.
    pub(super) fn refuse_queued(
        &mut self,
        turn: TurnId,
        refusal: &Refusal,
    ) -> Vec<(ConnId, Response)> {
        let Some(state) = self.turns.remove(&turn) else {
            return Vec::new();
        };
        if let Some(key) = &state.key {
            self.requests.forget(key);
        }
        let mut answers = Vec::new();
        for waiter in &state.waiters {
            self.conns.remove(&waiter.conn);
            answers.push((
                waiter.conn,
                self.refuse_talk(refusal, state.received_at, &state.meta),
            ));
        }
        answers
    }

    /// Returns the answer for `own` (the connection being served now) and queues the
    /// rest for the next wake-up.
    pub(super) fn deliver(
        &mut self,
        own: ConnId,
        answers: Vec<(ConnId, Response)>,
    ) -> Option<Response> {
        let mut mine = None;
        for (conn, response) in answers {
            if conn == own && mine.is_none() {
                mine = Some(response);
            } else {
                self.outbox.push((conn, response));
            }
        }
        if !self.outbox.is_empty() {
            (self.wake)();
        }
        mine
    }

    /// The audit line of a request that did not start a turn of its own.
    fn audit_request(
        &mut self,
        outcome: &str,
        detail: &str,
        meta: &TalkMeta,
        received_at: Instant,
        status: Option<u16>,
    ) {
        let duration_ms = elapsed_ms(received_at);
        self.audit
            .record(&meta.audit_record(outcome, detail, duration_ms, None, status));
    }
}
