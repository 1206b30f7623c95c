//! Parsing and validating the bytes of a `config.json` into a [`Config`]. No I/O.

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::error::{refuse, ConfigError, Problem, MAX_CONFIG_PROBLEMS};
use super::keys::{self, Object, BUS, ENGINE, TOP};
use super::{
    BusConfig, Config, EngineConfig, OutputMode, Peers, Preset, PromptMode, CONFIG_FILE,
    DEFAULT_ACCEPT_KINDS, DEFAULT_KIND, DEFAULT_MAX_CONCURRENT_TURNS, DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_QUEUED_TURNS, DEFAULT_REATTACH_SECS, MAX_CONCURRENT_TURNS_LIMIT,
    MAX_QUEUED_TURNS_LIMIT, MAX_REATTACH_SECS,
};
use crate::protocol::{non_negative_integer, InstanceName};
use crate::secret::Secret;

/// Parses and validates the bytes of a `config.json`. No I/O.
///
/// # Errors
///
/// The bytes are not JSON, not an object, an object holds a key the config may not
/// have (checked first, object by object), or a field has a value it may not have.
pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
    if let Some(path) = super::duplicates::first_duplicate(bytes) {
        return Err(ConfigError::new(Problem::DuplicateKey { path }));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|err| {
        // serde_json's text is what it found, then where: the where goes first.
        let at = format!("at line {} column {}", err.line(), err.column());
        let text = err.to_string();
        let found = text.strip_suffix(&format!(" {at}")).unwrap_or(&text);
        ConfigError::new(Problem::Syntax(format!("{at}: {found}")))
    })?;
    let Value::Object(fields) = value else {
        return Err(ConfigError::new(Problem::NotAnObject));
    };
    // Every problem in one run (the first MAX_CONFIG_PROBLEMS are shown): a field found
    // wrong takes its default and the rest is read on.
    let found = RefCell::new(Vec::new());
    let top = Section::new(&fields, &TOP, &found);
    let config = Config {
        bus: match fields.get("bus") {
            Some(Value::Bool(true)) => BusConfig::open(),
            Some(Value::Object(bus)) => parse_bus(&Section::new(bus, &BUS, &found)),
            // Missing, null, false, or any other non-object: the bus is off.
            _ => BusConfig::default(),
        },
        budget_usd: top.usd("budgetUsd"),
        engine: top.read("engine", None, |value, path| match value {
            Value::Null => Ok(None),
            Value::Object(engine) => Ok(Some(parse_engine(&Section::new(engine, &ENGINE, &found)))),
            _ => refuse(path, "must be an object or null"),
        }),
    };
    let mut problems = found.into_inner();
    if problems.is_empty() {
        return Ok(config);
    }
    problems.truncate(MAX_CONFIG_PROBLEMS);
    Err(ConfigError {
        file: CONFIG_FILE.to_owned(),
        problems,
    })
}

/// One object of the config, with the path that names its fields in problems, and
/// where the problems found are noted.
struct Section<'a> {
    fields: &'a Map<String, Value>,
    object: &'static Object,
    /// The problems found so far, in the order found.
    found: &'a RefCell<Vec<Problem>>,
}

