//! [`Bus`]: the server state the HTTP loop drives, and its routing: which path and
//! method get which answer, and the contract's check order from head to turn.

use super::answer::TalkMeta;
use super::lifetime::{TurnId, TurnState};
use super::requests::RequestStore;
use super::{checks, EngineOverride, Refusal};
use crate::audit::AuditLog;
use crate::config::Config;
use crate::engine::{RunningEngines, Turn, TurnOutput};
use crate::http::{
    ConnId, Control, Head, HeadAction, HttpError, Response, Service, HEALTH_PATH, TALK_PATH,
};
use crate::protocol::{self, Envelope, InstanceName};
use crate::secret::Secret;
use crate::turns::TurnPool;
use std::collections::HashMap;
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
    /// The bound address (the instance binds one): the `host` of the health proof's
    /// message (contract 6.1).
    pub host: IpAddr,
    /// The audit log, its writer thread running.
    pub audit: AuditLog,
    /// The engines running now, killed if they outlive the shutdown grace.
    pub running: RunningEngines,
}

/// Wakes the event loop from anywhere.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The bus server state, driven by the HTTP loop.
pub struct Bus {
    pub(super) name: InstanceName,
    pub(super) secret: Secret,
    pub(super) config: Arc<Config>,
    pub(super) config_path: PathBuf,
    pub(super) config_bytes: Vec<u8>,
    pub(super) engine_override: Option<EngineOverride>,
    pub(super) pool: TurnPool<TurnId, Turn, TurnOutput>,
    /// The turns admitted and not answered yet.
    pub(super) turns: HashMap<TurnId, TurnState>,
    /// Which turn each waiting connection waits on.
    pub(super) conns: HashMap<ConnId, TurnId>,
    pub(super) next_turn: u64,
    /// Request ids of running and recently answered turns (contract 8.2).
    pub(super) requests: RequestStore<TurnId, Envelope>,
    /// Answers for connections other than the one a callback serves, delivered at the
    /// next wake-up.
    pub(super) outbox: Vec<(ConnId, Response)>,
    /// Wakes the loop (to deliver the outbox).
    pub(super) wake: Wake,
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
    /// A server for `settings`, running turns on `pool`, waking the loop with `wake`.
    pub fn new(
        settings: ServerSettings,
        pool: TurnPool<TurnId, Turn, TurnOutput>,
        wake: Wake,
    ) -> Bus {
        let port = settings.port;
        Bus {
            pid: std::process::id(),
            host: settings.host,
            port,
            audit: settings.audit,
            running: settings.running,
            engines_killed_at: None,
            name: settings.name,
            secret: settings.secret,
            config: Arc::new(settings.config),
            config_path: settings.config_path,
            config_bytes: settings.config_bytes,
            engine_override: settings.engine_override,
            pool,
            turns: HashMap::new(),
            conns: HashMap::new(),
            next_turn: 0,
            requests: RequestStore::default(),
            outbox: Vec::new(),
            wake,
            stopping_since: None,
            allowed_hosts: checks::allowed_hosts(port),
        }
    }

    /// Hands back the pool after the loop ended, so its workers can be joined.
    pub fn into_pool(self) -> TurnPool<TurnId, Turn, TurnOutput> {
        self.pool
    }
}

impl Service for Bus {
    fn on_head(&mut self, _id: ConnId, head: &Head) -> HeadAction {
        let received_at = head.received_at;
        let path = head.path();
        let is_talk = path == TALK_PATH;
        if let Err(refusal) = checks::check_origin(head, &self.allowed_hosts) {
            let response = if is_talk {
                self.refuse_talk(&refusal, received_at, &TalkMeta::default())
            } else {
                self.refusal_response(&refusal, received_at)
            };
            return HeadAction::Respond(response);
        }
        match (path, head.method.as_str()) {
            // HEAD gets the GET answer; the HTTP layer leaves out its body (contract 3).
            (HEALTH_PATH, "GET" | "HEAD") => HeadAction::Respond(self.health(head)),
            (HEALTH_PATH, _) => HeadAction::Respond(
                self.refusal_response(&Refusal::MethodNotAllowed("GET, HEAD"), received_at),
            ),
            (TALK_PATH, "POST") => {
                match checks::check_talk_head(head, self.config.bus.enabled, &self.secret) {
                    Ok(length) => HeadAction::ReadBody(length),
                    Err(refusal) => HeadAction::Respond(self.refuse_talk(
                        &refusal,
                        received_at,
                        &TalkMeta::default(),
                    )),
                }
            }
            (TALK_PATH, _) => HeadAction::Respond(self.refuse_talk(
                &Refusal::MethodNotAllowed("POST"),
                received_at,
                &TalkMeta::default(),
            )),
            _ => HeadAction::Respond(self.refusal_response(&Refusal::NotFound, received_at)),
        }
    }

    fn on_request(&mut self, conn: ConnId, head: &Head, body: Vec<u8>) -> Option<Response> {
        let received_at = head.received_at;
        let request = match protocol::parse_talk_request(&body) {
            Ok(request) => request,
            Err(e) => {
                return Some(self.refuse_talk(&Refusal::Body(e), received_at, &TalkMeta::default()))
            }
        };
        let meta = TalkMeta {
            from_instance: Some(request.from_instance.clone()),
            depth: Some(request.depth),
            prompt_chars: Some(request.prompt.chars().count()),
            request_id: request.ext.request_id.as_ref().map(|id| id.to_string()),
        };
        let refusal = if !self.config.bus.peers.allows(&request.from_instance) {
            Some(Refusal::PeerNotAllowed)
        } else if request.depth >= self.config.bus.max_depth {
            Some(Refusal::DepthExceeded {
                depth: request.depth,
                max: self.config.bus.max_depth,
            })
        } else if self.stopping_since.is_some() {
            Some(Refusal::ShuttingDown)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            return Some(self.refuse_talk(&refusal, received_at, &meta));
        }
        self.admit(conn, request, received_at, meta)
    }

    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response {
        let refusal = Refusal::Http(error);
        match head {
            // A talk that got past its head is a talk outcome: it is audited.
            Some(head) if head.path() == TALK_PATH => {
                self.refuse_talk(&refusal, head.received_at, &TalkMeta::default())
            }
            _ => self.refusal_response(&refusal, Instant::now()),
        }
    }

    fn on_wake(&mut self, control: &mut Control) {
        for (conn, response) in std::mem::take(&mut self.outbox) {
            control.respond(conn, response);
        }
        let finished: Vec<_> = self.pool.finished().collect();
        for done in finished {
            for (conn, response) in self.complete(done.key, done.outcome) {
                control.respond(conn, response);
            }
        }
    }

    fn on_interrupt(&mut self, control: &mut Control) {
        self.begin_shutdown(control);
        control.tick_at(Instant::now());
    }

    fn on_tick(&mut self, now: Instant, control: &mut Control) -> Instant {
        self.tick(now, control)
    }

    fn on_abandoned(&mut self, conn: ConnId) {
        self.hung_up(conn);
        if !self.outbox.is_empty() {
            (self.wake)();
        }
    }
}
