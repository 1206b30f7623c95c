//! The server's upkeep between requests: config reload, the registry self-check, and
//! shutdown (stop accepting, answer queued turns, give running turns their grace,
//! then kill their engines).

use super::{Bus, Refusal};
use crate::config;
use crate::http::{Control, Service};
use crate::registry;
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

impl Bus {
    /// Re-reads config.json if it changed; keeps the last good config on any problem.
    pub(super) fn reload_config(&mut self) {
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
                if let Some(engine) = new
                    .engine
                    .as_ref()
                    .filter(|e| Some(*e) != self.config.engine.as_ref())
                {
                    crate::engine::warnings(engine)
                        .iter()
                        .for_each(|w| log::warn!("{w}"));
                }
                self.config = Arc::new(new);
            }
            Err(e) => log::warn!("{e}; keeping the last good config"),
        }
    }

    /// Writes this instance's registry entry again if it went missing.
    pub(super) fn check_registration(&mut self) {
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

    pub(super) fn begin_shutdown(&mut self, control: &mut Control) {
        if self.stopping_since.is_some() {
            // Asked twice: the running turns lose their grace.
            if self.engines_killed_at.is_none() {
                log::warn!(
                    "asked again to stop: killing {} engine(s)",
                    self.running.count()
                );
                self.running.kill_all();
                self.engines_killed_at = Some(Instant::now());
            }
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

    /// Periodic work: a config reload check and, every [`REGISTRY_CHECK_INTERVAL`], the
    /// registry self-check; during a shutdown, its progress. Returns when to be called
    /// next.
    pub(super) fn tick(&mut self, now: Instant, control: &mut Control) -> Instant {
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
}