impl<'a> Section<'a> {
    /// `fields` as `object`, its unknown keys noted first ([`keys::unknown`]).
    fn new(
        fields: &'a Map<String, Value>,
        object: &'static Object,
        found: &'a RefCell<Vec<Problem>>,
    ) -> Section<'a> {
        found.borrow_mut().extend(keys::unknown(fields, object));
        Section {
            fields,
            object,
            found,
        }
    }

    /// The value of `result`, or `None` with its problem noted.
    fn ok<T>(&self, result: Result<T, Problem>) -> Option<T> {
        result
            .map_err(|problem| self.found.borrow_mut().push(problem))
            .ok()
    }

    /// Field `key` as `read` reads its value (given its path), or `default` when it is
    /// missing or `read` refuses it (the problem noted).
    fn read<T>(
        &self,
        key: &str,
        default: T,
        read: impl FnOnce(&Value, &str) -> Result<T, Problem>,
    ) -> T {
        self.fields
            .get(key)
            .and_then(|value| self.ok(read(value, &self.object.path_of(key))))
            .unwrap_or(default)
    }

    /// Field `key` as `convert` reads it, or `default` when it is missing. When `convert`
    /// refuses the value, a problem naming the field with `message`.
    fn get<T>(
        &self,
        key: &str,
        default: T,
        convert: impl FnOnce(&Value) -> Option<T>,
        message: impl Into<String>,
    ) -> T {
        self.read(key, default, |value, path| {
            convert(value).map_or_else(|| refuse(path, message), Ok)
        })
    }

    /// The integer `key` in `min..=max` (converted to `T`), or `default` when absent.
    /// It is read as [`non_negative_integer`] reads it (`1.0` is 1; strings, fractions
    /// and negative numbers are not integers), with one difference kept from before the
    /// readers were merged: a number beyond `u64::MAX` is refused here rather than
    /// saturated, so that a typo like `1e30` in a config is an error and not
    /// "unlimited".
    fn int<T: TryFrom<u64>>(&self, key: &str, default: T, min: u64, max: u64) -> T {
        let message = if max == u64::MAX {
            "must be a positive integer".to_owned()
        } else {
            format!("must be an integer from {min} to {max}")
        };
        let read = |value: &Value| {
            let huge = value.as_f64().is_some_and(|f| f > u64::MAX as f64);
            let n = non_negative_integer(value).filter(|n| !huge && (min..=max).contains(n))?;
            T::try_from(n).ok()
        };
        self.get(key, default, read, message)
    }

    /// Field `key` as one of `options` (by name), or `default` when it is missing.
    fn choice<T: Copy>(&self, key: &str, default: T, options: &[(&str, T)]) -> T {
        let quoted: Vec<String> = options
            .iter()
            .map(|(name, _)| format!("\"{name}\""))
            .collect();
        let mut message = format!("must be {}", quoted.join(", "));
        if let Some(at) = message.rfind(", ") {
            message.replace_range(at..at + 2, " or ");
        }
        let read = |v: &Value| options.iter().find(|(name, _)| v.as_str() == Some(name));
        self.get(key, default, |v| read(v).map(|(_, t)| *t), message)
    }

    /// Field `key` as a list of instance names (empty when absent), naming the first
    /// bad item by index.
    fn names(&self, key: &str) -> Vec<InstanceName> {
        self.read(key, Vec::new(), |value, path| {
            string_list(value, path, false)?
                .into_iter()
                .enumerate()
                .map(|(i, name)| {
                    InstanceName::new(name)
                        .or_else(|_| refuse(format!("{path}[{i}]"), "must be an instance name"))
                })
                .collect()
        })
    }

    /// Field `key`, an amount of US dollars that may be left out: missing or `null` is
    /// `None`, else a finite number `>= 0`.
    fn usd(&self, key: &str) -> Option<f64> {
        let read = |value: &Value| match value {
            Value::Null => Some(None),
            _ => value
                .as_f64()
                .filter(|usd| usd.is_finite() && *usd >= 0.0)
                .map(Some),
        };
        self.get(key, None, read, "must be a non-negative number")
    }
}

/// What a `bus` object without keys reads as ([`BusConfig::open`]): every field at its
/// default, the bus on.
pub(super) fn bus_defaults() -> BusConfig {
    parse_bus(&Section::new(&Map::new(), &BUS, &RefCell::default()))
}

/// The `bus` object; a missing key takes its default.
fn parse_bus(bus: &Section) -> BusConfig {
    let peers = bus.read("peers", Peers::Any, |value, path| match value {
        _ if *value == true || *value == "*" => Ok(Peers::Any),
        Value::Bool(false) => Ok(Peers::Only(Vec::new())),
        Value::Array(_) => Ok(Peers::Only(string_list(value, path, true)?)),
        _ => refuse(path, "must be \"*\", true, false or an array of names"),
    });
    // Fields are checked in this order.
    BusConfig {
        // Allowing nobody turns the bus off.
        enabled: peers != Peers::Only(Vec::new()),
        peers,
        max_depth: bus.int("maxDepth", DEFAULT_MAX_DEPTH, 1, u64::MAX),
        port: bus.int("port", 0, 0, u64::from(u16::MAX)),
        // An empty string is no secret (`Secret::new` refuses it): one is generated.
        secret: bus.get(
            "secret",
            None,
            |v| v.as_str().map(Secret::new),
            "must be a string",
        ),
        kind: bus.get(
            "kind",
            DEFAULT_KIND.to_owned(),
            non_empty_string,
            "must be a non-empty string",
        ),
        accept_kinds: bus.read(
            "acceptKinds",
            DEFAULT_ACCEPT_KINDS.map(str::to_owned).to_vec(),
            |kinds, path| string_list(kinds, path, true),
        ),
        max_concurrent_turns: bus.int(
            "maxConcurrentTurns",
            DEFAULT_MAX_CONCURRENT_TURNS,
            1,
            MAX_CONCURRENT_TURNS_LIMIT as u64,
        ),
        max_queued_turns: bus.int(
            "maxQueuedTurns",
            DEFAULT_MAX_QUEUED_TURNS,
            0,
            MAX_QUEUED_TURNS_LIMIT as u64,
        ),
        cancel_on_hangup: bus.get(
            "cancelOnHangup",
            true,
            Value::as_bool,
            "must be true or false",
        ),
        reattach_secs: bus.int("reattachSecs", DEFAULT_REATTACH_SECS, 0, MAX_REATTACH_SECS),
        parallel: bus.names("parallel"),
        chain: bus.names("chain"),
        verifier: bus.get(
            "verifier",
            None,
            |v| match v {
                Value::Null => Some(None),
                Value::String(s) => InstanceName::new(s.as_str()).ok().map(Some),
                _ => None,
            },
            "must be an instance name or null",
        ),
    }
}

