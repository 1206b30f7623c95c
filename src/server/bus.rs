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
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Everything `serve` decided before the loop starts.
#[derive(Debug)]
pub struct ServerSettings {
    /// The instance's name.
    pub name: InstanceName,
    /// Path of config.json, re-read on change.
    pub config_path: PathBuf,
    /// The config loaded at startup.
    pub config: Config,
    /// The raw bytes it was loaded from (to notice edits).
    pub config_bytes: Vec<u8>,
    /// The engine that replaces config.json's, at startup and at every reload.
    pub engine_override: Option<EngineOverride>,
    /// The secret in force for the process's lifetime.
    pub secret: Secret,
    /// The bound port.
    pub port: u16,
    /// The bound address: the `host` of the health proof's message (contract 6.1).
    pub host: IpAddr,
    /// The audit log, its writer thread running.
    pub audit: AuditLog,
    /// The engines running now, killed if they outlive the shutdown grace.
    pub running: RunningEngines,
}

/// The bus server state, driven by the HTTP loop.
pub struct Bus {
    pub(super) name: InstanceName,
    pub(super) secret: Secret,
    pub(super) config: Arc<Config>,
    pub(super) config_path: PathBuf,
    pub(super) config_bytes: Vec<u8>,
    pub(super) engine_override: Option<EngineOverride>,
    pub(super) pool: TurnPool<TurnId, Turn, TurnOutput>,
    /// The turns admitted and not answered yet, who waits on them, and the stored
    /// answers.
    pub(super) table: TurnTable<ConnId>,
    pub(super) stopping_since: Option<Instant>,
    pub(super) engines_killed_at: Option<Instant>,
    pub(super) allowed_hosts: [String; 3],
    pub(super) audit: AuditLog,
    pub(super) running: RunningEngines,
    /// This process's id, for health (asked once: it is a syscall).
    pub(super) pid: u32,
    /// The bound address and port, which every connection arrives on.
    pub(super) host: IpAddr,
    pub(super) port: u16,
}

impl Bus {
    /// A server for `settings`, running turns on `pool`.
    pub fn new(settings: ServerSettings, pool: TurnPool<TurnId, Turn, TurnOutput>) -> Bus {
        let port = settings.port;
        Bus {
            pid: std::process::id(),
            host: settings.host,
            port,
            audit: settings.audit,
            running: settings.running,
            engines_killed_at: None,
            table: TurnTable::new(settings.name.clone()),
            name: settings.name,
            secret: settings.secret,
            config: Arc::new(settings.config),
            config_path: settings.config_path,
            config_bytes: settings.config_bytes,
            engine_override: settings.engine_override,
            pool,
            stopping_since: None,
            allowed_hosts: checks::allowed_hosts(port),
        }
    }

    /// Refuses `head` (`None`: the HTTP layer failed before one was complete). A talk
    /// refused is a talk outcome: it is audited.
    fn refuse(&mut self, refusal: &Refusal, head: Option<&Head>) -> Response {
        match head {
            Some(head) if head.path() == TALK_PATH => {
                self.refuse_talk(refusal, &TalkMeta::at(head.received_at))
            }
            Some(head) => self.refusal_response(refusal, head.received_at),
            None => self.refusal_response(refusal, Instant::now()),
        }
    }
}

impl Service for Bus {
    fn on_head(&mut self, _id: ConnId, head: &Head) -> HeadAction {
        let checked = checks::check_origin(head, &self.allowed_hosts).and_then(|()| {
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
            Err(refusal) => HeadAction::Respond(self.refuse(&refusal, Some(head))),
        }
    }

    fn on_request(&mut self, conn: ConnId, head: &Head, body: Vec<u8>) -> Option<Response> {
        self.talk(conn, head.received_at, &body)
    }

    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response {
        self.refuse(&Refusal::Http(error), head)
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
}
