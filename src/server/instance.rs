//! The composition root: one instance from start to stop. [`Instance::start`] reads the
//! config, locks the state directory, binds, then claims the name and registers in one
//! hold of the registry lock; [`Instance::run`] serves until a shutdown is asked for,
//! then deregisters. An instance dropped without `run` deregisters too, and stops its
//! threads.

use super::error::setup;
use super::registry_check::Registration;
use super::startup::{
    check_config, interrupt_pair, parse_config, prune_registry, read_trusted_config, ready_line,
    remove_stale_temp_files, route_signals,
};
use super::turn_table::TurnTable;
use super::{Bus, ServeError};
use crate::audit::AuditLog;
use crate::config::{EngineConfig, CONFIG_FILE};
use crate::engine::{Engine, Turn};
use crate::files;
use crate::http::{self, EventLoop};
use crate::protocol::InstanceName;
use crate::registry;
use crate::secret::Secret;
use crate::turns::TurnPool;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Locked by the running instance of a state directory, for its whole lifetime.
pub const SERVE_LOCK_FILE: &str = ".serve.lock";

/// Which engine an instance runs, in place of config.json's `engine` (which is then
/// ignored, also at reloads).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EngineOverride {
    /// The built-in echo engine: the reply is the prompt, unchanged.
    Echo,
    /// This engine command.
    Command(EngineConfig),
}

/// How to start an [`Instance`]. Only the state directory is required; the rest have
/// the defaults of `loopbus serve`.
///
/// ```no_run
/// use loopbus::{Instance, InstanceOptions};
///
/// let instance = Instance::start(InstanceOptions::new("/tmp/bus/worker").port(0))?;
/// println!("{} listens on {}", instance.name(), instance.addr());
/// let stop = instance.shutdown_handle();
/// let serving = std::thread::spawn(move || instance.run());
/// stop.shutdown();
/// serving.join().expect("the instance thread")?;
/// # Ok::<(), loopbus::ServeError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InstanceOptions {
    state_dir: PathBuf,
    name: Option<String>,
    ip: IpAddr,
    port: Option<u16>,
    engine: Option<EngineOverride>,
    handle_signals: bool,
}

impl InstanceOptions {
    /// Options for the instance whose state directory is `state_dir` (which holds its
    /// config.json; its parent is the channel root). The name defaults to the
    /// directory's last component, the address to 127.0.0.1 and the port to
    /// `bus.port`.
    pub fn new(state_dir: impl Into<PathBuf>) -> InstanceOptions {
        InstanceOptions {
            state_dir: state_dir.into(),
            name: None,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: None,
            engine: None,
            handle_signals: false,
        }
    }

    /// The instance's name, instead of the state directory's last component.
    pub fn name(mut self, name: impl Into<String>) -> InstanceOptions {
        self.name = Some(name.into());
        self
    }

    /// The address to listen on: 127.0.0.1 (the default) or ::1.
    pub fn bind(mut self, ip: IpAddr) -> InstanceOptions {
        self.ip = ip;
        self
    }

    /// The port to listen on, instead of `bus.port`; 0 lets the OS pick.
    pub fn port(mut self, port: u16) -> InstanceOptions {
        self.port = Some(port);
        self
    }

    /// The engine to run, instead of config.json's `engine`.
    pub fn engine(mut self, engine: EngineOverride) -> InstanceOptions {
        self.engine = Some(engine);
        self
    }

    /// Whether the process is the instance's own (`loopbus serve` turns it on; off by
    /// default, so an embedder's process keeps its own handling): SIGTERM, SIGINT,
    /// SIGHUP, SIGQUIT, and the other signals that end a process by default (SIGUSR1,
    /// SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO) stop the instance, and the process
    /// becomes a child subreaper
    /// that kills and reaps every child that is not a running engine (what an engine
    /// left behind).
    pub fn handle_signals(mut self, on: bool) -> InstanceOptions {
        self.handle_signals = on;
        self
    }
}

/// Asks a running [`Instance`] to stop, from any thread, the way SIGTERM does: no new
/// connections, queued turns answered `server_busy`, running turns given their grace.
/// Asking twice skips the grace.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<UnixStream>);

impl ShutdownHandle {
    /// Asks the instance to stop; returns at once.
    pub fn shutdown(&self) {
        // Non-blocking: if the pipe is full, a stop is already pending.
        let _ = (&*self.0).write(&[1]);
    }
}

