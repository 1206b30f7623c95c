//! What the bench measured, the machine it ran on, the targets, and the
//! Markdown table written to `bench/results.md`.

use crate::attack::{self, Attack};
use crate::delegate::Delegation;
use crate::load::{self, Mode, Stats};
use crate::machine::Machine;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// Issue 5's targets.
const MIN_THROUGHPUT_RATIO: f64 = 0.8;
const MAX_ATTACK_P99: Duration = Duration::from_millis(5);
const MAX_RSS_IDLE_KIB: u64 = 4 * 1024;
const MAX_RSS_IDLE_CONNECTIONS_KIB: u64 = 16 * 1024;
const MAX_BINARY_BYTES: u64 = 2 * 1024 * 1024;
const MAX_STARTUP: Duration = Duration::from_millis(10);
/// The keep-alive connection count the throughput targets are about.
const TARGET_CLIENTS: usize = 4;
/// Largest binary read whole to look for a symbol table.
const MAX_BINARY_SCAN: u64 = 256 * 1024 * 1024;

/// One load shape measured against loopbus and against the floor.
pub struct Pair {
    /// `health` or `talk`.
    pub endpoint: &'static str,
    /// Closed-loop clients.
    pub clients: usize,
    /// Keep-alive or new connection per request.
    pub mode: Mode,
    /// loopbus's figures.
    pub loopbus: Stats,
    /// The floor's figures.
    pub floor: Stats,
}

/// How a shape reads in the table.
pub fn shape(clients: usize, mode: Mode) -> String {
    match mode {
        Mode::KeepAlive => format!("{clients} keep-alive"),
        Mode::NewConnection => format!("{clients} × new conn."),
    }
}

/// Memory, size and start-up.
pub struct Footprint {
    /// Fresh instance, after its first answers.
    pub rss_idle_kib: Option<u64>,
    /// Peak during the 64-connection points.
    pub rss_64_kib: Option<u64>,
    /// Once the load points are over.
    pub rss_after_load_kib: Option<u64>,
    /// With 1,000 idle keep-alive connections, or why it was not measured.
    pub rss_idle_connections: Result<u64, String>,
    /// The release binary's size in bytes, and whether it has no symbol table.
    binary: Option<(u64, Option<bool>)>,
    /// Spawn to first health answer, one per start.
    pub startup: Vec<Duration>,
}

impl Default for Footprint {
    fn default() -> Footprint {
        Footprint {
            rss_idle_kib: None,
            rss_64_kib: None,
            rss_after_load_kib: None,
            rss_idle_connections: Err("not measured".to_owned()),
            binary: None,
            startup: Vec::new(),
        }
    }
}

impl Footprint {
    /// A footprint that knows the size of the binary at `bin`.
    pub fn of_binary(bin: &Path) -> Footprint {
        let size = std::fs::metadata(bin).ok().map(|m| m.len());
        Footprint {
            binary: size.map(|size| (size, is_stripped(bin, size))),
            ..Footprint::default()
        }
    }
}

/// Whether an ELF file has no `.symtab` section (its name would be in the section
/// name table); `None` when it could not be read.
fn is_stripped(bin: &Path, size: u64) -> Option<bool> {
    if size > MAX_BINARY_SCAN {
        return None;
    }
    let bytes = std::fs::read(bin).ok()?;
    Some(load::find(&bytes, b".symtab\0").is_none())
}

/// Everything one run measured.
pub struct Report {
    /// Where and how.
    pub machine: Machine,
    /// Items 1 and 2.
    pub pairs: Vec<Pair>,
    /// Item 3, or why it failed.
    pub attack: Result<Attack, String>,
    /// Item 4, `loopbus talk` as a process.
    pub talk_process: Delegation,
    /// Item 4, the library call.
    pub library: Delegation,
    /// Item 5.
    pub footprint: Footprint,
}

/// One target of the issue, judged.
struct Verdict {
    target: String,
    goal: String,
    measured: String,
    /// `None` when it could not be measured.
    pass: Option<bool>,
}

