//! The settings `loopbus init` writes: parsed from its flags (`--engine`, `--peers`,
//! `--budget`, `--port`, `--kind`, a new secret), and applied onto a config.json's JSON
//! so that every key no flag names stays as it was (`init --force` keeps an engine, a
//! budget and peers it was not told to change).

use crate::cli::{usage, UsageError};
use loopbus::{InstanceName, Secret, DEFAULT_ACCEPT_KINDS, DEFAULT_MAX_DEPTH};
use serde_json::{json, Map, Value};

/// The engines `--engine` knows by name: the preset, its argv, and its
/// `engine.output`. Any other `--engine` value is a command line, split on whitespace.
/// (`echo`, the built-in engine, is no command: it removes `engine`.)
///
/// - `claude`: Claude Code's print mode; its JSON result carries the reply and the cost.
/// - `codex`: Codex's non-interactive mode: `-` reads the prompt from stdin, the final
///   message is its stdout (progress goes to stderr), it runs in Codex's default
///   read-only sandbox, and `--skip-git-repo-check` lets it run outside a git
///   repository. Its text output reports no cost for `budgetUsd` to count.
pub const ENGINE_PRESETS: &[(&str, &[&str], &str)] = &[
    (
        "claude",
        &["claude", "-p", "--output-format", "json"],
        "json",
    ),
    (
        "codex",
        &["codex", "exec", "--skip-git-repo-check", "-"],
        "text",
    ),
];

/// The `--engine` value that means the built-in echo engine.
pub const ECHO_PRESET: &str = "echo";

/// Which engine `--engine` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineChoice {
    /// The built-in echo engine: no `engine` key.
    Echo,
    /// This argv, read as this `engine.output`.
    Command {
        /// The argv.
        command: Vec<String>,
        /// `"json"` or `"text"`.
        output: &'static str,
    },
}

impl EngineChoice {
    /// A preset's name or a command line.
    ///
    /// # Errors
    /// The value is empty or blank.
    pub fn parse(text: &str) -> Result<EngineChoice, UsageError> {
        if text == ECHO_PRESET {
            return Ok(EngineChoice::Echo);
        }
        if let Some((_, argv, output)) = ENGINE_PRESETS.iter().find(|(name, ..)| *name == text) {
            return Ok(EngineChoice::Command {
                command: argv.iter().map(|a| (*a).to_owned()).collect(),
                output,
            });
        }
        let command: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
        if command.is_empty() {
            return Err(usage(
                "`--engine` must be echo, claude, codex, or a command line such as \
                 `my-engine --flag`",
            ));
        }
        Ok(EngineChoice::Command {
            command,
            output: "text",
        })
    }
}

/// Who `--peers` lets call the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeersChoice {
    /// `*`: every caller.
    Any,
    /// These names only.
    Only(Vec<InstanceName>),
}

impl PeersChoice {
    /// `*`, or names separated by commas.
    ///
    /// # Errors
    /// An empty list (which would disable the bus), or a name that is not valid.
    pub fn parse(text: &str) -> Result<PeersChoice, UsageError> {
        if text.trim() == "*" {
            return Ok(PeersChoice::Any);
        }
        let names = text
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| InstanceName::new(n).map_err(|e| usage(format!("`--peers`: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if names.is_empty() {
            return Err(usage(
                "`--peers` must be `*` or instance names separated by commas (an empty list \
                 would disable the bus)",
            ));
        }
        Ok(PeersChoice::Only(names))
    }

    fn to_json(&self) -> Value {
        match self {
            PeersChoice::Any => json!("*"),
            PeersChoice::Only(names) => names.iter().map(|n| json!(n.as_str())).collect(),
        }
    }
}

/// `--budget USD`: a finite non-negative number, or `none` to remove `budgetUsd`.
///
/// # Errors
/// Anything else.
pub fn parse_budget(text: &str) -> Result<Option<f64>, UsageError> {
    if text == "none" {
        return Ok(None);
    }
    text.parse::<f64>()
        .ok()
        .filter(|usd| usd.is_finite() && *usd >= 0.0)
        .map(Some)
        .ok_or_else(|| usage("`--budget` must be a non-negative number of USD, or `none`"))
}

/// What `init` sets; `None` leaves a key as it is.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `--engine`.
    pub engine: Option<EngineChoice>,
    /// `--peers`.
    pub peers: Option<PeersChoice>,
    /// `--budget`: `Some(None)` removes `budgetUsd`.
    pub budget: Option<Option<f64>>,
    /// `--port`.
    pub port: Option<u16>,
    /// `--kind`.
    pub kind: Option<String>,
    /// A new fixed `bus.secret` (`--fixed-secret` where none is set, `--rotate-secret`).
    pub secret: Option<Secret>,
}

/// The `bus` object of a new config: every peer allowed, the default depth, an
/// OS-chosen port.
fn default_bus() -> Map<String, Value> {
    let mut bus = Map::new();
    bus.insert("peers".to_owned(), json!("*"));
    bus.insert("maxDepth".to_owned(), json!(DEFAULT_MAX_DEPTH));
    bus.insert("port".to_owned(), json!(0));
    bus
}

/// A new config.json's object: the default bus, nothing else (the echo engine, no
/// budget).
pub fn new_config() -> Map<String, Value> {
    let mut config = Map::new();
    config.insert("bus".to_owned(), Value::Object(default_bus()));
    config
}

impl Settings {
    /// Whether a setting of the `bus` object is given.
    fn touches_bus(&self) -> bool {
        self.peers.is_some() || self.port.is_some() || self.kind.is_some() || self.secret.is_some()
    }

