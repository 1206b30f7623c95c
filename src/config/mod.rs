//! `config.json`: the typed configuration, its defaults, and the file `loopbus init`
//! writes (contract section 2). Parsing and validation are in `parse`, reading the
//! file in `read`, the one error type in `error`.
//!
//! [`parse`] is pure: bytes in, a typed [`Config`] or a [`ConfigError`] naming the field
//! out. [`load`] adds reading the file (bounded, non-blocking, regular files only).
//! Validation is written by hand over `serde_json::Value` so that every error carries
//! the field's path and no error ever echoes a value (the secret lives in this file).
//!
//! Unknown keys are refused, at every level (`keys`): a typo must never widen access
//! or drop a limit. `bus.crew`, written by the original implementation, is known and
//! ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use crate::protocol::InstanceName;
use crate::secret::Secret;

mod duplicates;
mod error;
mod keys;
mod parse;
mod read;

pub use error::ConfigError;
pub use parse::parse;
pub use read::{load, parse_file, read_file};

/// The config file's name inside an instance's state directory.
pub const CONFIG_FILE: &str = "config.json";
/// Default `bus.maxDepth`: how many hops a delegation chain may take.
pub const DEFAULT_MAX_DEPTH: u64 = 3;
/// Default `bus.maxConcurrentTurns`: worker threads running turns. Above the default
/// max depth, so that a delegation cycle A→B→A can't deadlock.
pub const DEFAULT_MAX_CONCURRENT_TURNS: usize = 4;
/// Largest allowed `bus.maxConcurrentTurns`.
pub const MAX_CONCURRENT_TURNS_LIMIT: usize = 64;
/// Default `bus.maxQueuedTurns`: turns waiting for a worker before `server_busy`.
pub const DEFAULT_MAX_QUEUED_TURNS: usize = 16;
/// Largest allowed `bus.maxQueuedTurns`.
pub const MAX_QUEUED_TURNS_LIMIT: usize = 1024;
/// Default `bus.reattachSecs`: how long a hung-up turn with an `ext.requestId` is kept
/// for a retry to attach to (contract section 8.1).
pub const DEFAULT_REATTACH_SECS: u64 = 15;
/// Largest allowed `bus.reattachSecs` (10 minutes): a kept turn holds a worker and a
/// connection slot's worth of state, so the wait is bounded.
pub const MAX_REATTACH_SECS: u64 = 600;
/// Default `engine.timeoutSecs`.
pub const DEFAULT_ENGINE_TIMEOUT_SECS: u64 = 1800;
/// Default `engine.maxOutputBytes` (1 MiB).
pub const DEFAULT_ENGINE_MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// Default `bus.kind`: the fingerprint reported on `/api/health`.
pub const DEFAULT_KIND: &str = "loopbus";
/// Default `bus.acceptKinds`: the fingerprints the client accepts from a peer.
pub const DEFAULT_ACCEPT_KINDS: [&str; 2] = ["loopbus", "cc-telegram-bridge"];

/// A parsed, validated `config.json`. Fields may be added: build one from
/// [`Config::default`] (a disabled bus, no budget, the echo engine) and set fields.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Config {
    /// The `bus` section. The default is a disabled bus.
    pub bus: BusConfig,
    /// `budgetUsd`: the spend after which turns are refused; `None` means no budget.
    pub budget_usd: Option<f64>,
    /// `engine`: `None` means the built-in echo engine.
    pub engine: Option<EngineConfig>,
}

