//! `loopbus init DIR`: write a ready config.json, or change the settings given in an
//! existing one (`--force`), keeping a backup.

use super::settings::{self, EngineChoice, PeersChoice, Settings};
use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, UsageError, EXIT_OK};
use loopbus::{InstanceName, Secret, TrustKind, CONFIG_FILE, PRIVATE_FILE_MODE};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Help text.
pub const HELP: &str = "\
loopbus init NAME|DIR [--engine PRESET_OR_COMMAND] [--peers NAMES] [--budget USD]
                 [--port N] [--kind NAME] [--fixed-secret] [--force [--rotate-secret]]
                 [--json]

Create the state directory DIR (mode 0700; a bare NAME is $LOOPBUS_ROOT/NAME,
else ~/.loopbus/NAME, the channel root created 0700 too) and write
DIR/config.json (mode 0600):
the bus enabled, every peer allowed, maxDepth 3 and an OS-chosen port, changed by
the options below. No secret is written: the instance makes a fresh one at each
start and publishes it only in the registry (mode 0600).

--engine E      the engine: `echo` (the built-in echo engine, the default),
                a preset: `claude`, `codex` or `gemini` (engine.preset: the CLI
                in its non-interactive mode, its output read by the preset's
                parser for the reply, the tokens and, for claude, the cost; see
                docs/configuration.md), `NAME=PATH` (the preset, with its CLI at
                PATH: `--engine codex=/opt/codex/bin/codex`), or a command line,
                split on whitespace (`--engine 'my-engine --fast'`: its stdout is
                the reply). A command line whose program is named claude, codex or
                gemini takes that preset, and so its parser.
--peers NAMES   who may call this instance: `*` (every caller, the default) or
                names separated by commas (`--peers reviewer,planner`).
--budget USD    budgetUsd: turns are refused once this much is spent; `none`
                removes it.
--port N        bus.port (0: the OS picks at each start).
--kind NAME     write bus.kind NAME (the `kind` health answers with) and a
                bus.acceptKinds that keeps both loopbus and cc-telegram-bridge.
                `--kind cc-telegram-bridge` lets the original TypeScript bus find
                this instance (see docs/configuration.md, \"Running beside
                cc-telegram-bridge\").
--fixed-secret  also write a random bus.secret, kept across restarts (for scripts
                that call a fixed port with curl). It costs this: a secret that
                leaks, or that a squatter on a stale port learns, keeps working
                after every restart until you change it by hand. A fixed secret
                already in config.json is kept.
--rotate-secret write a new random bus.secret in place of the old one (it takes
                effect when the instance restarts).

An existing config.json is left alone unless --force is given. With --force, only
the settings given change; the rest (engine, budget, peers, secret, ...) is kept,
and the old file is kept as config.json.bak-TIMESTAMP (mode 0600). A running
instance reloads the new config.json within a second; port and secret changes take
effect when it restarts.

The engine gets each prompt on stdin (engine.prompt \"stdin\", the default). With
engine.prompt \"arg\" the prompt is the command's last argument instead, and every
local user can read it in the process list (ps, /proc/PID/cmdline): use \"arg\" only
for an engine that cannot read stdin, on a machine no one else uses.

--no-serve-hint leave out the closing `start it with: loopbus serve ...` line (for
                scripts that start it next, like `make run`).
--json          print what was done as one JSON object: {\"config\", \"name\",
                \"backup\", \"running\", \"engineFound\"} instead of sentences.

init warns when the engine command it wrote (a preset's CLI included) is not found
on the engine's PATH (engine.env.PATH, else PATH), and still writes the file.

Examples:
  loopbus init worker && loopbus serve worker
  loopbus init worker --engine claude --peers reviewer --budget 5
  loopbus init coder --engine codex=$HOME/.local/bin/codex
  loopbus init ./my-root/worker --force --budget 10
";

/// Runs `init`.
///
/// # Errors
/// Bad arguments, an existing config without `--force`, or a file system error.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(
        args,
        &["kind", "engine", "peers", "budget", "port"],
        &[
            "force",
            "fixed-secret",
            "rotate-secret",
            "json",
            "no-serve-hint",
        ],
    )?;
    args.at_most(1)?;
    let named = args.positionals.first().ok_or_else(|| {
        usage(
            "missing NAME; usage: loopbus init NAME|DIR [--force] [--engine E] [--peers NAMES] ...",
        )
    })?;
    let mut settings = settings_from(&args)?;
    let dir = super::instance_dir(Some(named), None, None)?;
    let name = super::instance_name(&dir, None)?;
    let path = dir.join(CONFIG_FILE);
    let force = args.switch("force");
    if path.exists() && !force {
        return Err(local(format!(
            "{}: already exists; pass --force to change it (the settings not given are kept)",
            path.display()
        )));
    }
    // The channel root holds the registry (secrets): create it private too, if missing.
    let root = loopbus::channel_root(&dir);
    for path in [&root, &dir] {
        // An existing directory another user owns or may write to is refused
        // (contract 1): that user could plant our registry or our config.
        match loopbus::check_trusted(path, TrustKind::Dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(local(untrusted_message(path, &e))),
            Ok(()) => {}
        }
        loopbus::create_dir_private(path)
            .map_err(|e| local(format!("{}: cannot create: {e}", path.display())))?;
    }
    let old = if path.exists() {
        let bytes = loopbus::read_config_file(&path).map_err(|e| local(e.to_string()))?;
        Some(bytes)
    } else {
        None
    };
    let (mut json, replaced) = match old.as_deref().map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Object(map))) => (map, false),
        Some(_) => (settings::new_config(), true),
        None => (settings::new_config(), false),
    };
    let has_secret = json
        .get("bus")
        .and_then(|b| b.get("secret"))
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    // Rotating makes a fixed secret fixed anew; where none is fixed (each start makes a
    // fresh one), it would quietly fix one, with all that costs: only on request.
    if args.switch("rotate-secret") && !has_secret && !args.switch("fixed-secret") {
        return Err(usage(format!(
            "{}: no fixed bus.secret to rotate: each start of the instance makes a fresh \
             one already (to write a fixed one, pass --fixed-secret)",
            path.display()
        ))
        .into());
    }
    if args.switch("rotate-secret") || (args.switch("fixed-secret") && !has_secret) {
        settings.secret = Some(
            Secret::generate()
                .map_err(|e| local(format!("cannot read random bytes from the OS: {e}")))?,
        );
    }
    settings.apply(&mut json);
    let mut text = serde_json::to_string_pretty(&Value::Object(json))
        .map_err(|e| local(format!("cannot write {}: {e}", path.display())))?;
    text.push('\n');
    // What init writes must be what serve accepts.
    let written = loopbus::parse_config_file(&path, text.as_bytes()).map_err(|e| {
        local(format!(
            "{e} (after applying the options; the file was not changed: fix it, or move it \
             away and run init again)"
        ))
    })?;
    let backup = match &old {
        Some(bytes) => Some(back_up(&path, bytes)?),
        None => None,
    };
    loopbus::write_atomic(&path, text.as_bytes(), PRIVATE_FILE_MODE)
        .map_err(|e| local(format!("{}: cannot write: {e}", path.display())))?;
    // An engine command that is not there fails every turn: say so now, not at the
    // first talk.
    let missing = written
        .engine
        .as_ref()
        .and_then(|engine| loopbus::engine_findings(Some(engine)).program.err());
    let running = loopbus::running_instance(&root, &name).ok().flatten();
    if args.switch("json") {
        let done = serde_json::json!({
            "config": path.display().to_string(),
            "name": name.as_str(),
            "backup": backup.as_ref().map(|b| b.display().to_string()),
            "running": running.as_ref().map(|e| serde_json::json!({"pid": e.pid, "port": e.port})),
            "engineFound": missing.is_none(),
        });
        output::println(&done.to_string())?;
        return Ok(EXIT_OK);
    }
    let mut said = format!("wrote {} for instance {name}", path.display());
    if let Some(backup) = &backup {
        let how = if replaced {
            "it was not a JSON object; "
        } else {
            ""
        };
        said.push_str(&format!("\n{how}the old one is {}", backup.display()));
    }
    if let Some(note) = settings.engine.as_ref().and_then(EngineChoice::note) {
        said.push_str(&format!("\nnote: {note}"));
    }
    if let Some(problem) = &missing {
        let fix = match written.engine.as_ref().and_then(|e| e.preset) {
            Some(preset) => format!("or give its path: --engine {}=PATH", preset.name()),
            None => "or --engine names another command".to_owned(),
        };
        said.push_str(&format!(
            "\nwarning: {problem}: every turn fails until it is installed ({fix})"
        ));
    }
    match running {
        Some(entry) => said.push_str(&format!(
            "\n{name} is running (pid {}, port {}): it reloads config.json within a second; \
             port and secret changes take effect when it restarts",
            entry.pid, entry.port
        )),
        None if args.switch("no-serve-hint") => {}
        None => said.push_str(&format!("\nstart it with: {}", serve_command(&dir, &name))),
    }
    output::println(&terminal::escape_for_terminal(&said))?;
    Ok(EXIT_OK)
}

