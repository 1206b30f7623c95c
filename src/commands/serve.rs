//! `loopbus serve`: the command-line face of [`Instance`]; runs one instance until
//! SIGTERM/SIGINT.

use crate::cli::{usage, Args, CommandError, EXIT_OK};
use crate::secret::Secret;
use crate::server::{Instance, InstanceOptions};
use std::net::{IpAddr, SocketAddr};

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
/// Bad arguments, or any [`crate::server::ServeError`]: a missing or invalid config, a
/// port in use, a non-loopback address, a failure to register, a loop failure.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
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
    let state_dir = super::state_dir_from(args.value("state-dir"))?;
    let mut options = InstanceOptions::new(state_dir).handle_signals(true);
    if let Some(name) = args.value("name") {
        options = options.name(name);
    }
    if let Some(port) = args.parsed::<u16>("port", "a port number (0-65535)")? {
        options = options.port(port);
    }
    if let Some(text) = args.value("bind") {
        let ip: IpAddr = text
            .parse()
            .map_err(|_| usage(format!("`--bind` must be an IP address, not {text:?}")))?;
        options = options.bind(ip);
    }
    let instance = Instance::start(options)?;
    if args.switch("print-curl") {
        print_curl(instance.name(), instance.addr(), instance.secret());
    }
    instance.run()?;
    Ok(EXIT_OK)
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
    // `make run` pipes nothing, but a supervisor may read stdout through a pipe.
    let _ = std::io::Write::flush(&mut std::io::stdout());
}