/// The `bus` section of `config.json`. Fields may be added: build one with
/// [`BusConfig::open`] or [`BusConfig::default`] and set fields.
///
/// ```
/// use loopbus::{BusConfig, Peers};
///
/// let mut bus = BusConfig::open();
/// bus.peers = Peers::Only(vec!["reviewer".to_owned()]);
/// assert!(bus.enabled && bus.peers.allows("reviewer") && !bus.peers.allows("other"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BusConfig {
    /// Whether the bus is on. Off when `bus` is missing, `null`, `false` or not an
    /// object, or when `peers` is `false` or `[]`.
    pub enabled: bool,
    /// `peers`: who may call this instance.
    pub peers: Peers,
    /// `maxDepth`: a request with `depth >= max_depth` is refused.
    pub max_depth: u64,
    /// `port`: 0 lets the OS pick.
    pub port: u16,
    /// `secret`: `None` when missing or empty; then one is generated at startup.
    pub secret: Option<Secret>,
    /// `kind`: the fingerprint reported on `/api/health`.
    pub kind: String,
    /// `acceptKinds`: the fingerprints accepted when probing a peer.
    pub accept_kinds: Vec<String>,
    /// `maxConcurrentTurns`: worker threads, 1 to 64.
    pub max_concurrent_turns: usize,
    /// `maxQueuedTurns`: queued turns beyond the running ones, 0 to 1024.
    pub max_queued_turns: usize,
    /// `cancelOnHangup`: whether a turn whose caller hung up is cancelled (section 8.1).
    pub cancel_on_hangup: bool,
    /// `reattachSecs`: how long a hung-up turn with an `ext.requestId` is kept, 0 to
    /// 600 (`config::MAX_REATTACH_SECS`).
    pub reattach_secs: u64,
    /// `parallel`: the targets of `fan` when none are given (contract 9).
    pub parallel: Vec<InstanceName>,
    /// `chain`: the stages of `chain` when none are given.
    pub chain: Vec<InstanceName>,
    /// `verifier`: the verifier of `verify` when none is given.
    pub verifier: Option<InstanceName>,
}

impl Default for BusConfig {
    /// A disabled bus with every other field at its default (`peers` is [`Peers::Any`]).
    fn default() -> BusConfig {
        BusConfig {
            enabled: false,
            ..BusConfig::open()
        }
    }
}

impl BusConfig {
    /// What `"bus": true` (and `"bus": {}`) means: the bus on, every caller allowed, every
    /// other field at its default.
    pub fn open() -> BusConfig {
        parse::bus_defaults()
    }
}

/// `bus.peers`: which callers (by `fromInstance`) are allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Peers {
    /// `"*"` or `true`: every caller.
    Any,
    /// A list: only these names (empty when the list was `[]` or `peers` was `false`).
    Only(Vec<String>),
}

impl Peers {
    /// Whether a caller named `name` is allowed.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Peers::Any => true,
            Peers::Only(names) => names.iter().any(|n| n == name),
        }
    }
}

/// The `engine` section: a command run once per turn.
///
/// `Debug` shows the names of `env` but not their values, which may be credentials.
/// Fields may be added: build one with [`EngineConfig::new`] and set fields.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// `command`: the argv, never empty, with a non-empty program name first.
    pub command: Vec<String>,
    /// `prompt`: how the prompt reaches the command.
    pub prompt: PromptMode,
    /// `output`: how stdout is read.
    pub output: OutputMode,
    /// `timeoutSecs`: after this the process group is killed.
    pub timeout_secs: u64,
    /// `maxOutputBytes`: output past this is cut and the turn fails.
    pub max_output_bytes: u64,
    /// `maxTurnCostUsd`: what one turn may cost at most (finite, non-negative), counted
    /// against `budgetUsd` for each running turn; `None`: the recent mean is counted.
    pub max_turn_cost_usd: Option<f64>,
    /// `cwd`: the working directory, if set.
    pub cwd: Option<PathBuf>,
    /// `env`: variables added to the command's environment.
    pub env: BTreeMap<String, String>,
    /// `preset`: the agent CLI whose command, prompt mode and output parser this engine
    /// took as defaults, if any.
    pub preset: Option<Preset>,
}

