//! The tools of `loopbus mcp`: their JSON Schemas (input and output, in a fixed
//! order), the parsing of a call's arguments into a [`Call`], and the shape of their
//! results. Pure. Tool results follow 2025-06-18 and later: `content` (one text item),
//! `structuredContent` matching the tool's `outputSchema`, `isError`.

use super::answers::Kind;
use loopbus::{InstanceName, TraceId, DEFAULT_TIMEOUT, MAX_TARGETS};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// How long a call waits for its work unless `waitSecs` says otherwise: below the 60 s
/// that some clients give a tool call by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(45);
/// The longest `waitSecs`, in seconds.
pub const MAX_WAIT_SECS: f64 = 600.0;
/// How many characters of an answer one result carries unless `maxChars` says
/// otherwise (about 5,000 tokens: well under a client's cap on one tool result).
pub const DEFAULT_MAX_CHARS: usize = 20_000;
/// The largest `maxChars`.
pub const MAX_MAX_CHARS: usize = 1 << 20;
/// The longest `timeoutSecs` of a delegation, in seconds: 30 days, as `talk`.
pub const MAX_TIMEOUT_SECS: f64 = 30.0 * 24.0 * 3600.0;

/// A tool call, its arguments checked.
#[derive(Debug, PartialEq)]
pub enum Call {
    /// `list_instances`.
    ListInstances,
    /// `talk`, `fan`, `chain` or `verify`.
    Delegate {
        /// Which.
        kind: Kind,
        /// The targets given (`None`: the config's list); verify: the answerer.
        targets: Option<Vec<InstanceName>>,
        /// verify: the verifier given (`None`: the config's).
        verifier: Option<InstanceName>,
        /// The prompt.
        prompt: String,
        /// Each delegation's timeout.
        timeout: Duration,
        /// How to wait and show the answer.
        view: View,
    },
    /// `result`: the answer of a handle, or its next page.
    Result {
        /// The handle.
        handle: String,
        /// Where the page starts, in characters.
        offset: usize,
        /// How to wait and show the answer.
        view: View,
    },
    /// `cancel`: stop a handle's work.
    Cancel {
        /// The handle.
        handle: String,
    },
    /// `trace`: the tree of a trace (`None`: the caller's last one).
    Trace {
        /// The trace id given.
        trace_id: Option<TraceId>,
    },
}

/// How a call waits for its work and how much of the answer it shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// `waitSecs`.
    pub wait: Duration,
    /// `maxChars`.
    pub max_chars: usize,
}

/// The tools as `tools/list` gives them, in that order, with their input and output
/// schemas. A string `"#/shared/NAME"` in it stands for the schema `NAME` of `shared`
/// (a JSON pointer into the file, as a `$ref`), put in whole by [`definitions`]. Kept as
/// data: built with `json!`, the same schemas cost tens of KiB of code in the binary. The
/// tests hold its limits and defaults to the constants above.
const TOOLS: &str = include_str!("tools.json");

/// Every tool, in the order `tools/list` gives them.
pub fn definitions() -> Vec<Value> {
    static TOOL_LIST: LazyLock<Vec<Value>> = LazyLock::new(|| {
        #[allow(
            clippy::expect_used,
            reason = "tools.json is a constant, parsed by the unit tests"
        )]
        let mut document: Value = serde_json::from_str(TOOLS).expect("tools.json parses");
        let shared = document["shared"].take();
        let mut tools = document["tools"].take();
        resolve(&mut tools, &shared);
        match tools {
            Value::Array(tools) => tools,
            _ => Vec::new(),
        }
    });
    TOOL_LIST.clone()
}

/// Replaces every string `"#/shared/NAME"` in `value` with `shared`'s `NAME`.
fn resolve(value: &mut Value, shared: &Value) {
    if let Some(name) = value.as_str().and_then(|s| s.strip_prefix("#/shared/")) {
        *value = shared[name].clone();
    }
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| resolve(v, shared)),
        Value::Object(map) => map.values_mut().for_each(|v| resolve(v, shared)),
        _ => {}
    }
}

/// A call's arguments, checked as its input schema says.
struct Arguments<'a> {
    values: &'a Map<String, Value>,
}

