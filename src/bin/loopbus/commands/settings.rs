//! The settings `loopbus init` writes: parsed from its flags (`--engine`, `--peers`,
//! `--budget`, `--port`, `--kind`, a new secret), and applied onto a config.json's JSON
//! so that every key no flag names stays as it was (`init --force` keeps an engine, a
//! budget and peers it was not told to change).

use crate::cli::{usage, UsageError};
use loopbus::{InstanceName, Preset, Secret, DEFAULT_ACCEPT_KINDS, DEFAULT_MAX_DEPTH};
use serde_json::{json, Map, Value};

/// The `--engine` value that means the built-in echo engine.
pub const ECHO_PRESET: &str = "echo";

/// Which engine `--engine` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineChoice {
    /// The built-in echo engine: no `engine` key.
    Echo,
    /// `engine.preset`, with `engine.command` when the CLI was given by path
    /// (`codex=/opt/codex`) or as a command line whose program is the CLI
    /// (`/opt/claude -p --output-format json`): either way the preset's parser reads it.
    Preset {
        /// The preset.
        preset: Preset,
        /// `engine.command`, or `None` for the preset's own.
        command: Option<Vec<String>>,
    },
    /// A command line that is no preset's CLI: its stdout is the reply.
    Command(Vec<String>),
}

impl EngineChoice {
    /// `echo`, a preset's name (`claude`, `codex`, `gemini`), `NAME=PATH` (the preset
    /// with its CLI at PATH), or a command line split on whitespace. A command line
    /// whose program's file name is a preset's CLI takes that preset.
    ///
    /// # Errors
    /// The value is empty or blank, or `NAME=` has no path.
    pub fn parse(text: &str) -> Result<EngineChoice, UsageError> {
        if text == ECHO_PRESET {
            return Ok(EngineChoice::Echo);
        }
        if let Some(preset) = Preset::from_name(text) {
            return Ok(EngineChoice::Preset {
                preset,
                command: None,
            });
        }
        let with_path = |preset: Preset, path: &str| EngineChoice::Preset {
            preset,
            command: Some(
                std::iter::once(path)
                    .chain(preset.command().iter().skip(1).copied())
                    .map(str::to_owned)
                    .collect(),
            ),
        };
        if let Some((name, path)) = text.split_once('=') {
            if let Some(preset) = Preset::from_name(name) {
                if path.trim().is_empty() {
                    return Err(usage(format!(
                        "`--engine {name}=PATH` needs the path of the {name} CLI"
                    )));
                }
                return Ok(with_path(preset, path));
            }
        }
        let command: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
        let Some(program) = command.first() else {
            return Err(usage(
                "`--engine` must be echo, claude, codex, gemini, NAME=PATH, or a command line \
                 such as `my-engine --flag`",
            ));
        };
        let file_name = std::path::Path::new(program)
            .file_name()
            .and_then(|n| n.to_str());
        match file_name.and_then(Preset::from_name) {
            Some(preset) if command.iter().eq(preset.command()) => Ok(EngineChoice::Preset {
                preset,
                command: None,
            }),
            Some(preset) if command.len() == 1 => Ok(with_path(preset, program)),
            Some(preset) => Ok(EngineChoice::Preset {
                preset,
                command: Some(command),
            }),
            None => Ok(EngineChoice::Command(command)),
        }
    }

