//! Running one turn (contract section 8): the budget check, then the built-in echo
//! engine or the configured engine command, then the usage record.
//!
//! `engine/budget.rs` admits a turn against the budget, counting the running turns'
//! estimates; `engine/preflight.rs` refuses what can never start (and warns about it at
//! start-up); `engine/process.rs` supervises the command's process (spawn, feed, drain,
//! deadline, kill, reap) with `engine/running.rs`, the engines running now;
//! `engine/reaper.rs` kills and reaps what they leave behind; `engine/outcome.rs`
//! interprets, without I/O, what an engine wrote and how it ended. Their limits are
//! named constants there.

mod budget;
mod cancel;
mod outcome;
mod parsers;
mod preflight;
mod process;
mod reaper;
mod running;

pub use cancel::CancelToken;
pub use outcome::{TurnOutput, TurnResult};
pub use preflight::{findings, warnings, Findings};
pub use process::KILL_GRACE;
pub use reaper::contain_leftovers;
pub use running::RunningEngines;

use crate::config::Config;
use crate::protocol::{
    format_traceparent, ErrorCode, Failure, RequestId, TalkRequest, TraceId, REQUEST_ID_VAR,
    TRACEPARENT_VAR, TRACE_ID_VAR,
};
use crate::usage::UsageStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One admitted `/api/talk` request, with the config in force when it was admitted.
#[derive(Debug)]
pub struct Turn {
    /// The validated request.
    pub request: TalkRequest,
    /// The configuration snapshot for this turn.
    pub config: Arc<Config>,
    /// Cancelled when the turn's caller gives up (contract 8.1).
    pub cancel: CancelToken,
    /// The tree the turn belongs to, given to its engine (contract 8.4).
    pub trace: Option<TurnTrace>,
}

/// A turn's place in its tree of delegations (contract 8.4), as its engine gets it:
/// `LOOPBUS_TRACE_ID`, `LOOPBUS_REQUEST_ID` and `TRACEPARENT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnTrace {
    /// The request's `ext.traceId`, or one the server made for a request without.
    pub trace_id: TraceId,
    /// The request's `ext.requestId`, or one the server made for a request without.
    pub request_id: RequestId,
    /// `TRACEPARENT`'s span id: [`crate::protocol::SPAN_ID_LEN`] lowercase hex digits,
    /// not all zeros, fresh for the turn.
    pub span_id: String,
}

/// The failure of a cancelled turn (contract 8.1: `cancelled`, not retryable).
pub fn cancelled() -> Failure {
    Failure::new(ErrorCode::Cancelled, "the turn was cancelled by its caller")
}

/// Runs one turn of `config`'s engine (the echo engine when it has none) for the
/// instance `instance` whose state is in `state_dir`, directly: no server, no HTTP. The
/// prompt comes from `operator` at depth 0. The turn is an ordinary one: the budget
/// admits it, usage.json records it, and `engine.timeoutSecs` holds, cut to `timeout`
/// (at least 1 s) when that is shorter. `loopbus doctor --probe` uses it to see what
/// the engine says (a CLI that is not logged in fails every turn while every static
/// check passes).
///
/// # Errors
///
/// The turn's failure, classified as any turn's would be (`auth`, `engine_cli`,
/// `timeout`, `budget_exhausted`, ...).
pub fn run_once(
    config: &Config,
    instance: &str,
    state_dir: &Path,
    prompt: &str,
    timeout: Duration,
) -> Result<String, Failure> {
    let mut config = config.clone();
    if let Some(engine) = config.engine.as_mut() {
        engine.timeout_secs = engine.timeout_secs.min(timeout.as_secs().max(1));
    }
    let turn = Turn {
        request: TalkRequest::new("operator", prompt, 0),
        config: Arc::new(config),
        cancel: CancelToken::new(),
        // No tree: a delegation the probe's engine makes starts its own.
        trace: None,
    };
    match Engine::new(instance, state_dir.to_path_buf())
        .run(&turn)
        .result
    {
        TurnResult::Reply(text) => Ok(text),
        TurnResult::Failed(failure) => Err(failure),
    }
}

/// Runs turns for one instance.
#[derive(Debug)]
pub struct Engine {
    /// The instance's name, for `LOOPBUS_INSTANCE`.
    pub instance: String,
    /// The instance's state directory, for `LOOPBUS_STATE_DIR`.
    pub state_dir: PathBuf,
    /// usage.json.
    pub usage: UsageStore,
    /// Engines running now.
    pub running: RunningEngines,
    /// The budget estimates of the turns running now.
    reservations: budget::Reservations,
}

impl Engine {
    /// An engine for `instance` whose state lives in `state_dir`.
    pub fn new(instance: &str, state_dir: PathBuf) -> Engine {
        Engine {
            instance: instance.to_owned(),
            usage: UsageStore::new(&state_dir),
            state_dir,
            running: RunningEngines::default(),
            reservations: budget::Reservations::default(),
        }
    }