impl<'a> Arguments<'a> {
    /// `values`, refusing keys not in `known`.
    fn new(values: &'a Map<String, Value>, known: &[&str]) -> Result<Arguments<'a>, String> {
        match values.keys().find(|k| !known.contains(&k.as_str())) {
            Some(key) => Err(format!(
                "unknown argument `{key}`; this tool takes {}",
                known.join(", ")
            )),
            None => Ok(Arguments { values }),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, String> {
        match self.values.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(format!("`{key}` must be a string")),
        }
    }

    fn required(&self, key: &str) -> Result<&'a str, String> {
        self.string(key)?.ok_or_else(|| format!("missing `{key}`"))
    }

    fn name(&self, key: &str) -> Result<InstanceName, String> {
        InstanceName::new(self.required(key)?).map_err(|e| format!("`{key}`: {e}"))
    }

    /// A list of instance names, if given.
    fn names(&self, key: &str) -> Result<Option<Vec<InstanceName>>, String> {
        let list = match self.values.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(list)) if (1..=MAX_TARGETS).contains(&list.len()) => list,
            Some(_) => {
                return Err(format!(
                    "`{key}` must be a list of 1 to {MAX_TARGETS} instance names"
                ))
            }
        };
        list.iter()
            .map(|name| {
                name.as_str()
                    .ok_or_else(|| format!("`{key}` must hold strings"))
                    .and_then(|n| InstanceName::new(n).map_err(|e| format!("`{key}`: {e}")))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// A number in `[min, max]` (`min` itself excluded when `open`), if given.
    fn number(&self, key: &str, min: f64, max: f64, open: bool) -> Result<Option<f64>, String> {
        let Some(value) = self.values.get(key).filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        value
            .as_f64()
            .filter(|n| (*n > min || (!open && *n == min)) && *n <= max)
            .map(Some)
            .ok_or_else(|| {
                let low = if open { "above" } else { "at least" };
                format!("`{key}` must be a number {low} {min} and at most {max}")
            })
    }

    fn integer(&self, key: &str, min: usize, max: usize) -> Result<Option<usize>, String> {
        let Some(value) = self.values.get(key).filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| (min..=max).contains(n))
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a whole number from {min} to {max}"))
    }

    fn view(&self) -> Result<View, String> {
        let wait = self
            .number("waitSecs", 0.0, MAX_WAIT_SECS, false)?
            .map_or(DEFAULT_WAIT, Duration::from_secs_f64);
        let max_chars = self
            .integer("maxChars", 1, MAX_MAX_CHARS)?
            .unwrap_or(DEFAULT_MAX_CHARS);
        Ok(View { wait, max_chars })
    }

    fn timeout(&self) -> Result<Duration, String> {
        Ok(self
            .number("timeoutSecs", 0.0, MAX_TIMEOUT_SECS, true)?
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64))
    }
}

/// Why a `tools/call` was not run.
#[derive(Debug, PartialEq)]
pub enum BadCall {
    /// Not a `CallToolRequest` (no `name`, `arguments` not an object) or no tool of
    /// that name: a protocol error (-32602) in every revision.
    Request(String),
    /// The arguments do not fit the tool's input schema: a protocol error in
    /// 2025-06-18, a tool error (`isError`) from 2025-11-25 on.
    Arguments(String),
}

