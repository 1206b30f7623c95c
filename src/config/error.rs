//! [`ConfigError`]: why a config could not be used, naming the file and the field.

use std::fmt;
use std::io;

use super::CONFIG_FILE;

/// Why a config could not be used. `Display` names the file, then the field when there
/// is one, then the problem; it never contains a value from the file.
#[derive(Debug)]
pub struct ConfigError {
    pub(super) file: String,
    /// The problems of the file found in one run, at least one and at most
    /// [`MAX_CONFIG_PROBLEMS`], shown one a line; the first is the error's.
    pub(super) problems: Vec<Problem>,
}

/// Most problems one config error reports (unknown keys and wrong values, each on its
/// own line): enough for a hand-edited file, bounded for a generated one.
pub const MAX_CONFIG_PROBLEMS: usize = 10;

/// What went wrong, behind [`ConfigError`].
#[derive(Debug)]
pub(super) enum Problem {
    /// The file could not be read.
    Read(io::Error),
    /// The bytes are not JSON: where, and what the parser found there (`at line 2
    /// column 1: trailing comma`; never a value from the file).
    Syntax(String),
    /// The JSON is not an object.
    NotAnObject,
    /// A field has a value it may not have.
    Field { path: String, message: String },
    /// A key the config may not hold, with the path of the key probably meant.
    UnknownKey {
        path: String,
        suggestion: Option<String>,
    },
    /// A key appears twice in one object.
    DuplicateKey { path: String },
}

/// Longest key path shown in an error; a longer one is cut (its full text stays in
/// [`ConfigError::field`]).
pub const MAX_SHOWN_KEY_CHARS: usize = 64;

impl ConfigError {
    /// The path of the offending field (`bus.maxDepth`, `bus.peers[1]`,
    /// `engine.env.HOME`) or unknown key (`bus.peer`), or `None` when the problem is not
    /// one field's.
    pub fn field(&self) -> Option<&str> {
        match self.problems.first()? {
            Problem::Field { path, .. }
            | Problem::UnknownKey { path, .. }
            | Problem::DuplicateKey { path } => Some(path),
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
        matches!(self.problems.first(), Some(Problem::Read(err)) if err.kind() == io::ErrorKind::NotFound)
    }

    /// `problem` in `config.json`.
    pub(super) fn new(problem: Problem) -> ConfigError {
        ConfigError {
            file: CONFIG_FILE.to_owned(),
            problems: vec![problem],
        }
    }
}

/// The error of a field, at `path`, whose value it may not have: `message` says what
/// it must be.
pub(super) fn refuse<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T, Problem> {
    Err(Problem::Field {
        path: path.into(),
        message: message.into(),
    })
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            f.write_str(if i == 0 { "" } else { "\n" })?;
            show(f, &self.file, problem)?;
        }
        Ok(())
    }
}

/// One problem of `file`, on one line.
fn show(f: &mut fmt::Formatter<'_>, file: &str, problem: &Problem) -> fmt::Result {
    match problem {
        Problem::Read(err) => write!(f, "{file}: cannot read: {err}"),
        Problem::Syntax(what) => write!(f, "{file}: not valid JSON {what}"),
        Problem::NotAnObject => write!(f, "{file}: must be a JSON object"),
        // A path can carry a name from the file (`engine.env.<name>`): shown like a key.
        Problem::Field { path, message } => write!(f, "{file}: {}: {message}", shown_key(path)),
        Problem::UnknownKey { path, suggestion } => {
            write!(f, "{file}: unknown key {}", shown_key(path))?;
            match suggestion {
                Some(meant) => write!(f, "; did you mean {meant}?"),
                None => Ok(()),
            }
        }
        Problem::DuplicateKey { path } => write!(
            f,
            "{file}: key {} appears twice; keep one (a JSON parser would keep the last)",
            shown_key(path)
        ),
    }
}

/// A key path as an error shows it: as it is when it is short and printable, else
/// quoted with escapes and cut to [`MAX_SHOWN_KEY_CHARS`], so that a key can't garble a
/// terminal or flood a log.
fn shown_key(path: &str) -> String {
    let plain = path.chars().count() <= MAX_SHOWN_KEY_CHARS
        && path.chars().all(|c| c.is_ascii_graphic() && c != '"');
    if plain {
        return path.to_owned();
    }
    let cut: String = path.chars().take(MAX_SHOWN_KEY_CHARS).collect();
    let ellipsis = if cut.len() < path.len() { "..." } else { "" };
    format!("{cut:?}{ellipsis}")
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.problems.first()? {
            Problem::Read(err) => Some(err),
            _ => None,
        }
    }
}
