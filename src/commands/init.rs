//! `loopbus init DIR`: write a ready config.json.

use crate::cli::{usage, Args, UsageError, EXIT_OK};
use crate::config::{self, CONFIG_FILE};
use crate::secret::Secret;
use crate::state;

/// Help text.
pub const HELP: &str = "\
loopbus init DIR [--force]

Create the state directory DIR (mode 0700) and write DIR/config.json (mode 0600):
the bus enabled, every peer allowed, maxDepth 3, an OS-chosen port, and a fresh
random secret. An existing config.json is left alone unless --force is given.

Example:
  loopbus init ~/.loopbus/worker && loopbus serve --state-dir ~/.loopbus/worker
";

/// Runs `init`.
///
/// # Errors
/// Bad arguments, an existing config without `--force`, or a file system error.
pub fn run(args: &[String]) -> Result<i32, UsageError> {
    let args = Args::parse(args, &[], &["force"])?;
    if args.help {
        print!("{HELP}");
        return Ok(EXIT_OK);
    }
    args.at_most(1)?;
    let dir = args
        .positionals
        .first()
        .ok_or_else(|| usage("missing DIR; usage: loopbus init DIR [--force]"))?;
    let dir = std::path::PathBuf::from(dir);
    let name = super::instance_name(&dir, None)?;
    let path = dir.join(CONFIG_FILE);
    if path.exists() && !args.switch("force") {
        return Err(usage(format!(
            "{}: already exists; pass --force to replace it",
            path.display()
        )));
    }
    // The channel root (DIR's parent) holds the registry: when init creates it, it is
    // private (0700) like the state directory, not left at the umask's mode.
    let root = super::channel_root(&dir);
    state::create_dir_private(&root)
        .and_then(|()| state::create_dir_private(&dir))
        .map_err(|e| usage(format!("{}: cannot create: {e}", dir.display())))?;
    let secret = state::random_hex(32)
        .ok()
        .and_then(Secret::new)
        .ok_or_else(|| usage("cannot read random bytes from the OS"))?;
    state::write_atomic(
        &path,
        config::default_config_json(&secret).as_bytes(),
        state::PRIVATE_FILE_MODE,
    )
    .map_err(|e| usage(format!("{}: cannot write: {e}", path.display())))?;
    println!("wrote {} for instance {name}", path.display());
    println!("start it with: loopbus serve --state-dir {}", dir.display());
    Ok(EXIT_OK)
}
