//! [`ConfigError`]: why a config could not be used, naming the file and the field.

use std::fmt;
use std::io;

use super::CONFIG_FILE;

/// Why a config could not be used. `Display` names the file, then the field when there
/// is one, then the problem; it never contains a value from the file.
#[derive(Debug)]
pub struct ConfigError {
    pub(super) file: String,
    pub(super) problem: Problem,
}

/// What went wrong, behind [`ConfigError`].
#[derive(Debug)]
pub(super) enum Problem {
    /// The file could not be read.
    Read(io::Error),
    /// The bytes are not JSON.
    Syntax { line: usize, column: usize },
    /// The JSON is not an object.
    NotAnObject,
    /// A field has a value it may not have.
    Field { path: String, message: &'static str },
}

impl ConfigError {
    /// The path of the offending field (`bus.maxDepth`, `bus.peers[1]`,
    /// `engine.env.HOME`), or `None` when the problem is not one field's.
    pub fn field(&self) -> Option<&str> {
        match &self.problem {
            Problem::Field { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The file the error is about: `config.json` from [`parse`](super::parse), the
    /// full path from [`load`](super::load) and the other readers.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Whether the file does not exist (so that a command can suggest `loopbus init`).
    pub fn is_not_found(&self) -> bool {
        matches!(&self.problem, Problem::Read(err) if err.kind() == io::ErrorKind::NotFound)
    }

    pub(super) fn field_error(path: impl Into<String>, message: &'static str) -> ConfigError {
        ConfigError {
            file: CONFIG_FILE.to_owned(),
            problem: Problem::Field {
                path: path.into(),
                message,
            },
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            Problem::Read(err) => write!(f, "{}: cannot read: {err}", self.file),
            Problem::Syntax { line, column } => write!(
                f,
                "{}: not valid JSON at line {line} column {column}",
                self.file
            ),
            Problem::NotAnObject => write!(f, "{}: must be a JSON object", self.file),
            Problem::Field { path, message } => write!(f, "{}: {path}: {message}", self.file),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            Problem::Read(err) => Some(err),
            _ => None,
        }
    }
}