/// One running instance: bound, registered, and ready to [`run`](Instance::run).
/// Dropping it without `run` closes its port, stops its turn workers, and removes its
/// registry entry (the fields drop in this order).
pub struct Instance {
    event_loop: EventLoop,
    bus: Bus,
    registration: Registration,
    shutdown: ShutdownHandle,
    /// Held until the instance is dropped: no second serve for this state directory.
    _serving: File,
    /// Keep the signals routed to the loop while the instance lives.
    _signals: Vec<signal_hook::SigId>,
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("name", &self.bus.name)
            .field("root", &self.registration.root)
            .field("addr", &self.bus.addr)
            .field("pid", &self.bus.pid)
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// Starts an instance: reads and validates config.json, takes the state
    /// directory's lock, prunes stale registry entries, binds, and registers, refusing
    /// a name that is already running under the channel root (the check and the write
    /// in one hold of the registry lock).
    ///
    /// # Errors
    ///
    /// Any [`ServeError`] but `Loop` and `Panicked`.
    pub fn start(options: InstanceOptions) -> Result<Instance, ServeError> {
        // Absolute, so that an engine running in another `engine.cwd` still finds it
        // through LOOPBUS_STATE_DIR.
        let state_dir =
            std::path::absolute(&options.state_dir).unwrap_or(options.state_dir.clone());
        let name = options
            .name
            .or_else(|| registry::default_name(&state_dir))
            .ok_or_else(|| {
                ServeError::InvalidName(format!(
                    "{}: cannot take an instance name from this path; pass --name",
                    state_dir.display()
                ))
            })?;
        let name = InstanceName::new(name).map_err(|e| ServeError::InvalidName(e.to_string()))?;
        let root = registry::channel_root(&state_dir);
        let config_path = state_dir.join(CONFIG_FILE);
        let config_bytes = read_trusted_config(&config_path)?;
        let config = parse_config(&config_path, &config_bytes, options.engine.as_ref())?;
        remove_stale_temp_files(&[&state_dir, &root]);
        check_config(&config, &config_path)?;

        let serving = files::hold_lock(&state_dir.join(SERVE_LOCK_FILE))
            .map_err(setup(format!("{}: cannot lock", state_dir.display())))?
            .ok_or_else(|| ServeError::AlreadyServing(state_dir.clone()))?;
        prune_registry(&root, &name);

        let requested = SocketAddr::new(options.ip, options.port.unwrap_or(config.bus.port));
        let listener = http::bind_loopback(requested).map_err(|source| ServeError::Bind {
            addr: requested,
            source,
        })?;
        let secret = config.bus.secret.clone().map_or_else(Secret::generate, Ok);
        let secret = secret.map_err(setup("cannot read random bytes from the OS"))?;
        let engine = Engine::new(&name, state_dir.clone());
        let running = engine.running.clone();
        let (interrupt, shutdown) =
            interrupt_pair().map_err(setup("cannot set up the stop pipe"))?;
        let signals = if options.handle_signals {
            // The process is the instance's own: what its engines leave behind is ours.
            if let Err(e) = crate::engine::contain_leftovers(&running) {
                log::warn!("cannot become a child subreaper: {e}; processes that escape an engine's group will outlive it");
            }
            route_signals(&shutdown).map_err(setup("cannot set up signal handling"))?
        } else {
            Vec::new()
        };
        let addr = listener
            .local_addr()
            .map_err(setup("cannot start the event loop"))?;
        let event_loop = EventLoop::new(listener, interrupt, config.bus.max_concurrent_turns)
            .map_err(setup("cannot start the event loop"))?;
        let waker = event_loop.waker();
        // The server glues the two: a worker runs a turn on the engine, then wakes the
        // loop. Waking fails only if the OS refuses the write to mio's eventfd; the
        // result then waits for the next wake-up.
        let pool = TurnPool::start(
            config.bus.max_concurrent_turns,
            config.bus.max_queued_turns,
            move |turn: &Turn| engine.run(turn),
            move || {
                let _ = waker.wake();
            },
        )
        .map_err(setup("cannot start turn workers"))?;
        let audit =
            AuditLog::start(&state_dir, &name).map_err(setup("cannot start the audit writer"))?;

        let pid = std::process::id();
        let registration = Registration::claim(root, name.clone(), addr, pid, &secret)?;
        log::info!("{}", ready_line(&name, addr, pid, &config));
        if !config.bus.enabled {
            super::upkeep::warn_bus_disabled(&config_path);
        }
        let bus = Bus {
            table: TurnTable::new(name.clone()),
            name,
            secret,
            config: Arc::new(config),
            config_path,
            config_bytes,
            engine_override: options.engine,
            pool,
            stopping_since: None,
            engines_killed_at: None,
            audit,
            running,
            pid,
            addr,
        };
        Ok(Instance {
            event_loop,
            bus,
            registration,
            shutdown: ShutdownHandle(Arc::new(shutdown)),
            _serving: serving,
            _signals: signals,
        })
    }

    /// The instance's name.
    pub fn name(&self) -> &InstanceName {
        &self.bus.name
    }

    /// The address it listens on (with the port the OS picked, for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.bus.addr
    }

    /// The channel root it is registered under.
    pub fn root(&self) -> &Path {
        &self.registration.root
    }

    /// The bus secret in force (from config.json, or generated at this start).
    pub fn secret(&self) -> &Secret {
        &self.bus.secret
    }

    /// A handle that stops [`run`](Instance::run) from any thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Serves until a shutdown is asked for (a [`ShutdownHandle`], or a signal when
    /// [`InstanceOptions::handle_signals`] is on), then deregisters and stops its
    /// threads (a turn worker still running a killed engine's turn exits after it).
    ///
    /// # Errors
    ///
    /// [`ServeError::Loop`] if polling failed, [`ServeError::Panicked`] if the loop
    /// panicked; the instance is deregistered either way.
    pub fn run(mut self) -> Result<(), ServeError> {
        // A bug that panics the loop must still take the instance out of the registry,
        // and leave no engine running.
        let running = self.bus.running.clone();
        let result = match catch_unwind(AssertUnwindSafe(|| self.event_loop.run(&mut self.bus))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ServeError::Loop(e)),
            Err(_) => Err(ServeError::Panicked),
        };
        if result.is_err() {
            log::error!(
                "the server loop failed; killing {} engine(s)",
                running.count()
            );
            running.kill_all();
        }
        drop(self.registration);
        // What the engines left behind is killed and reaped before serve exits: once it
        // has, it would be PID 1's (contract section 8).
        if !running.wait_contained() {
            log::warn!("exiting with processes left behind by engines still alive");
        }
        result?;
        // Dropping the bus writes what its audit log still queues and stops the workers.
        let name = self.bus.name.clone();
        drop(self.bus);
        log::info!("stopped {name}");
        Ok(())
    }
}
