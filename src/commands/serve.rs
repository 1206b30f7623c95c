//! `loopbus serve`: run one instance until SIGTERM/SIGINT.

use crate::cli::{usage, Args, UsageError, EXIT_OK};
use crate::config::{self, CONFIG_FILE};
use crate::engine::Engine;
use crate::http::{self, EventLoop};
use crate::protocol::InstanceName;
use crate::secret::Secret;
use crate::server::{Bus, ServerSettings};
use crate::turns::TurnPool;
use crate::{files, registry};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

/// Locked by the running `serve` of a state directory, for its whole lifetime.
pub const SERVE_LOCK_FILE: &str = ".serve.lock";

/// Help text.
pub const HELP: &str = "\
loopbus serve [--state-dir DIR] [--name NAME] [--port N] [--bind ADDR] [--print-curl]

Run the instance whose state directory is DIR (default: $LOOPBUS_STATE_DIR) until
SIGTERM or SIGINT. Reads DIR/config.json (create one with `loopbus init DIR`),
listens on ADDR:N (default 127.0.0.1 and bus.port; 0 lets the OS pick), and
registers in the channel root's .bus-registry.json (the root is DIR's parent).
The name defaults to DIR's last component. Only loopback addresses are accepted.
--print-curl prints a ready-to-paste curl command, secret included, once listening.

Example:
  loopbus serve --state-dir ~/.loopbus/worker --port 7701
";

/// Runs `serve`.
///
/// # Errors
/// Bad arguments, a missing or invalid config, a port in use, a non-loopback
/// address, or a failure to register.
pub fn run(args: &[String]) -> Result<i32, UsageError> {
    let args = Args::parse(
        args,
        &["state-dir", "name", "port", "bind"],
        &["print-curl"],
    )?;
    if args.help {
        print!("{HELP}");
        return Ok(EXIT_OK);
    }
    args.at_most(0)?;
    // Absolute, so that an engine running in another `engine.cwd` still finds it
    // through LOOPBUS_STATE_DIR.
    let state_dir = super::state_dir_from(args.value("state-dir"))?;
    let state_dir = std::path::absolute(&state_dir).unwrap_or(state_dir);
    let name = super::instance_name(&state_dir, args.value("name"))?;
    let root = super::channel_root(&state_dir);
    let config_path = state_dir.join(CONFIG_FILE);

    let loaded = config::read_file(&config_path)
        .and_then(|bytes| Ok((config::parse_file(&config_path, &bytes)?, bytes)));
    let (config, config_bytes) = loaded.map_err(|e| super::config_usage_error(&state_dir, &e))?;
    if let Ok(Some(mode)) = files::mode_is_wider(&config_path, files::PRIVATE_FILE_MODE) {
        log::warn!(
            "{} has mode {mode:o}; it holds the bus secret, so 600 is advised",
            config_path.display()
        );
    }

    if let Ok(Some(mode)) = files::mode_is_wider(&root, 0o755) {
        log::warn!(
            "{} has mode {mode:o}: others can write to the channel root that holds the registry",
            root.display()
        );
    }
    // Held until the process exits: no second `serve` for this state directory.
    let _serving = files::hold_lock(&state_dir.join(SERVE_LOCK_FILE))
        .map_err(|e| usage(format!("{}: cannot lock: {e}", state_dir.display())))?
        .ok_or_else(|| {
            usage(format!(
                "another loopbus serve is already running for {}",
                state_dir.display()
            ))
        })?;
    claim_name(&root, &name)?;

    let port = match args.parsed::<u16>("port", "a port number (0-65535)")? {
        Some(port) => port,
        None => config.bus.port,
    };
    let ip: IpAddr = match args.value("bind") {
        Some(text) => text
            .parse()
            .map_err(|_| usage(format!("`--bind` must be an IP address, not {text:?}")))?,
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    let listener = http::bind_loopback(SocketAddr::new(ip, port)).map_err(|e| {
        usage(format!(
            "cannot listen on {}: {e}",
            SocketAddr::new(ip, port)
        ))
    })?;

    let secret = match &config.bus.secret {
        Some(secret) => secret.clone(),
        None => Secret::generate()
            .map_err(|e| usage(format!("cannot read random bytes from the OS: {e}")))?,
    };
    let (interrupt, _guards) = signal_pipe()?;
    let mut event_loop = EventLoop::new(listener, Some(interrupt))
        .map_err(|e| usage(format!("cannot start the event loop: {e}")))?;
    let addr = event_loop.local_addr();

    let engine = Engine::new(&name, state_dir.clone());
    let running = engine.running.clone();
    let engine = Arc::new(engine);
    let pool = TurnPool::start(
        config.bus.max_concurrent_turns,
        config.bus.max_queued_turns,
        engine,
        event_loop.waker(),
    )
    .map_err(|e| usage(format!("cannot start turn workers: {e}")))?;

    let pid = std::process::id();
    registry::register(&root, &name, addr.port(), pid, &secret).map_err(|e| {
        usage(format!(
            "cannot register in {}: {e}",
            registry::registry_path(&root).display()
        ))
    })?;
    log::info!("serving {name} on {addr} (pid {pid})");
    if args.switch("print-curl") {
        print_curl(&name, addr, &secret);
    }

    let settings = ServerSettings {
        name: name.clone(),
        config_path,
        config,
        config_bytes,
        secret,
        port: addr.port(),
        state_dir,
        root: root.clone(),
        running,
    };
    let mut bus = Bus::new(settings, pool);
    // A bug that panics the loop must still take the instance out of the registry.
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| event_loop.run(&mut bus)));
    match registry::deregister(&root, &name, pid) {
        Ok(_) => {}
        Err(e) => log::warn!("cannot deregister from the registry: {e}"),
    }
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            log::error!("event loop failed: {e}");
            return Ok(crate::cli::EXIT_FAILURE);
        }
        Err(_) => {
            log::error!("event loop panicked; deregistered and exiting");
            return Ok(crate::cli::EXIT_FAILURE);
        }
    }
    let pool = bus.into_pool();
    if pool.is_idle() {
        pool.join();
    }
    log::info!("stopped {name}");
    Ok(EXIT_OK)
}

