//! Command-line parsing shared by every command: a small hand-written parser (no
//! dependency), the documented exit codes, and the errors a command ends with.

use std::collections::HashMap;
use std::fmt;

/// Success.
pub const EXIT_OK: i32 = 0;
/// A failure that is not retryable.
pub const EXIT_FAILURE: i32 = 1;
/// A usage error or a local configuration error.
pub const EXIT_USAGE: i32 = 2;
/// A failure that is retryable (sysexits' EX_TEMPFAIL).
pub const EXIT_RETRYABLE: i32 = 75;
/// `talk` stopped by SIGINT, after cancelling its turn (128 + 2, as a shell reports it).
pub const EXIT_SIGINT: i32 = 130;
/// `talk` stopped by SIGTERM, after cancelling its turn (128 + 15).
pub const EXIT_SIGTERM: i32 = 143;

/// A bad command line: an unknown option, a missing or malformed argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Shorthand for building a [`UsageError`].
pub fn usage(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// Why a command stopped without doing its work. `main` maps each variant to an exit
/// status in one `match`.
#[derive(Debug)]
#[non_exhaustive]
pub enum CommandError {
    /// A bad command line (exit 2).
    Usage(UsageError),
    /// A local configuration or state problem found before the command could act: no
    /// state directory, an unreadable or invalid config.json, an unreadable registry,
    /// a file that can't be written (exit 2).
    Local(String),
    /// An instance could not start, or failed while serving.
    Serve(crate::server::ServeError),
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::Usage(e) => e.fmt(f),
            CommandError::Local(message) => f.write_str(message),
            CommandError::Serve(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CommandError {}

impl From<UsageError> for CommandError {
    fn from(e: UsageError) -> CommandError {
        CommandError::Usage(e)
    }
}

impl From<crate::server::ServeError> for CommandError {
    fn from(e: crate::server::ServeError) -> CommandError {
        CommandError::Serve(e)
    }
}

/// Shorthand for building a [`CommandError::Local`].
pub fn local(message: impl Into<String>) -> CommandError {
    CommandError::Local(message.into())
}

/// A command's parsed arguments.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional arguments, in order.
    pub positionals: Vec<String>,
    values: HashMap<&'static str, String>,
    switches: Vec<&'static str>,
    /// `-h` or `--help` was given.
    pub help: bool,
}

impl Args {
    /// Parses `args` (without the command name). `valued` lists options that take a
    /// value (`--opt V` or `--opt=V`), `switches` those that don't.
    ///
    /// # Errors
    /// An unknown option, a missing value, or a value given to a switch.
    pub fn parse(
        args: &[String],
        valued: &[&'static str],
        switches: &[&'static str],
    ) -> Result<Args, UsageError> {
        let mut parsed = Args::default();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            if arg == "--" {
                parsed.positionals.extend(iter.by_ref().cloned());
                break;
            }
            if arg == "-h" || arg == "--help" {
                parsed.help = true;
                continue;
            }
            let Some(option) = arg.strip_prefix("--") else {
                if arg.starts_with('-') && arg.len() > 1 {
                    return Err(usage(format!("unknown option `{arg}`")));
                }
                parsed.positionals.push(arg.clone());
                continue;
            };
            let (name, inline) = match option.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (option, None),
            };
            if let Some(known) = valued.iter().find(|v| **v == name) {
                let value = match inline {
                    Some(value) => value,
                    None => iter
                        .next()
                        .cloned()
                        .ok_or_else(|| usage(format!("`--{name}` needs a value")))?,
                };
                parsed.values.insert(known, value);
            } else if let Some(known) = switches.iter().find(|s| **s == name) {
                if inline.is_some() {
                    return Err(usage(format!("`--{name}` takes no value")));
                }
                parsed.switches.push(known);
            } else {
                return Err(usage(format!("unknown option `--{name}`")));
            }
        }
        Ok(parsed)
    }

    /// The value of a valued option.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether a switch was given.
    pub fn switch(&self, name: &str) -> bool {
        self.switches.contains(&name)
    }

    /// The value of `name` parsed as `T`.
    ///
    /// # Errors
    /// The value does not parse.
    pub fn parsed<T: std::str::FromStr>(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<T>, UsageError> {
        self.value(name)
            .map(|v| {
                v.parse::<T>()
                    .map_err(|_| usage(format!("`--{name}` must be {what}")))
            })
            .transpose()
    }

    /// At most `max` positionals.
    ///
    /// # Errors
    /// More were given.
    pub fn at_most(&self, max: usize) -> Result<(), UsageError> {
        match self.positionals.get(max) {
            Some(extra) => Err(usage(format!("unexpected argument `{extra}`"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn parsing_table() {
        let valued = ["state-dir", "port"];
        let switches = ["json"];
        let a = Args::parse(
            &strings(&["x", "--port", "5", "--json", "--state-dir=/d", "y"]),
            &valued,
            &switches,
        )
        .unwrap();
        assert_eq!(a.positionals, strings(&["x", "y"]));
        assert_eq!(a.value("port"), Some("5"));
        assert_eq!(a.value("state-dir"), Some("/d"));
        assert!(a.switch("json"));
        assert_eq!(a.parsed::<u16>("port", "a port").unwrap(), Some(5));
        let a = Args::parse(&strings(&["--", "--json"]), &valued, &switches).unwrap();
        assert_eq!(a.positionals, strings(&["--json"]));
        assert!(
            Args::parse(&strings(&["-"]), &valued, &switches)
                .unwrap()
                .positionals
                == strings(&["-"])
        );
        let errors = [
            strings(&["--nope"]),
            strings(&["-x"]),
            strings(&["--port"]),
            strings(&["--json=1"]),
        ];
        for e in errors {
            assert!(Args::parse(&e, &valued, &switches).is_err(), "{e:?}");
        }
        let a = Args::parse(&strings(&["--port", "x"]), &valued, &switches).unwrap();
        assert!(a.parsed::<u16>("port", "a port").is_err());
        assert!(
            Args::parse(&strings(&["--help"]), &valued, &switches)
                .unwrap()
                .help
        );
        assert!(a.at_most(0).is_ok());
        let a = Args::parse(&strings(&["a", "b"]), &valued, &switches).unwrap();
        assert!(a.at_most(1).is_err());
    }
}