fn parse_engine(engine: &Section) -> EngineConfig {
    // A preset gives the defaults of `command`, `prompt` and `output`; each key set
    // overrides its own.
    let presets = Preset::ALL.map(|p| (p.name(), Some(p)));
    let preset = engine.choice("preset", None, &presets);
    let defaults = match preset {
        Some(preset) => EngineConfig::from_preset(preset),
        None => EngineConfig::new(Vec::new()),
    };
    EngineConfig {
        command: match (engine.fields.get("command"), preset) {
            (None, Some(_)) => defaults.command,
            (command, _) => engine.ok(parse_command(command)).unwrap_or_default(),
        },
        prompt: engine.choice(
            "prompt",
            defaults.prompt,
            &[("stdin", PromptMode::Stdin), ("arg", PromptMode::Arg)],
        ),
        output: engine.choice(
            "output",
            defaults.output,
            &[
                OutputMode::Text,
                OutputMode::Json,
                OutputMode::CodexJsonl,
                OutputMode::GeminiJson,
            ]
            .map(|o| (o.as_str(), o)),
        ),
        timeout_secs: engine.int("timeoutSecs", defaults.timeout_secs, 1, u64::MAX),
        max_output_bytes: engine.int("maxOutputBytes", defaults.max_output_bytes, 1, u64::MAX),
        max_turn_cost_usd: engine.usd("maxTurnCostUsd"),
        cwd: engine.get(
            "cwd",
            None,
            |v| {
                non_empty_string(v)
                    .filter(|s| !s.contains('\0'))
                    .map(|s| Some(s.into()))
            },
            "must be a non-empty string",
        ),
        env: engine.read("env", BTreeMap::new(), |vars, _| parse_env(engine, vars)),
        preset,
    }
}

/// `engine.command`: a non-empty argv whose program name is not empty.
fn parse_command(value: Option<&Value>) -> Result<Vec<String>, Problem> {
    let path = "engine.command";
    let command = match value {
        None => return refuse(path, "is required (or set engine.preset)"),
        Some(value @ Value::Array(items)) if !items.is_empty() => string_list(value, path, false)?,
        Some(_) => return refuse(path, "must be a non-empty array of strings"),
    };
    if command.first().is_some_and(String::is_empty) {
        return refuse(format!("{path}[0]"), "must be a non-empty string");
    }
    // A NUL byte can't be passed to exec; say so now rather than at the first turn.
    match command.iter().position(|arg| arg.contains('\0')) {
        Some(i) => refuse(format!("{path}[{i}]"), "must not contain a NUL character"),
        None => Ok(command),
    }
}

/// `engine.env`: names that can be environment variables, string values. Each bad
/// variable is a problem of its own.
fn parse_env(engine: &Section, vars: &Value) -> Result<BTreeMap<String, String>, Problem> {
    let Value::Object(vars) = vars else {
        return refuse("engine.env", "must be an object of strings");
    };
    let var = |(name, value): (&String, &Value)| match value {
        _ if name.is_empty() || name.contains('=') || name.contains('\0') => refuse(
            "engine.env",
            "variable names must be non-empty, without '=' or NUL",
        ),
        Value::String(s) if !s.contains('\0') => Ok((name.clone(), s.clone())),
        _ => refuse(format!("engine.env.{name}"), "must be a string without NUL"),
    };
    Ok(vars.iter().filter_map(|v| engine.ok(var(v))).collect())
}

