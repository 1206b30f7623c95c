//! [`Bus`]: the server state the HTTP loop drives, and its routing: which path and
//! method get which answer, the contract's check order from head to turn, and what the
//! turn table's decisions come to (the pool, the audit log, the answers written).

use super::answer::{json, TalkMeta};
use super::turn_table::{caller, Admit, HangUp, TurnId, TurnTable};
use super::{checks, EngineOverride, Refusal};
use crate::audit::AuditLog;
use crate::config::Config;
use crate::engine::{RunningEngines, Turn, TurnOutput};
use crate::http::{
    ConnId, Control, Head, HeadAction, HttpError, Response, Service, HEALTH_PATH, TALK_PATH,
};
use crate::protocol::{self, InstanceName};
use crate::secret::Secret;
use crate::turns::{Busy, Outcome, TurnPool};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    /// Admits a request that passed checks 1-9 (see [`TurnTable::admit`]). `Some`
    /// answers `conn` now; `None` when it waits on a turn.
    fn admit(
        &mut self,
        conn: ConnId,
        request: protocol::TalkRequest,
        meta: TalkMeta,
    ) -> Option<Response> {
        let engine = self.config.engine.as_ref();
        let timeout = Duration::from_secs(engine.map_or(0, |e| e.timeout_secs));
        let now = Instant::now();
        let admitted = self.table.admit(conn, &request, meta.clone(), timeout, now);
        let (outcome, detail, answer) = match admitted {
            Admit::New(new) => {
                let cancel = new.cancel_token();
                let turn = Turn {
                    request,
                    config: Arc::clone(&self.config),
                    cancel,
                };
                if let Err(Busy(_)) = self.pool.submit(new.id, turn) {
                    return Some(self.refuse_talk(&Refusal::Busy, &meta));
                }
                self.table.insert(new);
                return None;
            }
            Admit::Refused(refusal) => return Some(self.refuse_talk(&refusal, &meta)),
            Admit::Attached => (
                "attached",
                "a retry joined the running turn of its request id",
                None,
            ),
            Admit::Cancel(turn) => {
                self.cancel(turn, "cancelled by a cancel request");
                (
                    "cancel",
                    "a cancel request for the running turn of its request id",
                    None,
                )
            }
            Admit::Stored(envelope) if request.ext.cancel => (
                "duplicate",
                "a cancel request for a finished turn got its stored envelope",
                Some(json(200, envelope.to_json())),
            ),
            Admit::Stored(envelope) => (
                "duplicate",
                "a retry got the stored envelope of its request id; no engine ran",
                Some(json(200, envelope.to_json())),
            ),
        };
        let status = answer.as_ref().map(|_| 200);
        self.audit(&meta, outcome, detail, None, status);
        answer
    }

    /// Cancels `turn` (contract 8.1): a queued one is taken out of the queue, a running
    /// one's engine is stopped; either way its answer comes with the pool's report.
    pub(super) fn cancel(&mut self, turn: TurnId, why: &'static str) {
        if let Some(meta) = self.table.cancel(turn, why) {
            log::info!("cancelling the turn of {}: {why}", caller(meta));
        }
        self.pool.cancel(turn);
    }
}

impl Service for Bus {
    fn on_head(&mut self, _id: ConnId, head: &Head) -> HeadAction {
        let received_at = head.received_at;
        let path = head.path();
        let is_talk = path == TALK_PATH;
        if let Err(refusal) = checks::check_origin(head, &self.allowed_hosts) {
            let response = if is_talk {
                self.refuse_talk(&refusal, &TalkMeta::at(received_at))
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
                    Err(refusal) => {
                        HeadAction::Respond(self.refuse_talk(&refusal, &TalkMeta::at(received_at)))
                    }
                }
            }
            (TALK_PATH, _) => HeadAction::Respond(self.refuse_talk(
                &Refusal::MethodNotAllowed("POST"),
                &TalkMeta::at(received_at),
            )),
            _ => HeadAction::Respond(self.refusal_response(&Refusal::NotFound, received_at)),
        }
    }

    fn on_request(&mut self, conn: ConnId, head: &Head, body: Vec<u8>) -> Option<Response> {
        let received_at = head.received_at;
        let request = match protocol::parse_talk_request(&body) {
            Ok(request) => request,
            Err(e) => return Some(self.refuse_talk(&Refusal::Body(e), &TalkMeta::at(received_at))),
        };
        let meta = TalkMeta::of(&request, received_at);
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
            return Some(self.refuse_talk(&refusal, &meta));
        }
        self.admit(conn, request, meta)
    }

    fn error_response(&mut self, error: HttpError, head: Option<&Head>) -> Response {
        let refusal = Refusal::Http(error);
        match head {
            // A talk that got past its head is a talk outcome: it is audited.
            Some(head) if head.path() == TALK_PATH => {
                self.refuse_talk(&refusal, &TalkMeta::at(head.received_at))
            }
            _ => self.refusal_response(&refusal, Instant::now()),
        }
    }

    /// Answers the waiters of the turns the pool reported.
    fn on_wake(&mut self, control: &mut Control) {
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

    fn on_interrupt(&mut self, control: &mut Control) {
        self.begin_shutdown(control);
        control.tick_at(Instant::now());
    }

    fn on_tick(&mut self, now: Instant, control: &mut Control) -> Instant {
        self.tick(now, control)
    }

    /// What a hang-up does to its turn is the table's decision (contract 8.1).
    fn on_abandoned(&mut self, conn: ConnId) {
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
                self.audit(&meta, "abandoned", detail, None, None);
            }
        }
    }
}
