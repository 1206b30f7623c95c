//! One function per `loopbus` command. Each returns the process's exit status.

pub mod audit_log;
pub mod doctor;
pub mod entry;
pub mod health;
pub mod init;
pub mod list;
pub mod mcp;
pub mod output;
pub mod serve;
pub mod settings;
pub mod talk;
pub mod terminal;
pub mod trace;
pub mod usage_report;
pub mod workflow;

use crate::cli::{local, usage, CommandError, UsageError};
use loopbus::{Config, ConfigError, InstanceName, TrustKind, CONFIG_FILE, DEFAULT_ACCEPT_KINDS};
use std::path::{Path, PathBuf};

/// The state directory from `--state-dir`, else `$LOOPBUS_STATE_DIR`.
///
/// # Errors
/// Neither is set.
pub fn state_dir_from(flag: Option<&str>) -> Result<PathBuf, UsageError> {
    match flag {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => match std::env::var_os("LOOPBUS_STATE_DIR") {
            Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
            _ => Err(usage(
                "no instance: name one (`worker`), or pass --state-dir DIR or set \
                 LOOPBUS_STATE_DIR",
            )),
        },
    }
}

/// The channel root when neither `--root` nor a state directory names one:
/// `$LOOPBUS_ROOT`, else `~/.loopbus` ([`loopbus::default_channel_root`]).
///
/// # Errors
/// Neither `$LOOPBUS_ROOT` nor `$HOME` is set.
pub fn default_root() -> Result<PathBuf, UsageError> {
    loopbus::default_channel_root()
        .ok_or_else(|| usage("no channel root: pass --root DIR, or set LOOPBUS_ROOT or HOME"))
}

/// The state directory of the instance a command is about: the positional `named`
/// (a bare name is `<root>/NAME`, the root `--root` or [`default_root`]; anything
/// with a `/` is a path), else `--state-dir`, else `$LOOPBUS_STATE_DIR`.
///
/// # Errors
/// Both `named` and `--state-dir` given, an invalid name, or none of them.
pub fn instance_dir(
    named: Option<&str>,
    state_dir_flag: Option<&str>,
    root_flag: Option<&str>,
) -> Result<PathBuf, UsageError> {
    match (named, state_dir_flag) {
        (Some(_), Some(_)) => Err(usage("give an instance NAME or --state-dir DIR, not both")),
        (Some(named), None) if is_path(named) => Ok(PathBuf::from(named)),
        (Some(named), None) => {
            let name = parse_name(named)?;
            let root = match root_flag {
                Some(root) if !root.is_empty() => PathBuf::from(root),
                _ => default_root()?,
            };
            Ok(root.join(name.as_str()))
        }
        (None, flag) => state_dir_from(flag),
    }
}

/// Whether a command-line word names a directory rather than an instance: it has a
/// `/`, or is `.` or `..`.
fn is_path(word: &str) -> bool {
    word.contains('/') || word == "." || word == ".."
}

/// The instance name: `--name`, else the state directory's last component, parsed as
/// an [`InstanceName`].
///
/// # Errors
/// The name is missing or invalid.
pub fn instance_name(state_dir: &Path, flag: Option<&str>) -> Result<InstanceName, UsageError> {
    let name = match flag {
        Some(name) => name.to_owned(),
        None => loopbus::default_name(state_dir).ok_or_else(|| {
            usage(format!(
                "{}: cannot take an instance name from this path; pass --name",
                state_dir.display()
            ))
        })?,
    };
    parse_name(name)
}

/// `text` as an [`InstanceName`], its one error message as a usage error.
///
/// # Errors
/// `text` is not a valid instance name.
pub fn parse_name(text: impl Into<String>) -> Result<InstanceName, UsageError> {
    InstanceName::new(text).map_err(|e| usage(e.to_string()))
}

/// The config of the instance whose state directory is `state_dir`, read the way
/// `serve` reads it: the state directory and config.json must pass `serve`'s trust
/// check ([`loopbus::check_trusted`]: ours or root's, not writable by group or
/// others, a symlink only if ours), since another user who could write them would
/// decide our `peers`, `maxDepth` and whether our bus is enabled; then
/// [`loopbus::load_config`] (bounded, regular files only).
///
/// # Errors
/// The state directory or config.json is untrusted; config.json is missing,
/// unreadable or invalid. The message names the file and the field, never a value.
pub fn own_config(state_dir: &Path) -> Result<Config, CommandError> {
    let path = state_dir.join(CONFIG_FILE);
    for (checked, kind) in [
        (state_dir, TrustKind::Dir),
        (path.as_path(), TrustKind::File),
    ] {
        match loopbus::check_trusted(checked, kind) {
            // A missing one is load_config's to report, with the hint to create it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(local(e.to_string())),
            Ok(()) => {}
        }
    }
    loopbus::load_config(&path).map_err(|e| config_usage_error(state_dir, &e))
}

/// A config error as a local configuration error, with a hint to run `loopbus init`
/// when the file is missing.
pub fn config_usage_error(state_dir: &Path, error: &ConfigError) -> CommandError {
    if error.is_not_found() {
        local(format!(
            "{error} (create it with `loopbus init {}`)",
            state_dir.display()
        ))
    } else {
        local(error.to_string())
    }
}

/// Where `health` and `list` find the registry: `--root DIR`, else the parent of
/// `--state-dir` / `$LOOPBUS_STATE_DIR`, else [`default_root`]. Also returns the state
/// directory when one was given, whose config supplies `acceptKinds`.
///
/// # Errors
/// None of them is set, and neither `$LOOPBUS_ROOT` nor `$HOME`.
pub fn registry_root(
    root_flag: Option<&str>,
    state_dir_flag: Option<&str>,
) -> Result<(PathBuf, Option<PathBuf>), UsageError> {
    let state_dir = state_dir_from(state_dir_flag).ok();
    match (root_flag, state_dir) {
        (Some(root), state_dir) if !root.is_empty() => Ok((PathBuf::from(root), state_dir)),
        (_, Some(state_dir)) => Ok((loopbus::channel_root(&state_dir), Some(state_dir))),
        _ => Ok((default_root()?, None)),
    }
}

/// The kinds a probe accepts: the `acceptKinds` of the config in `state_dir` when it
/// has one, else the defaults.
///
/// # Errors
/// `state_dir` has a config.json that can't be read or is invalid.
pub fn accept_kinds(state_dir: Option<&Path>) -> Result<Vec<String>, CommandError> {
    match state_dir {
        Some(dir) if dir.join(CONFIG_FILE).exists() => Ok(own_config(dir)?.bus.accept_kinds),
        _ => Ok(DEFAULT_ACCEPT_KINDS.map(str::to_owned).to_vec()),
    }
}
