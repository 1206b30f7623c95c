//! Nothing left behind (contract 8): stop signals clean up, engines and whatever they
//! start are killed and reaped, a turn leaves no thread or descriptor in the server,
//! usage stays valid, temp files of a killed process are removed, the budget holds
//! under concurrent turns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn engine_config(engine: Value) -> Value {
    json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": engine})
}

fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/engines")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// Whether `pid` is a process that has not exited (a zombie counts as exited).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The pid written to `path` by an engine, once it is there.
fn read_pid(path: &Path) -> u32 {
    let mut pid = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            pid = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        }),
        "no pid in {}",
        path.display()
    );
    pid.unwrap()
}

fn stops_cleanly_on(signal_name: &str) {
    let root = TestRoot::new(&format!("contain-{signal_name}"));
    let pid_file = root.path.join("engine.pid");
    let mut config = engine_config(json!({"command": [script("sleeper.sh")]}));
    config["engine"]["env"] = json!({"PID_FILE": pid_file.to_str().unwrap()});
    let mut instance = root.start("w", &config);
    let turn = instance.spawn_talk("hold on");
    let grandchild = read_pid(&pid_file);
    signal(instance.pid(), signal_name);
    assert!(
        instance.wait_for_log("stopping", Duration::from_secs(10)),
        "{}",
        instance.stderr()
    );
    // Asked again: the running turn loses its grace, its engine is killed.
    signal(instance.pid(), signal_name);
    let status = instance.wait(Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(0),
        "SIG{signal_name}: {status}\n{}",
        instance.stderr()
    );
    let registry = root.registry();
    assert!(registry["instances"].get("w").is_none(), "{registry}");
    assert!(
        eventually(Duration::from_secs(10), || !process_alive(grandchild)),
        "the engine's child {grandchild} outlived SIG{signal_name}"
    );
    let _ = turn.join();
}

#[test]
fn bug_sighup_killed_serve_with_no_cleanup() {
    stops_cleanly_on("HUP");
}

#[test]
fn bug_sigquit_killed_serve_with_no_cleanup() {
    stops_cleanly_on("QUIT");
}

