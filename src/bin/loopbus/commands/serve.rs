//! `loopbus serve`: the command-line face of [`Instance`]; runs one instance until
//! SIGTERM/SIGINT.

use super::{output, terminal};
use crate::cli::{local, usage, Args, CommandError, UsageError, EXIT_OK};
use loopbus::{Instance, InstanceOptions, Secret, ServeError};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

/// Help text.
pub const HELP: &str = "\
loopbus serve [NAME | --state-dir DIR] [--name NAME] [--port N] [--bind ADDR]
              [--print-curl]

Run the instance NAME (state directory $LOOPBUS_ROOT/NAME, else ~/.loopbus/NAME),
or the one whose state directory is DIR (default: $LOOPBUS_STATE_DIR), until
SIGTERM or SIGINT. Reads DIR/config.json (create one with `loopbus init NAME`),
listens on ADDR:N (default 127.0.0.1 and bus.port; 0 lets the OS pick), and
registers in the channel root's .bus-registry.json (the root is DIR's parent).
The name defaults to DIR's last component. Only the loopback addresses 127.0.0.1
(or `localhost`) and ::1 are accepted. Once it is ready, one log line names the
instance, its address, engine, peers and budget.
--print-curl prints a ready-to-paste curl command once listening; the secret
goes to curl on its stdin (from the shell builtin printf), never in its arguments.

Examples:
  loopbus serve worker
  loopbus serve --state-dir ~/.loopbus/worker --port 7701
";

/// Runs `serve`.
///
/// # Errors
/// Bad arguments, or any [`ServeError`]: a missing or invalid config, a
/// port in use, a non-loopback address, a failure to register, a loop failure.
pub fn run(args: &[String]) -> Result<i32, CommandError> {
    let args = Args::parse(
        args,
        &["state-dir", "name", "port", "bind"],
        &["print-curl"],
    )?;
    args.at_most(1)?;
    let named = args.positionals.first().map(String::as_str);
    let state_dir = super::instance_dir(named, args.value("state-dir"), None)?;
    let root = loopbus::channel_root(&std::path::absolute(&state_dir).unwrap_or(state_dir.clone()));
    let mut options = InstanceOptions::new(state_dir).handle_signals(true);
    if let Some(name) = args.value("name") {
        options = options.name(name);
    }
    if let Some(port) = args.parsed::<u16>("port", "a port number (0-65535)")? {
        options = options.port(port);
    }
    if let Some(text) = args.value("bind") {
        options = options.bind(bind_address(text)?);
    }
    let instance = Instance::start(options).map_err(|e| name_the_holder(e, &root))?;
    if args.switch("print-curl") {
        // Serving matters more than this text: a closed stdout does not stop it.
        let _ = output::print(&curl_text(
            instance.name(),
            instance.addr(),
            instance.secret(),
        ));
    }
    instance.run()?;
    Ok(EXIT_OK)
}

/// `--bind ADDR`: an IP address, or `localhost` for 127.0.0.1 (the address the
/// clients dial).
fn bind_address(text: &str) -> Result<IpAddr, UsageError> {
    if text.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let text = text.trim_start_matches('[').trim_end_matches(']');
    text.parse().map_err(|_| {
        usage(format!(
            "`--bind` must be 127.0.0.1, localhost or ::1, not {}",
            terminal::escape_for_terminal(text)
        ))
    })
}

/// A bind failure because the port is in use, with the registered instance that holds
/// it named when the registry under `root` has one on that port.
fn name_the_holder(error: ServeError, root: &Path) -> CommandError {
    let ServeError::Bind { addr, source } = &error else {
        return error.into();
    };
    if source.kind() != io::ErrorKind::AddrInUse {
        return error.into();
    }
    let holder = loopbus::read_registry(root).ok().and_then(|entries| {
        entries
            .into_iter()
            .find(|(_, entry)| entry.port == addr.port())
    });
    match holder {
        Some((name, entry)) => local(format!(
            "cannot listen on {addr}: the port is in use, registered to instance {name} (pid \
             {}) in {}; stop it, or pick another port (--port, or bus.port; 0 lets the OS pick)",
            entry.pid,
            loopbus::registry_path(root).display()
        )),
        None => local(format!(
            "cannot listen on {addr}: the port is in use by a process not registered in {}; \
             pick another port (--port, or bus.port; 0 lets the OS pick)",
            loopbus::registry_path(root).display()
        )),
    }
}

/// What `--print-curl` prints. The secret reaches curl through its stdin
/// (`-H @-`), written by `printf`, a shell builtin: no process's argument list (which
/// every local user can read in `ps` or /proc/PID/cmdline) ever holds it.
fn curl_text(name: &str, addr: SocketAddr, secret: &Secret) -> String {
    format!(
        "loopbus: instance {name} is listening on http://{addr}\n\
         Talk to it (the secret is in this text, keep it local; the shell builtin printf \
         hands it to curl on stdin, off every command line):\n  \
         printf 'Authorization: %s\\n' {} | curl -s http://{addr}/api/talk -H @- \\\n    \
         -H 'Content-Type: application/json' -d '{{\"fromInstance\":\"operator\",\"prompt\":\"hello\",\"depth\":1}}'\n\
         Check its health:\n  curl -s http://{addr}/api/health\n",
        shell_quoted(&secret.bearer_header())
    )
}

/// `text` as one single-quoted shell word.
fn shell_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses() {
        let cases = [
            ("localhost", Some("127.0.0.1")),
            ("LOCALHOST", Some("127.0.0.1")),
            ("127.0.0.1", Some("127.0.0.1")),
            ("::1", Some("::1")),
            ("[::1]", Some("::1")),
            ("0.0.0.0", Some("0.0.0.0")), // refused at bind, with the reason
            ("example.com", None),
        ];
        for (text, want) in cases {
            let got = bind_address(text).ok().map(|ip| ip.to_string());
            assert_eq!(got.as_deref(), want, "{text}");
        }
    }

    #[test]
    fn shell_quoting_keeps_one_word() {
        assert_eq!(shell_quoted("Bearer abc"), "'Bearer abc'");
        assert_eq!(shell_quoted("it's $x"), r"'it'\''s $x'");
    }
}
