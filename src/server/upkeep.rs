//! The server's upkeep between requests: config reload, the turn table's deadlines
//! (reattach windows, waiters' deadlines) and shutdown (stop accepting, answer queued
//! turns, give running turns their grace, then kill their engines). The registry
//! self-check runs on a thread of its own ([`super::registry_check`]).
//!
//! The config reload is the one file read left on the loop, because it cannot wait:
//! [`read_trusted_config`] checks owners and modes as start-up does, opens without
//! blocking and without following a symlink, refuses anything but a regular file, and
//! reads at most `MAX_CONFIG_BYTES` (1 MiB) from it.

use super::startup::{parse_config, read_trusted_config};
use super::{Bus, Refusal};
use crate::http::{Control, Service};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often config.json is checked for edits (the contract asks for under a second).
pub const CONFIG_RELOAD_INTERVAL: Duration = Duration::from_millis(500);
/// The settings a reload cannot change, fixed for the process's lifetime (the socket,
/// the secret it published, the turn pool's sizes): an edit of one is warned about as
/// taking effect at the next start, never reported as changed.
const FIXED_UNTIL_RESTART: [&str; 4] = [
    "bus.port",
    "bus.secret",
    "bus.maxConcurrentTurns",
    "bus.maxQueuedTurns",
];
/// How long running turns may finish after SIGTERM/SIGINT before the process exits.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How often shutdown progress is checked.
const SHUTDOWN_POLL: Duration = Duration::from_millis(50);
/// After killing the engines that outlived [`SHUTDOWN_GRACE`], how long their turns
/// get to report (and their callers to be answered) before the process exits.
const SHUTDOWN_KILL_GRACE: Duration = Duration::from_secs(3);

/// The warning of a disabled bus, at startup and at a reload that disables it: the
/// instance answers health but refuses every talk, which would otherwise look healthy.
pub(super) fn warn_bus_disabled(config_path: &Path) {
    log::warn!(
        "the bus is disabled by {}: every talk is refused with bus_disabled \
         (`bus` is missing, not an object or true, or `peers` is false or [])",
        config_path.display()
    );
}

/// What a stopping instance logs: what it stopped, and what it waits for.
fn stopping_line(name: &str, queued: usize, running: usize) -> String {
    let turns = |n: usize| if n == 1 { "turn" } else { "turns" };
    let mut line = format!("{name} stopping: no new connections");
    if queued > 0 {
        line += &format!(", {queued} queued {} answered server_busy", turns(queued));
    }
    if running > 0 {
        let (grace, turns) = (SHUTDOWN_GRACE.as_secs(), turns(running));
        line += &format!(
            "; waiting up to {grace} s for {running} running {turns}; Ctrl-C again to stop now"
        );
    }
    line
}

impl Bus {
    /// Re-reads config.json if it changed, through the start-up trust checks
    /// ([`read_trusted_config`]); keeps the last good config on any problem, and warns
    /// once a problem (again only after a good read in between).
    pub(super) fn reload_config(&mut self) {
        let bytes = match read_trusted_config(&self.config_path) {
            Ok(bytes) if bytes == self.config_bytes => return,
            Ok(bytes) => bytes,
            Err(e) => {
                // Cleared, so that the next good read counts as a change.
                if !self.config_bytes.is_empty() {
                    log::warn!("{e}; keeping the last good config");
                    self.config_bytes.clear();
                }
                return;
            }
        };
        self.config_bytes = bytes;
        let engine = self.engine_override.as_ref();
        let new = match parse_config(&self.config_path, &self.config_bytes, engine) {
            Ok(new) => new,
            Err(e) => return log::warn!("{e}; keeping the last good config"),
        };
        let path = self.config_path.display();
        let (later, changed): (Vec<&str>, Vec<&str>) = self
            .config
            .changed_keys(&new)
            .into_iter()
            .partition(|key| FIXED_UNTIL_RESTART.contains(key));
        if !later.is_empty() {
            let later = later.join(" and ");
            log::warn!("{path}: {later} edited; that takes effect at the next start");
        }
        if self.config.bus.enabled && !new.bus.enabled {
            warn_bus_disabled(&self.config_path);
        }
        let what = if changed.is_empty() {
            "no setting changed now".to_owned()
        } else {
            format!("changed {}", changed.join(", "))
        };
        let (enabled, max_depth) = (new.bus.enabled, new.bus.max_depth);
        let bus = if enabled { "enabled" } else { "disabled" };
        log::info!("{path} reloaded: {what} (bus {bus}, maxDepth {max_depth})");
        let old_engine = self.config.engine.as_ref();
        if let Some(engine) = new.engine.as_ref().filter(|e| Some(*e) != old_engine) {
            crate::engine::warnings(engine)
                .iter()
                .for_each(|w| log::warn!("{path}: {w}"));
        }
        self.config = Arc::new(new);
    }

