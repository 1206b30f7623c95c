//! `loopbus doctor`: checks one instance's files, config, engine and registration, one
//! line per check (`ok`, `warn` or `fail`, what was checked, and for a problem what to
//! do). It reuses the checks `serve` makes (the config parser, the trust rules, the
//! engine preflight, the registry probe with proof) and never changes a file.

mod registry_checks;

use super::{output, terminal};
use crate::cli::{Args, CommandError, EXIT_FAILURE, EXIT_OK};
use loopbus::{Config, InstanceName, Peers, Secret, TrustKind, CONFIG_FILE};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Help text.
pub const HELP: &str = "\
loopbus doctor [NAME | --state-dir DIR] [--root DIR] [--name NAME] [--probe] [--json]

Check the instance NAME (under --root, else $LOOPBUS_ROOT, else ~/.loopbus), or
the one whose state directory is DIR (--state-dir, else $LOOPBUS_STATE_DIR), and
print one line per check: `ok`, `warn` or `fail`,
what was checked, and for a problem what to do. Checked: the state directory,
channel root, config.json and registry file (owner and mode), config.json
itself (syntax, unknown or repeated keys, values), a weak or sample
bus.secret, whether the bus is enabled, the engine command and engine.cwd,
`loopbus` on the engine's PATH (for nested delegation), whether the
registered port answers as this instance (with the secret's proof), stale
registry entries, and port conflicts with other registered instances. The
registry is the one of the channel root (--root, else the parent of DIR);
the instance's name is DIR's last component, or NAME for an instance started
with `loopbus serve --name NAME`. Nothing is changed. --json prints
{\"ok\": BOOL, \"checks\": [{\"level\", \"text\"}]} instead of the lines.

--probe         also run one short real turn through the instance's engine,
                directly (not over HTTP), with the prompt \"Reply with the word
                OK.\" and at most 60 s, and show what the engine said: its reply,
                or the failure's code and message. It catches what no static
                check can, such as a CLI that is not logged in. The turn is an
                ordinary one: the budget admits it and usage.json counts it.

Exit status: 1 if any check fails (a failed probe included), else 0 (warnings
included); 2 usage error.

Examples:
  loopbus doctor worker
  loopbus doctor worker --probe
  loopbus doctor --state-dir ~/.loopbus/worker --json
  LOOPBUS_STATE_DIR=~/.loopbus/worker loopbus doctor
";

/// A `bus.secret` with fewer distinct characters than this (`aaaaaaaaaaaaaaaaaaaa`) is
/// warned about as low in variety.
pub const MIN_SECRET_DISTINCT_CHARS: usize = 8;
/// The prompt of `doctor --probe`: short, with a reply easy to recognize.
pub const PROBE_PROMPT: &str = "Reply with the word OK.";
/// The longest `doctor --probe` waits for the engine (cut to `engine.timeoutSecs`
/// when that is shorter): enough for an agent CLI's start and one short answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of the probe's reply is shown, in characters.
pub const PROBE_EXCERPT_CHARS: usize = 200;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    /// `ok`, `warn` or `fail`.
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// The checks made so far, in order.
#[derive(Debug, Default)]
pub(super) struct Report {
    checks: Vec<(Level, String)>,
}

impl Report {
    pub(super) fn ok(&mut self, text: impl Into<String>) {
        self.checks.push((Level::Ok, text.into()));
    }
    pub(super) fn warn(&mut self, text: impl Into<String>) {
        self.checks.push((Level::Warn, text.into()));
    }
    pub(super) fn fail(&mut self, text: impl Into<String>) {
        self.checks.push((Level::Fail, text.into()));
    }
    fn failed(&self) -> bool {
        self.checks.iter().any(|(level, _)| *level == Level::Fail)
    }
}

/// What every check needs to know.
pub(super) struct Target<'a> {
    state_dir: &'a Path,
    pub(super) root: &'a Path,
    pub(super) name: &'a InstanceName,
    /// `loopbus serve --state-dir DIR`, for the messages.
    pub(super) serve: String,
}

/// Runs `doctor`.
///
/// # Errors
/// Bad arguments, or no state directory given.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["state-dir", "root", "name"], &["json", "probe"])?;
    if args.help {
        output::print(HELP)?;
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let named = args.positionals.first().map(String::as_str);
    let state_dir = super::instance_dir(named, args.value("state-dir"), args.value("root"))?;
    let root = match args.value("root") {
        Some(root) if !root.is_empty() => root.into(),
        _ => loopbus::channel_root(&state_dir),
    };
    let name = super::instance_name(&state_dir, args.value("name"))?;
    let name_flag = match args.value("name") {
        Some(name) => format!(" --name {name}"),
        None => String::new(),
    };
    let target = Target {
        state_dir: &state_dir,
        root: &root,
        name: &name,
        serve: format!(
            "loopbus serve --state-dir {}{name_flag}",
            state_dir.display()
        ),
    };
    let mut report = Report::default();
    let config = check_files(&mut report, &target);
    match &config {
        Some(config) => {
            check_secret(&mut report, &state_dir, config.bus.secret.as_ref());
            check_bus(&mut report, config);
            check_engine(&mut report, config);
        }
        None => check_delegation(&mut report, loopbus::engine_findings(None).delegation),
    }
    registry_checks::check(&mut report, &target, config.as_ref());
    if let Some(config) = config.as_ref().filter(|_| args.switch("probe")) {
        probe(&mut report, &target, config);
    }
    if args.switch("json") {
        let checks: Vec<serde_json::Value> = report
            .checks
            .iter()
            .map(|(level, text)| serde_json::json!({"level": level.word(), "text": text}))
            .collect();
        let json = serde_json::json!({"ok": !report.failed(), "checks": checks});
        output::println(&terminal::escape_for_terminal(&json.to_string()))?;
    }
    for (level, text) in report.checks.iter().filter(|_| !args.switch("json")) {
        let level = level.word();
        let shown = format!("{level:<4}  {}", terminal::escape_for_terminal(text));
        if output::println(&shown).is_err() {
            break;
        }
    }
    Ok(if report.failed() {
        EXIT_FAILURE
    } else {
        EXIT_OK
    })
}

/// The state directory, channel root, config.json and registry file: there, ours, and
/// not open to others; then config.json parsed. Returns the config when it is valid.
fn check_files(report: &mut Report, t: &Target<'_>) -> Option<Config> {
    let dir = t.state_dir.display();
    match std::fs::metadata(t.state_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            report.fail(format!(
                "state directory {dir} does not exist: create it with `loopbus init {dir}`"
            ));
            return None;
        }
        Err(e) => {
            report.fail(format!("cannot read state directory {dir}: {e}"));
            return None;
        }
        Ok(meta) if !meta.is_dir() => {
            report.fail(format!("state directory {dir} is not a directory"));
            return None;
        }
        Ok(_) => {}
    }
    trusted(report, t.state_dir, TrustKind::Dir, "state directory");
    trusted(report, t.root, TrustKind::Dir, "channel root");
    let path = t.state_dir.join(CONFIG_FILE);
    if trusted(report, &path, TrustKind::File, "file") {
        private(report, &path, "it may hold the bus secret");
    }
    let registry = loopbus::registry_path(t.root);
    if registry.exists() && trusted(report, &registry, TrustKind::File, "registry file") {
        private(report, &registry, "it holds every instance's secret");
    }
    let config = match loopbus::load_config(&path) {
        Ok(config) => {
            report.ok(format!("{} is valid", path.display()));
            config
        }
        Err(e) if e.is_not_found() => {
            report.fail(format!(
                "{}: no config.json: create it with `loopbus init {dir}`",
                path.display()
            ));
            return None;
        }
        Err(e) => {
            report.fail(format!(
                "{e} (`loopbus serve` refuses to start with this config, and a running one \
                 keeps its last good one: fix the file, then run `loopbus doctor` again)"
            ));
            return None;
        }
    };
    Some(config)
}

