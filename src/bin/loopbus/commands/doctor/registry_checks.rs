//! `doctor`'s registry checks: this instance's entry answering as itself (with the
//! secret's proof), stale entries, and port conflicts with other registered instances.

use super::{Report, Target};
use loopbus::{Config, Listed};
use std::collections::BTreeMap;

/// This instance's entry answering as itself, stale entries, and port conflicts.
pub(super) fn check(report: &mut Report, t: &Target<'_>, config: Option<&Config>) {
    let path = loopbus::registry_path(t.root);
    // No kind check: any instance that answers as its entry's name is there.
    let listed = match loopbus::list_instances(t.root, None) {
        Ok(listed) => listed,
        Err(e) => {
            report.fail(format!("cannot read {}: {e}", path.display()));
            return;
        }
    };
    match listed.iter().find(|l| &l.name == t.name) {
        None => report.fail(format!(
            "{} is not registered in {}: is `{}` running?",
            t.name,
            path.display(),
            t.serve
        )),
        Some(own) => check_own(report, t, own),
    }
    let stale: Vec<&Listed> = listed
        .iter()
        .filter(|l| &l.name != t.name && l.is_stale())
        .collect();
    for l in &stale {
        report.warn(format!(
            "registry entry {} (port {}, pid {}) is stale: {}; the next `loopbus serve` \
             under {} removes an entry whose process is gone",
            l.name,
            l.entry.port,
            l.entry.pid,
            why_stale(l),
            t.root.display()
        ));
    }
    // This instance's own entry, when stale, was reported above.
    let own_stale = listed.iter().any(|l| &l.name == t.name && l.is_stale());
    if stale.is_empty() && !own_stale {
        report.ok(format!(
            "no stale registry entries ({} registered)",
            listed.len()
        ));
    } else if stale.is_empty() {
        report.ok("no stale registry entries of other instances");
    }
    check_ports(report, t, &listed, config);
}

fn check_own(report: &mut Report, t: &Target<'_>, own: &Listed) {
    let port = own.entry.port;
    match &own.liveness {
        Ok(_) => report.ok(format!(
            "{} answers on its registered port {port} (pid {}){}",
            t.name,
            own.entry.pid,
            if own.entry.proof {
                ", proving it holds the secret"
            } else {
                ""
            },
        )),
        // Its process is gone: the port refuses, or answers as someone else.
        Err(e) if own.process_is_gone() => report.fail(format!(
            "registered port {port} does not answer as {}: the process {} that registered \
             it is gone ({e}); start it with `{}`",
            t.name, own.entry.pid, t.serve
        )),
        // Its process lives, yet the port does not answer as it: a wrong secret in the
        // registry, another program on the port, or an instance that hangs.
        Err(e) => report.fail(format!(
            "registered port {port} does not answer as {} ({e}), though its process {} is \
             alive: look at that process's log (`loopbus serve` logs to stderr), and at \
             `loopbus list`",
            t.name, own.entry.pid
        )),
    }
    if let Ok(answer) = &own.liveness {
        if answer.health.bus_enabled == Some(false) {
            report.warn(format!(
                "{} reports its bus disabled: every talk is refused",
                t.name
            ));
        }
    }
}

fn why_stale(listed: &Listed) -> String {
    if listed.process_is_gone() {
        return "its process is gone".to_owned();
    }
    match &listed.liveness {
        Err(e) => format!("its port does not answer as it ({e})"),
        Ok(_) => "its port answers".to_owned(),
    }
}

/// Two entries on one address, and a fixed `bus.port` that another live instance
/// holds.
fn check_ports(report: &mut Report, t: &Target<'_>, listed: &[Listed], config: Option<&Config>) {
    let mut by_port: BTreeMap<u16, Vec<&Listed>> = BTreeMap::new();
    for l in listed {
        by_port.entry(l.entry.port).or_default().push(l);
    }
    let mut conflicts = 0;
    for (port, holders) in &by_port {
        if holders.len() < 2 {
            continue;
        }
        conflicts += 1;
        let names: Vec<String> = holders.iter().map(|l| l.name.to_string()).collect();
        let text = format!(
            "{} are all registered on port {port}: only one can listen there; stop the \
             others, or remove their stale entries by starting them again",
            names.join(" and ")
        );
        if holders.iter().any(|l| &l.name == t.name) {
            report.fail(text);
        } else {
            report.warn(text);
        }
    }
    let fixed = config.map_or(0, |c| c.bus.port);
    if fixed != 0 {
        if let Some(holder) = by_port.get(&fixed).and_then(|holders| {
            holders
                .iter()
                .find(|l| &l.name != t.name && l.liveness.is_ok())
        }) {
            conflicts += 1;
            report.fail(format!(
                "bus.port {fixed} in config.json is where {} is registered and answering: \
                 `{}` cannot bind it; choose another port, or 0 to let the OS pick",
                holder.name, t.serve
            ));
        }
    }
    if conflicts == 0 {
        report.ok("no port conflict with another registered instance");
    }
}
