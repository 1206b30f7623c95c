//! The parsers of the agent CLIs' structured output (pure): what `claude -p
//! --output-format json`, `codex exec --json` and `gemini -p --output-format json` said
//! (the reply, or the CLI's own account of a failure), the usage they reported, and
//! their session id. `outcome.rs` turns a [`Report`] and the exit into the turn's
//! result; the shapes read are listed in docs/configuration.md.

use crate::config::OutputMode;
use crate::protocol::ErrorCode;
use crate::usage::TurnUsage;
use serde_json::Value;

/// The largest cost one turn may report, in US dollars: more is not a real bill but a
/// broken or hostile engine, and is refused as bad output rather than counted.
pub const MAX_TURN_COST_USD: f64 = 1_000.0;
/// The largest token count (of each kind) one turn may report.
pub const MAX_TURN_TOKENS: u64 = 1_000_000_000;
/// Longest session id kept for the audit line; a longer one (or one holding a control
/// character) is not a session id we record.
pub const MAX_SESSION_ID_CHARS: usize = 128;

/// What a structured engine's stdout said.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// The reply text, when the engine gave one.
    pub reply: Option<String>,
    /// The engine's own account of a failure (claude `is_error` or an error subtype,
    /// codex `turn.failed` or `error`, gemini `error`), when it gave one.
    pub error: Option<String>,
    /// The code of such a failure when no classification rule matches its text, when it
    /// is not `engine_cli`: `unknown` for a claude `is_error` without an error subtype.
    pub fallback: Option<ErrorCode>,
    /// The usage reported: absent fields count as 0.
    pub usage: TurnUsage,
    /// The CLI's session (conversation, thread) id, when it reported a plausible one.
    pub session_id: Option<String>,
}

/// Why stdout could not be read as `engine.output` says.
#[derive(Debug, Clone, PartialEq)]
pub enum Unreadable {
    /// Not the JSON the mode expects at all.
    NotStructured,
    /// A reported cost or token count is non-finite, negative, fractional or over its
    /// bound (which field, and why).
    BadUsage(String),
}

/// Reads `stdout` with the parser of `mode` (`None` for `"text"`, which has none); for
/// Gemini CLI, `stderr` when `stdout` holds no object.
pub fn parse(mode: OutputMode, stdout: &str, stderr: &str) -> Option<Result<Report, Unreadable>> {
    match mode {
        OutputMode::Text => None,
        OutputMode::Json => Some(claude(stdout)),
        OutputMode::CodexJsonl => Some(codex(stdout)),
        OutputMode::GeminiJson => Some(match gemini(stdout) {
            // Gemini CLI writes its JSON error object to stderr, not stdout.
            Err(Unreadable::NotStructured) => gemini(stderr),
            read => read,
        }),
    }
}