    /// Writes these settings into `config`, leaving every other key as it is. A `bus`
    /// that is no object (`true`, or a disabled bus) is replaced by the default one
    /// only when a bus setting is given.
    pub fn apply(&self, config: &mut Map<String, Value>) {
        if self.touches_bus() && !config.get("bus").is_some_and(Value::is_object) {
            config.insert("bus".to_owned(), Value::Object(default_bus()));
        }
        if let Some(Value::Object(bus)) = config.get_mut("bus") {
            self.apply_to_bus(bus);
        }
        match &self.budget {
            Some(Some(usd)) => {
                // A finite number (parse_budget) always has a JSON form.
                if let Some(number) = serde_json::Number::from_f64(*usd) {
                    config.insert("budgetUsd".to_owned(), Value::Number(number));
                }
            }
            Some(None) => {
                config.remove("budgetUsd");
            }
            None => {}
        }
        match &self.engine {
            Some(EngineChoice::Echo) => {
                config.remove("engine");
            }
            Some(EngineChoice::Command { command, output }) => {
                let engine = config
                    .entry("engine")
                    .or_insert_with(|| Value::Object(Map::new()));
                if !engine.is_object() {
                    *engine = Value::Object(Map::new());
                }
                if let Value::Object(engine) = engine {
                    engine.insert("command".to_owned(), json!(command));
                    if *output == "text" {
                        engine.remove("output"); // the default
                    } else {
                        engine.insert("output".to_owned(), json!(output));
                    }
                }
            }
            None => {}
        }
    }

    fn apply_to_bus(&self, bus: &mut Map<String, Value>) {
        if let Some(peers) = &self.peers {
            bus.insert("peers".to_owned(), peers.to_json());
        }
        if let Some(port) = self.port {
            bus.insert("port".to_owned(), json!(port));
        }
        if let Some(secret) = &self.secret {
            bus.insert("secret".to_owned(), json!(secret.expose()));
        }
        if let Some(kind) = &self.kind {
            bus.insert("kind".to_owned(), json!(kind));
            // The kind's own instances and both default kinds stay accepted: an
            // instance of kind cc-telegram-bridge is found by the original's client and
            // still finds loopbus peers.
            let accept = bus.entry("acceptKinds").or_insert_with(|| {
                DEFAULT_ACCEPT_KINDS
                    .iter()
                    .map(|k| json!(k))
                    .collect::<Value>()
            });
            if let Value::Array(kinds) = accept {
                if !kinds.iter().any(|k| k == kind.as_str()) {
                    kinds.push(json!(kind));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_choices() {
        assert_eq!(EngineChoice::parse("echo").unwrap(), EngineChoice::Echo);
        assert_eq!(
            EngineChoice::parse("claude").unwrap(),
            EngineChoice::Command {
                command: vec![
                    "claude".into(),
                    "-p".into(),
                    "--output-format".into(),
                    "json".into()
                ],
                output: "json"
            }
        );
        assert_eq!(
            EngineChoice::parse("codex").unwrap(),
            EngineChoice::Command {
                command: vec![
                    "codex".into(),
                    "exec".into(),
                    "--skip-git-repo-check".into(),
                    "-".into()
                ],
                output: "text"
            }
        );
        assert_eq!(
            EngineChoice::parse(" my-engine  --fast ").unwrap(),
            EngineChoice::Command {
                command: vec!["my-engine".into(), "--fast".into()],
                output: "text"
            }
        );
        assert!(EngineChoice::parse("  ").is_err());
    }

    #[test]
    fn peers_choices() {
        assert_eq!(PeersChoice::parse("*").unwrap(), PeersChoice::Any);
        let PeersChoice::Only(names) = PeersChoice::parse("a, b,").unwrap() else {
            panic!("a list")
        };
        assert_eq!(
            names.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        for bad in ["", ",", "a b", "-x"] {
            assert!(PeersChoice::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn budgets() {
        assert_eq!(parse_budget("1.20").unwrap(), Some(1.2));
        assert_eq!(parse_budget("none").unwrap(), None);
        for bad in ["-1", "NaN", "inf", "x", ""] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_keys_given_change() {
        let mut config: Map<String, Value> = serde_json::from_value(json!({
            "bus": {"peers": ["a"], "maxDepth": 5, "secret": "s"},
            "budgetUsd": 2.5,
            "engine": {"command": ["x"], "timeoutSecs": 10, "output": "json"}
        }))
        .unwrap();
        let before = config.clone();
        Settings::default().apply(&mut config);
        assert_eq!(config, before);
        Settings {
            engine: Some(EngineChoice::parse("y --z").unwrap()),
            port: Some(7701),
            ..Settings::default()
        }
        .apply(&mut config);
        let config = Value::Object(config);
        assert_eq!(
            config["bus"],
            json!({"peers": ["a"], "maxDepth": 5, "secret": "s", "port": 7701})
        );
        assert_eq!(config["budgetUsd"], json!(2.5));
        assert_eq!(
            config["engine"],
            json!({"command": ["y", "--z"], "timeoutSecs": 10})
        );
    }

    #[test]
    fn a_bus_setting_on_a_bus_that_is_no_object_starts_from_the_default() {
        for bus in [json!(true), json!(false), json!(null)] {
            let mut config: Map<String, Value> =
                serde_json::from_value(json!({ "bus": bus })).unwrap();
            Settings {
                kind: Some("other".to_owned()),
                ..Settings::default()
            }
            .apply(&mut config);
            assert_eq!(config["bus"]["peers"], "*");
            assert_eq!(
                config["bus"]["acceptKinds"],
                json!(["loopbus", "cc-telegram-bridge", "other"])
            );
        }
    }
}
