//! The bus server: routing, the contract's check order, envelopes, config reload and
//! shutdown. It plugs into the HTTP loop as its [`Service`].
//!
//! Checks on `POST /api/talk` run in the contract's order (section 3): checks 1-6 on
//! the head alone, so an unauthorized body is never read; checks 7-10 on the body.
//! [`Refusal::status_and_code`] is the one place where refusals get their status code
//! and wire error code.

use crate::audit::{self, AuditLog};
use crate::config::{self, Config};
use crate::engine::{Engine, RunningEngines, Turn, TurnResult};
use crate::http::{ConnId, Control, Head, HeadAction, HttpError, Response, Service};
use crate::protocol::{self, Envelope, ErrorCode, Failure, Health, InstanceName, TurnLoad};
use crate::registry;
use crate::secret::Secret;
use crate::turns::{Busy, Done, Outcome, TurnPool};

mod checks;
mod error;
mod instance;
mod refusal;
pub use error::ServeError;
pub use instance::{EngineOverride, Instance, InstanceOptions, ShutdownHandle};

pub use refusal::Refusal;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often config.json is checked for edits (the contract asks for under a second).
pub const CONFIG_RELOAD_INTERVAL: Duration = Duration::from_millis(500);
/// How long running turns may finish after SIGTERM/SIGINT before the process exits.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How often the instance checks that its registry entry is still there (and writes it
/// again if the file was deleted or torn).
pub const REGISTRY_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often shutdown progress is checked.
const SHUTDOWN_POLL: Duration = Duration::from_millis(50);
/// After killing the engines that outlived [`SHUTDOWN_GRACE`], how long their turns
/// get to report (and their callers to be answered) before the process exits.
const KILL_GRACE: Duration = Duration::from_secs(3);

/// The only paths served.
const TALK_PATH: &str = "/api/talk";
const HEALTH_PATH: &str = "/api/health";

/// What the audit line of one talk outcome knows about the request.
#[derive(Debug, Clone, Default)]
struct TalkMeta {
    from_instance: Option<String>,
    depth: Option<u64>,
    prompt_chars: Option<usize>,
}

/// A request waiting for its turn.
#[derive(Debug)]
struct Pending {
    received_at: Instant,
    meta: TalkMeta,
}

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
    /// The state directory (for the audit log).
    pub state_dir: PathBuf,
    /// The channel root whose registry lists this instance.
    pub root: PathBuf,
    /// The engines running now, killed if they outlive the shutdown grace.
    pub running: RunningEngines,
}

/// The bus server state, driven by the HTTP loop.
pub struct Bus {
    name: InstanceName,
    secret: Secret,
    config: Arc<Config>,
    config_path: PathBuf,
    config_bytes: Vec<u8>,
    engine_override: Option<EngineOverride>,
    pool: TurnPool<ConnId, Turn, TurnResult>,
    pending: HashMap<ConnId, Pending>,
    stopping_since: Option<Instant>,
    engines_killed_at: Option<Instant>,
    allowed_hosts: [String; 3],
    audit: AuditLog,
    running: RunningEngines,
    /// This process's id, for health (asked once: it is a syscall).
    pid: u32,
    root: PathBuf,
    port: u16,
    registry_checked_at: Instant,
}

impl Bus {
    /// A server for `settings`, running turns on `pool`.
    pub fn new(settings: ServerSettings, pool: TurnPool<ConnId, Turn, TurnResult>) -> Bus {
        let port = settings.port;
        let audit = AuditLog::new(&settings.state_dir, &settings.name);
        Bus {
            root: settings.root,
            port,
            registry_checked_at: Instant::now(),
            pid: std::process::id(),
            audit,
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

    fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![
                ("Content-Type", "application/json".to_owned()),
                ("Cache-Control", "no-store".to_owned()),
                ("X-Content-Type-Options", "nosniff".to_owned()),
            ],
            body,
            close: false,
        }
    }

