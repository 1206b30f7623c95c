//! The steps of an instance's start that are not the composition itself: reading and
//! checking its config and files, pruning the registry, the stop pipe and the signals
//! routed to it. Its name is claimed by the registration (`registry_check.rs`).

use super::{EngineOverride, ServeError};
use crate::config::{self, Config};
use crate::files;
use crate::http;
use crate::protocol::InstanceName;
use crate::registry;
use crate::secret::Secret;
use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Parses the `bytes` of config.json at `config_path`, with `engine` in place of its
/// own: at start-up and at every reload.
pub(super) fn parse_config(
    config_path: &Path,
    bytes: &[u8],
    engine: Option<&EngineOverride>,
) -> Result<Config, ServeError> {
    let mut config = config::parse_file(config_path, bytes).map_err(ServeError::Config)?;
    match engine {
        Some(EngineOverride::Echo) => config.engine = None,
        Some(EngineOverride::Command(engine)) => config.engine = Some(engine.clone()),
        None => {}
    }
    Ok(config)
}

/// The bytes of config.json at `config_path` (`<state dir>/config.json`), once the
/// trust checks pass, then a read that refuses a symlink or anything but a regular
/// file. The one gate for config.json, at start-up and at every reload: a reload that
/// skipped it ran the engine another user wrote after a mode slip.
///
/// The trust checks refuse a channel root, state directory or config.json that another
/// user owns or may write to (contract 1): its config would run that user's engine as
/// us, its registry would send our prompts and secrets where that user likes. Missing
/// paths are left to the steps that need them.
pub(super) fn read_trusted_config(config_path: &Path) -> Result<Vec<u8>, ServeError> {
    use files::TrustKind::{Dir, File};
    let state_dir = config_path.parent().unwrap_or(Path::new("."));
    let root = registry::channel_root(state_dir);
    for (path, kind) in [(root.as_path(), Dir), (state_dir, Dir), (config_path, File)] {
        if let Err(source) = files::check_trusted(path, kind) {
            if source.kind() != io::ErrorKind::NotFound {
                let path = path.to_path_buf();
                return Err(ServeError::Untrusted { path, source });
            }
        }
    }
    config::read_file(config_path).map_err(ServeError::Config)
}