fn verdicts(report: &Report) -> Vec<Verdict> {
    let mut rows = Vec::new();
    for endpoint in ["health", "talk"] {
        let pair = report.pairs.iter().find(|p| {
            p.endpoint == endpoint && p.clients == TARGET_CLIENTS && p.mode == Mode::KeepAlive
        });
        let ratio = pair.and_then(|p| ratio(p.loopbus.rps(), p.floor.rps()));
        rows.push(Verdict {
            target: format!("{endpoint} throughput, {TARGET_CLIENTS} keep-alive connections"),
            goal: format!("≥ {MIN_THROUGHPUT_RATIO:.1}× floor"),
            measured: pair.map_or_else(dash, |p| {
                format!(
                    "{} ({} vs {} req/s)",
                    times(ratio),
                    thousands(p.loopbus.rps()),
                    thousands(p.floor.rps())
                )
            }),
            pass: ratio.map(|r| r >= MIN_THROUGHPUT_RATIO),
        });
    }
    let attack_p99 = report
        .attack
        .as_ref()
        .ok()
        .and_then(|a| a.health.percentile(99.0));
    rows.push(Verdict {
        target: format!(
            "health p99, {} slow connections + slow turns",
            thousands(attack::SLOW_CONNECTIONS as f64)
        ),
        goal: format!("< {}", latency(Some(MAX_ATTACK_P99))),
        measured: latency(attack_p99),
        pass: attack_p99.map(|p| p < MAX_ATTACK_P99),
    });
    let footprint = &report.footprint;
    rows.push(Verdict {
        target: "RSS idle".to_owned(),
        goal: format!("< {}", mib(MAX_RSS_IDLE_KIB * 1024)),
        measured: footprint.rss_idle_kib.map_or_else(dash, kib),
        pass: footprint.rss_idle_kib.map(|k| k < MAX_RSS_IDLE_KIB),
    });
    let idle_connections = footprint.rss_idle_connections.as_ref().ok().copied();
    rows.push(Verdict {
        target: "RSS, 1,000 idle connections".to_owned(),
        goal: format!("< {}", mib(MAX_RSS_IDLE_CONNECTIONS_KIB * 1024)),
        measured: idle_connections.map_or_else(dash, kib),
        pass: idle_connections.map(|k| k < MAX_RSS_IDLE_CONNECTIONS_KIB),
    });
    let binary = footprint.binary.map(|(size, _)| size);
    rows.push(Verdict {
        target: "stripped release binary".to_owned(),
        goal: format!("< {}", mib(MAX_BINARY_BYTES)),
        measured: binary.map_or_else(dash, mib),
        pass: binary.map(|b| b < MAX_BINARY_BYTES),
    });
    let startup = load::median(&footprint.startup);
    rows.push(Verdict {
        target: "start to first health answer (median)".to_owned(),
        goal: format!("< {}", latency(Some(MAX_STARTUP))),
        measured: latency(startup),
        pass: startup.map(|s| s < MAX_STARTUP),
    });
    rows
}

/// The whole Markdown document.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = render_into(&mut out, report);
    out
}

fn render_into(out: &mut String, report: &Report) -> std::fmt::Result {
    let m = &report.machine;
    writeln!(out, "# loopbus benchmarks\n")?;
    writeln!(
        out,
        "Written by `make bench` (`examples/bench/`); rerun it rather than editing this file. The sections after the generated ones are `bench/notes.md`, copied as they are."
    )?;
    if m.quick {
        writeln!(
            out,
            "\n**Quick run (`--quick`): shortened measurements, for trying the harness only.**"
        )?;
    }
    writeln!(out, "\n| run | |\n| --- | --- |")?;
    writeln!(out, "| date | {} |", m.date)?;
    writeln!(
        out,
        "| machine | {}, nproc {}, {} RAM, Linux {} |",
        m.cpu, m.nproc, m.memory, m.kernel
    )?;
    writeln!(
        out,
        "| load average (1 min) before the run | {} |",
        m.load_before
    )?;
    writeln!(
        out,
        "| CPU taken by other processes during the run | {} |",
        m.foreign_cpu.map_or_else(dash, |share| format!(
            "{:.0}% of all CPU time{}",
            share * 100.0,
            if m.noisy() {
                " (**busy machine: figures are noisy**)"
            } else {
                ""
            }
        ))
    )?;
    writeln!(out, "| command | `{}` |", m.command)?;
    writeln!(out, "| commit | {} |", m.commit)?;
    writeln!(
        out,
        "| method | closed-loop clients on std threads, 127.0.0.1 only; {}; only requests answered 200 inside the window count; latency percentiles are nearest-rank over every counted request |",
        m.timing
    )?;

    writeln!(out, "\n## Targets (issue 5)\n")?;
    writeln!(
        out,
        "| target | goal | measured | result |\n| --- | --- | --- | --- |"
    )?;
    for v in verdicts(report) {
        let result = match v.pass {
            Some(true) => "PASS",
            Some(false) => "**MISS**",
            None => "not measured",
        };
        writeln!(
            out,
            "| {} | {} | {} | {result} |",
            v.target, v.goal, v.measured
        )?;
    }

    render_pairs(out, &report.pairs)?;
    render_attack(out, &report.attack)?;
    render_delegation(out, report)?;
    render_footprint(out, &report.footprint)
}

