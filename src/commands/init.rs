//! `loopbus init DIR`: write a ready config.json.

use crate::cli::{local, usage, Args, CommandError, EXIT_OK};
use crate::config::{self, CONFIG_FILE};
use crate::secret::Secret;
use crate::{files, registry};

/// Help text.
pub const HELP: &str = "\
loopbus init DIR [--force] [--fixed-secret] [--kind NAME]

Create the state directory DIR (mode 0700) and write DIR/config.json (mode 0600):
the bus enabled, every peer allowed, maxDepth 3 and an OS-chosen port. No secret is
written: the instance makes a fresh one at each start and publishes it only in the
registry (mode 0600). An existing config.json is left alone unless --force is given.

--fixed-secret  also write a random bus.secret, kept across restarts (for scripts
                that call a fixed port with curl). It costs this: a secret that
                leaks, or that a squatter on a stale port learns, keeps working
                after every restart until you change it by hand.

--kind NAME     write bus.kind NAME (the `kind` health answers with) and a
                bus.acceptKinds that keeps both loopbus and cc-telegram-bridge.
                `--kind cc-telegram-bridge` lets the original TypeScript bus find
                this instance (see the README, \"Running beside cc-telegram-bridge\").

The engine gets each prompt on stdin (engine.prompt \"stdin\", the default). With
engine.prompt \"arg\" the prompt is the command's last argument instead, and every
local user can read it in the process list (ps, /proc/PID/cmdline): use \"arg\" only
for an engine that cannot read stdin, on a machine no one else uses.

Example:
  loopbus init ~/.loopbus/worker && loopbus serve --state-dir ~/.loopbus/worker
";

/// Runs `init`.
///
/// # Errors
/// Bad arguments, an existing config without `--force`, or a file system error.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(args, &["kind"], &["force", "fixed-secret"])?;
    if args.help {
        print!("{HELP}");
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let dir = args.positionals.first().ok_or_else(|| {
        usage("missing DIR; usage: loopbus init DIR [--force] [--fixed-secret] [--kind NAME]")
    })?;
    let kind = args.value("kind");
    if kind.is_some_and(|kind| kind.is_empty() || kind.chars().any(char::is_control)) {
        return Err(usage("`--kind` must be a non-empty name without control characters").into());
    }
    let dir = std::path::PathBuf::from(dir);
    let name = super::instance_name(&dir, None)?;
    let path = dir.join(CONFIG_FILE);
    if path.exists() && !args.switch("force") {
        return Err(local(format!(
            "{}: already exists; pass --force to replace it",
            path.display()
        )));
    }
    // The channel root holds the registry (secrets): create it private too, if missing.
    let root = registry::channel_root(&dir);
    for path in [&root, &dir] {
        // An existing directory another user owns or may write to is refused
        // (contract 1): that user could plant our registry or our config.
        match files::check_trusted(path, files::TrustKind::Dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(local(untrusted_message(path, &e))),
            Ok(()) => {}
        }
        files::create_dir_private(path)
            .map_err(|e| local(format!("{}: cannot create: {e}", path.display())))?;
    }
    let secret = if args.switch("fixed-secret") {
        Some(
            Secret::generate()
                .map_err(|e| local(format!("cannot read random bytes from the OS: {e}")))?,
        )
    } else {
        None
    };
    files::write_atomic(
        &path,
        config::default_config_json_with(secret.as_ref(), kind).as_bytes(),
        files::PRIVATE_FILE_MODE,
    )
    .map_err(|e| local(format!("{}: cannot write: {e}", path.display())))?;
    println!("wrote {} for instance {name}", path.display());
    println!("start it with: loopbus serve --state-dir {}", dir.display());
    Ok(EXIT_OK)
}

/// Why `init` refuses `path`: the owner, mode and fix when it is untrusted.
fn untrusted_message(path: &std::path::Path, e: &std::io::Error) -> String {
    match files::untrusted(e) {
        Some(untrusted) => format!("{untrusted}; loopbus serve would refuse it too"),
        None => format!("{}: cannot check its owner: {e}", path.display()),
    }
}
