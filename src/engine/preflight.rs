//! Mistakes that can never succeed (contract 4): a missing or non-executable engine
//! program, a bad `engine.cwd`, a prompt that cannot be an argument. Each turn that
//! meets one fails `engine_cli` with `retryable: false` and a message naming the cause;
//! [`warnings`] finds the configuration ones at start-up and at a reload, before any
//! caller does.

use crate::config::{EngineConfig, PromptMode};
use crate::protocol::{ErrorCode, Failure};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

/// Linux's limit on one argument, terminating NUL included (`MAX_ARG_STRLEN`, 32 pages
/// of 4 KiB): a longer prompt in `"arg"` mode makes `execve` fail with `E2BIG`.
pub const MAX_ARG_STRLEN: usize = 128 * 1024;

/// The program a nested engine delegates through (`loopbus talk`), looked up on the
/// engine's `PATH` at start-up.
pub const DELEGATION_PROGRAM: &str = "loopbus";

/// An `engine_cli` failure that retrying cannot fix.
pub fn not_retryable(message: impl Into<String>) -> Failure {
    Failure {
        retryable: false,
        ..Failure::new(ErrorCode::EngineCli, message)
    }
}

/// The failure of a turn that cannot start, found before spawning: `engine.cwd` is not
/// a directory we may enter, or the prompt cannot be passed as an argument.
pub fn refusal(engine: &EngineConfig, prompt: &str) -> Option<Failure> {
    let arg = engine.prompt == PromptMode::Arg;
    let problem = if let Some(problem) = engine.cwd.as_deref().and_then(cwd_problem) {
        problem
    } else if arg && prompt.len() >= MAX_ARG_STRLEN {
        format!(
            "the prompt is {} bytes, over Linux's limit of {} bytes for one argument \
             (MAX_ARG_STRLEN); engine.prompt \"arg\" cannot pass it, \"stdin\" can",
            prompt.len(),
            MAX_ARG_STRLEN - 1
        )
    } else if arg && prompt.contains('\0') {
        "the prompt contains a NUL character, which cannot be passed as an argument \
         (engine.prompt \"arg\"); \"stdin\" can"
            .to_owned()
    } else {
        return None;
    };
    Some(not_retryable(problem))
}

/// The failure for a spawn error: a program that is missing or not executable, or an
/// argument list the kernel refuses, is not retryable; other errors (out of processes
/// or descriptors) may pass.
pub fn spawn_failure(engine: &EngineConfig, error: &io::Error) -> Failure {
    let program = engine.command.first().map(String::as_str).unwrap_or("");
    match error.kind() {
        io::ErrorKind::NotFound => not_retryable(format!(
            "engine command `{program}` not found{} (engine.command)",
            match engine.env.get("PATH") {
                Some(_) if !program.contains('/') => " on engine.env.PATH",
                _ if !program.contains('/') => " on PATH",
                _ => "",
            }
        )),
        io::ErrorKind::PermissionDenied => not_retryable(format!(
            "engine command `{program}` cannot be executed: {error} (engine.command)"
        )),
        io::ErrorKind::ArgumentListTooLong | io::ErrorKind::InvalidInput => not_retryable(format!(
            "cannot start engine `{program}`: {error} (engine.command and prompt)"
        )),
        _ => Failure::new(
            ErrorCode::EngineCli,
            format!("cannot start engine `{program}`: {error}"),
        ),
    }
}

/// What is wrong with `engine` that no turn can get past, and what a nested engine
/// will miss: `engine.cwd` not an enterable directory, the program not found or not
/// executable, [`DELEGATION_PROGRAM`] not on the engine's `PATH`. One line each, for
/// the log.
pub fn warnings(engine: &EngineConfig) -> Vec<String> {
    let findings = findings(Some(engine));
    let fatal = findings.cwd.into_iter().chain(findings.program.err());
    fatal
        .map(|problem| format!("{problem}; every engine turn will fail"))
        .chain(findings.delegation.err())
        .collect()
}

/// The start-up checks of one engine, each on its own (`loopbus doctor` shows them
/// one a line; `serve` logs the problems).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Findings {
    /// Why `engine.cwd` cannot be entered, if it is set and cannot.
    pub cwd: Option<String>,
    /// Where the program is, or why it is not an executable file. `Ok(None)` when it
    /// is relative to a broken `engine.cwd` (unknowable; [`Findings::cwd`] says why).
    pub program: Result<Option<PathBuf>, String>,
    /// Where `loopbus` (for nested delegation) is on the engine's `PATH`, or that it
    /// is not.
    pub delegation: Result<PathBuf, String>,
}

