//! [`Bus`]: the server state the HTTP loop drives, and its routing: which path and
//! method get which answer, and the contract's check order from head to turn.

use super::answer::{elapsed_ms, Pending, TalkMeta};
use super::{checks, EngineOverride, Refusal};
use crate::audit::{self, AuditLog};
use crate::config::Config;
use crate::engine::{Engine, RunningEngines, Turn, TurnResult};
use crate::http::{
    ConnId, Control, Head, HeadAction, HttpError, Response, Service, HEALTH_PATH, TALK_PATH,
};
use crate::protocol::{self, InstanceName};
use crate::secret::Secret;
use crate::turns::{Busy, Done, Outcome, TurnPool};
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

/// The bus server state, driven by the HTTP loop.
pub struct Bus {
    pub(super) name: InstanceName,
    pub(super) secret: Secret,
    pub(super) config: Arc<Config>,
    pub(super) config_path: PathBuf,
    pub(super) config_bytes: Vec<u8>,
    pub(super) engine_override: Option<EngineOverride>,
    pub(super) pool: TurnPool<ConnId, Turn, TurnResult>,
    pub(super) pending: HashMap<ConnId, Pending>,
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
    pub fn new(settings: ServerSettings, pool: TurnPool<ConnId, Turn, TurnResult>) -> Bus {
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
            pending: HashMap::new(),
            stopping_since: None,
            allowed_hosts: checks::allowed_hosts(port),
        }
    }

    /// Hands back the pool after the loop ended, so its workers can be joined.
    pub fn into_pool(self) -> TurnPool<ConnId, Turn, TurnResult> {
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

    fn on_request(&mut self, id: ConnId, head: &Head, body: Vec<u8>) -> Option<Response> {
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
        let turn = Turn {
            request,
            config: Arc::clone(&self.config),
        };
        if let Some(result) = Engine::run_inline(&turn) {
            // Echo without a budget: no process, no file, nothing to wait for.
            self.pending.insert(id, Pending { received_at, meta });
            let done = Done {
                key: id,
                outcome: Outcome::Finished(result),
            };
            return self.finish(done).map(|(_, response)| response);
        }
        match self.pool.submit(id, turn) {
            Ok(()) => {
                self.pending.insert(id, Pending { received_at, meta });
                None
            }
            Err(Busy(_turn)) => Some(self.refuse_talk(&Refusal::Busy, received_at, &meta)),
        }
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
        let finished: Vec<_> = self.pool.finished().collect();
        for done in finished {
            if let Some((conn, response)) = self.finish(done) {
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

    fn on_abandoned(&mut self, id: ConnId) {
        // A queued turn is dropped; a running one finishes (its usage counts) and its
        // answer is discarded.
        if let Some(pending) = self.pending.remove(&id) {
            let cancelled = self.pool.cancel(id).is_some();
            let detail = if cancelled {
                "the caller went away while its turn was queued; it will not run"
            } else {
                "the caller went away while its turn ran; the answer is dropped"
            };
            log::info!("{}: {detail}", pending.meta.describe());
            self.audit.record(&audit::Record {
                outcome: "abandoned",
                detail,
                from_instance: pending.meta.from_instance.as_deref(),
                depth: pending.meta.depth,
                duration_ms: elapsed_ms(pending.received_at),
                error_code: None,
                prompt_chars: pending.meta.prompt_chars,
                status: None,
            });
        }
    }
}
