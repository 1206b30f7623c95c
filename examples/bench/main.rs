//! `make bench`: measures loopbus against the targets of issue 5 and writes the
//! Markdown table to `bench/results.md` (and stdout).
//!
//! In one run, on 127.0.0.1 only:
//! 1. `loopbus serve` (release build, echo engine): requests/s and latency
//!    p50/p99/p99.9 of `GET /api/health` and `POST /api/talk` with 1, 4 and 64
//!    keep-alive connections and with a new connection per request;
//! 2. the same load against a floor server this bench runs itself ([`floor`]),
//!    with loopbus's figures as ratios to the floor's, pair by pair;
//! 3. health latency while 1,000 connections trickle one byte a second and
//!    `maxConcurrentTurns` slow turns run ([`attack`]);
//! 4. the cost of one delegation: `loopbus talk` as a process and the library call
//!    ([`delegate`]);
//! 5. RSS idle, under 64 connections and with 1,000 idle connections, the binary's
//!    size, and the time from process start to the first health answer.
//!
//! Usage: `cargo run --release --example bench -- [--quick] [--out FILE] [--bin PATH]`.
//! `--quick` shortens every measurement (for trying the harness, not for figures) and
//! only prints the table unless `--out` is given. `--bin` measures another `loopbus`
//! binary than the release build next to this example.

mod attack;
mod delegate;
mod floor;
mod instance;
mod load;
mod machine;
mod report;

use instance::{Root, Server};
use load::{Conn, Load, Mode, Stats};
use machine::Machine;
use report::{Footprint, Pair, Report};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

/// Untimed lead-in of every load point.
const WARMUP: Duration = Duration::from_millis(500);
/// Measured window of every load point.
const WINDOW: Duration = Duration::from_millis(2_500);
/// `--quick` lead-in and window.
const QUICK_WARMUP: Duration = Duration::from_millis(200);
const QUICK_WINDOW: Duration = Duration::from_millis(500);
/// Keep-alive connection counts measured.
const KEEP_ALIVE_CLIENTS: [usize; 3] = [1, 4, 64];
/// Concurrent clients in the new-connection-per-request mode.
const NEW_CONNECTION_CLIENTS: usize = 4;
/// The keep-alive count whose peak RSS is reported.
const RSS_CLIENTS: usize = 64;
/// Queue room for the echo instance, so that 64 talk clients never meet `server_busy`
/// (the default, 16, would refuse most of them: that is back-pressure, not speed).
const ECHO_MAX_QUEUED_TURNS: usize = 128;
/// Idle connections held open for the RSS reading.
const IDLE_CONNECTIONS: usize = 1_000;
/// Descriptors the bench needs beyond the idle connections.
const SPARE_DESCRIPTORS: u64 = 64;
/// Pause before an RSS reading, so the server has settled.
const SETTLE: Duration = Duration::from_millis(300);
/// Samples of the start-up time, of `loopbus talk` and of the library call.
const STARTUP_SAMPLES: usize = 20;
const TALK_PROCESS_SAMPLES: usize = 50;
const LIBRARY_SAMPLES: usize = 1_000;
const QUICK_STARTUP_SAMPLES: usize = 5;
const QUICK_TALK_PROCESS_SAMPLES: usize = 10;
const QUICK_LIBRARY_SAMPLES: usize = 100;
/// Most attempts at finding a free port for a timed start.
const STARTUP_PORT_ATTEMPTS: usize = 5;
/// Instance names under the bench's channel root.
const ECHO: &str = "bench-echo";
const CALLER: &str = "bench-caller";
const STARTUP: &str = "bench-startup";
/// Where the table goes, relative to the crate root.
const RESULTS_FILE: &str = "bench/results.md";
/// Hand-written notes (before/after measurements of past changes), relative to the
/// crate root: appended to [`RESULTS_FILE`] as they are, so that a rerun keeps them.
const NOTES_FILE: &str = "bench/notes.md";

/// What the command line asked for.
struct Settings {
    warmup: Duration,
    window: Duration,
    startup_samples: usize,
    talk_samples: usize,
    library_samples: usize,
    quick: bool,
    /// Only the delegation figures (`--delegation`), printed, not written.
    delegation_only: bool,
    /// Where to write the table (besides stdout), if anywhere.
    out: Option<PathBuf>,
    bin: PathBuf,
    command: String,
}

