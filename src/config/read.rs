//! Reading `config.json`: the one reader for `serve`, its reload and the commands.
//! Bounded, opened without blocking, regular files only (on
//! [`files::read_regular_file`]).

use std::path::Path;

use super::error::{ConfigError, Problem};
use super::{parse, Config};
use crate::files;

/// A config.json larger than this is refused rather than read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The bytes of the config file at `path`: a regular file of at most 1 MiB
/// (`MAX_CONFIG_BYTES`), read without ever blocking on a FIFO or device put in its
/// place (the event loop calls this to notice edits).
///
/// # Errors
///
/// The file is missing or unreadable, not a regular file, or too large; the error
/// names `path` in full ([`ConfigError::is_not_found`] tells a missing file).
pub fn read_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    files::read_regular_file(path, MAX_CONFIG_BYTES).map_err(|err| ConfigError {
        file: path.display().to_string(),
        ..ConfigError::new(Problem::Read(err))
    })
}

/// Parses `bytes`, read from `path`, as [`parse`] does; errors name `path` in full
/// instead of `config.json`.
///
/// # Errors
///
/// As [`parse`].
pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
    parse(bytes).map_err(|err| ConfigError {
        file: path.display().to_string(),
        ..err
    })
}

/// Reads (`read_file`) and parses (`parse_file`) the config file at `path`. Errors
/// name `path` in full.
///
/// # Errors
///
/// The file can't be read, or [`parse`] rejects it.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    parse_file(path, &read_file(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CONFIG_FILE;

    #[test]
    fn load_names_the_file() {
        let dir = crate::files::test_support::TestDir::new("config");
        let path = dir.path().join(CONFIG_FILE);

        let err = load(&path).unwrap_err();
        assert_eq!(err.file(), path.display().to_string());
        assert!(
            err.to_string()
                .starts_with(&format!("{}: cannot read: ", path.display())),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some());

        std::fs::write(&path, br#"{"bus": {"port": 99999}}"#).unwrap();
        let err = load(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: bus.port: must be an integer from 0 to 65535",
                path.display()
            )
        );

        std::fs::write(&path, br#"{"bus": {"port": 4242}}"#).unwrap();
        assert_eq!(load(&path).unwrap().bus.port, 4242);
    }
}