/// A trust check ([`loopbus::check_trusted`], as `serve` makes it) as a line; whether
/// it passed. A missing path is left to the checks that need it.
fn trusted(report: &mut Report, path: &Path, kind: TrustKind, what: &str) -> bool {
    match loopbus::check_trusted(path, kind) {
        Ok(()) => {
            report.ok(format!(
                "{what} {} is ours and not writable by others",
                path.display()
            ));
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            match loopbus::untrusted(&e) {
                Some(untrusted) => report.fail(format!("{untrusted}; `loopbus serve` refuses it")),
                None => report.fail(format!("cannot check {what} {}: {e}", path.display())),
            }
            false
        }
    }
}

/// Warns about a file others may read (`serve` warns the same at start-up).
fn private(report: &mut Report, path: &Path, why: &str) {
    if let Ok(Some(mode)) = loopbus::mode_is_wider(path, loopbus::PRIVATE_FILE_MODE) {
        report.warn(format!(
            "{} has mode {mode:o} and {why}: run `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
}

/// What is weak about a secret, if anything: a fail by the rule `serve` refuses to
/// start by ([`Secret::weakness`]), or a warning of low variety; never its value.
fn secret_weakness(secret: &Secret) -> Option<(Level, String)> {
    if let Some(weakness) = secret.weakness() {
        return Some((Level::Fail, weakness.to_string()));
    }
    let mut distinct: Vec<char> = secret.expose().chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_SECRET_DISTINCT_CHARS {
        return Some((
            Level::Warn,
            format!(
                "has only {} distinct characters (at least {MIN_SECRET_DISTINCT_CHARS} wanted)",
                distinct.len()
            ),
        ));
    }
    None
}

fn check_secret(report: &mut Report, state_dir: &Path, secret: Option<&Secret>) {
    let Some(secret) = secret else {
        report.ok("bus.secret is not set: each start makes a fresh random one");
        return;
    };
    match secret_weakness(secret) {
        None => report.ok("bus.secret is set and not a sample or a short one"),
        Some((level, weakness)) => {
            let text = format!(
                "bus.secret in {} {weakness}: any local user may guess it; remove \
                 it (each start then makes a fresh random one), or set 64 random hex digits \
                 (`loopbus init --fixed-secret` writes such a one)",
                state_dir.join(CONFIG_FILE).display()
            );
            if level == Level::Fail {
                report.fail(text);
            } else {
                report.warn(text);
            }
        }
    }
}

fn check_bus(report: &mut Report, config: &Config) {
    if !config.bus.enabled {
        report.warn(
            "the bus is disabled in config.json: every talk is refused; set \"bus\": \
             {\"peers\": \"*\"} (or a list of caller names) to enable it",
        );
        return;
    }
    let peers = match &config.bus.peers {
        Peers::Only(names) => format!("{} named peer(s)", names.len()),
        _ => "any peer".to_owned(),
    };
    report.ok(format!("the bus is enabled for {peers}"));
}

fn check_engine(report: &mut Report, config: &Config) {
    let Some(engine) = &config.engine else {
        // The echo engine never delegates onwards: where `loopbus` is does not matter.
        report.ok("engine: the built-in echo engine (config.json has no engine section)");
        return;
    };
    let found = loopbus::engine_findings(Some(engine));
    if let Some(cwd) = &engine.cwd {
        match &found.cwd {
            None => report.ok(format!(
                "engine.cwd {} is a directory we may enter",
                cwd.display()
            )),
            Some(problem) => report.fail(format!(
                "{problem}: every engine turn fails; create it or fix engine.cwd"
            )),
        }
    }
    match &found.program {
        Ok(Some(path)) => report.ok(format!("engine command found: {}", path.display())),
        Ok(None) => {}
        Err(problem) => report.fail(format!(
            "{problem}: every engine turn fails; install it, or fix engine.command (or \
             engine.env.PATH)"
        )),
    }
    check_delegation(report, found.delegation);
}

/// One real turn through the engine (`--probe`): its reply, cut, or its failure.
fn probe(report: &mut Report, t: &Target<'_>, config: &Config) {
    let said = loopbus::run_engine_once(
        config,
        t.name.as_str(),
        t.state_dir,
        PROBE_PROMPT,
        PROBE_TIMEOUT,
    );
    match said {
        Ok(reply) => {
            let mut excerpt: String = reply.trim().chars().take(PROBE_EXCERPT_CHARS).collect();
            if reply.trim().chars().count() > PROBE_EXCERPT_CHARS {
                excerpt.push_str("...");
            }
            report.ok(format!("engine probe: the engine replied: {excerpt}"));
        }
        Err(failure) => {
            let fix = match failure.code.as_str() {
                "auth" => {
                    "; log the engine's CLI in, as the user `loopbus serve` runs as, then \
                     probe again"
                }
                _ => "",
            };
            report.fail(format!(
                "engine probe failed: {} ({}retryable): {}{fix}",
                failure.code.as_str(),
                if failure.retryable { "" } else { "not " },
                failure.error
            ));
        }
    }
}

/// `loopbus` on the engine's PATH (`engine.env.PATH`, else ours): a warning, since only
/// an engine that delegates needs it.
fn check_delegation(report: &mut Report, delegation: Result<PathBuf, String>) {
    match delegation {
        Ok(path) => report.ok(format!(
            "`loopbus` is on the engine's PATH ({}): nested delegation can work",
            path.display()
        )),
        Err(problem) => report.warn(problem),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_secrets_table() {
        let cases: &[(&str, Option<Level>)] = &[
            ("optional", Some(Level::Fail)),
            ("OPTIONAL", Some(Level::Fail)),
            ("hunter2", Some(Level::Fail)),
            ("short-but-mixed", Some(Level::Fail)),
            ("aaaaaaaaaaaaaaaaaaaaaaaa", Some(Level::Warn)),
            ("abababababababababab", Some(Level::Warn)),
            ("0123456789abcdef", None),
            (
                "6f1c0e0d9a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5",
                None,
            ),
        ];
        for (secret, want) in cases {
            assert_eq!(
                secret_weakness(&Secret::new(*secret).unwrap()).map(|(level, _)| level),
                *want,
                "{secret}"
            );
        }
        // The message never quotes the value.
        let (_, text) = secret_weakness(&Secret::new("optional").unwrap()).unwrap();
        assert!(!text.contains("optional"), "{text}");
    }
}
