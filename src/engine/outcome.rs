//! What an engine's exit and output mean (pure): the reply or the classified failure,
//! and the usage the engine reported.
//!
//! Nothing here touches a process or a file, so every rule is tested with plain values.

use super::parsers::{self, Report, Unreadable};
use crate::config::OutputMode;
use crate::protocol::classify;
use crate::protocol::{ErrorCode, Failure};
use crate::usage::TurnUsage;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// Longest engine message carried into an envelope's `error`.
pub const MAX_ENGINE_MESSAGE_CHARS: usize = 1_000;
/// How many of the last non-empty lines of stderr (or stdout) a failure message quotes.
pub const MESSAGE_LINES: usize = 3;

/// Exit statuses with which a shell says a command it ran was not executable (126) or
/// not found (127): an engine failing so is not retryable.
pub const COMMAND_NOT_FOUND_STATUSES: [i32; 2] = [126, 127];
/// What the message of such a failure starts with when the output names `loopbus`.
pub const NESTED_LOOPBUS_HINT: &str =
    "the engine could not run `loopbus` (is it on the engine's PATH? set engine.env.PATH)";

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    /// The reply text (200, success envelope).
    Reply(String),
    /// A classified failure (200, failure envelope). Output the engine was not meant
    /// to write is one too (`engine_cli`), never a 500.
    Failed(Failure),
}

/// What one turn produced: its answer, the usage its engine reported (`None`: nothing
/// to record) and its session id. A turn's runner records the usage in usage.json; it
/// is returned too, for the envelope's `usage` (contract 8.3).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutput {
    /// What the turn answers.
    pub result: TurnResult,
    /// The usage to add to `usage.json`, if the run counts as an engine turn.
    pub usage: Option<TurnUsage>,
    /// The agent CLI's session id, when it reported one (for the audit line).
    pub session_id: Option<String>,
}

impl TurnOutput {
    /// An answer without usage.
    pub fn without_usage(result: TurnResult) -> TurnOutput {
        TurnOutput {
            result,
            usage: None,
            session_id: None,
        }
    }

    /// A failure with nothing to record.
    pub fn failed(code: ErrorCode, message: impl Into<String>) -> TurnOutput {
        TurnOutput::without_usage(TurnResult::Failed(Failure::new(code, message)))
    }
}

/// Turns an engine's exit and output (`stdout` as configured by `output`) into a result.
///
/// A failed exit is classified from the CLI's own failure message (or, for Gemini CLI,
/// its exit code), else from stderr and stdout; its message is the CLI's structured
/// message, else the last lines of stderr, else of stdout. A successful exit replies
/// with stdout (text, one trailing newline dropped) or the structured reply, unless the
/// structured output reports a failure (see `engine/parsers.rs`).
pub fn interpret(output: OutputMode, exit: ExitStatus, stdout: &[u8], stderr: &[u8]) -> TurnOutput {
    let stdout_text = String::from_utf8_lossy(stdout);
    let stderr_text = String::from_utf8_lossy(stderr);
    let report = match parsers::parse(output, &stdout_text, &stderr_text).transpose() {
        Ok(report) => report,
        // Bad usage is bad output, whatever else the engine said. The turn still
        // counts, at no cost: nothing it reported can be trusted.
        Err(Unreadable::BadUsage(bad)) => {
            return TurnOutput {
                usage: Some(TurnUsage::default()),
                ..TurnOutput::failed(ErrorCode::EngineCli, bounded(&bad))
            }
        }
        Err(Unreadable::NotStructured) => None,
    };
    let engine_cli = |message| TurnResult::Failed(Failure::new(ErrorCode::EngineCli, message));
    TurnOutput {
        // Without a report (a text engine reports none, other output is unreadable) a
        // turn that exited 0 still counts, at no cost.
        usage: report
            .as_ref()
            .map(|r| r.usage)
            .or(exit.success().then(TurnUsage::default)),
        session_id: report.as_ref().and_then(|r| r.session_id.clone()),
        result: match report {
            _ if !exit.success() => {
                let said = report.and_then(|r| r.error.or(r.reply));
                TurnResult::Failed(failed_exit(output, exit, said, &stdout_text, &stderr_text))
            }
            None if output != OutputMode::Text => engine_cli(format!(
                "engine output is not what engine.output \"{}\" reads",
                output.as_str()
            )),
            None => match std::str::from_utf8(stdout) {
                Ok(text) => TurnResult::Reply(
                    text.strip_suffix('\n')
                        .map(|t| t.strip_suffix('\r').unwrap_or(t))
                        .unwrap_or(text)
                        .to_owned(),
                ),
                Err(_) => {
                    engine_cli("engine output is not UTF-8 (engine.output is \"text\")".into())
                }
            },
            Some(Report {
                error: Some(error),
                fallback,
                ..
            }) => {
                let code = classify(&error)
                    .or(fallback)
                    .unwrap_or(ErrorCode::EngineCli);
                TurnResult::Failed(Failure::new(code, bounded(&error)))
            }
            Some(Report {
                reply: Some(reply), ..
            }) => TurnResult::Reply(reply),
            Some(_) => engine_cli(format!(
                "engine output has no reply (engine.output \"{}\")",
                output.as_str()
            )),
        },
    }
}

