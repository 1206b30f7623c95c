//! The one entry the `loopbus` binary calls: sets up logging, picks the command, and
//! runs it.

use crate::cli::{usage, CommandError, EXIT_OK};
use std::ffi::OsString;
use std::io::Write;

const HELP: &str = "\
loopbus: a local instance-to-instance bus for AI-agent instances

Usage: loopbus <command> [options]

Commands:
  serve    run an instance (see `loopbus serve --help`)
  init     write a ready config.json for a new instance
  talk     delegate a prompt to another instance and print its reply
  health   check whether an instance is alive
  list     list the registered instances, alive or not

Run `loopbus <command> --help` for a command's options and an example.

Exit status: 0 success, 1 failure (not retryable), 75 retryable failure,
2 usage or local configuration error.
Logging: RUST_LOG=debug|info|warn|error (default info), to stderr.
";

/// Runs the command named by `args` (without the program name) and returns its exit
/// status, or why it could not do its work.
///
/// # Errors
///
/// Arguments that are not UTF-8, an unknown command, or whatever the command returns.
pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<i32, CommandError> {
    init_logging();
    let args: Vec<String> = args
        .into_iter()
        .map(OsString::into_string)
        .collect::<Result<_, _>>()
        .map_err(|_| usage("arguments must be valid UTF-8"))?;
    let Some((command, rest)) = args.split_first() else {
        eprint!("{HELP}");
        return Err(usage("no command given").into());
    };
    let code = match command.as_str() {
        "serve" => super::serve::run(rest)?,
        "init" => super::init::run(rest)?,
        "talk" => super::talk::run(rest)?,
        "health" => super::health::run(rest)?,
        "list" => super::list::run(rest)?,
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            EXIT_OK
        }
        "--version" | "-V" | "version" => {
            println!("loopbus {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        other => {
            return Err(usage(format!("unknown command `{other}`; run `loopbus --help`")).into())
        }
    };
    let _ = std::io::stdout().flush();
    Ok(code)
}

/// `RUST_LOG` (default `info`) to stderr, each line stamped with the UTC time.
fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|out, record| {
            writeln!(
                out,
                "{} {:5} {}",
                crate::time::now_iso8601(),
                record.level(),
                record.args()
            )
        })
        .init();
}
