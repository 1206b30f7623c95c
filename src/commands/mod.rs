//! One function per `loopbus` command. Each returns the process's exit status.

pub mod init;
pub mod serve;

use crate::cli::{usage, UsageError};
use std::path::PathBuf;

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
                "no state directory: pass --state-dir DIR or set LOOPBUS_STATE_DIR",
            )),
        },
    }
}

/// The instance name: `--name`, else the state directory's last component. Either way
/// it must match `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
///
/// # Errors
/// The name is missing or invalid.
pub fn instance_name(
    state_dir: &std::path::Path,
    flag: Option<&str>,
) -> Result<String, UsageError> {
    let name = match flag {
        Some(name) => name.to_owned(),
        None => {
            let absolute =
                std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
            absolute
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
                .ok_or_else(|| {
                    usage(format!(
                        "{}: cannot take an instance name from this path; pass --name",
                        state_dir.display()
                    ))
                })?
        }
    };
    if crate::registry::is_valid_instance_name(&name) {
        Ok(name)
    } else {
        Err(usage(format!(
            "invalid instance name {name:?}: it must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}"
        )))
    }
}

/// The channel root: the state directory's parent.
pub fn channel_root(state_dir: &std::path::Path) -> PathBuf {
    let absolute = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    absolute
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"))
}