/// The shortest `loopbus serve` line that serves `dir`: by name when it is under the
/// default channel root.
fn serve_command(dir: &Path, name: &InstanceName) -> String {
    let default = loopbus::default_channel_root()
        .map(|root| root.join(name.as_str()))
        .and_then(|d| std::path::absolute(d).ok());
    if default.is_some() && default == std::path::absolute(dir).ok() {
        format!("loopbus serve {name}")
    } else {
        format!("loopbus serve --state-dir {}", dir.display())
    }
}

/// The settings the options give.
fn settings_from(args: &Args) -> Result<Settings, UsageError> {
    let kind = args.value("kind");
    if kind.is_some_and(|kind| kind.is_empty() || kind.chars().any(char::is_control)) {
        return Err(usage(
            "`--kind` must be a non-empty name without control characters",
        ));
    }
    Ok(Settings {
        engine: args.value("engine").map(EngineChoice::parse).transpose()?,
        peers: args.value("peers").map(PeersChoice::parse).transpose()?,
        budget: args
            .value("budget")
            .map(settings::parse_budget)
            .transpose()?,
        port: args.parsed::<u16>("port", "a port number (0-65535)")?,
        kind: kind.map(str::to_owned),
        secret: None,
    })
}

/// Keeps `bytes`, the config.json at `path` about to be replaced, as
/// `config.json.bak-TIMESTAMP` (mode 0600: it may hold the secret), and returns its
/// path.
fn back_up(path: &Path, bytes: &[u8]) -> Result<PathBuf, CommandError> {
    let stamp: String = loopbus::now_iso8601()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let mut backup = path.as_os_str().to_owned();
    backup.push(format!(".bak-{stamp}"));
    let backup = PathBuf::from(backup);
    loopbus::write_atomic(&backup, bytes, PRIVATE_FILE_MODE)
        .map_err(|e| local(format!("{}: cannot write: {e}", backup.display())))?;
    Ok(backup)
}

/// Why `init` refuses `path`: the owner, mode and fix when it is untrusted.
fn untrusted_message(path: &std::path::Path, e: &std::io::Error) -> String {
    match loopbus::untrusted(e) {
        Some(untrusted) => format!("{untrusted}; loopbus serve would refuse it too"),
        None => format!("{}: cannot check its owner: {e}", path.display()),
    }
}