/// Runs the checks of [`Findings`] on `engine` (`None`: the built-in echo engine, which
/// has no command and no cwd; only [`Findings::delegation`] is checked, on our `PATH`).
/// Reads the file system only; starts nothing.
pub fn findings(engine: Option<&EngineConfig>) -> Findings {
    // The engine's `PATH`: `engine.env.PATH` when it sets one, else ours.
    let path_var = engine
        .and_then(|engine| engine.env.get("PATH"))
        .map(OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    let engine_cwd = engine.and_then(|engine| engine.cwd.as_deref());
    let cwd = engine_cwd.and_then(cwd_problem);
    let program = match engine.and_then(|engine| engine.command.first()) {
        // A relative program with a slash is found from `engine.cwd`: unknowable while
        // that is broken (reported as `cwd`).
        Some(program) if cwd.is_some() && program.contains('/') && !program.starts_with('/') => {
            Ok(None)
        }
        Some(program) => find_program(program, &path_var, engine_cwd)
            .map(Some)
            .ok_or_else(|| {
                let problem = format!(
                    "engine command `{program}` is not an executable file{}",
                    if program.contains('/') {
                        ""
                    } else {
                        " on the engine's PATH"
                    }
                );
                match engine.and_then(|engine| engine.preset) {
                    // The preset's CLI: say which, and the ways to point at it.
                    Some(preset) => format!(
                        "{problem} (engine.preset \"{}\": install its CLI, add its \
                         directory to engine.env.PATH, or set engine.command to its path \
                         and arguments)",
                        preset.name()
                    ),
                    None => problem,
                }
            }),
        // The echo engine has no command (and the parser refuses an empty one).
        None => Ok(None),
    };
    Findings {
        cwd,
        program,
        delegation: find_program(DELEGATION_PROGRAM, &path_var, None).ok_or_else(|| {
            format!(
                "`{DELEGATION_PROGRAM}` is not on the engine's PATH; an engine that delegates \
                 with `{DELEGATION_PROGRAM} talk` will fail (set engine.env.PATH)"
            )
        }),
    }
}

/// Why `cwd` cannot be an engine's working directory, if it cannot.
fn cwd_problem(cwd: &Path) -> Option<String> {
    let problem = match std::fs::metadata(cwd) {
        Err(e) => e.to_string(),
        Ok(meta) if !meta.is_dir() => "not a directory".to_owned(),
        Ok(_) => match rustix::fs::access(cwd, rustix::fs::Access::EXEC_OK) {
            Ok(()) => return None,
            Err(e) => io::Error::from(e).to_string(),
        },
    };
    Some(format!(
        "engine.cwd {} cannot be entered: {problem}",
        cwd.display()
    ))
}

/// Where `program` is: itself if it contains a slash (from `cwd` if relative), else
/// the first executable file of that name in `path_var`.
fn find_program(program: &str, path_var: &OsString, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let path = match cwd {
            Some(cwd) => cwd.join(program),
            None => PathBuf::from(program),
        };
        return is_executable(&path).then_some(path);
    }
    std::env::split_paths(path_var)
        .map(|dir| dir.join(program))
        .find(|path| is_executable(path))
}

fn is_executable(path: &Path) -> bool {
    path.is_file() && rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(command: &[&str]) -> EngineConfig {
        EngineConfig::new(command.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn bug_a_bad_cwd_was_reported_as_the_command_missing() {
        let mut e = engine(&["sh", "-c", "true"]);
        e.cwd = Some("/nonexistent/loopbus-cwd".into());
        let f = refusal(&e, "hi").unwrap();
        assert_eq!(f.code, ErrorCode::EngineCli);
        assert!(!f.retryable);
        assert!(
            f.error.contains("engine.cwd /nonexistent/loopbus-cwd"),
            "{f:?}"
        );
        e.cwd = Some("/etc/passwd".into());
        assert!(refusal(&e, "hi").unwrap().error.contains("not a directory"));
        assert!(warnings(&e).iter().any(|w| w.contains("engine.cwd")));
        e.cwd = Some("/".into());
        assert_eq!(refusal(&e, "hi"), None);
    }

    #[test]
    fn bug_a_prompt_over_the_argument_limit_was_retryable() {
        let mut e = engine(&["echo"]);
        e.prompt = PromptMode::Arg;
        let long = "x".repeat(MAX_ARG_STRLEN);
        let f = refusal(&e, &long).unwrap();
        assert!(!f.retryable && f.error.contains("MAX_ARG_STRLEN"), "{f:?}");
        assert_eq!(refusal(&e, &long[1..]), None);
        assert!(!refusal(&e, "a\0b").unwrap().retryable);
        // On stdin any length and any character pass.
        e.prompt = PromptMode::Stdin;
        assert_eq!(refusal(&e, &long), None);
        assert_eq!(refusal(&e, "a\0b"), None);
    }

    #[test]
    fn spawn_failures_that_cannot_pass_are_not_retryable() {
        let e = engine(&["loopbus-no-such-engine"]);
        let missing = io::Error::from(io::ErrorKind::NotFound);
        let f = spawn_failure(&e, &missing);
        assert!(!f.retryable);
        assert!(
            f.error
                .contains("`loopbus-no-such-engine` not found on PATH"),
            "{f:?}"
        );
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert!(!spawn_failure(&e, &denied).retryable);
        let busy = io::Error::from(io::ErrorKind::WouldBlock);
        assert!(spawn_failure(&e, &busy).retryable);
    }

    #[test]
    fn a_missing_preset_cli_is_named_with_the_fix() {
        let mut e = EngineConfig::from_preset(crate::config::Preset::Codex);
        e.env.insert("PATH".to_owned(), "/nonexistent".to_owned());
        let found = warnings(&e);
        assert!(
            found.iter().any(|w| w
                .contains("`codex` is not an executable file on the engine's PATH")
                && w.contains("engine.preset \"codex\"")
                && w.contains("engine.command")),
            "{found:?}"
        );
    }

    #[test]
    fn warnings_name_a_missing_program_and_a_missing_loopbus() {
        let mut e = engine(&["loopbus-no-such-engine"]);
        e.env.insert("PATH".to_owned(), "/nonexistent".to_owned());
        let found = warnings(&e);
        assert!(
            found.iter().any(|w| w.contains("`loopbus-no-such-engine`")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|w| w.contains("`loopbus` is not on")),
            "{found:?}"
        );
        let mut e = engine(&["/bin/sh"]);
        e.env.insert("PATH".to_owned(), "/bin:/usr/bin".to_owned());
        let found = warnings(&e);
        assert!(!found.iter().any(|w| w.contains("/bin/sh")), "{found:?}");
    }
}