fn main() -> ExitCode {
    let settings = match parse_args() {
        Ok(Some(settings)) => settings,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    if settings.delegation_only {
        return match delegation_only(&settings) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&settings) {
        Ok(report) => {
            let mut markdown = report::render(&report);
            print!("{markdown}");
            let Some(out) = &settings.out else {
                return ExitCode::SUCCESS;
            };
            let notes = Path::new(env!("CARGO_MANIFEST_DIR")).join(NOTES_FILE);
            if let Ok(notes) = std::fs::read_to_string(&notes) {
                markdown.push('\n');
                markdown.push_str(&notes);
            }
            if let Some(dir) = out.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = std::fs::write(out, &markdown) {
                eprintln!("bench: cannot write {}: {e}", out.display());
                return ExitCode::FAILURE;
            }
            eprintln!(
                "bench: wrote {} in {:.0} s",
                out.display(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Option<Settings>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = None;
    let mut bin = None;
    let mut quick = false;
    let mut delegation_only = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--delegation" => delegation_only = true,
            "--out" => out = Some(PathBuf::from(iter.next().ok_or("--out needs a file")?)),
            "--bin" => bin = Some(PathBuf::from(iter.next().ok_or("--bin needs a path")?)),
            "-h" | "--help" => {
                println!("usage: cargo run --release --example bench -- [--quick] [--delegation] [--out FILE] [--bin PATH]");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    let bin = match bin {
        Some(bin) => bin,
        None => default_bin()?,
    };
    // A quick run only prints, unless told where to write: its figures are not results.
    if out.is_none() && !quick && !delegation_only {
        out = Some(manifest.join(RESULTS_FILE));
    }
    let command = if args.is_empty() {
        "make bench".to_owned()
    } else {
        format!(
            "cargo run --locked --release --example bench -- {}",
            args.join(" ")
        )
    };
    Ok(Some(Settings {
        warmup: if quick { QUICK_WARMUP } else { WARMUP },
        window: if quick { QUICK_WINDOW } else { WINDOW },
        startup_samples: if quick {
            QUICK_STARTUP_SAMPLES
        } else {
            STARTUP_SAMPLES
        },
        talk_samples: if quick {
            QUICK_TALK_PROCESS_SAMPLES
        } else {
            TALK_PROCESS_SAMPLES
        },
        library_samples: if quick {
            QUICK_LIBRARY_SAMPLES
        } else {
            LIBRARY_SAMPLES
        },
        quick,
        delegation_only,
        out,
        bin,
        command,
    }))
}

/// The release `loopbus` next to this example: `<target>/release/examples/bench` →
/// `<target>/release/loopbus`.
fn default_bin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("loopbus"))
        .ok_or("cannot find the target directory")?;
    if !bin.is_file() {
        return Err(format!(
            "{} does not exist: run `cargo build --release` first (or `make bench`)",
            bin.display()
        ));
    }
    Ok(bin)
}

fn progress(what: &str) {
    eprintln!("bench: {what}");
}

fn run(settings: &Settings) -> Result<Report, String> {
    let mut machine = Machine::probe(settings.command.clone(), settings.quick);
    machine.timing = format!(
        "{:.1} s warm-up, then {:.1} s measured, per point",
        settings.warmup.as_secs_f64(),
        settings.window.as_secs_f64()
    );
    let root = Root::new().map_err(|e| format!("cannot create the bench root: {e}"))?;
    let mut footprint = Footprint::of_binary(&settings.bin);

    progress("start-up time");
    footprint.startup = startup_times(&settings.bin, &root, settings.startup_samples)?;

    progress("echo instance and floor server");
    let bus = json!({"maxQueuedTurns": ECHO_MAX_QUEUED_TURNS});
    let echo = Server::start(
        &settings.bin,
        &root,
        ECHO,
        &instance::config(&bus, &json!({})),
    )?;
    thread::sleep(SETTLE);
    footprint.rss_idle_kib = echo.rss_kib();
    let health_size = check_health(echo.addr)?;
    let talk_size = check_talk(echo.addr)?;
    let floor = floor::Floor::start(health_size, talk_size)
        .map_err(|e| format!("cannot start the floor server: {e}"))?;

    let pairs = throughput(settings, &echo, floor.addr())?;
    footprint.rss_64_kib = pairs
        .iter()
        .filter(|p| p.clients == RSS_CLIENTS && p.mode == Mode::KeepAlive)
        .filter_map(|p| p.loopbus.peak_rss_kib)
        .max();
    floor.stop();

    thread::sleep(SETTLE);
    footprint.rss_after_load_kib = echo.rss_kib();
    progress("1,000 idle connections");
    footprint.rss_idle_connections = idle_connections_rss(&echo);

    progress("delegation: `loopbus talk` as a process");
    root.write_config(CALLER, &instance::config(&json!({}), &json!({})))
        .map_err(|e| format!("cannot write the caller's config: {e}"))?;
    let caller_dir = root.state_dir(CALLER);
    let talk_process =
        delegate::talk_process(&settings.bin, &caller_dir, ECHO, settings.talk_samples);
    progress("delegation: library call");
    let library = delegate::library_call(&caller_dir, ECHO, settings.library_samples);
    echo.stop();

    progress("slow-connection attack");
    let attack = attack::run(&settings.bin, &root, settings.warmup, settings.window);
    machine.finish();
    Ok(Report {
        machine,
        pairs,
        attack,
        talk_process,
        library,
        footprint,
    })
}

/// `--delegation`: item 4 alone, against a fresh echo instance, as plain lines (for
/// working on the client's fast path without the whole run).
fn delegation_only(settings: &Settings) -> Result<String, String> {
    let root = Root::new().map_err(|e| format!("cannot create the bench root: {e}"))?;
    let echo = Server::start(
        &settings.bin,
        &root,
        ECHO,
        &instance::config(&json!({}), &json!({})),
    )?;
    root.write_config(CALLER, &instance::config(&json!({}), &json!({})))
        .map_err(|e| format!("cannot write the caller's config: {e}"))?;
    let caller_dir = root.state_dir(CALLER);
    progress("delegation: `loopbus talk` as a process");
    let talk = delegate::talk_process(&settings.bin, &caller_dir, ECHO, settings.talk_samples);
    progress("delegation: library call");
    let library = delegate::library_call(&caller_dir, ECHO, settings.library_samples);
    echo.stop();
    Ok(format!(
        "`loopbus talk` as a process: {}\nlibrary client call: {}\n",
        report::delegation_line(&talk),
        report::delegation_line(&library)
    ))
}

/// Median-able start-up times: spawn to first 200 from health, each on a fresh port.
fn startup_times(bin: &Path, root: &Root, samples: usize) -> Result<Vec<Duration>, String> {
    root.write_config(STARTUP, &instance::config(&json!({}), &json!({})))
        .map_err(|e| format!("cannot write the start-up config: {e}"))?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut last_error = String::new();
        for _ in 0..STARTUP_PORT_ATTEMPTS {
            let port = instance::free_port().map_err(|e| format!("no free port: {e}"))?;
            match Server::start_timed(bin, root, STARTUP, port) {
                Ok((server, took)) => {
                    times.push(took);
                    server.stop();
                    last_error.clear();
                    break;
                }
                Err(e) => last_error = e,
            }
        }
        if !last_error.is_empty() {
            return Err(last_error);
        }
    }
    Ok(times)
}

/// One health answer checked in full; returns the response's size in bytes.
fn check_health(addr: SocketAddr) -> Result<usize, String> {
    let (size, body) = exchange(addr, &instance::health_request(addr))?;
    if body["status"] != "ok" {
        return Err(format!("unexpected health answer: {body}"));
    }
    Ok(size)
}

/// One talk answer checked in full; returns the response's size in bytes.
fn check_talk(addr: SocketAddr) -> Result<usize, String> {
    let (size, body) = exchange(addr, &talk(addr, false))?;
    if body["success"] != true || body["text"] != delegate::PROMPT {
        return Err(format!("unexpected talk answer: {body}"));
    }
    Ok(size)
}

fn exchange(addr: SocketAddr, request: &str) -> Result<(usize, Value), String> {
    let mut conn = Conn::connect(addr).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let answer = conn
        .exchange(request.as_bytes())
        .map_err(|e| format!("no answer from {addr}: {e}"))?;
    if answer.status != 200 {
        return Err(format!("{addr} answered {}", answer.status));
    }
    let body = serde_json::from_slice(conn.body(&answer))
        .map_err(|e| format!("{addr} answered something that is not JSON: {e}"))?;
    Ok((answer.size(), body))
}

/// The talk request the load sends: the library's own encoding of a depth-1 request.
fn talk(addr: SocketAddr, close: bool) -> String {
    let body =
        loopbus::encode_talk_request(&loopbus::TalkRequest::new(CALLER, delegate::PROMPT, 1));
    let request = instance::talk_request(addr, &String::from_utf8_lossy(&body));
    with_close(request, close)
}

fn health(addr: SocketAddr, close: bool) -> String {
    with_close(instance::health_request(addr), close)
}

/// Adds `Connection: close` to a request's head when asked.
fn with_close(request: String, close: bool) -> String {
    if close {
        request.replacen("\r\n", "\r\nConnection: close\r\n", 1)
    } else {
        request
    }
}

/// Every point of items 1 and 2, loopbus and floor back to back, the order alternating
/// so that neither always runs first.
fn throughput(settings: &Settings, echo: &Server, floor: SocketAddr) -> Result<Vec<Pair>, String> {
    type Build = fn(SocketAddr, bool) -> String;
    let endpoints: [(&'static str, Build); 2] = [("health", health), ("talk", talk)];
    let shapes: Vec<(usize, Mode)> = KEEP_ALIVE_CLIENTS
        .iter()
        .map(|&n| (n, Mode::KeepAlive))
        .chain([(NEW_CONNECTION_CLIENTS, Mode::NewConnection)])
        .collect();
    let mut pairs = Vec::new();
    for (endpoint, build) in endpoints {
        for &(clients, mode) in &shapes {
            let close = mode == Mode::NewConnection;
            let point = |addr: SocketAddr, rss_pid: Option<u32>| Load {
                addr,
                request: build(addr, close).into_bytes().into(),
                clients,
                mode,
                warmup: settings.warmup,
                window: settings.window,
                rss_pid,
            };
            let label = format!("{endpoint}, {}", report::shape(clients, mode));
            let measure = |who: &str, load: &Load| -> Result<Stats, String> {
                progress(&format!("{label}: {who}"));
                load::run(load).map_err(|e| format!("{label}, {who}: {e}"))
            };
            let ours = point(echo.addr, Some(echo.pid()));
            let theirs = point(floor, None);
            let (loopbus, floor_stats) = if pairs.len() % 2 == 0 {
                let a = measure("loopbus", &ours)?;
                (a, measure("floor", &theirs)?)
            } else {
                let b = measure("floor", &theirs)?;
                (measure("loopbus", &ours)?, b)
            };
            pairs.push(Pair {
                endpoint,
                clients,
                mode,
                loopbus,
                floor: floor_stats,
            });
        }
    }
    Ok(pairs)
}

/// RSS with [`IDLE_CONNECTIONS`] keep-alive connections that each made one health
/// request and then went quiet; also checks health still answers meanwhile.
fn idle_connections_rss(echo: &Server) -> Result<u64, String> {
    let needed = IDLE_CONNECTIONS as u64 + SPARE_DESCRIPTORS;
    match machine::open_files_limit() {
        Some(limit) if limit < needed => {
            return Err(format!(
                "skipped: the open-files limit is {limit}, {needed} needed (ulimit -n)"
            ))
        }
        _ => {}
    }
    let request = instance::health_request(echo.addr);
    let mut conns = Vec::with_capacity(IDLE_CONNECTIONS);
    for index in 0..IDLE_CONNECTIONS {
        let mut conn =
            Conn::connect(echo.addr).map_err(|e| format!("connection {index} failed: {e}"))?;
        match conn.exchange(request.as_bytes()) {
            Ok(answer) if answer.status == 200 => conns.push(conn),
            Ok(answer) => return Err(format!("connection {index}: status {}", answer.status)),
            Err(e) => return Err(format!("connection {index}: {e}")),
        }
    }
    thread::sleep(SETTLE);
    let rss = echo.rss_kib().ok_or("cannot read the server's VmRSS")?;
    if instance::health_status(echo.addr) != Some(200) {
        return Err("health did not answer with 1,000 idle connections open".to_owned());
    }
    drop(conns);
    Ok(rss)
}
