//! [`Bus`]: the server state the HTTP loop drives, and its routing: which path and
//! method get which answer, and the contract's checks on a head, before the secret and
//! with it. What an authorized talk comes to is `talk.rs`'s.

use super::answer::TalkMeta;
use super::turn_table::{TurnId, TurnTable};
use super::{checks, EngineOverride, Refusal};
use crate::audit::AuditLog;
use crate::config::Config;
use crate::engine::{RunningEngines, Turn, TurnOutput};
use crate::http::{
    ConnId, Control, Head, HeadAction, HttpError, Response, Service, HEALTH_PATH, TALK_PATH,
};
use crate::protocol::InstanceName;
use crate::secret::Secret;
use crate::turns::TurnPool;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The bus server state, driven by the HTTP loop.
pub struct Bus {
    /// The instance's name.
    pub(super) name: InstanceName,
    /// The secret in force for the process's lifetime.
    pub(super) secret: Secret,
    /// The config in force (the last good one read).
    pub(super) config: Arc<Config>,
    /// Path of config.json, re-read on change.
    pub(super) config_path: PathBuf,
    /// The raw bytes the config was loaded from (to notice edits); empty after a
    /// refused read, so that the next good one counts as a change.
    pub(super) config_bytes: Vec<u8>,
    /// The engine that replaces config.json's, at startup and at every reload.
    pub(super) engine_override: Option<EngineOverride>,
    /// The turn workers and their queue.
    pub(super) pool: TurnPool<TurnId, Turn, TurnOutput>,
    /// The turns admitted and not answered yet, who waits on them, and the stored
    /// answers.
    pub(super) table: TurnTable<ConnId>,
    /// When a shutdown began, if one did.
    pub(super) stopping_since: Option<Instant>,
    /// When the shutdown killed the engines that outlived its grace, if it did.
    pub(super) engines_killed_at: Option<Instant>,
    /// The audit log, its writer thread running.
    pub(super) audit: AuditLog,
    /// The engines running now, killed if they outlive the shutdown grace.
    pub(super) running: RunningEngines,
    /// This process's id, for health (asked once: it is a syscall).
    pub(super) pid: u32,
    /// The bound address, which every connection arrives on.
    pub(super) addr: SocketAddr,
}

impl Bus {
    /// Refuses `head` (`None`: the HTTP layer failed before one was complete). A talk
    /// refused is a talk outcome: it is audited.
    fn refuse_head(&mut self, refusal: &Refusal, head: Option<&Head>) -> Response {
        let received_at = head.map_or_else(Instant::now, |head| head.received_at);
        let is_talk = head.is_some_and(|head| head.path() == TALK_PATH);
        self.refuse(refusal, &TalkMeta::of(None, received_at), is_talk)
    }
}

impl Service for Bus {
    fn on_head(&mut self, _id: ConnId, head: &Head) -> HeadAction {
        let checked = checks::check_origin(head, self.addr.port()).and_then(|()| {
            match (head.path(), head.method.as_str()) {
                // HEAD gets the GET answer; the HTTP layer leaves out its body (contract 3).
                (HEALTH_PATH, "GET" | "HEAD") => Ok(None),
                (HEALTH_PATH, _) => Err(Refusal::MethodNotAllowed("GET, HEAD")),
                (TALK_PATH, "POST") => {
                    checks::check_talk_head(head, self.config.bus.enabled, &self.secret).map(Some)
                }
                (TALK_PATH, _) => Err(Refusal::MethodNotAllowed("POST")),
                _ => Err(Refusal::NotFound),
            }
        });
        match checked {
            Ok(Some(length)) => HeadAction::ReadBody(length),
            Ok(None) => HeadAction::Respond(self.health(head)),
            Err(refusal) => HeadAction::Respond(self.refuse_head(&refusal, Some(head))),
        }
    }

    fn on_request(&mut self, conn: ConnId, head: &Head, body: Vec<u8>) -> Option<Response> {
        self.talk(conn, head, &body)
    }

    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response {
        self.refuse_head(&Refusal::Http(error), head)
    }

    fn on_wake(&mut self, control: &mut Control) {
        self.answer_finished(control);
    }

    fn on_interrupt(&mut self, control: &mut Control) {
        self.begin_shutdown(control);
        control.tick_at(Instant::now());
    }

    fn on_tick(&mut self, now: Instant, control: &mut Control) -> Instant {
        self.tick(now, control)
    }

    fn on_abandoned(&mut self, conn: ConnId) {
        self.hang_up(conn);
    }

    fn before_poll(&mut self) {
        self.pool.dispatch();
    }
}