    /// What to tell the user about this choice: a preset's CLI given with arguments
    /// other than the preset's is still read by the preset's parser.
    pub fn note(&self) -> Option<String> {
        let EngineChoice::Preset {
            preset,
            command: Some(command),
        } = self
        else {
            return None;
        };
        let args = command.iter().skip(1).map(String::as_str);
        if args.eq(preset.command().iter().skip(1).copied()) {
            return None;
        }
        let name = preset.name();
        Some(format!(
            "`{}` is the {name} CLI, so engine.preset \"{name}\" reads its output as \
             engine.output \"{}\" (what `{}` prints); these arguments differ from the \
             preset's: check that they print the same (for plain text output, set \
             \"output\": \"text\" in config.json)",
            command[0],
            preset.output().as_str(),
            preset.command().join(" ")
        ))
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
        let engine = match &self.engine {
            None => return,
            Some(EngineChoice::Echo) => {
                config.remove("engine");
                return;
            }
            Some(_) => config
                .entry("engine")
                .or_insert_with(|| Value::Object(Map::new())),
        };
        if !engine.is_object() {
            *engine = Value::Object(Map::new());
        }
        let Value::Object(engine) = engine else {
            return;
        };
        match &self.engine {
            Some(EngineChoice::Preset { preset, command }) => {
                engine.insert("preset".to_owned(), json!(preset.name()));
                match command {
                    Some(command) => engine.insert("command".to_owned(), json!(command)),
                    None => engine.remove("command"),
                };
                // The preset's own prompt mode and parser.
                engine.remove("output");
                engine.remove("prompt");
            }
            Some(EngineChoice::Command(command)) => {
                engine.insert("command".to_owned(), json!(command));
                engine.remove("preset");
                engine.remove("output"); // "text", the default
            }
            Some(EngineChoice::Echo) | None => {}
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
        let preset = |preset, command: Option<&[&str]>| EngineChoice::Preset {
            preset,
            command: command.map(|c| c.iter().map(|a| (*a).to_owned()).collect()),
        };
        let rows: &[(&str, EngineChoice)] = &[
            ("echo", EngineChoice::Echo),
            ("claude", preset(Preset::Claude, None)),
            ("codex", preset(Preset::Codex, None)),
            ("gemini", preset(Preset::Gemini, None)),
            (
                "codex=/opt/my codex/codex",
                preset(
                    Preset::Codex,
                    Some(&[
                        "/opt/my codex/codex",
                        "exec",
                        "--json",
                        "--skip-git-repo-check",
                        "-",
                    ]),
                ),
            ),
            (
                "/usr/local/bin/gemini",
                preset(
                    Preset::Gemini,
                    Some(&["/usr/local/bin/gemini", "--output-format", "json", "-p"]),
                ),
            ),
            // Issue 21: a path to claude with its arguments kept the text parser.
            (
                "/opt/claude -p --output-format json",
                preset(
                    Preset::Claude,
                    Some(&["/opt/claude", "-p", "--output-format", "json"]),
                ),
            ),
            (
                "codex exec --json --skip-git-repo-check -",
                preset(Preset::Codex, None),
            ),
            (
                " my-engine  --fast ",
                EngineChoice::Command(vec!["my-engine".into(), "--fast".into()]),
            ),
            ("other=/x", EngineChoice::Command(vec!["other=/x".into()])),
        ];
        for (text, want) in rows {
            assert_eq!(EngineChoice::parse(text).unwrap(), *want, "{text}");
        }
        for bad in ["  ", "codex=", "claude= "] {
            assert!(EngineChoice::parse(bad).is_err(), "{bad}");
        }
        // Arguments other than the preset's are said to be read by its parser.
        let note = |text| EngineChoice::parse(text).unwrap().note();
        assert_eq!(note("/opt/claude -p --output-format json"), None);
        assert_eq!(note("codex=/opt/codex"), None);
        let said = note("/opt/claude -p").unwrap();
        assert!(said.contains("engine.output \"json\""), "{said}");
        assert_eq!(note("my-engine"), None);
    }

    #[test]
    fn a_preset_replaces_the_command_and_the_parser_and_a_command_the_preset() {
        let mut config: Map<String, Value> = serde_json::from_value(json!({
            "engine": {"command": ["x"], "output": "json", "prompt": "arg", "timeoutSecs": 9}
        }))
        .unwrap();
        let set = |config: &mut Map<String, Value>, engine: &str| {
            Settings {
                engine: Some(EngineChoice::parse(engine).unwrap()),
                ..Settings::default()
            }
            .apply(config)
        };
        set(&mut config, "gemini");
        assert_eq!(
            config["engine"],
            json!({"preset": "gemini", "timeoutSecs": 9})
        );
        set(&mut config, "codex=/opt/codex");
        assert_eq!(
            config["engine"],
            json!({"preset": "codex", "timeoutSecs": 9,
                   "command": ["/opt/codex", "exec", "--json", "--skip-git-repo-check", "-"]})
        );
        set(&mut config, "my-engine -v");
        assert_eq!(
            config["engine"],
            json!({"command": ["my-engine", "-v"], "timeoutSecs": 9})
        );
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