/// The failure of an engine that exited with `exit` other than 0. `said` is the CLI's
/// own structured message, if any: it is the message, and what is classified (the
/// rest of stdout may quote tool output); else stderr and stdout are. A Gemini CLI exit
/// code of [`parsers::GEMINI_EXIT_CODES`] decides the code itself.
fn failed_exit(
    output: OutputMode,
    exit: ExitStatus,
    said: Option<String>,
    stdout: &str,
    stderr: &str,
) -> Failure {
    let mut text = match (exit.code(), exit.signal()) {
        (Some(code), _) => format!("engine exited with status {code}"),
        (None, Some(signal)) => format!("engine was killed by signal {signal}"),
        (None, None) => "engine failed".to_owned(),
    };
    let gemini = exit.code().filter(|_| output == OutputMode::GeminiJson);
    let mut failure = match gemini.and_then(parsers::gemini_exit) {
        Some((_, code, retryable, meaning)) => {
            text.push_str(&format!(" (Gemini CLI: {meaning})"));
            Failure {
                retryable: *retryable,
                ..Failure::new(code.clone(), "")
            }
        }
        None => {
            let classified = match &said {
                Some(said) => format!("{said}\n{stderr}"),
                None => format!("{stderr}\n{stdout}"),
            };
            Failure::new(classify(&classified).unwrap_or(ErrorCode::EngineCli), "")
        }
    };
    let said = said
        .or_else(|| last_lines(stderr))
        .or_else(|| last_lines(stdout));
    if let Some(message) = said.filter(|m| !m.is_empty()) {
        text = format!("{text}: {message}");
    }
    // (No documented Gemini CLI code is one of these.)
    let status = exit.code().unwrap_or_default();
    if failure.code == ErrorCode::EngineCli && COMMAND_NOT_FOUND_STATUSES.contains(&status) {
        // A command the engine runs is missing: retrying cannot fix that.
        failure.retryable = false;
        let lower = format!("{stderr}\n{stdout}").to_lowercase();
        if lower.contains(super::preflight::DELEGATION_PROGRAM) {
            text = format!("{NESTED_LOOPBUS_HINT}: {text}");
        }
    }
    failure.error = bounded(&text);
    failure
}

/// The last [`MESSAGE_LINES`] non-empty lines of `text`, joined and bounded.
fn last_lines(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(MESSAGE_LINES);
    (!lines.is_empty()).then(|| bounded(&lines[start..].join(" | ")))
}