/// Removes the temp files that a writer killed mid-write left in `dirs` (the state
/// directory and the channel root).
pub(super) fn remove_stale_temp_files(dirs: &[&Path]) {
    for dir in dirs {
        match files::remove_stale_temp_files(dir) {
            Ok(removed) => {
                for path in removed {
                    log::info!("removed {}, left by a process that is gone", path.display());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("cannot look for stale temp files in {}: {e}", dir.display()),
        }
    }
}

/// The start-up checks of a config that a reload cannot change: a `bus.secret` that is
/// weak (contract 2) is refused, and so is one whose running plus queued turns could
/// not all wait on their callers' connections while [`http::HEALTH_RESERVE`]
/// connections stay free (contract section 3, "open connections"), under the
/// connection cap the event loop uses (which keeps the running engines' descriptors
/// free). A config.json that others may read ([`read_trusted_config`] refused one they
/// may write) is warned about: it may hold the bus secret; so are the engine's problems.
pub(super) fn check_config(config: &Config, config_path: &Path) -> Result<(), ServeError> {
    if let Some(weakness) = config.bus.secret.as_ref().and_then(Secret::weakness) {
        let config_path = config_path.to_path_buf();
        return Err(ServeError::WeakSecret {
            config_path,
            weakness,
        });
    }
    let bus = &config.bus;
    let turns = bus
        .max_concurrent_turns
        .saturating_add(bus.max_queued_turns);
    let cap = http::connection_cap(bus.max_concurrent_turns);
    if turns > http::max_authorized(cap) {
        return Err(ServeError::TurnsExceedConnections {
            config_path: config_path.to_path_buf(),
            turns,
            cap,
        });
    }
    if let Ok(Some(mode)) = files::mode_is_wider(config_path, files::PRIVATE_FILE_MODE) {
        log::warn!(
            "{} has mode {mode:o}; it holds the bus secret, so 600 is advised",
            config_path.display()
        );
    }
    if let Some(engine) = &config.engine {
        crate::engine::warnings(engine)
            .iter()
            .for_each(|w| log::warn!("{}: {w}", config_path.display()));
    }
    Ok(())
}

/// Prunes stale registry entries (contract section 6) but `name`'s, which
/// `Registration::claim` looks at (and warns about a squatter on its port) before replacing
/// it. A registry that can't be read or written here is only a warning; registering
/// reports real trouble.
pub(super) fn prune_registry(root: &Path, name: &InstanceName) {
    let path = registry::registry_path(root);
    match registry::prune(root, Some(name)) {
        Ok(pruned) => {
            for stale in pruned {
                log::info!(
                    "removed the stale registry entry of {stale} from {}",
                    path.display()
                );
            }
        }
        Err(e) => log::warn!("cannot prune {}: {e}", path.display()),
    }
}

/// The one line logged once an instance is ready: its name, address and pid, and the
/// engine, peers and budget it runs with (no secret, no env values).
pub(super) fn ready_line(
    name: &InstanceName,
    addr: SocketAddr,
    pid: u32,
    config: &Config,
) -> String {
    let engine = config.engine.as_ref().map(|e| e.command.join(" "));
    let engine = engine.unwrap_or_else(|| "built-in echo".to_owned());
    let peers = match (&config.bus.peers, config.bus.enabled) {
        (_, false) => "none (bus disabled)".to_owned(),
        (config::Peers::Any, true) => "*".to_owned(),
        (config::Peers::Only(names), true) => names.join(","),
    };
    let budget = config
        .budget_usd
        .map_or("none".to_owned(), |usd| format!("{usd} USD"));
    format!(
        "ready: {name} on http://{addr} (pid {pid}), engine {engine}, peers {peers}, \
         maxDepth {}, budget {budget}",
        config.bus.max_depth
    )
}

/// The loop's end of the stop pipe (readable when a stop is asked for) and the end
/// that asks.
pub(super) fn interrupt_pair() -> io::Result<(mio::net::UnixStream, UnixStream)> {
    let (read, write) = UnixStream::pair()?;
    read.set_nonblocking(true)?;
    write.set_nonblocking(true)?;
    Ok((mio::net::UnixStream::from_std(read), write))
}

/// The signals that stop an instance like [`ShutdownHandle::shutdown`] (contract 8):
/// each deregisters and kills the engines before the exit, none leaves the registry
/// entry or an engine behind. Besides the four the contract names, every other signal
/// whose default action ends the process without a fault (SIGUSR1, SIGUSR2, SIGALRM,
/// SIGVTALRM, SIGPROF and SIGIO): left at their default, each killed serve
/// and left its entry.
const STOP_SIGNALS: [i32; 10] = {
    use signal_hook::consts::*;
    [
        SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
    ]
};

/// Routes the [`STOP_SIGNALS`] to the stop pipe.
pub(super) fn route_signals(write: &UnixStream) -> io::Result<Vec<signal_hook::SigId>> {
    STOP_SIGNALS
        .into_iter()
        .map(|signal| signal_hook::low_level::pipe::register(signal, write.try_clone()?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_engine_peers_and_budget() {
        let name = InstanceName::new("worker").unwrap();
        let addr: SocketAddr = "127.0.0.1:7701".parse().unwrap();
        let mut config = Config {
            bus: config::BusConfig::open(),
            ..Config::default()
        };
        assert_eq!(
            ready_line(&name, addr, 42, &config),
            "ready: worker on http://127.0.0.1:7701 (pid 42), engine built-in echo, peers *, \
             maxDepth 3, budget none"
        );
        config.bus.peers = config::Peers::Only(vec!["a".into(), "b".into()]);
        config.budget_usd = Some(1.2);
        config.engine = Some(config::EngineConfig::new(vec![
            "claude".into(),
            "-p".into(),
        ]));
        let line = ready_line(&name, addr, 42, &config);
        assert!(
            line.ends_with("engine claude -p, peers a,b, maxDepth 3, budget 1.2 USD"),
            "{line}"
        );
        config.bus.enabled = false;
        assert!(ready_line(&name, addr, 42, &config).contains("peers none (bus disabled)"));
    }
}
