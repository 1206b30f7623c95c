//! The `loopbus` command: runs one command and maps its outcome to the documented exit
//! status, in one `match`. The binary uses the library's public API only
//! (`loopbus::...`), like any embedder.
#![forbid(unsafe_code)]

mod cli;
mod commands;

use cli::{CommandError, EXIT_FAILURE, EXIT_USAGE};
use commands::entry::{report, run};

fn main() {
    let code = match run(std::env::args_os().skip(1)) {
        Ok(code) => code,
        Err(error) => {
            report(&error);
            match error {
                CommandError::Serve(e) if e.while_serving() => EXIT_FAILURE,
                CommandError::Serve(_) | CommandError::Usage(_) | CommandError::Local(_) => {
                    EXIT_USAGE
                }
                _ => EXIT_FAILURE,
            }
        }
    };
    std::process::exit(code);
}
