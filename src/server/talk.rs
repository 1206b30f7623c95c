//! After the secret: a talk's body checks (7-10), its admission into the turn table,
//! and what the pool's reports and a caller's hang-up come to (the answers written, the
//! audit lines). Nothing here runs for a request without the secret.

use super::answer::{json, TalkMeta};
use super::turn_table::{caller, Admit, Ended, HangUp, TurnId};
use super::{Bus, Refusal};
use crate::engine::{Turn, TurnTrace};
use crate::http::{ConnId, Control, Head, Response};
use crate::protocol::{self, ErrorCode, Failure, RequestId, TalkRequest, TraceId, SPAN_ID_LEN};
use crate::secret;
use crate::turns::{Busy, Outcome};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A new turn's place in its tree (contract 8.4): the request's trace and request ids,
/// or fresh ones where it had none (so that the server starts a tree for a caller
/// without trace context, and its engine's delegations still hang under this turn),
/// and a fresh span id for `TRACEPARENT`. An error when the OS's randomness fails.
fn turn_trace(request: &TalkRequest) -> std::io::Result<TurnTrace> {
    /// Hex digits in an id the server makes: 128 bits, as a client's.
    const ID_HEX: usize = 32;
    // One read of the OS's randomness for all three (a system call per turn, not three).
    let random = secret::random_hex((2 * ID_HEX + SPAN_ID_LEN) / 2)?;
    let (fresh_trace, rest) = random.split_at(ID_HEX);
    let (fresh_request, span) = rest.split_at(ID_HEX);
    // 32 hex digits of random bytes are a request id, and a trace id unless all zeros.
    let trace_id = request.ext.trace_id.clone();
    let trace_id = trace_id.map_or_else(|| TraceId::new(fresh_trace.to_owned()), Ok);
    let request_id = request.ext.request_id.clone();
    let request_id = request_id.map_or_else(|| RequestId::new(fresh_request.to_owned()), Ok);
    let mut span_id = span.to_owned();
    if span_id.bytes().all(|b| b == b'0') {
        // W3C forbids an all-zero span id; the odds are 2^-64.
        span_id.replace_range(..1, "1");
    }
    Ok(TurnTrace {
        trace_id: trace_id.map_err(std::io::Error::other)?,
        request_id: request_id.map_err(std::io::Error::other)?,
        span_id,
    })
}

impl Bus {
    /// A talk whose head passed checks 1-6: the checks on its body, then admission.
    /// `Some` answers `conn` now; `None` when it waits on a turn.
    pub(super) fn talk(&mut self, conn: ConnId, head: &Head, body: &[u8]) -> Option<Response> {
        let parsed = protocol::parse_talk_request(body);
        let meta = TalkMeta::of(parsed.as_ref().ok(), head.received_at);
        let bus = &self.config.bus;
        let refusal = match parsed {
            Err(e) => Refusal::Body(e),
            Ok(r) if !bus.peers.allows(&r.from_instance) => Refusal::PeerNotAllowed,
            Ok(r) if r.depth >= bus.max_depth => {
                let (depth, max) = (r.depth, bus.max_depth);
                Refusal::DepthExceeded { depth, max }
            }
            Ok(_) if self.stopping_since.is_some() => Refusal::ShuttingDown,
            Ok(request) => return self.admit(conn, request, meta),
        };
        Some(self.refuse(&refusal, &meta, true))
    }

    /// Admits a request that passed checks 1-9 (see [`TurnTable::admit`]). `Some`
    /// answers `conn` now; `None` when it waits on a turn.
    fn admit(&mut self, conn: ConnId, request: TalkRequest, meta: TalkMeta) -> Option<Response> {
        let engine = self.config.engine.as_ref();
        let timeout = Duration::from_secs(engine.map_or(0, |e| e.timeout_secs));
        // A new turn's audit line names the ids the server made for it.
        let trace = turn_trace(&request)
            .map_err(|e| log::warn!("cannot make the turn's trace ids: {e}"))
            .ok();
        let mut turn_meta = meta.clone();
        if let Some(trace) = &trace {
            turn_meta.ext.trace_id = Some(trace.trace_id.clone());
            turn_meta.ext.request_id = Some(trace.request_id.clone());
        }
        let admitted = self
            .table
            .admit(conn, &request, turn_meta, timeout, Instant::now());
        let (outcome, detail) = match admitted {
            Admit::New(id, cancel) => {
                let config = Arc::clone(&self.config);
                let turn = Turn {
                    request,
                    config,
                    cancel,
                    trace,
                };
                if let Err(Busy(_)) = self.pool.submit(id, turn) {
                    self.table.refuse(id, Refusal::Busy);
                    return Some(self.refuse(&Refusal::Busy, &meta, true));
                }
                return None;
            }
            Admit::Refused(refusal) => return Some(self.refuse(&refusal, &meta, true)),
            Admit::Attached(turn) if request.ext.cancel => {
                self.cancel(turn, "cancelled by a cancel request");
                (
                    "cancel",
                    "a cancel request for the running turn of its request id",
                )
            }
            Admit::Attached(_) => (
                "attached",
                "a retry joined the running turn of its request id",
            ),
            Admit::Stored(envelope) => {
                let detail = match request.ext.cancel {
                    true => "a cancel request for a finished turn got its stored envelope",
                    false => "a retry got the stored envelope of its request id; no engine ran",
                };
                self.audit(&meta, "duplicate", detail, None, Some(200), None);
                return Some(json(200, envelope.to_json()));
            }
        };
        self.audit(&meta, outcome, detail, None, None, None);
        None
    }