/// `claude -p --output-format json`: one object; the reply is `result`; `is_error:
/// true` or a `subtype` other than `success` (`error_max_turns`,
/// `error_during_execution`, `error_max_budget_usd`, ...) is a failure whose message is
/// `result` (else the `errors` strings, else the subtype); cost from `total_cost_usd`;
/// tokens from `usage.input_tokens`, `usage.output_tokens`,
/// `usage.cache_read_input_tokens`; `session_id`. A warning line before the object is
/// skipped.
pub fn claude(stdout: &str) -> Result<Report, Unreadable> {
    let value = json_object(stdout).ok_or(Unreadable::NotStructured)?;
    let mut usage = tokens(
        value.get("usage"),
        "usage",
        ["input_tokens", "output_tokens", "cache_read_input_tokens"],
    )?;
    if let Some(v) = present(value.get("total_cost_usd")) {
        usage.cost_usd = v
            .as_f64()
            .filter(|c| c.is_finite() && (0.0..=MAX_TURN_COST_USD).contains(c))
            .ok_or_else(|| {
                Unreadable::BadUsage(format!(
                    "engine reported total_cost_usd {v}, not a cost from $0 to ${MAX_TURN_COST_USD} a turn (MAX_TURN_COST_USD)"
                ))
            })?;
        usage.cost_reported = true;
    }
    let result = value.get("result").and_then(Value::as_str);
    let subtype = value
        .get("subtype")
        .and_then(Value::as_str)
        .filter(|s| *s != "success");
    let failed = value.get("is_error").and_then(Value::as_bool) == Some(true) || subtype.is_some();
    let message = || {
        let errors: Vec<&str> = value
            .get("errors")
            .and_then(Value::as_array)
            .map(|errors| errors.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match (result.filter(|r| !r.trim().is_empty()), subtype) {
            (Some(result), _) => result.to_owned(),
            (None, _) if !errors.is_empty() => errors.join("; "),
            (None, Some(subtype)) => format!("claude stopped: {subtype}"),
            (None, None) => "claude reported an error".to_owned(),
        }
    };
    Ok(Report {
        reply: result.filter(|_| !failed).map(str::to_owned),
        error: failed.then(message),
        fallback: subtype.is_none().then_some(ErrorCode::Unknown),
        usage,
        session_id: session_id(value.get("session_id")),
    })
}

/// `codex exec --json`: JSON Lines events; the reply is the `text` of the last
/// `item.completed` whose item `type` is `agent_message`; tokens from the last
/// `turn.completed`'s `usage` (`input_tokens`, `cached_input_tokens`,
/// `output_tokens`), no cost; `turn.failed` (its `error.message`) or `error` (its
/// `message`) not followed by a `turn.completed` is a failure; the session id is `thread.started`'s `thread_id`. Lines
/// that are not JSON objects (a warning) are skipped; no event at all is unreadable.
pub fn codex(stdout: &str) -> Result<Report, Unreadable> {
    let mut report = Report::default();
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(Value::is_object)
        .collect();
    if events.is_empty() {
        return Err(Unreadable::NotStructured);
    }
    let mut last_usage = None;
    for event in &events {
        match event.get("type").and_then(Value::as_str) {
            Some("thread.started") => report.session_id = session_id(event.get("thread_id")),
            Some("item.completed") => {
                let item = event.get("item");
                if item.and_then(|i| i.get("type")).and_then(Value::as_str) == Some("agent_message")
                {
                    report.reply = string(item.and_then(|i| i.get("text"))).or(report.reply);
                }
            }
            Some("turn.completed") => {
                last_usage = event.get("usage");
                // An `error` event the turn went on from (a reconnection) failed nothing.
                report.error = None;
            }
            Some("turn.failed") => {
                let message = string(event.get("error").and_then(|e| e.get("message")));
                report.error = Some(message.unwrap_or_else(|| "codex: the turn failed".into()));
            }
            Some("error") => {
                let message = string(event.get("message"));
                report.error = Some(message.unwrap_or_else(|| "codex reported an error".into()));
            }
            _ => {}
        }
    }
    report.usage = tokens(
        last_usage,
        "turn.completed.usage",
        ["input_tokens", "output_tokens", "cached_input_tokens"],
    )?;
    Ok(report)
}

/// `gemini -p --output-format json`: one object `{session_id, response, stats,
/// error}`; the reply is `response`; an `error` object is a failure (its `message`);
/// tokens are summed over `stats.models.*.tokens`: `prompt` (input, cached ones
/// included), `candidates` (output), `cached`; no cost. A warning line before the
/// object is skipped.
pub fn gemini(stdout: &str) -> Result<Report, Unreadable> {
    let value = json_object(stdout).ok_or(Unreadable::NotStructured)?;
    let mut usage = TurnUsage::default();
    let models = value
        .get("stats")
        .and_then(|s| s.get("models"))
        .and_then(Value::as_object);
    for (model, stats) in models.into_iter().flatten() {
        let one = tokens(
            stats.get("tokens"),
            &format!("stats.models.{model}.tokens"),
            ["prompt", "candidates", "cached"],
        )?;
        let sum = |a: u64, b: u64, field: &str| {
            Some(a + b).filter(|n| *n <= MAX_TURN_TOKENS).ok_or_else(|| {
                Unreadable::BadUsage(format!(
                    "engine reported more than {MAX_TURN_TOKENS} {field} tokens in all (MAX_TURN_TOKENS)"
                ))
            })
        };
        usage.input_tokens = sum(usage.input_tokens, one.input_tokens, "prompt")?;
        usage.output_tokens = sum(usage.output_tokens, one.output_tokens, "candidates")?;
        usage.cached_tokens = sum(usage.cached_tokens, one.cached_tokens, "cached")?;
        usage.tokens_reported |= one.tokens_reported;
    }
    let error = present(value.get("error"))
        .map(|e| string(e.get("message")).unwrap_or_else(|| "gemini reported an error".into()));
    Ok(Report {
        reply: string(value.get("response")),
        error,
        usage,
        session_id: session_id(value.get("session_id")),
        ..Report::default()
    })
}

/// Gemini CLI's documented exit codes in headless mode, and what each means here:
/// the code, whether retrying the same turn can pass, and the meaning for the message.
/// `130` is not `cancelled`: that code means this turn's caller cancelled it (contract
/// 8.1), which loopbus knows without the CLI's word; an interrupt from anyone else is
/// an `engine_cli` failure that may pass.
pub const GEMINI_EXIT_CODES: [(i32, ErrorCode, bool, &str); 8] = [
    (41, ErrorCode::Auth, false, "authentication error"),
    (42, ErrorCode::EngineCli, false, "input error"),
    (44, ErrorCode::EngineCli, false, "sandbox error"),
    (52, ErrorCode::EngineCli, false, "configuration error"),
    (53, ErrorCode::EngineCli, false, "turn limit exceeded"),
    (54, ErrorCode::EngineCli, true, "tool execution error"),
    (
        55,
        ErrorCode::EngineCli,
        false,
        "untrusted workspace: trust engine.cwd in Gemini CLI",
    ),
    (130, ErrorCode::EngineCli, true, "interrupted"),
];

/// The row of [`GEMINI_EXIT_CODES`] for `status`, if it has one.
pub fn gemini_exit(status: i32) -> Option<&'static (i32, ErrorCode, bool, &'static str)> {
    GEMINI_EXIT_CODES.iter().find(|(code, ..)| *code == status)
}