fn non_empty_string(value: &Value) -> Option<String> {
    value.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// `value` as a list of strings (non-empty ones if `non_empty`), naming the first bad
/// item by index.
fn string_list(value: &Value, path: &str, non_empty: bool) -> Result<Vec<String>, Problem> {
    let kind = if non_empty {
        "non-empty string"
    } else {
        "string"
    };
    let Value::Array(items) = value else {
        return refuse(path, format!("must be an array of {kind}s"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) if !(non_empty && s.is_empty()) => Ok(s.clone()),
            _ => refuse(format!("{path}[{i}]"), format!("must be a {kind}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::default_config_json;
    use crate::config::{DEFAULT_ENGINE_MAX_OUTPUT_BYTES, DEFAULT_ENGINE_TIMEOUT_SECS};
    use std::path::PathBuf;

    fn bus_defaults_enabled() -> BusConfig {
        BusConfig::open()
    }

    #[test]
    fn bus_forms() {
        let only = |names: &[&str]| Peers::Only(names.iter().map(|s| s.to_string()).collect());
        // (config, enabled, peers)
        let cases: &[(&str, bool, Peers)] = &[
            (r#"{}"#, false, Peers::Any),
            (r#"{"bus": null}"#, false, Peers::Any),
            (r#"{"bus": false}"#, false, Peers::Any),
            (r#"{"bus": 1}"#, false, Peers::Any),
            (r#"{"bus": "yes"}"#, false, Peers::Any),
            (r#"{"bus": [1]}"#, false, Peers::Any),
            (r#"{"bus": true}"#, true, Peers::Any),
            (r#"{"bus": {}}"#, true, Peers::Any),
            (r#"{"bus": {"peers": "*"}}"#, true, Peers::Any),
            (r#"{"bus": {"peers": true}}"#, true, Peers::Any),
            (r#"{"bus": {"peers": false}}"#, false, only(&[])),
            (r#"{"bus": {"peers": []}}"#, false, only(&[])),
            (r#"{"bus": {"peers": ["a", "b"]}}"#, true, only(&["a", "b"])),
        ];
        for (json, enabled, peers) in cases {
            let config = parse(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(config.bus.enabled, *enabled, "{json}");
            assert_eq!(&config.bus.peers, peers, "{json}");
        }
        let all_defaults = parse(br#"{"bus": true}"#).unwrap();
        assert_eq!(all_defaults.bus, bus_defaults_enabled());
        assert_eq!(all_defaults.budget_usd, None);
        assert_eq!(all_defaults.engine, None);
    }

    #[test]
    fn valid_fields() {
        let full = parse(
            br#"{
              "bus": {
                "peers": ["reviewer"], "maxDepth": 5.0, "port": 65535, "secret": "s3cret",
                "kind": "other", "acceptKinds": ["x"], "maxConcurrentTurns": 64,
                "maxQueuedTurns": 0, "cancelOnHangup": false, "reattachSecs": 600,
                "parallel": ["a", "b.2"], "chain": ["b"], "verifier": "v",
                "crew": {"written": ["by the original implementation"]}
              },
              "budgetUsd": 1.5,
              "engine": {
                "command": ["claude", "-p"], "prompt": "arg", "output": "json",
                "timeoutSecs": 60, "maxOutputBytes": 10, "maxTurnCostUsd": 0.25,
                "cwd": "/tmp", "env": {"A": "1", "B": "", "any name": "x"}
              }
            }"#,
        )
        .unwrap();
        let bus = &full.bus;
        assert!(bus.enabled);
        assert!(bus.peers.allows("reviewer") && !bus.peers.allows("other"));
        assert_eq!(bus.max_depth, 5);
        assert_eq!(bus.port, 65535);
        assert_eq!(bus.secret.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(bus.kind, "other");
        assert_eq!(bus.accept_kinds, ["x"]);
        assert_eq!(bus.max_concurrent_turns, 64);
        assert_eq!(bus.max_queued_turns, 0);
        assert!(!bus.cancel_on_hangup);
        assert_eq!(bus.reattach_secs, MAX_REATTACH_SECS);
        let names = |list: &[InstanceName]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&bus.parallel), ["a", "b.2"]);
        assert_eq!(names(&bus.chain), ["b"]);
        assert_eq!(bus.verifier.as_ref().map(InstanceName::as_str), Some("v"));
        assert_eq!(full.budget_usd, Some(1.5));
        let engine = full.engine.unwrap();
        assert_eq!(engine.command, ["claude", "-p"]);
        assert_eq!(engine.prompt, PromptMode::Arg);
        assert_eq!(engine.output, OutputMode::Json);
        assert_eq!(engine.timeout_secs, 60);
        assert_eq!(engine.max_output_bytes, 10);
        assert_eq!(engine.max_turn_cost_usd, Some(0.25));
        assert_eq!(engine.cwd, Some(PathBuf::from("/tmp")));
        assert_eq!(engine.env.get("B").map(String::as_str), Some(""));

        let minimal = parse(br#"{"engine": {"command": ["cat"]}, "budgetUsd": 0}"#).unwrap();
        assert_eq!(minimal.budget_usd, Some(0.0));
        let engine = minimal.engine.unwrap();
        assert_eq!(engine.prompt, PromptMode::Stdin);
        assert_eq!(engine.output, OutputMode::Text);
        assert_eq!(engine.timeout_secs, DEFAULT_ENGINE_TIMEOUT_SECS);
        assert_eq!(engine.max_output_bytes, DEFAULT_ENGINE_MAX_OUTPUT_BYTES);
        assert_eq!(engine.max_turn_cost_usd, None);
        assert_eq!(engine.cwd, None);
        assert!(engine.env.is_empty());

        type Check = fn(&Config) -> bool;
        let cases: &[(&str, Check)] = &[
            (r#"{"bus": {"maxDepth": 1}}"#, |c| c.bus.max_depth == 1),
            (r#"{"bus": {"maxDepth": 1.0}}"#, |c| c.bus.max_depth == 1),
            (r#"{"bus": {"port": 0}}"#, |c| c.bus.port == 0),
            (r#"{"bus": {"secret": ""}}"#, |c| c.bus.secret.is_none()),
            (r#"{"bus": {}}"#, |c| c.bus.secret.is_none()),
            (r#"{"bus": {"acceptKinds": []}}"#, |c| {
                c.bus.accept_kinds.is_empty()
            }),
            (r#"{"bus": {"maxConcurrentTurns": 1}}"#, |c| {
                c.bus.max_concurrent_turns == 1
            }),
            (r#"{"bus": {"maxQueuedTurns": 1024}}"#, |c| {
                c.bus.max_queued_turns == 1024
            }),
            (r#"{"bus": {}}"#, |c| {
                c.bus.cancel_on_hangup && c.bus.reattach_secs == DEFAULT_REATTACH_SECS
            }),
            (r#"{"bus": {"reattachSecs": 0}}"#, |c| {
                c.bus.reattach_secs == 0
            }),
            (r#"{"bus": {"cancelOnHangup": true}}"#, |c| {
                c.bus.cancel_on_hangup
            }),
            (
                r#"{"engine": {"command": ["a"], "maxTurnCostUsd": 0}}"#,
                |c| c.engine.as_ref().and_then(|e| e.max_turn_cost_usd) == Some(0.0),
            ),
            (
                r#"{"engine": {"command": ["a"], "maxTurnCostUsd": null}}"#,
                |c| {
                    c.engine
                        .as_ref()
                        .is_some_and(|e| e.max_turn_cost_usd.is_none())
                },
            ),
            (r#"{"bus": {"verifier": null}}"#, |c| {
                c.bus.verifier.is_none()
            }),
            (r#"{"budgetUsd": null}"#, |c| c.budget_usd.is_none()),
            (r#"{"engine": null}"#, |c| c.engine.is_none()),
            (r#"{"bus": false, "budgetUsd": 2}"#, |c| {
                c.budget_usd == Some(2.0)
            }),
        ];
        for (json, check) in cases {
            let config = parse(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert!(check(&config), "{json}: {config:?}");
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        // (the `bus` object, field, words the message must contain)
        let bus: &[(&str, &str, &str)] = &[
            (r#"{"peers": "all"}"#, "bus.peers", "must be"),
            (r#"{"peers": null}"#, "bus.peers", "must be"),
            (r#"{"peers": 1}"#, "bus.peers", "must be"),
            (r#"{"peers": ["a", 1]}"#, "bus.peers[1]", "non-empty string"),
            (r#"{"peers": [""]}"#, "bus.peers[0]", "non-empty string"),
            (
                r#"{"maxDepth": 0}"#,
                "bus.maxDepth",
                "must be a positive integer",
            ),
            (r#"{"maxDepth": -1}"#, "bus.maxDepth", "positive integer"),
            (r#"{"maxDepth": 1.5}"#, "bus.maxDepth", "positive integer"),
            (r#"{"maxDepth": "3"}"#, "bus.maxDepth", "positive integer"),
            (r#"{"maxDepth": null}"#, "bus.maxDepth", "positive integer"),
            (r#"{"maxDepth": 1e30}"#, "bus.maxDepth", "positive integer"),
            (r#"{"port": 65536}"#, "bus.port", "0 to 65535"),
            (r#"{"port": -1}"#, "bus.port", "0 to 65535"),
            (r#"{"port": 80.5}"#, "bus.port", "0 to 65535"),
            (r#"{"port": "80"}"#, "bus.port", "0 to 65535"),
            (r#"{"secret": 42}"#, "bus.secret", "must be a string"),
            (r#"{"secret": null}"#, "bus.secret", "must be a string"),
            (r#"{"kind": ""}"#, "bus.kind", "non-empty string"),
            (r#"{"kind": 1}"#, "bus.kind", "non-empty string"),
            (r#"{"acceptKinds": "loopbus"}"#, "bus.acceptKinds", "array"),
            (
                r#"{"acceptKinds": [""]}"#,
                "bus.acceptKinds[0]",
                "non-empty",
            ),
            (
                r#"{"maxConcurrentTurns": 0}"#,
                "bus.maxConcurrentTurns",
                "1 to 64",
            ),
            (
                r#"{"maxConcurrentTurns": 65}"#,
                "bus.maxConcurrentTurns",
                "1 to 64",
            ),
            (
                r#"{"maxQueuedTurns": -1}"#,
                "bus.maxQueuedTurns",
                "0 to 1024",
            ),
            (
                r#"{"maxQueuedTurns": 1025}"#,
                "bus.maxQueuedTurns",
                "0 to 1024",
            ),
            (
                r#"{"cancelOnHangup": "yes"}"#,
                "bus.cancelOnHangup",
                "true or false",
            ),
            (
                r#"{"cancelOnHangup": null}"#,
                "bus.cancelOnHangup",
                "true or false",
            ),
            (r#"{"reattachSecs": -1}"#, "bus.reattachSecs", "0 to 600"),
            (r#"{"reattachSecs": 601}"#, "bus.reattachSecs", "0 to 600"),
            (r#"{"reattachSecs": 1.5}"#, "bus.reattachSecs", "0 to 600"),
            (r#"{"reattachSecs": "15"}"#, "bus.reattachSecs", "0 to 600"),
            (r#"{"parallel": "a"}"#, "bus.parallel", "array of strings"),
            (r#"{"chain": [null]}"#, "bus.chain[0]", "must be a string"),
            (
                r#"{"verifier": 1}"#,
                "bus.verifier",
                "instance name or null",
            ),
            (
                r#"{"verifier": "a b"}"#,
                "bus.verifier",
                "instance name or null",
            ),
            (
                r#"{"parallel": ["a", ""]}"#,
                "bus.parallel[1]",
                "instance name",
            ),
            (r#"{"chain": ["-x"]}"#, "bus.chain[0]", "instance name"),
            // An invalid field is an error even when the bus is off.
            (r#"{"peers": false, "port": -1}"#, "bus.port", "0 to 65535"),
        ];
        // (the `engine` object, field, words the message must contain)
        let engine: &[(&str, &str, &str)] = &[
            (r#"{}"#, "engine.command", "is required"),
            (r#"{"command": []}"#, "engine.command", "non-empty array"),
            (
                r#"{"command": "claude"}"#,
                "engine.command",
                "non-empty array",
            ),
            (
                r#"{"command": [""]}"#,
                "engine.command[0]",
                "non-empty string",
            ),
            (
                r#"{"command": ["a", 2]}"#,
                "engine.command[1]",
                "must be a string",
            ),
            (r#"{"command": ["a\u0000"]}"#, "engine.command[0]", "NUL"),
            (
                r#"{"command": ["a"], "prompt": "file"}"#,
                "engine.prompt",
                "stdin",
            ),
            (
                r#"{"command": ["a"], "prompt": null}"#,
                "engine.prompt",
                "stdin",
            ),
            (
                r#"{"command": ["a"], "output": "xml"}"#,
                "engine.output",
                "json",
            ),
            (
                r#"{"command": ["a"], "timeoutSecs": 0}"#,
                "engine.timeoutSecs",
                "positive",
            ),
            (
                r#"{"command": ["a"], "timeoutSecs": 2.5}"#,
                "engine.timeoutSecs",
                "positive",
            ),
            (
                r#"{"command": ["a"], "maxOutputBytes": 0}"#,
                "engine.maxOutputBytes",
                "positive",
            ),
            (
                r#"{"command": ["a"], "maxTurnCostUsd": -1}"#,
                "engine.maxTurnCostUsd",
                "non-negative number",
            ),
            (
                r#"{"command": ["a"], "maxTurnCostUsd": "0.5"}"#,
                "engine.maxTurnCostUsd",
                "non-negative number",
            ),
            (r#"{"command": ["a"], "cwd": 1}"#, "engine.cwd", "string"),
            (r#"{"command": ["a"], "cwd": ""}"#, "engine.cwd", "string"),
            (r#"{"command": ["a"], "env": []}"#, "engine.env", "object"),
            (
                r#"{"command": ["a"], "env": {"K": 1}}"#,
                "engine.env.K",
                "string",
            ),
            (
                r#"{"command": ["a"], "env": {"A=B": "x"}}"#,
                "engine.env",
                "names",
            ),
        ];
        // (the whole file, field, words the message must contain)
        let top: &[(&str, &str, &str)] = &[
            (
                r#"{"budgetUsd": -0.01}"#,
                "budgetUsd",
                "non-negative number",
            ),
            (r#"{"budgetUsd": "1"}"#, "budgetUsd", "non-negative number"),
            (r#"{"engine": true}"#, "engine", "object or null"),
            (r#"{"engine": ["cat"]}"#, "engine", "object or null"),
        ];

        let cases = bus
            .iter()
            .map(|(j, f, m)| (format!(r#"{{"bus": {j}}}"#), *f, *m))
            .chain(
                engine
                    .iter()
                    .map(|(j, f, m)| (format!(r#"{{"engine": {j}}}"#), *f, *m)),
            )
            .chain(top.iter().map(|(j, f, m)| (j.to_string(), *f, *m)));
        for (json, field, message) in cases {
            let err = parse(json.as_bytes()).expect_err(&json);
            assert_eq!(err.field(), Some(field), "{json}");
            let shown = err.to_string();
            let prefix = format!("config.json: {field}: ");
            assert!(shown.starts_with(&prefix), "{json}: {shown}");
            assert!(shown.contains(message), "{json}: {shown}");
        }
    }

    /// Each of these typos used to load, with a wider access or a lost limit: `peer`
    /// left `peers` at `"*"`, `budgetUSD` meant no budget, `maxdepth` meant 3.
    /// A preset fills in the command, the prompt mode and the parser; each key set
    /// overrides its own, and `engine.command` keeps the preset's parser.
    #[test]
    fn engine_presets() {
        let engine = |json: &str| {
            parse(format!(r#"{{"engine": {json}}}"#).as_bytes())
                .unwrap()
                .engine
                .unwrap()
        };
        // (engine object, command, prompt, output)
        let rows: &[(&str, &[&str], PromptMode, OutputMode)] = &[
            (
                r#"{"preset": "claude"}"#,
                &["claude", "-p", "--output-format", "json"],
                PromptMode::Stdin,
                OutputMode::Json,
            ),
            (
                r#"{"preset": "codex"}"#,
                &["codex", "exec", "--json", "--skip-git-repo-check", "-"],
                PromptMode::Stdin,
                OutputMode::CodexJsonl,
            ),
            (
                r#"{"preset": "gemini"}"#,
                &["gemini", "--output-format", "json", "-p"],
                PromptMode::Arg,
                OutputMode::GeminiJson,
            ),
            (
                r#"{"preset": "gemini", "command": ["/opt/gemini", "-p"]}"#,
                &["/opt/gemini", "-p"],
                PromptMode::Arg,
                OutputMode::GeminiJson,
            ),
            (
                r#"{"preset": "codex", "output": "text", "prompt": "arg"}"#,
                &["codex", "exec", "--json", "--skip-git-repo-check", "-"],
                PromptMode::Arg,
                OutputMode::Text,
            ),
            (
                r#"{"command": ["x"], "output": "codex-jsonl"}"#,
                &["x"],
                PromptMode::Stdin,
                OutputMode::CodexJsonl,
            ),
            (
                r#"{"command": ["x"], "output": "gemini-json"}"#,
                &["x"],
                PromptMode::Stdin,
                OutputMode::GeminiJson,
            ),
        ];
        for (json, command, prompt, output) in rows {
            let e = engine(json);
            assert_eq!(e.command, *command, "{json}");
            assert_eq!((e.prompt, e.output), (*prompt, *output), "{json}");
        }
        assert_eq!(engine(r#"{"preset": "codex"}"#).preset, Some(Preset::Codex));
        assert_eq!(engine(r#"{"command": ["codex"]}"#).preset, None);
        // A bad preset or a bad command next to one is still an error naming the key.
        for (json, field) in [
            (r#"{"preset": "Claude"}"#, "engine.preset"),
            (r#"{"preset": 1}"#, "engine.preset"),
            (r#"{"preset": "claude", "command": []}"#, "engine.command"),
        ] {
            let err = parse(format!(r#"{{"engine": {json}}}"#).as_bytes()).unwrap_err();
            assert_eq!(err.field(), Some(field), "{json}");
        }
    }

    #[test]
    fn bug_a_typo_in_a_key_widened_access_or_dropped_a_limit() {
        let cases = [
            (
                r#"{"bus": {"peer": ["a"]}}"#,
                "bus.peer",
                "config.json: unknown key bus.peer; did you mean bus.peers?",
            ),
            (
                r#"{"bus": true, "budgetUSD": 1}"#,
                "budgetUSD",
                "config.json: unknown key budgetUSD; did you mean budgetUsd?",
            ),
            (
                r#"{"bus": {"maxdepth": 1}}"#,
                "bus.maxdepth",
                "config.json: unknown key bus.maxdepth; did you mean bus.maxDepth?",
            ),
            (
                r#"{"engine": {"command": ["a"], "maxOutputbytes": 1}}"#,
                "engine.maxOutputbytes",
                "config.json: unknown key engine.maxOutputbytes; did you mean engine.maxOutputBytes?",
            ),
            (
                r#"{"engine": {"command": ["a"], "preset": "claude-code"}}"#,
                "engine.preset",
                "config.json: engine.preset: must be \"claude\", \"codex\" or \"gemini\"",
            ),
            // Checked in a disabled bus too, and before the values.
            (
                r#"{"bus": {"peers": false, "prot": 1}}"#,
                "bus.prot",
                "config.json: unknown key bus.prot; did you mean bus.port?",
            ),
            (
                r#"{"bus": {"maxDepth": "x", "secert": "s"}}"#,
                "bus.secert",
                "config.json: unknown key bus.secert; did you mean bus.secret?\n\
                 config.json: bus.maxDepth: must be a positive integer",
            ),
        ];
        for (json, field, want) in cases {
            let err = parse(json.as_bytes()).expect_err(json);
            assert_eq!(err.field(), Some(field), "{json}");
            assert_eq!(err.to_string(), want, "{json}");
        }
        // Not a key the bus is off for: a `bus` that is not an object has no keys.
        assert!(!parse(br#"{"bus": "yes"}"#).unwrap().bus.enabled);
    }

    /// The messages spell the bounds out; they must be the constants'.
    #[test]
    fn messages_name_the_bounds_in_force() {
        let cases = [
            (
                "reattachSecs",
                MAX_REATTACH_SECS + 1,
                format!("0 to {MAX_REATTACH_SECS}"),
            ),
            (
                "maxQueuedTurns",
                MAX_QUEUED_TURNS_LIMIT as u64 + 1,
                format!("0 to {MAX_QUEUED_TURNS_LIMIT}"),
            ),
            (
                "maxConcurrentTurns",
                MAX_CONCURRENT_TURNS_LIMIT as u64 + 1,
                format!("1 to {MAX_CONCURRENT_TURNS_LIMIT}"),
            ),
        ];
        for (key, value, words) in cases {
            let json = format!(r#"{{"bus": {{"{key}": {value}}}}}"#);
            let err = parse(json.as_bytes()).unwrap_err();
            assert!(err.to_string().ends_with(&words), "{json}: {err}");
        }
    }

    #[test]
    fn bug_a_config_with_several_mistakes_showed_one_per_run() {
        let json = br#"{"budgetUSD": 1, "bus": {"peer": "*", "maxDepth": "x", "port": -1},
            "engine": {"command": ["claude"], "timeoutSecs": "long", "cwdd": "/"}}"#;
        let err = parse(json).unwrap_err();
        let lines: Vec<String> = err.to_string().lines().map(str::to_owned).collect();
        let want = [
            "config.json: unknown key budgetUSD; did you mean budgetUsd?",
            "config.json: unknown key bus.peer; did you mean bus.peers?",
            "bus.maxDepth",
            "bus.port",
            "config.json: unknown key engine.cwdd; did you mean engine.cwd?",
            "engine.timeoutSecs",
        ];
        assert_eq!(lines.len(), want.len(), "{err}");
        for (line, want) in lines.iter().zip(want) {
            assert!(line.starts_with("config.json: "), "{line}");
            assert!(line.contains(want), "{line} should name {want}");
        }
        assert_eq!(err.field(), Some("budgetUSD"));
        // Bounded: a generated file with a hundred wrong keys gets MAX_CONFIG_PROBLEMS.
        let many: Vec<String> = (0..100).map(|i| format!("\"k{i}\": 1")).collect();
        let json = format!("{{{}}}", many.join(","));
        let err = parse(json.as_bytes()).unwrap_err();
        assert_eq!(err.to_string().lines().count(), MAX_CONFIG_PROBLEMS);
    }

    #[test]
    fn whole_file_errors() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"",
                "config.json: not valid JSON at line 1 column 0: EOF while parsing a value",
            ),
            (
                b"{\n  \"bus\": {\n    x}",
                "config.json: not valid JSON at line 3 column 5: key must be a string",
            ),
            (
                b"\xff",
                "config.json: not valid JSON at line 1 column 1: expected value",
            ),
            (
                b"{\"bus\": true,\n}",
                "config.json: not valid JSON at line 2 column 1: trailing comma",
            ),
            (b"[]", "config.json: must be a JSON object"),
            (b"null", "config.json: must be a JSON object"),
            (b"\"bus\"", "config.json: must be a JSON object"),
        ];
        for (bytes, want) in cases {
            let err = parse(bytes).unwrap_err();
            assert_eq!(err.to_string(), *want);
            assert_eq!(err.field(), None);
        }
    }

    #[test]
    fn errors_never_echo_the_secret() {
        let err = parse(br#"{"bus": {"secret": "hunter2", "maxDepth": "hunter2"}}"#).unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
        assert!(!format!("{err:?}").contains("hunter2"));
        let config = parse(br#"{"bus": {"secret": "hunter2"}}"#).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn engine_debug_hides_env_values() {
        let config =
            parse(br#"{"engine": {"command": ["x"], "env": {"API_KEY": "sk-123"}}}"#).unwrap();
        let shown = format!("{:?}", config.engine);
        assert!(shown.contains("API_KEY"), "{shown}");
        assert!(!shown.contains("sk-123"), "{shown}");
    }

    #[test]
    fn default_config_round_trips() {
        let secret = Secret::new("ab\"c\\d").unwrap();
        let json = default_config_json(Some(&secret));
        let config = parse(json.as_bytes()).unwrap();
        let without = parse(default_config_json(None).as_bytes()).unwrap();
        assert_eq!(without.bus, bus_defaults_enabled());
        assert_eq!(
            config.bus,
            BusConfig {
                secret: Some(secret),
                ..bus_defaults_enabled()
            }
        );
        assert!(
            json.starts_with("{\n  \"bus\": {\n    \"peers\": \"*\",\n"),
            "{json}"
        );
    }
}