    fn envelope_response(status: u16, envelope: &Envelope) -> Response {
        Bus::json(status, envelope.to_json())
    }

    fn refusal_response(&self, refusal: &Refusal, received_at: Instant) -> Response {
        let (status, code) = refusal.status_and_code();
        let envelope = Envelope::failure(
            &self.name,
            Failure::new(code, refusal.message()),
            elapsed_ms(received_at),
        );
        let mut response = Bus::envelope_response(status, &envelope);
        if let Refusal::MethodNotAllowed(allow) = refusal {
            response.headers.push(("Allow", (*allow).to_owned()));
        }
        if matches!(refusal, Refusal::Http(_)) {
            response.close = true;
        }
        response
    }

    /// Answers a talk with a refusal and records the outcome.
    fn refuse_talk(
        &mut self,
        refusal: &Refusal,
        received_at: Instant,
        meta: &TalkMeta,
    ) -> Response {
        let (status, code) = refusal.status_and_code();
        log::debug!(
            "talk refused: {} {} (from {:?}, depth {:?}, prompt {:?} chars)",
            status,
            code,
            meta.from_instance.as_deref().unwrap_or("?"),
            meta.depth,
            meta.prompt_chars
        );
        let message = refusal.message();
        let duration_ms = elapsed_ms(received_at);
        self.audit.record(&audit::Record {
            outcome: "refused",
            detail: &message,
            from_instance: meta.from_instance.as_deref(),
            depth: meta.depth,
            duration_ms,
            error_code: Some(code.as_str()),
            prompt_chars: meta.prompt_chars,
            status: Some(status),
        });
        self.refusal_response(refusal, received_at)
    }

    /// Records a turn's answer in the audit log.
    fn audit_answer(&mut self, pending: &Pending, envelope: &Envelope) {
        let (outcome, detail, code) = match &envelope.failure {
            None => ("success", "ok", None),
            Some(f) => ("failure", audit_detail(f), Some(f.code.as_str())),
        };
        self.audit.record(&audit::Record {
            outcome,
            detail,
            from_instance: pending.meta.from_instance.as_deref(),
            depth: pending.meta.depth,
            duration_ms: envelope.duration_ms,
            error_code: code,
            prompt_chars: pending.meta.prompt_chars,
            status: Some(200),
        });
    }

    fn health(&self) -> Response {
        let load = self.pool.load();
        let status = if self.stopping_since.is_some() {
            Health::STOPPING
        } else {
            Health::OK
        };
        let turns = TurnLoad {
            running: load.running,
            queued: load.queued,
            max: load.max,
        };
        let body = Health::new(&self.config.bus.kind, &self.name, status, self.pid);
        Bus::json(200, body.with_turns(turns).to_json())
    }

    /// Turns a finished job into the response for its connection.
    fn finish(&mut self, done: Done<ConnId, TurnResult>) -> Option<(ConnId, Response)> {
        let pending = self.pending.remove(&done.key)?;
        let took = elapsed_ms(pending.received_at);
        let response = match done.outcome {
            Outcome::Finished(TurnResult::Reply(text)) => {
                log::debug!(
                    "talk answered: success (from {:?}, depth {:?}, {} ms)",
                    pending.meta.from_instance.as_deref().unwrap_or("?"),
                    pending.meta.depth,
                    took
                );
                let envelope = Envelope::success(&self.name, text, took);
                self.audit_answer(&pending, &envelope);
                Bus::envelope_response(200, &envelope)
            }
            Outcome::Finished(TurnResult::Failed(failure)) => {
                log::debug!(
                    "talk answered: failure {} (from {:?}, {} ms)",
                    failure.code,
                    pending.meta.from_instance.as_deref().unwrap_or("?"),
                    took
                );
                let envelope = Envelope::failure(&self.name, failure, took);
                self.audit_answer(&pending, &envelope);
                Bus::envelope_response(200, &envelope)
            }
            Outcome::Panicked => {
                log::error!("turn handler panicked");
                self.refuse_talk(
                    &Refusal::HandlerPanicked,
                    pending.received_at,
                    &pending.meta,
                )
            }
        };
        Some((done.key, response))
    }