    /// Runs one turn to completion (on a worker thread: it may block until
    /// `engine.timeoutSecs`). With a budget set, a spent (or unknowable) budget, counting
    /// the estimates of the turns running now, refuses the turn before any engine runs
    /// (see `engine/budget.rs`); an engine turn's usage is then recorded.
    pub fn run(&self, turn: &Turn) -> TurnOutput {
        let engine = turn.config.engine.as_ref();
        let cap = engine.and_then(|e| e.max_turn_cost_usd);
        let admitted = turn
            .config
            .budget_usd
            .map(|budget| self.reservations.admit(&self.usage, budget, cap))
            .transpose();
        let reservation = match admitted {
            Ok(reservation) => reservation,
            Err(refusal) => return TurnOutput::without_usage(TurnResult::Failed(refusal)),
        };
        // The built-in echo engine, used when no `engine` is configured: the reply is
        // the prompt. No process, no cost, no usage record.
        let Some(engine) = engine else {
            return TurnOutput::without_usage(TurnResult::Reply(turn.request.prompt.clone()));
        };
        let request = &turn.request;
        // The trace variables are empty (which a client reads as unset) for a turn
        // without a trace, so that none is inherited from the server's own environment.
        let (trace_id, request_id, traceparent) = match &turn.trace {
            Some(t) => (
                t.trace_id.to_string(),
                t.request_id.to_string(),
                format_traceparent(&t.trace_id, &t.span_id),
            ),
            None => Default::default(),
        };
        let env = vec![
            ("LOOPBUS_INSTANCE", self.instance.clone().into()),
            ("LOOPBUS_STATE_DIR", self.state_dir.clone().into()),
            ("LOOPBUS_FROM", request.from_instance.clone().into()),
            ("LOOPBUS_DEPTH", request.depth.to_string().into()),
            (TRACE_ID_VAR, trace_id.into()),
            (REQUEST_ID_VAR, request_id.into()),
            (TRACEPARENT_VAR, traceparent.into()),
        ];
        let run = process::run(engine, turn, env, &self.running);
        if let Some(Err(e)) = run.usage.as_ref().map(|u| self.usage.record(u)) {
            log::error!("cannot record usage: {e}");
        }
        if let Some(reservation) = reservation {
            reservation.finish(run.usage.map(|u| u.cost_usd));
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_support::TestDir;
    use crate::usage;

    fn turn(config: &str, prompt: &str) -> Turn {
        Turn {
            request: TalkRequest::new("caller", prompt, 1),
            cancel: CancelToken::new(),
            config: Arc::new(crate::config::parse(config.as_bytes()).unwrap()),
            trace: None,
        }
    }

    /// The echo engine, with or without a budget, runs like any turn: on a worker,
    /// through `run`.
    #[test]
    fn the_echo_engine_replies_the_prompt_and_records_no_usage() {
        let dir = TestDir::new("engine-echo");
        let engine = Engine::new("worker", dir.path().to_path_buf());
        let want = TurnResult::Reply("say this back".to_owned());
        for config in ["{}", r#"{"budgetUsd":1}"#] {
            let output = engine.run(&turn(config, "say this back"));
            assert_eq!(output, TurnOutput::without_usage(want.clone()), "{config}");
        }
        assert!(!dir.path().join(usage::USAGE_FILE).exists());
    }

    #[test]
    fn a_spent_budget_refuses_before_the_engine_runs() {
        let dir = TestDir::new("engine-budget");
        std::fs::write(
            dir.path().join(usage::USAGE_FILE),
            br#"{"totalCostUsd":2,"requestCount":1}"#,
        )
        .unwrap();
        let engine = Engine::new("worker", dir.path().to_path_buf());
        // The command would fail if it ran.
        let config = r#"{"budgetUsd":1,"engine":{"command":["false"]}}"#;
        let TurnResult::Failed(f) = engine.run(&turn(config, "x")).result else {
            panic!("not refused")
        };
        assert_eq!(f.code, ErrorCode::BudgetExhausted);
        assert_eq!(f.error, usage::budget_message(2.0, 1.0));
    }

    #[test]
    fn run_once_runs_one_turn_with_the_shorter_timeout() {
        let dir = TestDir::new("engine-once");
        let config = |json: &str| crate::config::parse(json.as_bytes()).unwrap();
        let once = |json: &str| {
            run_once(
                &config(json),
                "worker",
                dir.path(),
                "hi",
                Duration::from_secs(1),
            )
        };
        assert_eq!(once("{}"), Ok("hi".to_owned()));
        assert_eq!(
            once(r#"{"engine":{"command":["cat"]}}"#),
            Ok("hi".to_owned())
        );
        let slow = once(r#"{"engine":{"command":["sleep","30"],"timeoutSecs":60}}"#);
        assert_eq!(slow.map_err(|f| f.code), Err(ErrorCode::Timeout));
        // The `cat` turn was recorded; the echo engine and a timed-out one report none.
        let usage = crate::usage::UsageStore::new(dir.path()).current().unwrap();
        assert_eq!(usage.request_count, 1);
    }

    #[test]
    fn a_command_turn_is_recorded_in_usage() {
        let dir = TestDir::new("engine-usage");
        let engine = Engine::new("worker", dir.path().to_path_buf());
        let config = r#"{"budgetUsd":5,"engine":{"command":["cat"]}}"#;
        assert_eq!(
            engine.run(&turn(config, "hi")).result,
            TurnResult::Reply("hi".to_owned())
        );
        assert_eq!(engine.usage.current().unwrap().request_count, 1);
    }
}