fn render_pairs(out: &mut String, pairs: &[Pair]) -> std::fmt::Result {
    writeln!(
        out,
        "\n## Throughput and latency: loopbus against the floor\n"
    )?;
    writeln!(
        out,
        "loopbus: `loopbus serve`, release build, echo engine, default config but `maxQueuedTurns` {} (so that 64 talk clients are queued, not refused). \
         Floor: a server inside the bench on std, one thread per connection, keep-alive, no validation, a fixed reply of the same size as loopbus's. \
         Ratio: loopbus ÷ floor (req/s: higher is better; latency: lower is better). \
         Server CPU: user + system CPU time of the `loopbus serve` process over the window (from /proc, 10 ms ticks), per request answered; the floor shares the bench's process, so it has none.\n",
        crate::ECHO_MAX_QUEUED_TURNS
    )?;
    writeln!(
        out,
        "| endpoint | clients | server | req/s | p50 | p99 | p99.9 | errors | server CPU/req |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for p in pairs {
        let shape = shape(p.clients, p.mode);
        for (who, s) in [("loopbus", &p.loopbus), ("floor", &p.floor)] {
            writeln!(
                out,
                "| {} | {} | {who} | {} | {} | {} | {} | {} | {} |",
                p.endpoint,
                shape,
                thousands(s.rps()),
                latency(s.percentile(50.0)),
                latency(s.percentile(99.0)),
                latency(s.percentile(99.9)),
                s.errors,
                s.cpu_per_request()
                    .map_or_else(dash, |d| format!("{:.1} µs", d.as_secs_f64() * 1e6))
            )?;
        }
        let lat = |q: f64| {
            let a = p.loopbus.percentile(q).map(|d| d.as_secs_f64());
            let b = p.floor.percentile(q).map(|d| d.as_secs_f64());
            times(a.zip(b).and_then(|(a, b)| ratio(a, b)))
        };
        writeln!(
            out,
            "| {} | {} | *ratio* | *{}* | *{}* | *{}* | *{}* | | |",
            p.endpoint,
            shape,
            times(ratio(p.loopbus.rps(), p.floor.rps())),
            lat(50.0),
            lat(99.0),
            lat(99.9)
        )?;
    }
    Ok(())
}

fn render_attack(out: &mut String, attack: &Result<Attack, String>) -> std::fmt::Result {
    writeln!(out, "\n## Health under a slow-connection attack\n")?;
    let a = match attack {
        Ok(a) => a,
        Err(e) => return writeln!(out, "Not measured: {}", one_line(e)),
    };
    writeln!(
        out,
        "A fresh instance whose engine is `sh -c 'sleep {}; cat'`. Its `maxConcurrentTurns` turns are started and left running; \
         then {} connections each send one byte of a never-ending request head per second, spread evenly; \
         meanwhile one keep-alive client asks for health in a closed loop.\n",
        attack::SLOW_TURN.as_secs(),
        thousands(a.slow_connections as f64)
    )?;
    writeln!(out, "| measure | value |\n| --- | ---: |")?;
    let h = &a.health;
    writeln!(
        out,
        "| health p50 / p99 / p99.9 | {} / {} / {} |",
        latency(h.percentile(50.0)),
        latency(h.percentile(99.0)),
        latency(h.percentile(99.9))
    )?;
    writeln!(
        out,
        "| health req/s (one client), errors | {}, {} |",
        thousands(h.rps()),
        h.errors
    )?;
    writeln!(
        out,
        "| slow connections open at the end / opened | {} / {} |",
        a.slow_connections_open, a.slow_connections
    )?;
    writeln!(
        out,
        "| slow turns running before / answered after | {} / {} of {} |",
        a.slow_turns_running, a.slow_turns_ok, a.slow_turns
    )?;
    writeln!(
        out,
        "| peak RSS during the attack | {} |",
        h.peak_rss_kib.map_or_else(dash, kib)
    )
}