    /// Re-reads config.json if it changed; keeps the last good config on any problem.
    fn reload_config(&mut self) {
        let bytes = match config::read_file(&self.config_path) {
            Ok(bytes) => bytes,
            Err(e) => {
                if !self.config_bytes.is_empty() {
                    log::warn!("{e}; keeping the last good config");
                    self.config_bytes.clear();
                }
                return;
            }
        };
        if bytes == self.config_bytes {
            return;
        }
        self.config_bytes = bytes;
        match config::parse(&self.config_bytes) {
            Ok(mut new) => {
                if let Some(engine) = &self.engine_override {
                    engine.apply(&mut new);
                }
                if new.bus.port != self.config.bus.port || new.bus.secret != self.config.bus.secret
                {
                    log::warn!(
                        "config.json: port and secret changes take effect at the next start"
                    );
                }
                log::info!(
                    "config.json reloaded: bus {}, maxDepth {}",
                    if new.bus.enabled {
                        "enabled"
                    } else {
                        "disabled"
                    },
                    new.bus.max_depth
                );
                self.config = Arc::new(new);
            }
            Err(e) => log::warn!("{e}; keeping the last good config"),
        }
    }

    /// Writes this instance's registry entry again if it went missing.
    fn check_registration(&mut self) {
        match registry::ensure_registered(&self.root, &self.name, self.port, self.pid, &self.secret)
        {
            Ok(true) => log::warn!(
                "the registry entry of {} was missing; registered again",
                self.name
            ),
            Ok(false) => {}
            Err(e) => log::warn!("cannot check the registry: {e}"),
        }
    }

    fn begin_shutdown(&mut self, control: &mut Control) {
        if self.stopping_since.is_some() {
            return;
        }
        log::info!("stopping: no new connections, queued turns get server_busy");
        self.stopping_since = Some(Instant::now());
        control.stop_accepting();
        for (conn, _job) in self.pool.close() {
            if let Some(pending) = self.pending.remove(&conn) {
                let response =
                    self.refuse_talk(&Refusal::ShuttingDown, pending.received_at, &pending.meta);
                control.respond(conn, response);
            }
        }
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
            (HEALTH_PATH, "GET") => HeadAction::Respond(self.health()),
            (HEALTH_PATH, _) => HeadAction::Respond(
                self.refusal_response(&Refusal::MethodNotAllowed("GET"), received_at),
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
        match self.stopping_since {
            None => {
                self.reload_config();
                if now.duration_since(self.registry_checked_at) >= REGISTRY_CHECK_INTERVAL {
                    self.registry_checked_at = now;
                    self.check_registration();
                }
                now + CONFIG_RELOAD_INTERVAL
            }
            Some(since) => {
                self.on_wake(control);
                if self.pool.is_idle() && self.pending.is_empty() {
                    control.exit();
                } else if let Some(killed_at) = self.engines_killed_at {
                    if now.duration_since(killed_at) >= KILL_GRACE {
                        log::warn!("turns still running after their engines were killed; exiting");
                        control.exit();
                    }
                } else if now.duration_since(since) >= SHUTDOWN_GRACE {
                    log::warn!(
                        "running turns did not finish within {SHUTDOWN_GRACE:?}; killing {} engine(s)",
                        self.running.count()
                    );
                    self.running.kill_all();
                    self.engines_killed_at = Some(now);
                }
                now + SHUTDOWN_POLL
            }
        }
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
            log::info!(
                "caller {:?}: {detail}",
                pending.meta.from_instance.as_deref().unwrap_or("?")
            );
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

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