impl EngineConfig {
    /// The engine `command` (an argv) with every other field at its default: prompt on
    /// stdin, text output, a timeout of 1,800 s (`config::DEFAULT_ENGINE_TIMEOUT_SECS`),
    /// 1 MiB of output (`config::DEFAULT_ENGINE_MAX_OUTPUT_BYTES`), no `maxTurnCostUsd`,
    /// no `cwd`, no added `env`.
    pub fn new(command: Vec<String>) -> EngineConfig {
        EngineConfig {
            command,
            prompt: PromptMode::default(),
            output: OutputMode::default(),
            timeout_secs: DEFAULT_ENGINE_TIMEOUT_SECS,
            max_output_bytes: DEFAULT_ENGINE_MAX_OUTPUT_BYTES,
            max_turn_cost_usd: None,
            cwd: None,
            env: BTreeMap::new(),
            preset: None,
        }
    }

    /// The engine of `preset`: its command, prompt mode and output parser, every other
    /// field at its default.
    pub fn from_preset(preset: Preset) -> EngineConfig {
        EngineConfig {
            prompt: preset.prompt(),
            output: preset.output(),
            preset: Some(preset),
            ..EngineConfig::new(preset.command().iter().map(|a| (*a).to_owned()).collect())
        }
    }
}

impl fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineConfig")
            .field("command", &self.command)
            .field("prompt", &self.prompt)
            .field("output", &self.output)
            .field("timeout_secs", &self.timeout_secs)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("max_turn_cost_usd", &self.max_turn_cost_usd)
            .field("cwd", &self.cwd)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("preset", &self.preset)
            .finish()
    }
}

/// `engine.prompt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PromptMode {
    /// `"stdin"` (default): the prompt is written to the command's stdin.
    #[default]
    Stdin,
    /// `"arg"`: the prompt is the command's last argument.
    Arg,
}

/// `engine.output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OutputMode {
    /// `"text"` (default): stdout is the reply.
    #[default]
    Text,
    /// `"json"`: stdout is one JSON object in the shape of
    /// `claude -p --output-format json`.
    Json,
    /// `"codex-jsonl"`: stdout is the JSON Lines event stream of `codex exec --json`.
    CodexJsonl,
    /// `"gemini-json"`: stdout is the JSON object of `gemini -p --output-format json`.
    GeminiJson,
}

impl OutputMode {
    /// The mode's name in `config.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputMode::Text => "text",
            OutputMode::Json => "json",
            OutputMode::CodexJsonl => "codex-jsonl",
            OutputMode::GeminiJson => "gemini-json",
        }
    }
}

/// `engine.preset`: an agent CLI loopbus knows how to run, in its documented
/// non-interactive mode (docs/configuration.md says why each argument is there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preset {
    /// Claude Code: `claude -p --output-format json`, the prompt on stdin.
    Claude,
    /// Codex: `codex exec --json --skip-git-repo-check -`, the prompt on stdin (`-`).
    Codex,
    /// Gemini CLI: `gemini --output-format json -p PROMPT`, stdin closed.
    Gemini,
}

impl Preset {
    /// Every preset, in the order errors and help list them.
    pub const ALL: [Preset; 3] = [Preset::Claude, Preset::Codex, Preset::Gemini];

    /// The preset of `name` (`"claude"`, `"codex"`, `"gemini"`).
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The preset's name, which is also its CLI's program name.
    pub fn name(self) -> &'static str {
        // Each command of `command` is a literal that starts with the program.
        self.command()[0]
    }

    /// Its `engine.command`: the program, then the arguments of its non-interactive
    /// mode. With `engine.prompt` `"arg"` the prompt follows the last one.
    pub fn command(self) -> &'static [&'static str] {
        match self {
            Preset::Claude => &["claude", "-p", "--output-format", "json"],
            Preset::Codex => &["codex", "exec", "--json", "--skip-git-repo-check", "-"],
            Preset::Gemini => &["gemini", "--output-format", "json", "-p"],
        }
    }

    /// Its `engine.prompt`: Gemini CLI takes the prompt as the value of `-p` (it would
    /// read a piped stdin as extra context, so stdin is closed); the others read stdin.
    pub fn prompt(self) -> PromptMode {
        match self {
            Preset::Gemini => PromptMode::Arg,
            Preset::Claude | Preset::Codex => PromptMode::Stdin,
        }
    }

    /// Its `engine.output`: the parser of its CLI's output.
    pub fn output(self) -> OutputMode {
        match self {
            Preset::Claude => OutputMode::Json,
            Preset::Codex => OutputMode::CodexJsonl,
            Preset::Gemini => OutputMode::GeminiJson,
        }
    }
}