/// `text` trimmed and cut to [`MAX_ENGINE_MESSAGE_CHARS`].
fn bounded(text: &str) -> String {
    crate::protocol::truncate_chars(text.trim().to_owned(), MAX_ENGINE_MESSAGE_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("Invalid API key · Please run /login", Some("auth")),
            ("Error: not logged in", Some("auth")),
            ("HTTP 401 from provider", Some("auth")),
            ("request failed with status code 401", Some("auth")),
            ("API Error (401) {...}", Some("auth")),
            ("file.py:401: syntax error", None),
            ("Unauthorized", Some("auth")),
            ("error at line 4011", None),
            ("EROFS: read-only file system", Some("write_permission")),
            ("open /x: Permission denied", Some("write_permission")),
            ("Operation not permitted", Some("write_permission")),
            (
                "No conversation found with session ID abc",
                Some("session_state"),
            ),
            ("error: no such session", Some("session_state")),
            // The first matching rule wins.
            ("unauthorized: permission denied", Some("auth")),
            ("segfault", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                classify(text).as_ref().map(ErrorCode::as_str),
                *want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn interpret_table() {
        // (mode, exit, stdout, stderr, expected: Ok(reply) | Err(code))
        type Row = (
            OutputMode,
            ExitStatus,
            &'static [u8],
            &'static str,
            Result<&'static str, &'static str>,
        );
        let rows: &[Row] = &[
            (OutputMode::Text, code(0), b"hello\n", "", Ok("hello")),
            (OutputMode::Text, code(0), b"crlf\r\n", "", Ok("crlf")),
            (
                OutputMode::Text,
                code(0),
                b"two\nlines\n\n",
                "",
                Ok("two\nlines\n"),
            ),
            (OutputMode::Text, code(0), b"", "noise", Ok("")),
            (
                OutputMode::Text,
                code(0),
                b"caf\xc3\xa9",
                "",
                Ok("caf\u{e9}"),
            ),
            (OutputMode::Text, code(0), b"caf\xe9", "", Err("engine_cli")),
            (
                OutputMode::Text,
                code(1),
                b"",
                "Invalid API key · Please run /login",
                Err("auth"),
            ),
            (OutputMode::Text, code(2), b"", "boom", Err("engine_cli")),
            (OutputMode::Text, signal(9), b"", "", Err("engine_cli")),
            (OutputMode::Text, unknown(), b"", "", Err("engine_cli")),
            (
                OutputMode::Text,
                code(1),
                b"",
                "rm: Permission denied",
                Err("write_permission"),
            ),
            (
                OutputMode::Json,
                code(0),
                br#"{"result":"ok","total_cost_usd":0.5}"#,
                "",
                Ok("ok"),
            ),
            (
                OutputMode::Json,
                code(0),
                br#"{"result":"No conversation found","is_error":true}"#,
                "",
                Err("session_state"),
            ),
            (
                OutputMode::Json,
                code(0),
                br#"{"result":"weird","is_error":true}"#,
                "",
                Err("unknown"),
            ),
            (
                OutputMode::Json,
                code(0),
                br#"{"result":"fine","is_error":false}"#,
                "",
                Ok("fine"),
            ),
            (
                OutputMode::Json,
                code(1),
                br#"{"result":"Invalid API key","is_error":true}"#,
                "",
                Err("auth"),
            ),
            (
                OutputMode::Json,
                code(0),
                b"not json",
                "",
                Err("engine_cli"),
            ),
            (OutputMode::Json, code(0), b"[1]", "", Err("engine_cli")),
            (
                OutputMode::Json,
                code(0),
                br#"{"text":"no result"}"#,
                "",
                Err("engine_cli"),
            ),
            (
                OutputMode::Json,
                code(0),
                br#"{"result":7}"#,
                "",
                Err("engine_cli"),
            ),
            (
                OutputMode::Json,
                code(0),
                b"warning: old\n{\"result\":\"ok\"}\n",
                "",
                Ok("ok"),
            ),
        ];
        for (mode, exit, out, err, want) in rows {
            let run = interpret(*mode, *exit, out, err.as_bytes());
            let got = match &run.result {
                TurnResult::Reply(text) => Ok(text.as_str()),
                TurnResult::Failed(f) => Err(f.code.as_str()),
            };
            assert_eq!(got, *want, "{mode:?} {exit:?} {out:?} {err:?}");
        }
    }

    /// Each preset CLI's failures through the one classification: "not logged in" in
    /// each one's shape is `auth`, not retryable; bad output is `engine_cli`.
    #[test]
    fn preset_failures_table() {
        // (mode, exit, stdout, stderr, code, retryable, words of the message)
        type Row = (
            OutputMode,
            ExitStatus,
            &'static str,
            &'static str,
            &'static str,
            bool,
            &'static str,
        );
        let rows: &[Row] = &[
            (
                OutputMode::Json,
                code(1),
                r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login"}"#,
                "",
                "auth",
                false,
                "engine exited with status 1: Not logged in",
            ),
            (
                OutputMode::Json,
                code(0),
                r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":8}"#,
                "",
                "engine_cli",
                true,
                "claude stopped: error_max_turns",
            ),
            (
                OutputMode::CodexJsonl,
                code(1),
                "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"turn.failed\",\"error\":{\"message\":\"unexpected status 401 Unauthorized\"}}\n",
                "Reading prompt from stdin...",
                "auth",
                false,
                "401 Unauthorized",
            ),
            (
                OutputMode::CodexJsonl,
                code(0),
                r#"{"type":"error","message":"Not logged in"}"#,
                "",
                "auth",
                false,
                "Not logged in",
            ),
            // A tool's output that says "permission denied" is not the CLI's failure.
            (
                OutputMode::CodexJsonl,
                code(1),
                "{\"type\":\"item.completed\",\"item\":{\"type\":\"command_execution\",\"aggregated_output\":\"permission denied\"}}\n{\"type\":\"turn.failed\",\"error\":{\"message\":\"stream disconnected\"}}",
                "",
                "engine_cli",
                true,
                "stream disconnected",
            ),
            (
                OutputMode::CodexJsonl,
                code(0),
                r#"{"type":"turn.completed","usage":{"input_tokens":1}}"#,
                "",
                "engine_cli",
                true,
                "no reply",
            ),
            (
                OutputMode::GeminiJson,
                code(41),
                r#"{"session_id":"g","error":{"type":"Error","message":"Please set an Auth method","code":41}}"#,
                "",
                "auth",
                false,
                "status 41 (Gemini CLI: authentication error): Please set an Auth method",
            ),
            // What Gemini CLI 0.61 did here, not logged in: nothing on stdout, its
            // error object pretty-printed on stderr.
            (
                OutputMode::GeminiJson,
                code(41),
                "",
                "{\n  \"session_id\": \"g\",\n  \"error\": {\n    \"type\": \"Error\",\n    \"message\": \"Please set an Auth method in your settings.json\",\n    \"code\": 41\n  }\n}\n",
                "auth",
                false,
                "status 41 (Gemini CLI: authentication error): Please set an Auth method in your settings.json",
            ),
            (
                OutputMode::GeminiJson,
                code(55),
                "",
                "folder is not trusted",
                "engine_cli",
                false,
                "untrusted workspace",
            ),
            (
                OutputMode::GeminiJson,
                code(130),
                "",
                "",
                "engine_cli",
                true,
                "interrupted",
            ),
            (
                OutputMode::GeminiJson,
                code(0),
                "plain text",
                "",
                "engine_cli",
                true,
                "engine.output \"gemini-json\"",
            ),
        ];
        for (mode, exit, out, err, code, retryable, words) in rows {
            let run = interpret(*mode, *exit, out.as_bytes(), err.as_bytes());
            let TurnResult::Failed(f) = &run.result else {
                panic!("not a failure: {out}")
            };
            assert_eq!(
                (f.code.as_str(), f.retryable),
                (*code, *retryable),
                "{mode:?} {exit:?} {out}"
            );
            assert!(f.error.contains(words), "{f:?}");
        }
        // The session id comes through a failure too.
        let run = interpret(
            OutputMode::GeminiJson,
            code(41),
            br#"{"session_id":"g-1","error":{"message":"x"}}"#,
            b"",
        );
        assert_eq!(run.session_id.as_deref(), Some("g-1"));
    }

    #[test]
    fn failure_message_table() {
        // (mode, exit, stdout, stderr, the envelope's `error`)
        type Row = (
            OutputMode,
            ExitStatus,
            &'static str,
            &'static str,
            &'static str,
        );
        let rows: &[Row] = &[
            (
                OutputMode::Text,
                code(1),
                "",
                "Invalid API key \u{b7} Please run /login\n",
                "engine exited with status 1: Invalid API key · Please run /login",
            ),
            // Only the last lines of stderr, joined.
            (
                OutputMode::Text,
                code(3),
                "out",
                "a\n\nb\nc\nd\n",
                "engine exited with status 3: b | c | d",
            ),
            // Stdout when stderr is empty.
            (
                OutputMode::Text,
                code(1),
                "only stdout\n",
                "  \n",
                "engine exited with status 1: only stdout",
            ),
            (
                OutputMode::Text,
                signal(9),
                "",
                "",
                "engine was killed by signal 9",
            ),
            (OutputMode::Text, unknown(), "", "", "engine failed"),
            // The engine's JSON `result` before stderr.
            (
                OutputMode::Json,
                code(1),
                r#"{"result":"structured","is_error":true}"#,
                "stderr text",
                "engine exited with status 1: structured",
            ),
            (
                OutputMode::Json,
                code(0),
                r#"{"result":"  said so  ","is_error":true}"#,
                "",
                "said so",
            ),
        ];
        for (mode, exit, out, err, want) in rows {
            let run = interpret(*mode, *exit, out.as_bytes(), err.as_bytes());
            let TurnResult::Failed(f) = run.result else {
                panic!("not a failure: {out:?} {err:?}")
            };
            assert_eq!(f.error, *want);
            // The envelope's retry hint follows the code's row of the retry table.
            assert_eq!(f.retryable, f.code.retryable(), "{want}");
        }
    }

    #[test]
    fn an_auth_failure_is_not_retryable() {
        let run = interpret(OutputMode::Text, code(1), b"", b"Error: not logged in");
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert_eq!(f.code, ErrorCode::Auth);
        assert!(!f.retryable);
    }

    #[test]
    fn bug_loopbus_missing_on_a_nested_engines_path_was_retryable() {
        let run = interpret(
            OutputMode::Text,
            code(127),
            b"",
            b"engine.sh: 3: loopbus: not found",
        );
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert_eq!(f.code, ErrorCode::EngineCli);
        assert!(!f.retryable);
        assert!(f.error.starts_with(NESTED_LOOPBUS_HINT), "{f:?}");
        // Another missing command: not retryable, no hint; another status: retryable.
        let run = interpret(OutputMode::Text, code(127), b"", b"jq: not found");
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert!(!f.retryable && !f.error.contains("loopbus"), "{f:?}");
        let run = interpret(OutputMode::Text, code(1), b"", b"loopbus: boom");
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert!(f.retryable);
    }

    #[test]
    fn failure_message_is_bounded() {
        let long = "x".repeat(MAX_ENGINE_MESSAGE_CHARS * 2);
        let run = interpret(OutputMode::Text, code(1), b"", long.as_bytes());
        let TurnResult::Failed(f) = run.result else {
            panic!("not a failure")
        };
        assert!(f.error.chars().count() <= MAX_ENGINE_MESSAGE_CHARS, "{f:?}");
    }

    #[test]
    fn usage_table() {
        let full = TurnUsage {
            input_tokens: 3,
            output_tokens: 4,
            cached_tokens: 5,
            cost_usd: 0.25,
            cost_reported: true,
            tokens_reported: true,
        };
        // (mode, exit, stdout, the usage to record)
        let rows: &[(OutputMode, ExitStatus, &str, Option<TurnUsage>)] = &[
            (
                OutputMode::Json,
                code(0),
                r#"{"result":"x","total_cost_usd":0.25,"usage":{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":5}}"#,
                Some(full),
            ),
            // Absent and null fields count as 0.
            (
                OutputMode::Json,
                code(0),
                r#"{"result":"x","total_cost_usd":null,"usage":{"input_tokens":null}}"#,
                Some(TurnUsage::default()),
            ),
            // A failed JSON engine that still reported its cost: it counts.
            (
                OutputMode::Json,
                code(1),
                r#"{"result":"x","total_cost_usd":0.25,"usage":{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":5}}"#,
                Some(full),
            ),
            // A failed exit without JSON: nothing to record.
            (OutputMode::Json, code(1), "crash", None),
            (OutputMode::Text, code(1), "crash", None),
            // A successful text or malformed JSON turn counts, at zero cost.
            (OutputMode::Text, code(0), "ok", Some(TurnUsage::default())),
            (
                OutputMode::Json,
                code(0),
                "not json",
                Some(TurnUsage::default()),
            ),
        ];
        for (mode, exit, out, want) in rows {
            let run = interpret(*mode, *exit, out.as_bytes(), b"");
            assert_eq!(run.usage, *want, "{mode:?} {exit:?} {out:?}");
        }
    }

    #[test]
    fn bug_a_cost_of_1e308_turned_the_total_into_null() {
        // Each row is bad engine output: engine_cli, and nothing it reported counted.
        let rows = [
            r#"{"result":"x","total_cost_usd":1e308}"#,
            r#"{"result":"x","total_cost_usd":-0.5}"#,
            r#"{"result":"x","total_cost_usd":1000.01}"#,
            r#"{"result":"x","total_cost_usd":"1"}"#,
            r#"{"result":"x","usage":{"input_tokens":-2}}"#,
            r#"{"result":"x","usage":{"output_tokens":1.5}}"#,
            r#"{"result":"x","usage":{"cache_read_input_tokens":18446744073709551615}}"#,
            r#"{"result":"x","usage":{"input_tokens":1000000001}}"#,
            // serde_json refuses a number out of f64's range: not a JSON object.
            r#"{"result":"x","total_cost_usd":1e400}"#,
        ];
        for out in rows {
            for exit in [code(0), code(1)] {
                let run = interpret(OutputMode::Json, exit, out.as_bytes(), b"");
                let TurnResult::Failed(f) = &run.result else {
                    panic!("accepted {out}")
                };
                assert_eq!(f.code, ErrorCode::EngineCli, "{out}");
                let counted = run.usage.unwrap_or_default();
                assert_eq!(counted, TurnUsage::default(), "{out}");
            }
        }
        // The bounds themselves pass.
        let at_bounds =
            r#"{"result":"x","total_cost_usd":1000,"usage":{"input_tokens":1000000000}}"#;
        let run = interpret(OutputMode::Json, code(0), at_bounds.as_bytes(), b"");
        assert_eq!(run.result, TurnResult::Reply("x".to_owned()));
    }

    /// A status exited with `code`.
    fn code(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    /// A status killed by `signal`.
    fn signal(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    /// A status that is neither (stopped by SIGSTOP).
    fn unknown() -> ExitStatus {
        ExitStatus::from_raw(0x137f)
    }

    #[test]
    fn exit_status_conversion() {
        assert_eq!((code(2).code(), code(2).signal()), (Some(2), None));
        assert_eq!((signal(9).code(), signal(9).signal()), (None, Some(9)));
        assert_eq!((unknown().code(), unknown().signal()), (None, None));
        assert!(code(0).success());
    }
}
