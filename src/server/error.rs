//! [`ServeError`]: every way an instance can fail to start or stop serving, each with
//! a message that names the file, address or name concerned, never a secret.

use crate::config::ConfigError;
use crate::http;
use crate::secret::Weakness;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why an instance could not start or stopped with a failure. Messages name the file,
/// address or name concerned, never a secret.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServeError {
    /// The instance name (given, or taken from the state directory) is not valid.
    InvalidName(String),
    /// config.json is missing, unreadable or invalid (the error names it in full).
    Config(ConfigError),
    /// config.json allows more running plus queued turns than connections can hold:
    /// each waits on its caller's connection, and a reserve of connections
    /// (`http::HEALTH_RESERVE`, 32) is kept from talks so that health always has room.
    TurnsExceedConnections {
        /// Its config.json.
        config_path: PathBuf,
        /// `bus.maxConcurrentTurns` + `bus.maxQueuedTurns`.
        turns: usize,
        /// The connection cap (lower under a low open-files limit).
        cap: usize,
    },
    /// The channel root, the state directory or config.json is another user's, or
    /// writable by group or others (contract 1), so its contents can't be trusted: a
    /// planted config runs its engine as us, a planted registry redirects prompts.
    Untrusted {
        /// The path refused.
        path: PathBuf,
        /// `PermissionDenied` wrapping the refusal (which names the
        /// owner, the mode and the fix), or the error reading its metadata.
        source: io::Error,
    },
    /// `bus.secret` fixes a secret that is a sample value or too short (contract 2):
    /// another local user could guess it.
    WeakSecret {
        /// Its config.json.
        config_path: PathBuf,
        /// What is weak about it (never the value).
        weakness: Weakness,
    },
    /// Another instance is already serving this state directory.
    AlreadyServing(PathBuf),
    /// An instance of this name is already running under the channel root.
    NameTaken {
        /// The name.
        name: String,
        /// The channel root.
        root: PathBuf,
        /// The running instance's pid.
        pid: u32,
        /// The running instance's port.
        port: u16,
    },
    /// The listener could not be bound (in use, not a loopback address, ...).
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        source: io::Error,
    },
    /// The OS refused something the instance needs: the state directory's serve lock,
    /// randomness for the secret, the event loop, signal handling, the turn workers,
    /// its entry in the channel root's registry.
    Setup {
        /// What failed, naming the file concerned (`cannot start the event loop`,
        /// `cannot register in <registry file>`).
        what: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The event loop failed while serving.
    Loop(io::Error),
    /// The event loop panicked (a bug); the instance deregistered.
    Panicked,
}

impl ServeError {
    /// Whether the failure happened while serving, rather than while starting.
    pub fn while_serving(&self) -> bool {
        matches!(self, ServeError::Loop(_) | ServeError::Panicked)
    }
}

/// A [`ServeError::Setup`] of `what` failing, for `map_err`.
pub(super) fn setup(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Setup { what, source }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::InvalidName(why) => f.write_str(why),
            // The error names the file and the field, never a value.
            ServeError::Config(error) if error.is_not_found() => {
                let dir = Path::new(error.file()).parent().unwrap_or(Path::new("."));
                let dir = dir.display();
                write!(f, "{error} (create it with `loopbus init {dir}`)")
            }
            ServeError::Config(error) => write!(f, "{error}"),
            ServeError::TurnsExceedConnections {
                config_path,
                turns,
                cap,
            } => write!(
                f,
                "{}: bus.maxConcurrentTurns + bus.maxQueuedTurns is {turns}, but at most \
                 {room} connections can hold talks (the connection cap of {cap} less {reserve} \
                 kept for health); lower bus.maxQueuedTurns, or raise the open-files limit \
                 (`ulimit -n`) if it lowered the cap",
                config_path.display(),
                room = http::max_authorized(*cap),
                reserve = http::HEALTH_RESERVE,
            ),
            ServeError::Untrusted { path, source } => match crate::files::untrusted(source) {
                Some(untrusted) => write!(f, "{untrusted}"),
                None => write!(f, "{}: cannot check its owner: {source}", path.display()),
            },
            ServeError::WeakSecret {
                config_path,
                weakness,
            } => write!(
                f,
                "{}: bus.secret {weakness}: any local user may guess it; remove it (each \
                 start then makes a fresh random one), or replace it with a random one \
                 (`loopbus init {} --force --rotate-secret`)",
                config_path.display(),
                config_path.parent().unwrap_or(config_path).display()
            ),
            ServeError::AlreadyServing(dir) => write!(
                f,
                "another loopbus serve is already running for {}",
                dir.display()
            ),
            ServeError::NameTaken {
                name,
                root,
                pid,
                port,
            } => write!(
                f,
                "an instance named {name} is already running under {} (pid {pid}, port {port})",
                root.display()
            ),
            ServeError::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            ServeError::Setup { what, source } => write!(f, "{what}: {source}"),
            ServeError::Loop(e) => write!(f, "event loop failed: {e}"),
            ServeError::Panicked => f.write_str("event loop panicked; deregistered"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Config(error) => Some(error),
            ServeError::Untrusted { source, .. }
            | ServeError::Bind { source, .. }
            | ServeError::Setup { source, .. }
            | ServeError::Loop(source) => Some(source),
            _ => None,
        }
    }
}