/// The engine's JSON object: the whole of stdout, or else what follows the last line
/// that opens an object (an engine may print a warning before the object, on one line
/// or pretty-printed).
pub fn json_object(stdout: &str) -> Option<Value> {
    let object = |text: &str| {
        serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
    };
    object(stdout).or_else(|| {
        let start = stdout.rfind("\n{").map_or(0, |at| at + 1);
        object(&stdout[start..])
    })
}

/// `v` if it is a string.
fn string(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

/// `v` unless it is absent or `null`.
fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

/// Input, output and cached token counts from the fields `names` (in that order) of
/// `object`, which is at `path` (for the message). Absent or null counts as 0; a present
/// one must be an integer from 0 to [`MAX_TURN_TOKENS`].
fn tokens(object: Option<&Value>, path: &str, names: [&str; 3]) -> Result<TurnUsage, Unreadable> {
    let mut counts = [0u64; 3];
    let mut reported = false;
    for (count, name) in counts.iter_mut().zip(names) {
        let Some(v) = present(object.and_then(|o| o.get(name))) else {
            continue;
        };
        *count = v.as_u64().filter(|n| *n <= MAX_TURN_TOKENS).ok_or_else(|| {
            Unreadable::BadUsage(format!(
                "engine reported {path}.{name} {v}, not a token count from 0 to {MAX_TURN_TOKENS} (MAX_TURN_TOKENS)"
            ))
        })?;
        reported = true;
    }
    let [input_tokens, output_tokens, cached_tokens] = counts;
    Ok(TurnUsage {
        input_tokens,
        output_tokens,
        cached_tokens,
        tokens_reported: reported,
        ..TurnUsage::default()
    })
}

/// A session id worth recording: a non-empty string of at most
/// [`MAX_SESSION_ID_CHARS`] without control characters.
fn session_id(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.chars().count() <= MAX_SESSION_ID_CHARS)
        .filter(|s| !s.chars().any(char::is_control))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's expectation: the reply or the failure's message, and the session id.
    type Want = (Result<&'static str, &'static str>, Option<&'static str>);

    fn outcome(report: &Report) -> (Result<&str, &str>, Option<&str>) {
        let answer = match (&report.error, &report.reply) {
            (Some(error), _) => Err(error.as_str()),
            (None, Some(reply)) => Ok(reply.as_str()),
            (None, None) => Err("<no reply>"),
        };
        (answer, report.session_id.as_deref())
    }

    type Parser = fn(&str) -> Result<Report, Unreadable>;

    fn check(parser: Parser, rows: &[(&str, Want)]) {
        for (stdout, want) in rows {
            let report = parser(stdout).unwrap_or_else(|e| panic!("{e:?}: {stdout}"));
            assert_eq!(outcome(&report), *want, "{stdout}");
        }
    }

    #[test]
    fn claude_table() {
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":2100,"num_turns":1,"result":"Paris.","session_id":"4f1c2d3e-0000-4000-8000-000000000001","total_cost_usd":0.0123,"usage":{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":4096,"cache_creation_input_tokens":0}}"#;
        check(
            claude,
            &[
                (
                    ok,
                    (Ok("Paris."), Some("4f1c2d3e-0000-4000-8000-000000000001")),
                ),
                // Not logged in: Claude Code reports it as a result marked is_error.
                (
                    r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login","session_id":"s-1","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}"#,
                    (Err("Not logged in · Please run /login"), Some("s-1")),
                ),
                (
                    r#"{"type":"result","subtype":"error_max_turns","is_error":false,"num_turns":3,"session_id":"s-2"}"#,
                    (Err("claude stopped: error_max_turns"), Some("s-2")),
                ),
                (
                    r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["tool crashed","again"]}"#,
                    (Err("tool crashed; again"), None),
                ),
                (
                    r#"{"type":"result","subtype":"error_max_budget_usd","is_error":true,"result":""}"#,
                    (Err("claude stopped: error_max_budget_usd"), None),
                ),
                // A warning line before the object; a session id that is not one.
                (
                    "warning: update available\n{\"result\":\"ok\",\"session_id\":\"a\\u0007b\"}\n",
                    (Ok("ok"), None),
                ),
                (r#"{"result":"x","session_id":7}"#, (Ok("x"), None)),
                (r#"{"text":"no result"}"#, (Err("<no reply>"), None)),
            ],
        );
        let report = claude(ok).unwrap();
        assert_eq!(
            report.usage,
            TurnUsage {
                input_tokens: 12,
                output_tokens: 3,
                cached_tokens: 4096,
                cost_usd: 0.0123,
                cost_reported: true,
                tokens_reported: true,
            }
        );
        // Only a plain `is_error` falls back to `unknown`; an error subtype is the CLI's.
        assert_eq!(report.fallback, Some(ErrorCode::Unknown));
        let stopped = claude(r#"{"subtype":"error_max_turns"}"#).unwrap();
        assert_eq!(stopped.fallback, None);
        assert_eq!(claude("not json"), Err(Unreadable::NotStructured));
        assert_eq!(claude("[1]"), Err(Unreadable::NotStructured));
    }

    #[test]
    fn codex_table() {
        let ok = concat!(
            r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}"#,
            "\n",
            r#"{"type":"turn.started"}"#,
            "\n",
            r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"thinking"}}"#,
            "\n",
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"first"}}"#,
            "\n",
            r#"{"type":"item.started","item":{"id":"item_2","type":"command_execution","command":"ls","status":"in_progress"}}"#,
            "\n",
            r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"the answer"}}"#,
            "\n",
            r#"{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}"#,
            "\n",
        );
        check(
            codex,
            &[
                (ok, (Ok("the answer"), Some("0199a213-81c0-7800-8aa1-bbab2a035a53"))),
                // Not logged in: the model request fails with a 401.
                (
                    concat!(
                        r#"{"type":"thread.started","thread_id":"t-1"}"#,
                        "\n",
                        r#"{"type":"turn.started"}"#,
                        "\n",
                        r#"{"type":"error","message":"unexpected status 401 Unauthorized: Missing bearer or basic authentication in header"}"#,
                        "\n",
                        r#"{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: Missing bearer or basic authentication in header"}}"#,
                    ),
                    (
                        Err("unexpected status 401 Unauthorized: Missing bearer or basic authentication in header"),
                        Some("t-1"),
                    ),
                ),
                (
                    r#"{"type":"error","message":"Not logged in. Run codex login."}"#,
                    (Err("Not logged in. Run codex login."), None),
                ),
                (
                    r#"{"type":"turn.failed","error":{}}"#,
                    (Err("codex: the turn failed"), None),
                ),
                // A stream error the turn recovered from is no failure.
                (
                    concat!(
                        r#"{"type":"error","message":"Reconnecting... 1/5"}"#,
                        "\n",
                        r#"{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"done"}}"#,
                        "\n",
                        r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}"#,
                    ),
                    (Ok("done"), None),
                ),
                // A warning line among the events; no agent message at all.
                (
                    "Reading prompt from stdin...\n{\"type\":\"turn.started\"}\n{\"type\":\"turn.completed\",\"usage\":{}}",
                    (Err("<no reply>"), None),
                ),
            ],
        );
        let usage = codex(ok).unwrap().usage;
        assert_eq!(
            (
                usage.input_tokens,
                usage.cached_tokens,
                usage.output_tokens,
                usage.cost_reported
            ),
            (24763, 24448, 122, false)
        );
        assert!(usage.tokens_reported);
        assert_eq!(codex(""), Err(Unreadable::NotStructured));
        assert_eq!(codex("plain text\n"), Err(Unreadable::NotStructured));
    }

    #[test]
    fn gemini_table() {
        let ok = r#"{"session_id":"g-1","response":"Paris is the capital.","stats":{"models":{"gemini-2.5-pro":{"api":{"totalRequests":2,"totalErrors":0,"totalLatencyMs":5000},"tokens":{"prompt":1000,"candidates":40,"total":1100,"cached":600,"thoughts":60,"tool":0}},"gemini-2.5-flash":{"tokens":{"prompt":200,"candidates":10,"cached":0}}},"tools":{"totalCalls":0},"files":{"totalLinesAdded":0}}}"#;
        check(
            gemini,
            &[
                (ok, (Ok("Paris is the capital."), Some("g-1"))),
                // Not logged in: exit 41, and an error object.
                (
                    r#"{"session_id":"g-2","error":{"type":"Error","message":"Please set an Auth method in your settings.json or specify one of the following environment variables before running: GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA","code":41}}"#,
                    (
                        Err("Please set an Auth method in your settings.json or specify one of the following environment variables before running: GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI, GOOGLE_GENAI_USE_GCA"),
                        Some("g-2"),
                    ),
                ),
                (
                    r#"{"response":"partial","error":{"type":"FatalTurnLimitedError","code":53}}"#,
                    (Err("gemini reported an error"), None),
                ),
                (r#"{"response":"x","error":null}"#, (Ok("x"), None)),
                (r#"{"stats":{}}"#, (Err("<no reply>"), None)),
            ],
        );
        let usage = gemini(ok).unwrap().usage;
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.cached_tokens),
            (1200, 50, 600)
        );
        assert!(usage.tokens_reported && !usage.cost_reported);
        let silent = gemini(r#"{"response":"x"}"#).unwrap().usage;
        assert!(!silent.is_reported());
        assert_eq!(
            gemini("Loaded cached credentials."),
            Err(Unreadable::NotStructured)
        );
        // A warning line, then the object pretty-printed.
        let pretty = "Loaded cached credentials.\n{\n  \"response\": \"hi\",\n  \"stats\": {}\n}\n";
        assert_eq!(gemini(pretty).unwrap().reply.as_deref(), Some("hi"));
    }

    #[test]
    fn bad_usage_is_unreadable_in_every_parser() {
        let rows: &[(Parser, &str, &str)] = &[
            (
                claude,
                r#"{"result":"x","total_cost_usd":-1}"#,
                "total_cost_usd",
            ),
            (
                claude,
                r#"{"result":"x","usage":{"output_tokens":1.5}}"#,
                "usage.output_tokens",
            ),
            (
                codex,
                r#"{"type":"turn.completed","usage":{"input_tokens":-3}}"#,
                "turn.completed.usage.input_tokens",
            ),
            (
                codex,
                r#"{"type":"turn.completed","usage":{"cached_input_tokens":"9"}}"#,
                "cached_input_tokens",
            ),
            (
                gemini,
                r#"{"response":"x","stats":{"models":{"m":{"tokens":{"candidates":1000000001}}}}}"#,
                "stats.models.m.tokens.candidates",
            ),
            (
                gemini,
                r#"{"response":"x","stats":{"models":{"a":{"tokens":{"prompt":1000000000}},"b":{"tokens":{"prompt":1}}}}}"#,
                "MAX_TURN_TOKENS",
            ),
        ];
        for (parser, stdout, field) in rows {
            match parser(stdout) {
                Err(Unreadable::BadUsage(why)) => assert!(why.contains(field), "{why}"),
                other => panic!("{stdout}: {other:?}"),
            }
        }
    }

    #[test]
    fn gemini_exit_codes() {
        let code =
            |status| gemini_exit(status).map(|(_, code, retryable, _)| (code.clone(), *retryable));
        assert_eq!(code(41), Some((ErrorCode::Auth, false)));
        assert_eq!(code(55), Some((ErrorCode::EngineCli, false)));
        assert_eq!(code(54), Some((ErrorCode::EngineCli, true)));
        assert_eq!(code(130), Some((ErrorCode::EngineCli, true)));
        assert_eq!(code(1), None);
        assert_eq!(code(0), None);
    }
}