impl Config {
    /// The keys whose values differ between `self` and `other`, in the file's terms
    /// (`bus.peers`, `budgetUsd`, `engine.command`, ...), for the reload log line; the
    /// bus turned on or off is `bus` (its `enabled` is no key of the file).
    pub fn changed_keys(&self, other: &Config) -> Vec<&'static str> {
        let (a, b) = (&self.bus, &other.bus);
        let mut changed = [
            ("bus", a.enabled != b.enabled),
            ("bus.peers", a.peers != b.peers),
            ("bus.maxDepth", a.max_depth != b.max_depth),
            ("bus.port", a.port != b.port),
            ("bus.secret", a.secret != b.secret),
            ("bus.kind", a.kind != b.kind),
            ("bus.acceptKinds", a.accept_kinds != b.accept_kinds),
            (
                "bus.maxConcurrentTurns",
                a.max_concurrent_turns != b.max_concurrent_turns,
            ),
            (
                "bus.maxQueuedTurns",
                a.max_queued_turns != b.max_queued_turns,
            ),
            (
                "bus.cancelOnHangup",
                a.cancel_on_hangup != b.cancel_on_hangup,
            ),
            ("bus.reattachSecs", a.reattach_secs != b.reattach_secs),
            ("bus.parallel", a.parallel != b.parallel),
            ("bus.chain", a.chain != b.chain),
            ("bus.verifier", a.verifier != b.verifier),
            ("budgetUsd", self.budget_usd != other.budget_usd),
        ]
        .to_vec();
        match (&self.engine, &other.engine) {
            (Some(a), Some(b)) => changed.extend([
                ("engine.preset", a.preset != b.preset),
                ("engine.command", a.command != b.command),
                ("engine.prompt", a.prompt != b.prompt),
                ("engine.output", a.output != b.output),
                ("engine.timeoutSecs", a.timeout_secs != b.timeout_secs),
                (
                    "engine.maxOutputBytes",
                    a.max_output_bytes != b.max_output_bytes,
                ),
                (
                    "engine.maxTurnCostUsd",
                    a.max_turn_cost_usd != b.max_turn_cost_usd,
                ),
                ("engine.cwd", a.cwd != b.cwd),
                ("engine.env", a.env != b.env),
            ]),
            (a, b) => changed.push(("engine", a.is_some() != b.is_some())),
        }
        changed.retain(|(_, differs)| *differs);
        changed.into_iter().map(|(key, _)| key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The `config.json` that `loopbus init` writes: the bus on, every peer allowed,
    /// default depth, an OS-chosen port, and `secret` only when one is given (`init
    /// --fixed-secret`): without it each start makes a fresh secret. (`init` itself calls
    /// [`default_config_json_with`].)
    pub(super) fn default_config_json(secret: Option<&Secret>) -> String {
        default_config_json_with(secret, None)
    }

    /// [`default_config_json`], and with a `kind` (`init --kind NAME`) also `bus.kind`
    /// NAME and an explicit `bus.acceptKinds` that keeps both default kinds
    /// ([`DEFAULT_ACCEPT_KINDS`]) and adds NAME when it is neither: an instance of kind
    /// `cc-telegram-bridge` is found by the original's client and still finds loopbus
    /// peers. (`init` now builds its file in `commands::settings`; this is the tests'
    /// minimal config.)
    pub(super) fn default_config_json_with(secret: Option<&Secret>, kind: Option<&str>) -> String {
        // `Value`'s Display writes a properly escaped JSON string.
        let secret_line = secret
            .map(|secret| {
                let secret = Value::String(secret.expose().to_owned());
                format!(",\n    \"secret\": {secret}")
            })
            .unwrap_or_default();
        let kind_lines = kind
            .map(|kind| {
                let mut accept: Vec<Value> = DEFAULT_ACCEPT_KINDS
                    .iter()
                    .map(|k| Value::String((*k).to_owned()))
                    .collect();
                if !DEFAULT_ACCEPT_KINDS.contains(&kind) {
                    accept.push(Value::String(kind.to_owned()));
                }
                let kind = Value::String(kind.to_owned());
                let accept = Value::Array(accept);
                format!(",\n    \"kind\": {kind},\n    \"acceptKinds\": {accept}")
            })
            .unwrap_or_default();
        format!(
            "{{\n  \"bus\": {{\n    \"peers\": \"*\",\n    \"maxDepth\": {DEFAULT_MAX_DEPTH},\n    \
             \"port\": 0{kind_lines}{secret_line}\n  }}\n}}\n"
        )
    }

    #[test]
    fn peers_allows() {
        let only = Peers::Only(vec!["a".into(), "b".into()]);
        let cases = [
            (&Peers::Any, "anyone", true),
            (&only, "a", true),
            (&only, "b", true),
            (&only, "c", false),
            (&only, "", false),
            (&Peers::Only(Vec::new()), "a", false),
        ];
        for (peers, name, want) in cases {
            assert_eq!(peers.allows(name), want, "{peers:?} {name}");
        }
    }

    #[test]
    fn changed_keys_name_what_an_edit_changed() {
        let old = parse::parse(br#"{"bus": {"peers": "*"}}"#).unwrap();
        assert!(old.changed_keys(&old).is_empty());
        let new = parse::parse(
            br#"{"bus": {"peers": ["a"], "maxDepth": 2}, "budgetUsd": 1, "engine": {"command": ["x"]}}"#,
        )
        .unwrap();
        assert_eq!(
            old.changed_keys(&new),
            ["bus.peers", "bus.maxDepth", "budgetUsd", "engine"]
        );
        let off = parse::parse(br#"{"bus": false}"#).unwrap();
        assert!(old.changed_keys(&off).contains(&"bus"));
        let other_engine =
            parse::parse(br#"{"bus": {"peers": ["a"], "maxDepth": 2}, "budgetUsd": 1, "engine": {"command": ["y"], "timeoutSecs": 5}}"#)
                .unwrap();
        assert_eq!(
            new.changed_keys(&other_engine),
            ["engine.command", "engine.timeoutSecs"]
        );
    }

    /// `init` could not write a config the original's client finds (contract 4.1,
    /// issue 12): `--kind` sets `bus.kind` and keeps both kinds accepted.
    #[test]
    fn bug_init_could_not_set_the_kind() {
        for (kind, accept) in [
            ("cc-telegram-bridge", vec!["loopbus", "cc-telegram-bridge"]),
            ("loopbus", vec!["loopbus", "cc-telegram-bridge"]),
            (
                "other \"q\"",
                vec!["loopbus", "cc-telegram-bridge", "other \"q\""],
            ),
        ] {
            let json = default_config_json_with(None, Some(kind));
            let config = parse::parse(json.as_bytes()).unwrap();
            assert_eq!(config.bus.kind, kind);
            assert_eq!(config.bus.accept_kinds, accept);
        }
        let plain = parse::parse(default_config_json(None).as_bytes()).unwrap();
        assert_eq!(plain.bus.kind, DEFAULT_KIND);
    }
}
