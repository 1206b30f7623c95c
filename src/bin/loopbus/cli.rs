//! Command-line parsing shared by every command: a small hand-written parser (no
//! dependency), the documented exit codes, and the errors a command ends with.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::collections::HashMap;
use std::fmt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

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
/// `talk` stopped by SIGHUP (its terminal closed), after cancelling its turn (128 + 1).
pub const EXIT_SIGHUP: i32 = 129;

/// The signals that make `talk`, `fan`, `chain`, `verify` and `mcp` cancel the work in
/// flight and exit: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (their terminal closed).
const STOP_SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Makes each of [`STOP_SIGNALS`] set `caught` to its number, then write a byte to
/// `wake` (non-blocking), so that a thread reading the other end wakes at once.
///
/// # Errors
/// A handler could not be registered, or `wake` could not be cloned.
pub fn on_stop_signals(caught: &Arc<AtomicUsize>, wake: &UnixStream) -> std::io::Result<()> {
    for signal in STOP_SIGNALS {
        // Registered in this order, so the flag is set before the wake-up is written.
        signal_hook::flag::register_usize(signal, Arc::clone(caught), signal as usize)?;
        signal_hook::low_level::pipe::register(signal, wake.try_clone()?)?;
    }
    Ok(())
}

/// The exit status and the name of a caught stop signal (as [`on_stop_signals`] stores
/// it); `None` for none.
pub fn stopped_by(caught: usize) -> Option<(i32, &'static str)> {
    match i32::try_from(caught) {
        Ok(0) => None,
        Ok(SIGINT) => Some((EXIT_SIGINT, "SIGINT")),
        Ok(SIGHUP) => Some((EXIT_SIGHUP, "SIGHUP")),
        _ => Some((EXIT_SIGTERM, "SIGTERM")),
    }
}

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
    Serve(loopbus::ServeError),
    /// stdout was closed by its reader (`loopbus list | head -1`): the command stops
    /// writing and the process exits quietly, with status 0.
    StdoutClosed,
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::Usage(e) => e.fmt(f),
            CommandError::Local(message) => f.write_str(message),
            CommandError::Serve(e) => e.fmt(f),
            CommandError::StdoutClosed => f.write_str("stdout was closed"),
        }
    }
}

impl std::error::Error for CommandError {}

impl From<UsageError> for CommandError {
    fn from(e: UsageError) -> CommandError {
        CommandError::Usage(e)
    }
}

impl From<loopbus::ServeError> for CommandError {
    fn from(e: loopbus::ServeError) -> CommandError {
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
    /// value (`--opt V` or `--opt=V`), `switches` those that don't (`-v` is
    /// `--verbose` where that is one).
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
            if arg == "-v" && switches.contains(&"verbose") {
                parsed.switches.push("verbose");
                continue;
            }
            let Some(option) = arg.strip_prefix("--") else {
                if arg.starts_with('-') && arg.len() > 1 {
                    let name = arg.trim_start_matches('-');
                    return Err(unknown_option(arg, name, valued, switches));
                }
                parsed.positionals.push(arg.to_owned());
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
                return Err(unknown_option(&format!("--{name}"), name, valued, switches));
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

/// Most edits (insertions, deletions, substitutions) between a mistyped word and the
/// word meant for a "did you mean" suggestion; one more for words longer than
/// [`SUGGEST_LONG_WORD`] characters.
pub const SUGGEST_MAX_EDITS: usize = 2;
/// Words longer than this may be [`SUGGEST_MAX_EDITS`] + 1 edits off.
pub const SUGGEST_LONG_WORD: usize = 8;

/// The word of `candidates` closest to `word` (case-insensitive), if one is close
/// enough to be what was meant; the first of equally close ones.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_lowercase();
    let limit = if word.chars().count() > SUGGEST_LONG_WORD {
        SUGGEST_MAX_EDITS + 1
    } else {
        SUGGEST_MAX_EDITS
    };
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        let edits = edit_distance(&word, &candidate.to_lowercase());
        // A word that short is never "close": `-x` is no typo of `--id`.
        if edits <= limit
            && edits < candidate.chars().count()
            && best.is_none_or(|(b, _)| edits < b)
        {
            best = Some((edits, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// The edit distance between `a` and `b`, by chars: insertions, deletions,
/// substitutions and swaps of two neighbours (`lsit` is one swap from `list`), each
/// one edit, no part of the word edited twice.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // `d[i][j]`: the distance between `a[..i]` and `b[..j]`.
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `unknown option ARG`, with the option meant when one is close.
fn unknown_option(
    arg: &str,
    name: &str,
    valued: &[&'static str],
    switches: &[&'static str],
) -> UsageError {
    let known = valued.iter().chain(switches).copied().chain(["help"]);
    match closest(name, known) {
        Some(meant) => usage(format!("unknown option `{arg}`; did you mean `--{meant}`?")),
        None => usage(format!("unknown option `{arg}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_exit_as_a_shell_reports_them() {
        let caught = |signal: i32| stopped_by(usize::try_from(signal).unwrap());
        assert_eq!(stopped_by(0), None);
        assert_eq!(caught(SIGINT), Some((130, "SIGINT")));
        assert_eq!(caught(SIGTERM), Some((143, "SIGTERM")));
        assert_eq!(caught(SIGHUP), Some((129, "SIGHUP")));
        assert_eq!(STOP_SIGNALS.len(), 3);
    }

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

    #[test]
    fn unknown_options_suggest_the_one_meant() {
        let valued = ["state-dir", "port", "root"];
        let switches = ["json", "force"];
        let cases = [
            ("--jsno", Some("did you mean `--json`?")),
            ("--state_dir", Some("did you mean `--state-dir`?")),
            ("--statedir", Some("did you mean `--state-dir`?")),
            ("-json", Some("did you mean `--json`?")),
            ("--forse=1", Some("did you mean `--force`?")),
            ("--hlep", Some("did you mean `--help`?")),
            ("--xyzzy", None),
            ("-x", None),
        ];
        for (arg, want) in cases {
            let e = Args::parse(&strings(&[arg]), &valued, &switches).unwrap_err();
            match want {
                Some(want) => assert!(e.0.ends_with(want), "{arg}: {e}"),
                None => assert!(!e.0.contains("did you mean"), "{arg}: {e}"),
            }
        }
    }

    #[test]
    fn edit_distances() {
        let cases = [
            ("", "", 0),
            ("a", "", 1),
            ("list", "list", 0),
            ("lsit", "list", 1),
            ("lsit", "init", 2),
            ("helth", "health", 1),
            ("serv", "serve", 1),
            ("kitten", "sitting", 3),
        ];
        for (a, b, want) in cases {
            assert_eq!(edit_distance(a, b), want, "{a} {b}");
        }
        assert_eq!(closest("tlak", ["serve", "talk", "list"]), Some("talk"));
        assert_eq!(closest("frobnicate", ["serve", "talk", "list"]), None);
    }
}