fn render_delegation(out: &mut String, report: &Report) -> std::fmt::Result {
    writeln!(out, "\n## One delegation, end to end (echo engine)\n")?;
    writeln!(
        out,
        "| path | samples | median | fastest | slowest |\n| --- | ---: | ---: | ---: | ---: |"
    )?;
    let rows = [
        (
            "`loopbus talk TARGET PROMPT` as a process",
            &report.talk_process,
        ),
        ("library client call", &report.library),
    ];
    for (path, d) in rows {
        match d {
            Delegation::Measured {
                samples,
                median,
                min,
                max,
            } => writeln!(
                out,
                "| {path} | {samples} | {} | {} | {} |",
                latency(Some(*median)),
                latency(Some(*min)),
                latency(Some(*max))
            )?,
            Delegation::NotAvailable(why) => {
                writeln!(out, "| {path} | – | not available: {} | | |", one_line(why))?
            }
            Delegation::Failed(why) => {
                writeln!(out, "| {path} | – | failed: {} | | |", one_line(why))?
            }
        }
    }
    Ok(())
}

/// One delegation measurement on one line: `median M (fastest F, slowest S, N samples)`.
pub fn delegation_line(d: &Delegation) -> String {
    match d {
        Delegation::Measured {
            samples,
            median,
            min,
            max,
        } => format!(
            "median {} (fastest {}, slowest {}, {samples} samples)",
            latency(Some(*median)),
            latency(Some(*min)),
            latency(Some(*max))
        ),
        Delegation::NotAvailable(why) => format!("not available: {}", one_line(why)),
        Delegation::Failed(why) => format!("failed: {}", one_line(why)),
    }
}

fn render_footprint(out: &mut String, f: &Footprint) -> std::fmt::Result {
    writeln!(out, "\n## Footprint and start-up\n")?;
    writeln!(out, "| measure | value |\n| --- | ---: |")?;
    writeln!(
        out,
        "| RSS idle (fresh instance) | {} |",
        f.rss_idle_kib.map_or_else(dash, kib)
    )?;
    writeln!(
        out,
        "| RSS under 64 keep-alive connections (peak) | {} |",
        f.rss_64_kib.map_or_else(dash, kib)
    )?;
    writeln!(
        out,
        "| RSS idle after the load points | {} |",
        f.rss_after_load_kib.map_or_else(dash, kib)
    )?;
    let idle = match &f.rss_idle_connections {
        Ok(k) => kib(*k),
        Err(e) => one_line(e),
    };
    writeln!(
        out,
        "| RSS with 1,000 idle keep-alive connections (after the load points) | {idle} |"
    )?;
    let binary = match f.binary {
        Some((size, stripped)) => format!(
            "{} ({} bytes{})",
            mib(size),
            thousands(size as f64),
            match stripped {
                Some(true) => ", no symbol table",
                Some(false) => ", **has a symbol table**",
                None => "",
            }
        ),
        None => dash(),
    };
    writeln!(out, "| release binary | {binary} |")?;
    let min = f.startup.iter().min().copied();
    let max = f.startup.iter().max().copied();
    writeln!(
        out,
        "| start to first health answer, median of {} (fastest, slowest) | {} ({}, {}) |",
        f.startup.len(),
        latency(load::median(&f.startup)),
        latency(min),
        latency(max)
    )
}

fn ratio(ours: f64, floor: f64) -> Option<f64> {
    (floor > 0.0 && ours.is_finite()).then(|| ours / floor)
}

fn times(ratio: Option<f64>) -> String {
    ratio.map_or_else(dash, |r| format!("{r:.2}×"))
}

fn dash() -> String {
    "–".to_owned()
}

/// A latency in µs below a millisecond, else in ms.
fn latency(d: Option<Duration>) -> String {
    match d {
        None => dash(),
        Some(d) if d < Duration::from_millis(1) => format!("{} µs", d.as_micros()),
        Some(d) if d < Duration::from_secs(1) => format!("{:.2} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
    }
}

fn kib(k: u64) -> String {
    mib(k * 1024)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A count with thousands separators, rounded.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The first line of a message, with table-breaking characters replaced.
fn one_line(text: &str) -> String {
    text.lines().next().unwrap_or("").replace('|', "/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_table() {
        let cases = [
            (thousands(0.0), "0"),
            (thousands(999.4), "999"),
            (thousands(1_000.0), "1,000"),
            (thousands(1_234_567.0), "1,234,567"),
            (latency(Some(Duration::from_micros(45))), "45 µs"),
            (latency(Some(Duration::from_micros(4_560))), "4.56 ms"),
            (latency(None), "–"),
            (mib(3 * 1024 * 1024 / 2), "1.50 MiB"),
            (times(ratio(4.0, 5.0)), "0.80×"),
            (times(ratio(1.0, 0.0)), "–"),
            (one_line("a|b\nc"), "a/b"),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
