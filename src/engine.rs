//! Running one turn: the built-in echo engine, or the configured engine command.

use crate::config::Config;
use crate::protocol::{Failure, TalkRequest};
use crate::turns::Runner;
use std::path::PathBuf;
use std::sync::Arc;

/// One admitted `/api/talk` request, with the config in force when it was admitted.
#[derive(Debug)]
pub struct Turn {
    /// The validated request.
    pub request: TalkRequest,
    /// The configuration snapshot for this turn.
    pub config: Arc<Config>,
}

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    /// The reply text (200, success envelope).
    Reply(String),
    /// A classified failure (200, failure envelope).
    Failed(Failure),
    /// The handler produced something that is not a result (500,
    /// `invalid_handler_response`); the text says what, for the log only.
    Invalid(String),
}

/// Runs turns for one instance.
#[derive(Debug)]
pub struct Engine {
    /// The instance's name, for `LOOPBUS_INSTANCE`.
    pub instance: String,
    /// The instance's state directory, for `LOOPBUS_STATE_DIR`.
    pub state_dir: PathBuf,
}

impl Runner<Turn, TurnResult> for Engine {
    fn run(&self, turn: &Turn) -> TurnResult {
        match &turn.config.engine {
            None => TurnResult::Reply(turn.request.prompt.clone()),
            Some(_) => TurnResult::Failed(Failure::new(
                crate::protocol::ErrorCode::EngineCli,
                "engine commands are not available in this build",
            )),
        }
    }
}