#[test]
fn bug_a_cost_of_1e308_made_usage_null_and_a_corrupt_file_per_turn() {
    let root = TestRoot::new("contain-cost");
    let mut config = engine_config(json!({"command": [script("huge_cost.sh")], "output": "json"}));
    config["budgetUsd"] = json!(5);
    let instance = root.start("w", &config);
    for _ in 0..3 {
        let v = instance.talk("c", "hi", 0).json();
        assert_eq!(v["success"], false, "{v}");
        assert_eq!(v["errorCode"], "engine_cli", "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("MAX_TURN_COST_USD"),
            "{v}"
        );
    }
    let bytes = std::fs::read(instance.state_dir.join("usage.json")).unwrap();
    let usage: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(usage["totalCostUsd"], json!(0.0), "{usage}");
    assert_eq!(usage["requestCount"], 3, "{usage}");
    let corrupt: Vec<_> = std::fs::read_dir(&instance.state_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert!(corrupt.is_empty(), "{corrupt:?}");
    // The budget still works: a good turn is admitted.
    assert_eq!(instance.health()["instance"], "w");
}

#[test]
fn bug_temp_files_left_by_kill_9_were_never_removed() {
    let root = TestRoot::new("contain-temp");
    let state_dir = root.state_dir("w");
    std::fs::create_dir_all(&state_dir).unwrap();
    // Beyond any pid_max: no live process owns these.
    let stale_usage = state_dir.join(".usage.json.tmp.2147483646.0");
    let stale_registry = root.path.join(".bus-registry.json.tmp.2147483646.3");
    // This test process is alive: its temp file is kept.
    let live = root
        .path
        .join(format!(".bus-registry.json.tmp.{}.1", std::process::id()));
    for path in [&stale_usage, &stale_registry, &live] {
        std::fs::write(path, b"{").unwrap();
    }
    let instance = root.start("w", &open_config("s-0123456789abcdef"));
    assert!(!stale_usage.exists(), "{}", instance.stderr());
    assert!(!stale_registry.exists(), "{}", instance.stderr());
    assert!(live.exists());
}

/// Whether `/proc` has any entry for `pid`, a zombie included.
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// How many entries `/proc/<pid>/<what>` has (`task`: threads, `fd`: descriptors).
fn count_in_proc(pid: u32, what: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/{what}"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn have_setsid() -> bool {
    std::process::Command::new("setsid")
        .arg("true")
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `turns` turns of an engine whose child escapes its group (holding its pipes,
/// or not) and checks that each child is killed and reaped, and that the server's
/// threads and descriptors return to where they were.
fn escaped_children_are_killed_and_reaped(label: &str, hold_pipes: bool, turns: usize) {
    if !have_setsid() {
        eprintln!("skipped: no `setsid` (util-linux) to escape a process group with");
        return;
    }
    let root = TestRoot::new(label);
    let pid_file = root.path.join("escaped.pids");
    let mut config = engine_config(json!({"command": [script("escape_group.sh")]}));
    config["engine"]["env"] = json!({
        "PID_FILE": pid_file.to_str().unwrap(),
        "HOLD_PIPES": if hold_pipes { "1" } else { "0" },
    });
    let instance = root.start("w", &config);
    let server = instance.pid();
    let escaped = |n: usize| -> Vec<u32> {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(pids.len(), n, "{text}");
        pids
    };
    let all_gone = |pids: &[u32]| {
        eventually(Duration::from_secs(10), || {
            pids.iter().all(|pid| !process_exists(*pid))
        })
    };
    // A first turn warms the server up; then the baseline.
    assert_success(&instance.talk("c", "hi", 0), "w", "escaped", "warm-up");
    assert!(
        all_gone(&escaped(1)),
        "the first escaped child outlived its turn"
    );
    // The audit writer opens its file with the first line, a moment after the answer:
    // the baseline is taken once that descriptor is open.
    let audit = instance.state_dir.join("audit.log.jsonl");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::metadata(&audit)
            .is_ok_and(|m| m.len() > 0)),
        "the warm-up turn was never audited"
    );
    let threads = count_in_proc(server, "task");
    let fds = count_in_proc(server, "fd");
    for n in 0..turns {
        assert_success(
            &instance.talk("c", "hi", 0),
            "w",
            "escaped",
            &format!("turn {n}"),
        );
    }
    let pids = escaped(turns + 1);
    assert!(
        all_gone(&pids),
        "escaped children left behind: {:?}\n{}",
        pids.iter()
            .filter(|p| process_exists(**p))
            .collect::<Vec<_>>(),
        instance.stderr()
    );
    assert!(
        eventually(Duration::from_secs(10), || count_in_proc(server, "task")
            <= threads
            && count_in_proc(server, "fd") <= fds),
        "threads {} (was {threads}), fds {} (was {fds})",
        count_in_proc(server, "task"),
        count_in_proc(server, "fd")
    );
}

#[test]
fn bug_children_escaping_with_setsid_held_the_pipes_and_leaked_threads_and_fds() {
    escaped_children_are_killed_and_reaped("contain-hold", true, 3);
}

#[test]
fn bug_an_engines_child_that_escapes_its_group_was_never_killed() {
    escaped_children_are_killed_and_reaped("contain-escape", false, 3);
}

/// Sends 8 talks at once to a $0.60 engine under a $1.00 budget; returns the total
/// spent and how many turns succeeded.
fn eight_concurrent_turns(instance: &Instance) -> (f64, usize) {
    let talks: Vec<_> = (0..8).map(|_| instance.spawn_talk("spend")).collect();
    let mut succeeded = 0;
    for talk in talks {
        let v = talk.join().unwrap().json();
        if v["success"] == true {
            succeeded += 1;
        } else {
            assert_eq!(v["errorCode"], "budget_exhausted", "{v}");
        }
    }
    let usage: Value =
        serde_json::from_slice(&std::fs::read(instance.state_dir.join("usage.json")).unwrap())
            .unwrap();
    (usage["totalCostUsd"].as_f64().unwrap(), succeeded)
}

fn budget_config(engine: Value) -> Value {
    json!({
        "bus": {"peers": "*", "secret": "s-0123456789abcdef", "maxConcurrentTurns": 8},
        "budgetUsd": 1.0,
        "engine": engine,
    })
}

/// The documented bound: the spend stays under budgetUsd plus one turn's cost.
const BUDGET: f64 = 1.0;
const TURN_COST: f64 = 0.6;

#[test]
fn bug_concurrent_turns_overshot_the_budget_threefold() {
    let root = TestRoot::new("contain-budget");
    let config = budget_config(json!({
        "command": [script("cost_060.sh")], "output": "json", "maxTurnCostUsd": TURN_COST
    }));
    let instance = root.start("w", &config);
    let (spent, succeeded) = eight_concurrent_turns(&instance);
    assert!(spent < BUDGET + TURN_COST, "spent {spent} of {BUDGET}");
    assert!(
        (spent - TURN_COST * succeeded as f64).abs() < 1e-9,
        "{spent} {succeeded}"
    );
    assert!(succeeded >= 1);
}

#[test]
fn the_recent_mean_reserves_for_running_turns_without_a_cap() {
    let root = TestRoot::new("contain-budget-mean");
    let config = budget_config(json!({"command": [script("cost_060.sh")], "output": "json"}));
    let instance = root.start("w", &config);
    // One turn gives the mean.
    assert_eq!(instance.talk("c", "first", 0).json()["success"], true);
    let (spent, _) = eight_concurrent_turns(&instance);
    assert!(spent < BUDGET + TURN_COST, "spent {spent} of {BUDGET}");
}

/// Regression: at shutdown, a process an engine left behind (escaped with `setsid`,
/// ignoring SIGTERM) got SIGTERM only: serve exited before the SIGKILL that follows
/// `LEFTOVER_KILL_GRACE`, and the process lived on under PID 1. Serve now waits until
/// its engines' leftovers are killed and reaped before it exits.
#[test]
fn bug_leftovers_of_an_engine_survived_shutdown() {
    if !have_setsid() {
        eprintln!("skipped: no `setsid` (util-linux) to escape a process group with");
        return;
    }
    let root = TestRoot::new("contain-shutdown-leftover");
    let pid_file = root.path.join("leftover.pid");
    let mut config = engine_config(json!({"command": [script("stubborn_leftover.sh")]}));
    config["engine"]["env"] = json!({"PID_FILE": pid_file.to_str().unwrap()});
    let mut instance = root.start("w", &config);
    let turn = instance.spawn_talk("leave something");
    let leftover = read_pid(&pid_file);
    assert!(process_alive(leftover));
    signal(instance.pid(), "TERM");
    let status = instance.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", instance.stderr());
    let _ = turn.join();
    // Once serve has exited, nothing of it is left to reap the leftover: it must be
    // gone already (or, as PID 1's zombie, about to be).
    let gone = eventually(Duration::from_secs(10), || !process_alive(leftover));
    if !gone {
        let _ = common::try_signal(leftover, rustix::process::Signal::KILL);
    }
    assert!(
        gone,
        "process {leftover}, left by an engine, outlived serve\n{}",
        instance.stderr()
    );
}