/// The call that `tools/call`'s `params` ask for.
///
/// # Errors
/// No `name`, an unknown tool, or arguments the tool's schema refuses.
pub fn parse_call(params: &Map<String, Value>) -> Result<Call, BadCall> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| BadCall::Request("`name` must be a string".to_owned()))?;
    let empty = Map::new();
    let values = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(values)) => values,
        Some(_) => return Err(BadCall::Request("`arguments` must be an object".to_owned())),
    };
    let common = ["prompt", "timeoutSecs", "waitSecs", "maxChars"];
    let view = ["waitSecs", "maxChars"];
    let delegate = |kind, extra: &[&str], values| -> Result<Call, String> {
        let a = Arguments::new(values, &[extra, &common].concat())?;
        let (targets, verifier) = match kind {
            Kind::Talk => (Some(vec![a.name("target")?]), None),
            Kind::Fan | Kind::Chain => (a.names("targets")?, None),
            Kind::Verify => (
                Some(vec![a.name("answerer")?]),
                a.string("verifier")?
                    .map(|_| a.name("verifier"))
                    .transpose()?,
            ),
        };
        Ok(Call::Delegate {
            kind,
            targets,
            verifier,
            prompt: a.required("prompt")?.to_owned(),
            timeout: a.timeout()?,
            view: a.view()?,
        })
    };
    let parsed = match name {
        "list_instances" => Arguments::new(values, &[]).map(|_| Call::ListInstances),
        "talk" => delegate(Kind::Talk, &["target"], values),
        "fan" => delegate(Kind::Fan, &["targets"], values),
        "chain" => delegate(Kind::Chain, &["targets"], values),
        "verify" => delegate(Kind::Verify, &["answerer", "verifier"], values),
        "result" => {
            Arguments::new(values, &[&["handle", "offset"][..], &view].concat()).and_then(|a| {
                Ok(Call::Result {
                    handle: a.required("handle")?.to_owned(),
                    offset: a.integer("offset", 0, usize::MAX)?.unwrap_or(0),
                    view: a.view()?,
                })
            })
        }
        "cancel" => Arguments::new(values, &["handle"]).and_then(|a| {
            Ok(Call::Cancel {
                handle: a.required("handle")?.to_owned(),
            })
        }),
        "trace" => Arguments::new(values, &["traceId"]).and_then(|a| {
            let trace_id = a.string("traceId")?.map(TraceId::new).transpose();
            Ok(Call::Trace {
                trace_id: trace_id.map_err(|e| format!("`traceId`: {e}"))?,
            })
        }),
        other => return Err(BadCall::Request(format!("unknown tool `{other}`"))),
    };
    parsed.map_err(|message| BadCall::Arguments(format!("{name}: {message}")))
}

/// A tool result: `text` as the one content item, `structured` as
/// `structuredContent` when given.
pub fn tool_result(text: &str, structured: Option<Value>, is_error: bool) -> Value {
    let mut result = json!({
        "content": [{"type": "text", "text": text}],
        "isError": is_error,
    });
    if let Some(structured) = structured {
        result["structuredContent"] = structured;
    }
    result
}

/// One page of a text: the characters from `offset`, at most `max_chars` of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Page<'a> {
    /// The page.
    pub text: &'a str,
    /// Where the next page starts, if there is one.
    pub next: Option<usize>,
    /// The whole text's length in characters.
    pub total: usize,
}