    /// Cancels `turn` (contract 8.1): a queued one is taken out of the queue, a running
    /// one's engine is stopped; either way its answer comes with the pool's report.
    pub(super) fn cancel(&mut self, turn: TurnId, why: &'static str) {
        if let Some(meta) = self.table.cancel(turn, why) {
            log::info!("cancelling the turn of {}: {why}", caller(meta));
        }
        self.pool.cancel(turn);
    }

    /// Answers the waiters of the turns the pool reported.
    pub(super) fn answer_finished(&mut self, control: &mut Control) {
        let now = Instant::now();
        let finished: Vec<_> = self.pool.finished().collect();
        for done in finished {
            if matches!(done.outcome, Outcome::Panicked) {
                log::error!("turn handler panicked");
            }
            if let Some(ended) = self.table.finish(done.key, done.outcome, now) {
                self.answer(ended, control);
            }
        }
    }

    /// What a hang-up does to its turn is the table's decision (contract 8.1).
    pub(super) fn hang_up(&mut self, conn: ConnId) {
        let reattach = self.config.bus.reattach_secs;
        match self.table.hang_up(conn, &self.config.bus, Instant::now()) {
            HangUp::Nothing => {}
            HangUp::Kept(caller) if self.config.bus.cancel_on_hangup => log::info!(
                "caller {caller} hung up; its turn waits {reattach} s for a retry of its request id"
            ),
            HangUp::Kept(caller) => log::info!(
                "caller {caller} hung up; its turn runs to its end (bus.cancelOnHangup is false), and a retry of its request id gets its answer"
            ),
            HangUp::Cancel(turn) => self.cancel(turn, "the caller hung up"),
            HangUp::Abandoned(turn, meta) => {
                let detail = if self.pool.cancel(turn) {
                    "the caller went away while its turn was queued; it will not run"
                } else {
                    "the caller went away while its turn ran; the answer is dropped"
                };
                log::info!("caller {}: {detail}", caller(&meta));
                self.audit(&meta, "abandoned", detail, None, None, None);
            }
        }
    }

    /// Writes a turn's answer to each of its waiters and records it: its envelope
    /// (audited once), or a refusal each.
    pub(super) fn answer(&mut self, (turn, answer): Ended<ConnId>, control: &mut Control) {
        let envelope = match &answer {
            Ok(envelope) => envelope,
            Err(refusal) => {
                for waiter in &turn.waiters {
                    control.respond(waiter.conn, self.refuse(refusal, &turn.meta, true));
                }
                return;
            }
        };
        let (outcome, detail, code) = match (&envelope.failure, turn.cancelled) {
            (None, _) => ("success", "ok", None),
            (Some(f), Some(why)) => ("cancelled", why, Some(f.code.as_str())),
            (Some(f), None) => ("failure", audit_detail(f), Some(f.code.as_str())),
        };
        log::debug!(
            "talk answered: {outcome}{} ({}, {} ms)",
            code.map(|c| format!(" {c}")).unwrap_or_default(),
            turn.meta.describe(),
            envelope.duration_ms
        );
        if let (Some(failure), None) = (&envelope.failure, turn.cancelled) {
            // The person running the instance sees its failures (never the prompt):
            // the first line of its message, cut to MAX_LOGGED_FAILURE_CHARS (the
            // logger escapes it: it may quote the engine).
            let line = failure.error.lines().next().unwrap_or_default();
            let first: String = line.chars().take(MAX_LOGGED_FAILURE_CHARS).collect();
            let who = turn.meta.describe();
            log::info!("turn failed: {} ({who}): {first}", failure.code);
        }
        let status = (!turn.waiters.is_empty()).then_some(200);
        self.audit(&turn.meta, outcome, detail, code, status, envelope.usage);
        for waiter in &turn.waiters {
            control.respond(waiter.conn, json(200, waiter.negotiate(envelope).to_json()));
        }
    }
}

/// What the audit log says of a failed turn. Messages built from the engine's own
/// output may quote the prompt, so only the code is kept for those; the messages this
/// crate writes itself and that carry nothing of the engine's (budget, timeout, usage
/// file) are kept whole.
fn audit_detail(failure: &Failure) -> &str {
    match failure.code {
        ErrorCode::BudgetExhausted | ErrorCode::Timeout | ErrorCode::InternalError => {
            &failure.error
        }
        _ => "the engine failed; its output is not logged here",
    }
}

/// Most characters of a failed turn's message in its log line.
const MAX_LOGGED_FAILURE_CHARS: usize = 200;
