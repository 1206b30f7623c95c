//! The `loopbus` command: parses the command line, runs one command, and maps the
//! outcome to the documented exit status.
#![forbid(unsafe_code)]

use loopbus::cli::{EXIT_OK, EXIT_USAGE};
use loopbus::commands;
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

fn main() {
    init_logging();
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect::<Result<_, _>>()
    {
        Ok(args) => args,
        Err(_) => {
            eprintln!("loopbus: arguments must be valid UTF-8");
            std::process::exit(EXIT_USAGE);
        }
    };
    let Some((command, rest)) = args.split_first() else {
        eprint!("{HELP}");
        std::process::exit(EXIT_USAGE);
    };
    let result = match command.as_str() {
        "serve" => commands::serve::run(rest),
        "init" => commands::init::run(rest),
        "talk" => commands::talk::run(rest),
        "health" => commands::health::run(rest),
        "list" => commands::list::run(rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(EXIT_OK)
        }
        "--version" | "-V" | "version" => {
            println!("loopbus {}", env!("CARGO_PKG_VERSION"));
            Ok(EXIT_OK)
        }
        other => Err(loopbus::cli::usage(format!(
            "unknown command `{other}`; run `loopbus --help`"
        ))),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("loopbus: {e}");
            EXIT_USAGE
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|out, record| {
            writeln!(
                out,
                "{} {:5} {}",
                loopbus::time::now_iso8601(),
                record.level(),
                record.args()
            )
        })
        .init();
}