/// The page of `text` starting at character `offset` (past the end: empty).
pub fn page(text: &str, offset: usize, max_chars: usize) -> Page<'_> {
    let total = text.chars().count();
    let byte_at = |chars: usize| {
        text.char_indices()
            .nth(chars)
            .map_or(text.len(), |(i, _)| i)
    };
    let start = byte_at(offset);
    let end = offset.saturating_add(max_chars);
    let stop = if end >= total {
        text.len()
    } else {
        byte_at(end)
    };
    Page {
        text: &text[start..stop],
        next: (end < total).then_some(end),
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(value: Value) -> Result<Call, BadCall> {
        parse_call(value.as_object().unwrap())
    }

    #[test]
    fn arguments_are_checked_as_the_schemas_say() {
        let talk = call(
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "hi",
            "waitSecs": 1.5, "maxChars": 10, "timeoutSecs": 3}}),
        );
        let w = || InstanceName::new("w").unwrap();
        assert_eq!(
            talk,
            Ok(Call::Delegate {
                kind: Kind::Talk,
                targets: Some(vec![w()]),
                verifier: None,
                prompt: "hi".into(),
                timeout: Duration::from_secs(3),
                view: View {
                    wait: Duration::from_millis(1500),
                    max_chars: 10
                },
            })
        );
        let defaults = call(json!({"name": "result", "arguments": {"handle": "h"}}));
        assert_eq!(
            defaults,
            Ok(Call::Result {
                handle: "h".into(),
                offset: 0,
                view: View {
                    wait: DEFAULT_WAIT,
                    max_chars: DEFAULT_MAX_CHARS
                }
            })
        );
        assert_eq!(
            call(json!({"name": "list_instances"})),
            Ok(Call::ListInstances)
        );
        let bad = [
            json!({"name": "talk", "arguments": {"prompt": "hi"}}),
            json!({"name": "talk", "arguments": {"target": "../x", "prompt": "hi"}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": 1}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "p", "waitSecs": 601}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "p", "waitSecs": -1}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "p", "timeoutSecs": 0}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "p", "maxChars": 0}}),
            json!({"name": "talk", "arguments": {"target": "w", "prompt": "p", "extra": 1}}),
            json!({"name": "result", "arguments": {"handle": "h", "offset": -1}}),
            json!({"name": "fan", "arguments": {"prompt": "p", "targets": []}}),
            json!({"name": "fan", "arguments": {"prompt": "p", "targets": ["ok", 3]}}),
            json!({"name": "chain", "arguments": {"prompt": "p", "targets": "a,b"}}),
            json!({"name": "verify", "arguments": {"prompt": "p"}}),
            json!({"name": "trace", "arguments": {"traceId": "not hex"}}),
            json!({"name": "verify", "arguments": {"prompt": "p", "answerer": "a", "verifier": "!"}}),
        ];
        for value in bad {
            assert!(
                matches!(call(value.clone()), Err(BadCall::Arguments(_))),
                "{value}"
            );
        }
        for value in [
            json!({"name": "nope"}),
            json!({"name": "cancel", "arguments": []}),
            json!({"name": 7}),
        ] {
            assert!(
                matches!(call(value.clone()), Err(BadCall::Request(_))),
                "{value}"
            );
        }
    }

    #[test]
    fn pages_cut_at_characters_and_say_where_the_next_starts() {
        let text = "aé€😀bc";
        assert_eq!(
            page(text, 0, 3),
            Page {
                text: "aé€",
                next: Some(3),
                total: 6
            }
        );
        assert_eq!(
            page(text, 3, 3),
            Page {
                text: "😀bc",
                next: None,
                total: 6
            }
        );
        assert_eq!(page(text, 0, 6).next, None);
        assert_eq!(page(text, 9, 3).text, "");
        assert_eq!(page(text, 1, usize::MAX).text, "é€😀bc");
        assert_eq!(page("", 0, 1).next, None);
    }

    #[test]
    fn every_tool_has_schemas_and_a_fixed_order() {
        let tools = definitions();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "list_instances",
                "talk",
                "fan",
                "chain",
                "verify",
                "result",
                "cancel",
                "trace"
            ]
        );
        for tool in &tools {
            assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
            assert!(tool["description"].as_str().is_some_and(|d| d.len() > 20));
        }
    }

    #[test]
    fn the_schemas_say_the_limits_and_defaults_of_the_constants() {
        let limits = [
            ("waitSecs", "maximum", json!(MAX_WAIT_SECS)),
            ("maxChars", "maximum", json!(MAX_MAX_CHARS)),
            ("timeoutSecs", "maximum", json!(MAX_TIMEOUT_SECS)),
            ("targets", "maxItems", json!(MAX_TARGETS)),
        ];
        let defaults = [
            ("waitSecs", DEFAULT_WAIT.as_secs()),
            ("maxChars", DEFAULT_MAX_CHARS as u64),
            ("timeoutSecs", DEFAULT_TIMEOUT.as_secs()),
        ];
        let mut checked = 0;
        for tool in definitions() {
            let properties = &tool["inputSchema"]["properties"];
            for (key, bound, limit) in &limits {
                if let Some(schema) = properties.get(key) {
                    assert_eq!(&schema[bound], limit, "{} {key}", tool["name"]);
                    checked += 1;
                }
            }
            for (key, default) in defaults {
                if let Some(schema) = properties.get(key) {
                    let description = schema["description"].as_str().unwrap_or_default();
                    assert!(
                        description.contains(&format!("(default {default})")),
                        "{key}"
                    );
                }
            }
        }
        // waitSecs and maxChars in 5 tools, timeoutSecs in 4, targets in 2.
        assert_eq!(checked, 5 + 5 + 4 + 2);
    }

    #[test]
    fn shared_schemas_are_put_in_whole() {
        fn check(value: &Value) {
            match value {
                Value::Null => panic!("a reference to no shared schema"),
                Value::String(s) => assert!(!s.starts_with("#/"), "{s}"),
                Value::Array(items) => items.iter().for_each(check),
                Value::Object(map) => map.values().for_each(check),
                _ => {}
            }
        }
        let tools = definitions();
        tools.iter().for_each(check);
        let outcome = &tools[1]["outputSchema"];
        assert_eq!(outcome["required"], json!(["status", "elapsedSecs"]));
        for tool in &tools[1..7] {
            assert_eq!(&tool["outputSchema"], outcome, "{}", tool["name"]);
        }
    }
}