/// Before listening: refuses to start when an instance of the same name is already
/// running under `root` (its registered port answers health as `name`), then prunes
/// stale registry entries (contract section 6). A registry that can't be read or
/// written here is only a warning; `register` reports real trouble.
fn claim_name(root: &std::path::Path, name: &InstanceName) -> Result<(), UsageError> {
    match registry::running(root, name) {
        Ok(Some(entry)) => {
            return Err(usage(format!(
                "an instance named {name} is already running under {} (pid {}, port {})",
                root.display(),
                entry.pid,
                entry.port
            )))
        }
        Ok(None) => {}
        Err(e) => log::warn!("cannot read the registry: {e}"),
    }
    match registry::prune(root) {
        Ok(pruned) => {
            for stale in pruned {
                log::info!("removed the stale registry entry of {stale}");
            }
        }
        Err(e) => log::warn!("cannot prune the registry: {e}"),
    }
    Ok(())
}

/// A stream that becomes readable on SIGTERM or SIGINT, and the registrations that keep
/// those signals routed to it.
fn signal_pipe() -> Result<(mio::net::UnixStream, Vec<signal_hook::SigId>), UsageError> {
    let fail = |e: std::io::Error| usage(format!("cannot set up signal handling: {e}"));
    let (read, write) = std::os::unix::net::UnixStream::pair().map_err(fail)?;
    read.set_nonblocking(true).map_err(fail)?;
    write.set_nonblocking(true).map_err(fail)?;
    let mut guards = Vec::new();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let write = write.try_clone().map_err(fail)?;
        guards.push(signal_hook::low_level::pipe::register(signal, write).map_err(fail)?);
    }
    Ok((mio::net::UnixStream::from_std(read), guards))
}

fn print_curl(name: &str, addr: SocketAddr, secret: &Secret) {
    println!("loopbus: instance {name} is listening on http://{addr}");
    println!("Talk to it (the bus secret is in this command; keep it local):");
    println!(
        "  curl -s http://{addr}/api/talk -H 'Authorization: {}' -H 'Content-Type: application/json' \\\n    -d '{{\"fromInstance\":\"me\",\"prompt\":\"hello\",\"depth\":0}}'",
        secret.bearer_header()
    );
    println!("Check its health:");
    println!("  curl -s http://{addr}/api/health");
}