    /// Kills the running engines at `now`, saying `why`.
    fn kill_engines(&mut self, why: &str, now: Instant) {
        log::warn!("{why}; killing {} engine(s)", self.running.count());
        self.running.kill_all();
        self.engines_killed_at = Some(now);
    }

    pub(super) fn begin_shutdown(&mut self, control: &mut Control) {
        if self.stopping_since.is_some() {
            // Asked twice: the running turns lose their grace.
            if self.engines_killed_at.is_none() {
                self.kill_engines("asked again to stop", Instant::now());
            }
            return;
        }
        self.stopping_since = Some(Instant::now());
        control.stop_accepting();
        let queued = self.pool.close();
        let line = stopping_line(&self.name, queued.len(), self.pool.load().running);
        log::info!("{line}");
        for (turn, _job) in queued {
            if let Some(ended) = self.table.refuse(turn, Refusal::ShuttingDown) {
                self.answer(ended, control);
            }
        }
    }

    /// Periodic work: a config reload check, the turn table's deadlines; during a
    /// shutdown, its progress. Returns when to be called next.
    pub(super) fn tick(&mut self, now: Instant, control: &mut Control) -> Instant {
        let (expired, overdue, next) = self
            .table
            .tick(now, &self.config.bus, |turn| self.pool.is_queued(turn));
        for turn in expired {
            self.cancel(
                turn,
                "the caller hung up and no retry came within bus.reattachSecs",
            );
        }
        for (turn, ended) in overdue {
            log::error!(
                "a bug: the turn of {} did not answer within engine.timeoutSecs plus {} s; \
                 its callers get internal_error",
                super::turn_table::caller(&ended.0.meta),
                super::turn_table::WAITER_GRACE.as_secs()
            );
            self.pool.cancel(turn);
            self.answer(ended, control);
        }
        self.on_wake(control);
        match self.stopping_since {
            None => {
                self.reload_config();
                let reload = now + CONFIG_RELOAD_INTERVAL;
                next.map_or(reload, |due| due.min(reload))
            }
            Some(since) => {
                if self.pool.is_idle() && self.table.is_empty() {
                    control.exit();
                } else if let Some(killed_at) = self.engines_killed_at {
                    if now.duration_since(killed_at) >= SHUTDOWN_KILL_GRACE {
                        log::warn!("turns still running after their engines were killed; exiting");
                        control.exit();
                    }
                } else if now.duration_since(since) >= SHUTDOWN_GRACE {
                    let secs = SHUTDOWN_GRACE.as_secs();
                    let why = format!("running turns did not finish within {secs} s");
                    self.kill_engines(&why, now);
                }
                now + SHUTDOWN_POLL
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_says_what_it_waits_for() {
        assert_eq!(
            stopping_line("worker", 0, 2),
            "worker stopping: no new connections; waiting up to 30 s for 2 running turns; \
             Ctrl-C again to stop now"
        );
        assert_eq!(
            stopping_line("worker", 1, 1),
            "worker stopping: no new connections, 1 queued turn answered server_busy; \
             waiting up to 30 s for 1 running turn; Ctrl-C again to stop now"
        );
        assert_eq!(
            stopping_line("worker", 0, 0),
            "worker stopping: no new connections"
        );
    }
}
