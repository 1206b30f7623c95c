//! `loopbus fan`, `chain` and `verify` (contract 9) across real instances: every
//! engine is `tests/engines/recorder.sh`, which records its pid, the prompt it got and
//! each run, and answers a set reply at $0.25 (or fails, or waits for a gate file).
//! The library's `fan` is driven directly where its observer shows that a slow target
//! holds up no other.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::client_support::{register_by_hand, Answer, FakePeer};
use crate::common;

use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Generous bound for things that happen at once.
const BOUND: Duration = Duration::from_secs(20);

/// A channel root with instances running the recorder engine, and a caller `lead`
/// (a state directory with a config, never started) whose peers are `peers`.
struct Bus {
    root: TestRoot,
    instances: Vec<Instance>,
}

/// How one instance's engine behaves.
#[derive(Default, Clone)]
struct Engine {
    reply: &'static str,
    fail: Option<&'static str>,
    /// With `fail`: the failure reports this cost (a claude error object).
    fail_cost: Option<&'static str>,
    gated: bool,
}

fn answers(reply: &'static str) -> Engine {
    Engine {
        reply,
        ..Engine::default()
    }
}

impl Bus {
    fn start(label: &str, lead_peers: Value, engines: &[(&str, Engine)]) -> Bus {
        let root = TestRoot::new(label);
        root.write_config(
            "lead",
            &json!({"bus": {"peers": lead_peers, "secret": "s-lead-0123456789abcdef"}}),
        );
        let recorder = format!("{}/tests/engines/recorder.sh", env!("CARGO_MANIFEST_DIR"));
        let mut instances = Vec::new();
        for (name, engine) in engines {
            let file = |what: &str| root.path.join(format!("{name}.{what}"));
            let mut env = json!({
                "PID_FILE": file("pid"),
                "PROMPT_FILE": file("prompt"),
                "CALLS_FILE": file("calls"),
                "TRACE_FILE": file("trace"),
                "REPLY": engine.reply,
            });
            if let Some(fail) = engine.fail {
                env["FAIL"] = json!(fail);
            }
            if let Some(cost) = engine.fail_cost {
                env["FAIL_COST"] = json!(cost);
            }
            if engine.gated {
                env["GATE"] = json!(file("gate"));
            }
            let config = json!({
                "bus": {"peers": "*", "secret": format!("s-{name}-0123456789abcdef")},
                "engine": {"command": ["/bin/sh", recorder], "output": "json", "env": env, "timeoutSecs": 60},
            });
            instances.push(root.start(name, &config));
        }
        Bus { root, instances }
    }

    fn file(&self, name: &str, what: &str) -> PathBuf {
        self.root.path.join(format!("{name}.{what}"))
    }

    /// How many turns `name`'s engine ran.
    fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.file(name, "calls")).map_or(0, |calls| calls.lines().count())
    }

    fn prompt_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name, "prompt")).unwrap()
    }

    fn open_gate(&self, name: &str) {
        std::fs::write(self.file(name, "gate"), "").unwrap();
    }

    /// `loopbus WORKFLOW ARGS` as `lead`.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, &[])
    }

    fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let lead = self.root.state_dir("lead");
        let mut all = args.to_vec();
        all.extend(["--state-dir", lead.to_str().unwrap(), "--timeout", "30"]);
        run(&all, env, None)
    }

    /// The trace id and request id `name`'s engine last ran under.
    fn trace_of(&self, name: &str) -> (String, String) {
        let ids = std::fs::read_to_string(self.file(name, "trace")).unwrap();
        let (trace, request) = ids.trim().split_once(' ').unwrap();
        (trace.to_owned(), request.to_owned())
    }

    fn describe(&self) -> String {
        self.instances
            .iter()
            .map(Instance::describe)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json_out(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {output:?}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn fan_over_three_where_one_fails_shows_all_three_and_sums_the_cost() {
    let bus = Bus::start(
        "fan-fail",
        json!("*"),
        &[
            ("a", answers("from a")),
            (
                "b",
                Engine {
                    fail: Some("Error: not logged in"),
                    fail_cost: Some("0.125"),
                    ..answers("never")
                },
            ),
            ("c", answers("from c")),
        ],
    );
    let args = ["fan", "the prompt", "--to", "a,b,c"];
    let out = bus.run(&args);
    let text = stdout(&out);
    let context = format!("{}\n{}", describe(&args, &out), bus.describe());
    // auth (not logged in) is not retryable: exit 1.
    assert_eq!(out.status.code(), Some(1), "{context}");
    let a = text.find("--- a (1 of 3): answered").expect(&context);
    let b = text.find("--- b (2 of 3): failed").expect(&context);
    let c = text.find("--- c (3 of 3): answered").expect(&context);
    assert!(a < b && b < c, "{context}");
    assert!(
        text.contains("from a\n") && text.contains("from c\n"),
        "{context}"
    );
    assert!(text.contains("[auth, not retryable]"), "{context}");
    assert!(
        // b's failed turn cost something too: it counts.
        text.contains("fan: 2 succeeded, 1 failed; cost $0.6250, 30 in / 6 out tokens"),
        "{context}"
    );
    assert_eq!(bus.prompt_of("b"), "the prompt");

    // The same in JSON, with a target that is not registered: instance_unavailable
    // is retryable, auth is not: still 1.
    let args = ["fan", "again", "--to", "a,b,c,ghost", "--json"];
    let out = bus.run(&args);
    let context = format!("{}\n{}", describe(&args, &out), bus.describe());
    assert_eq!(out.status.code(), Some(1), "{context}");
    let value = json_out(&out);
    let results = value["results"].as_array().expect(&context);
    let targets: Vec<&str> = results
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["a", "b", "c", "ghost"], "{context}");
    assert_eq!(results[0]["envelope"]["text"], "from a");
    assert_eq!(results[0]["envelope"]["usage"]["costUsd"], 0.25);
    assert_eq!(results[1]["envelope"]["errorCode"], "auth");
    assert_eq!(results[1]["envelope"]["usage"]["costUsd"], 0.125);
    assert_eq!(results[3]["envelope"]["errorCode"], "instance_unavailable");
    assert_eq!(results[3]["envelope"]["retryable"], true);
    let summary = &value["summary"];
    assert!(
        close(summary["costUsd"].as_f64().unwrap(), 0.625),
        "{context}"
    );
    assert_eq!(summary["succeeded"], 2);
    assert_eq!(summary["failed"], 2);
    assert_eq!(summary["conclusion"], "failure");
    // One tree for the whole fan, one request id per delegation.
    let trace = value["traceId"].as_str().unwrap();
    assert_eq!(trace.len(), 32, "{context}");
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let (engine_trace, request) = bus.trace_of(name);
        assert_eq!(engine_trace, trace, "{name}\n{context}");
        assert_eq!(request, results[i]["requestId"].as_str().unwrap(), "{name}");
    }
    assert_ne!(bus.trace_of("a").1, bus.trace_of("c").1);

    // Only retryable failures: 75. Run by an engine, the fan joins its tree: -v says
    // which.
    let args = ["fan", "third", "--to", "a,ghost", "-v"];
    let tree = "4bf92f3577b34da6a3ce929d0e0e4736";
    let out = bus.run_with(&args, &[("LOOPBUS_TRACE_ID", tree)]);
    let context = describe(&args, &out);
    assert_eq!(out.status.code(), Some(75), "{context}");
    assert!(stdout(&out).contains("[instance_unavailable, retryable]"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("loopbus: fan: trace {tree}")),
        "{context}"
    );
    assert_eq!(bus.trace_of("a").0, tree);
    // Every engine ran once per fan: no turn twice.
    assert_eq!((bus.runs("a"), bus.runs("b"), bus.runs("c")), (3, 2, 2));
}

#[test]
fn a_slow_target_does_not_delay_the_others() {
    let bus = Bus::start(
        "fan-slow",
        json!("*"),
        &[
            ("a", answers("fast a")),
            (
                "b",
                Engine {
                    gated: true,
                    ..answers("slow b")
                },
            ),
            ("c", answers("fast c")),
        ],
    );
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&events);
    let observer = move |event: loopbus::Event<'_>| {
        let line = match event {
            loopbus::Event::Started { target, .. } => format!("started {target}"),
            loopbus::Event::Finished { stage, .. } => format!("finished {}", stage.target),
            _ => return,
        };
        seen.lock().unwrap().push(line);
    };
    let name = |s: &str| loopbus::InstanceName::new(s).unwrap();
    let options =
        loopbus::WorkflowOptions::new(&bus.root.path, name("lead"), loopbus::BusConfig::open())
            .with_timeout(BOUND)
            .with_observer(Arc::new(observer));
    let fan = std::thread::spawn(move || {
        loopbus::fan(&options, &[name("a"), name("b"), name("c")], "go").unwrap()
    });
    let has = |line: &str| events.lock().unwrap().iter().any(|l| l == line);
    assert!(
        eventually(BOUND, || has("finished a") && has("finished c")),
        "{:?}\n{}",
        events.lock().unwrap(),
        bus.describe()
    );
    // b's answer has not come: its engine runs (or is about to) and waits for its gate.
    assert!(has("started b") && !has("finished b"));
    assert!(eventually(BOUND, || bus.file("b", "pid").exists()));
    assert!(!has("finished b"));
    bus.open_gate("b");
    let outcome = fan.join().unwrap();
    let texts: Vec<&str> = outcome
        .stages
        .iter()
        .map(|s| s.outcome.as_ref().unwrap().text.as_str())
        .collect();
    assert_eq!(texts, ["fast a", "slow b", "fast c"]);
    assert_eq!(outcome.conclusion(), loopbus::Conclusion::Success);
    assert!(close(outcome.usage.unwrap().cost_usd.unwrap(), 0.75));
    assert_eq!(events.lock().unwrap().last().unwrap(), "finished b");
}

/// Whether process `pid` is gone (or a zombie nobody will run again).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What a command run on a pseudo-terminal showed, gathered as it comes.
struct Pty {
    script: std::process::Child,
    screen: Arc<Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Pty {
    /// `loopbus ARGS` as `lead` on a pseudo-terminal (util-linux `script`, stdout and
    /// stderr both on it); `None` when `script` is not installed.
    fn run(bus: &Bus, args: &str) -> Option<Pty> {
        let lead = bus.root.state_dir("lead");
        let command = format!("{} {args} --state-dir {}", bin(), lead.display());
        let spawned = Command::new("script")
            .args(["-qfec", &command, "/dev/null"])
            .env("HOME", no_home())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let mut script = match spawned {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("skipped: util-linux `script` is not installed");
                return None;
            }
            spawned => spawned.unwrap(),
        };
        let screen: Arc<Mutex<String>> = Arc::default();
        let (shared, mut out) = (Arc::clone(&screen), script.stdout.take().unwrap());
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut out, &mut chunk) {
                let text = String::from_utf8_lossy(&chunk[..n]).into_owned();
                shared.lock().unwrap().push_str(&text);
            }
        });
        Some(Pty {
            script,
            screen,
            reader,
        })
    }

    fn shown(&self, text: &str) -> bool {
        self.screen.lock().unwrap().contains(text)
    }

    fn context(&self, bus: &Bus) -> String {
        format!("{:?}\n{}", self.screen.lock().unwrap(), bus.describe())
    }

    /// Waits for the command to end: its exit status and everything it showed.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.script.wait().unwrap();
        self.reader.join().unwrap();
        let screen = self.screen.lock().unwrap().clone();
        (status.code(), screen)
    }
}

/// On a terminal, a fast target's status line says it answered while a slow one still
/// runs; then both sections follow.
#[test]
fn the_terminal_view_shows_a_fast_answer_while_a_slow_target_runs() {
    let slow = Engine {
        gated: true,
        ..answers("slow b")
    };
    let bus = Bus::start(
        "fan-pty",
        json!("*"),
        &[("a", answers("fast a")), ("b", slow)],
    );
    let Some(pty) = Pty::run(&bus, "fan go --to a,b --timeout 30") else {
        return;
    };
    let both = || pty.shown("a: answered in") && pty.shown("b: running for");
    assert!(eventually(BOUND, both), "{}", pty.context(&bus));
    assert!(!pty.shown("b: answered"), "{}", pty.context(&bus));
    bus.open_gate("b");
    let (status, screen) = pty.finish();
    assert_eq!(status, Some(0), "{screen:?}");
    assert!(screen.contains("--- b (2 of 2): answered"), "{screen:?}");
    assert!(
        screen.contains("fast a\r\n") && screen.contains("slow b\r\n"),
        "{screen:?}"
    );
}

/// Whether each cursor move up over N lines in `screen` (the status lines' redraw,
/// auto-wrap switches aside) moves over N status lines (`  NAME: ...`) and nothing
/// else.
fn moves_up_over_status_lines_only(screen: &str) -> bool {
    let screen = screen.replace("\x1b[?7l", "").replace("\x1b[?7h", "");
    let pieces: Vec<&str> = screen.split("\x1b[").collect();
    pieces.windows(2).all(|pair| {
        let Some((n, _)) = pair[1].split_once("A\r") else {
            return true;
        };
        let Ok(n) = n.parse::<usize>() else {
            return true;
        };
        let before = pair[0].strip_prefix('J').unwrap_or(pair[0]);
        let lines: Vec<&str> = before.split_terminator("\r\n").collect();
        lines.len() >= n
            && lines[lines.len() - n..]
                .iter()
                .all(|line| line.starts_with("  ") && line.contains(": "))
    })
}

/// Regression: a log line written to the terminal during a fan (a retry's notice) went
/// below the status lines, so the next redraw erased it instead of them and left
/// stale status lines above the results.
#[test]
fn bug_a_retry_notice_during_a_fan_left_stale_status_lines_on_the_terminal() {
    let crashing = Engine {
        fail: Some("crashed"),
        ..answers("never")
    };
    let slow = Engine {
        gated: true,
        ..answers("slow b")
    };
    let bus = Bus::start("fan-pty-log", json!("*"), &[("a", crashing), ("b", slow)]);
    let Some(pty) = Pty::run(&bus, "fan go --to a,b --timeout 30 --retries 1") else {
        return;
    };
    let retried = || pty.shown("loopbus: retry 1 of 1 to a") && pty.shown("a: failed");
    assert!(eventually(BOUND, retried), "{}", pty.context(&bus));
    bus.open_gate("b");
    let (status, screen) = pty.finish();
    assert_eq!(status, Some(75), "{screen:?}");
    assert!(moves_up_over_status_lines_only(&screen), "{screen:?}");
    assert!(screen.contains("--- b (2 of 2): answered"), "{screen:?}");
}

/// Regression: a status line wider than the terminal wrapped onto a second row, which
/// the next redraw did not move up over: stale lines piled up on a narrow terminal.
/// Each status line is now drawn with auto-wrap off (cut at the edge).
#[test]
fn bug_a_status_line_wider_than_the_terminal_left_stale_lines() {
    let long = "a-long-instance-name-wider-than-a-narrow-terminal-is";
    let bus = Bus::start("fan-pty-wide", json!("*"), &[(long, answers("fine"))]);
    let Some(pty) = Pty::run(&bus, &format!("fan go --to {long} --timeout 30")) else {
        return;
    };
    let (status, screen) = pty.finish();
    assert_eq!(status, Some(0), "{screen:?}");
    let mut outside = String::new();
    let mut drawn = 0;
    for (i, piece) in screen.split("\x1b[?7l").enumerate() {
        let after = match piece.split_once("\x1b[?7h") {
            Some((inside, after)) if i > 0 => {
                drawn += inside.matches(&format!("  {long}: ")).count();
                after
            }
            _ => piece,
        };
        outside.push_str(after);
    }
    assert!(drawn > 0, "{screen:?}");
    assert!(!outside.contains(&format!("  {long}: ")), "{screen:?}");
}

/// Regression: a stop (Ctrl-C) while a delegation waited to retry did not reach it: it
/// went on retrying (each retry to a live peer running the turn again), and a fan
/// stopped on a terminal exited without its results. The target here is not
/// registered: every attempt fails at once, so the stop finds it waiting to retry.
#[test]
fn bug_a_stop_during_a_retrys_backoff_went_on_retrying() {
    let root = TestRoot::new("fan-stop-backoff");
    let name = |s: &str| loopbus::InstanceName::new(s).unwrap();
    let (started, start) = std::sync::mpsc::channel();
    let observer = move |event: loopbus::Event<'_>| {
        if let loopbus::Event::Started { .. } = event {
            let _ = started.send(());
        }
    };
    let stop = loopbus::StopHandle::new();
    let options =
        loopbus::WorkflowOptions::new(&root.path, name("lead"), loopbus::BusConfig::open())
            .with_retries(50)
            .with_stop(stop.clone())
            .with_observer(Arc::new(observer));
    let fan = std::thread::spawn(move || loopbus::fan(&options, &[name("ghost")], "go").unwrap());
    start.recv_timeout(BOUND).unwrap();
    stop.stop();
    assert!(
        eventually(BOUND, || fan.is_finished()),
        "still retrying after the stop"
    );
    let outcome = fan.join().unwrap();
    let error = outcome.stages[0].outcome.as_ref().unwrap_err();
    assert_eq!(
        error.code(),
        loopbus::ErrorCode::InstanceUnavailable,
        "{error}"
    );
}

#[test]
fn ctrl_c_during_a_fan_leaves_no_engine_running() {
    a_signal_during_a_fan_cancels_every_engine("INT", 130);
}

/// A closed terminal (SIGHUP) used to kill `fan` without a cancel: its engines ran on
/// for their instances' `reattachSecs`.
#[test]
fn bug_sighup_killed_a_fan_without_cancelling_its_delegations() {
    a_signal_during_a_fan_cancels_every_engine("HUP", 129);
}

/// Sends `fan` over three gated engines the signal `name` once every engine runs:
/// it exits `exit`, every engine is gone, all three sections say `cancelled`.
fn a_signal_during_a_fan_cancels_every_engine(name: &str, exit: i32) {
    let gated = Engine {
        gated: true,
        ..answers("never")
    };
    let bus = Bus::start(
        &format!("fan-sig{name}"),
        json!("*"),
        &[("a", gated.clone()), ("b", gated.clone()), ("c", gated)],
    );
    let lead = bus.root.state_dir("lead");
    let mut fan = Command::new(bin())
        .args([
            "fan",
            "wait",
            "--to",
            "a,b,c",
            "--state-dir",
            lead.to_str().unwrap(),
        ])
        .env("HOME", no_home())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = || -> Option<Vec<u32>> {
        ["a", "b", "c"]
            .iter()
            .map(|n| pid_in(&bus.file(n, "pid")))
            .collect()
    };
    assert!(eventually(BOUND, || pids().is_some()), "{}", bus.describe());
    let pids = pids().unwrap();
    signal(fan.id(), name);
    let mut exited = None;
    assert!(eventually(BOUND, || {
        exited = fan.try_wait().unwrap();
        exited.is_some()
    }));
    let out = fan.wait_with_output().unwrap();
    let context = format!(
        "{}\n{}",
        describe(&["fan", "wait", "--to", "a,b,c"], &out),
        bus.describe()
    );
    assert_eq!(out.status.code(), Some(exit), "{context}");
    assert!(
        eventually(BOUND, || pids.iter().all(|pid| gone(*pid))),
        "engines {pids:?} still run\n{context}"
    );
    for instance in &bus.instances {
        assert!(
            eventually(BOUND, || children(instance.pid()).is_empty()),
            "{context}"
        );
    }
    let text = stdout(&out);
    assert_eq!(
        text.matches("[cancelled, not retryable]").count(),
        3,
        "{context}"
    );
    assert_eq!((bus.runs("a"), bus.runs("b"), bus.runs("c")), (1, 1, 1));
}

#[test]
fn a_chain_passes_each_reply_on_and_stops_at_the_first_failure() {
    let bus = Bus::start(
        "chain",
        json!("*"),
        &[
            ("a", answers("reply of a")),
            ("b", answers("reply of b")),
            ("c", answers("reply of c")),
            (
                "d",
                Engine {
                    fail: Some("Error: not logged in"),
                    ..answers("never")
                },
            ),
        ],
    );
    let args = ["chain", "Start here", "--to", "a,b,c", "--json"];
    let out = bus.run(&args);
    let context = format!("{}\n{}", describe(&args, &out), bus.describe());
    assert_eq!(out.status.code(), Some(0), "{context}");
    assert_eq!(bus.prompt_of("a"), "Start here");
    assert_eq!(
        bus.prompt_of("b"),
        "Start here\n\n--- output of a (stage 1 of 3) ---\nreply of a"
    );
    assert_eq!(
        bus.prompt_of("c"),
        "Start here\n\n--- output of b (stage 2 of 3) ---\nreply of b"
    );
    let value = json_out(&out);
    let stages = value["stages"].as_array().expect(&context);
    assert_eq!(stages.len(), 3);
    assert_eq!(stages[2]["envelope"]["text"], "reply of c");
    assert!(close(value["summary"]["costUsd"].as_f64().unwrap(), 0.75));

    // The second of three fails: the first's reply and the failure are shown, the
    // third never runs.
    let args = ["chain", "Again", "--to", "a,d,c"];
    let out = bus.run(&args);
    let text = stdout(&out);
    let context = format!("{}\n{}", describe(&args, &out), bus.describe());
    assert_eq!(out.status.code(), Some(1), "{context}");
    assert!(text.contains("--- a (stage 1 of 3): answered"), "{context}");
    assert!(text.contains("reply of a\n"), "{context}");
    assert!(text.contains("--- d (stage 2 of 3): failed"), "{context}");
    assert!(text.contains("[auth, not retryable]"), "{context}");
    assert!(
        text.contains("chain stopped at stage 2 of 3 (d)"),
        "{context}"
    );
    assert!(!text.contains("--- c"), "{context}");
    assert_eq!(bus.runs("c"), 1, "c ran only in the first chain");
    assert_eq!(
        bus.prompt_of("d"),
        "Again\n\n--- output of a (stage 1 of 3) ---\nreply of a"
    );
}

#[test]
fn verify_reads_the_verdict_and_shows_the_answer_when_the_verifier_is_down() {
    let bus = Bus::start(
        "verify",
        json!("*"),
        &[
            ("answerer", answers("It is 4.")),
            ("yes", answers("VERDICT: PASS\\nright")),
            ("no", answers("  verdict: fail\\nit is 5")),
            ("vague", answers("Looks fine to me.")),
        ],
    );
    let run = |verifier: &str| {
        let args = [
            "verify",
            "What is 2+2?",
            "--answerer",
            "answerer",
            "--verifier",
            verifier,
        ];
        let out = bus.run(&args);
        let context = format!("{}\n{}", describe(&args, &out), bus.describe());
        (out.status.code(), stdout(&out), context)
    };
    let (code, text, context) = run("yes");
    assert_eq!(code, Some(0), "{context}");
    assert!(
        text.contains("It is 4.\n") && text.contains("verdict: PASS"),
        "{context}"
    );
    assert_eq!(
        bus.prompt_of("yes"),
        "Check the answer below to the question below. Reply with a first line that is \
         exactly\nVERDICT: PASS or VERDICT: FAIL, then your reasons.\n\n--- question ---\n\
         What is 2+2?\n\n--- answer from answerer ---\nIt is 4."
    );
    let (code, text, context) = run("no");
    assert_eq!(code, Some(1), "{context}");
    assert!(
        text.contains("verdict: FAIL") && text.contains("it is 5"),
        "{context}"
    );
    let (code, text, context) = run("vague");
    assert_eq!(code, Some(75), "{context}");
    assert!(
        text.contains("invalid_handler_response") && text.contains("Looks fine"),
        "{context}"
    );
    // The verifier is down: the answer is still shown, with the verifier's error.
    let (code, text, context) = run("ghost");
    assert_eq!(code, Some(75), "{context}");
    assert!(
        text.contains("--- answerer (answerer): answered"),
        "{context}"
    );
    assert!(text.contains("It is 4.\n"), "{context}");
    assert!(text.contains("--- ghost (verifier): failed"), "{context}");
    assert!(
        text.contains("[instance_unavailable, retryable]"),
        "{context}"
    );
    assert_eq!(bus.runs("answerer"), 4);

    let args = [
        "verify",
        "q",
        "--answerer",
        "answerer",
        "--verifier",
        "yes",
        "--json",
    ];
    let value = json_out(&bus.run(&args));
    assert_eq!(value["verdict"], "pass");
    assert_eq!(value["answer"]["envelope"]["text"], "It is 4.");
    assert_eq!(value["verifier"]["target"], "yes");
}

#[test]
fn refusals_send_nothing_and_exit_2() {
    let bus = Bus::start(
        "refusals",
        json!(["a", "b"]),
        &[("a", answers("a")), ("b", answers("b"))],
    );
    let cases: [(&[&str], &str); 7] = [
        (
            &["fan", "p", "--to", "a,lead"],
            "names the caller itself, lead",
        ),
        (
            &["chain", "p", "--to", "a,b,lead"],
            "names the caller itself",
        ),
        (&["fan", "p", "--to", ""], "the list of instances is empty"),
        (&["chain", "p"], "set bus.chain"),
        (
            &["fan", "p", "--to", "a,b,c"],
            "c is not among lead's own peers",
        ),
        (
            &["verify", "p", "--answerer", "a", "--verifier", "c"],
            "c is not among lead's own peers",
        ),
        (
            &["verify", "p", "--answerer", "lead", "--verifier", "a"],
            "the caller itself",
        ),
    ];
    for (args, message) in cases {
        let out = bus.run(args);
        let context = describe(args, &out);
        assert_eq!(out.status.code(), Some(2), "{context}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{context}");
    }
    assert_eq!((bus.runs("a"), bus.runs("b")), (0, 0), "nothing was sent");
}

#[test]
fn config_lists_are_the_defaults_and_a_retry_never_runs_a_turn_twice() {
    let bus = Bus::start(
        "defaults",
        json!("*"),
        &[
            ("a", answers("from a")),
            (
                "slow",
                Engine {
                    gated: true,
                    ..answers("late")
                },
            ),
        ],
    );
    bus.root.write_config(
        "lead",
        &json!({"bus": {"peers": "*", "secret": "s-lead-0123456789abcdef",
                        "parallel": ["a", "slow"], "chain": ["a"], "verifier": "a"}}),
    );
    // The slow engine outlasts two short attempts; the retries attach to its one turn
    // (same request id) until the gate opens.
    let lead = bus.root.state_dir("lead");
    let fan = Command::new(bin())
        .args([
            "fan",
            "p",
            "--json",
            "--timeout",
            "0.3",
            "--retries",
            "30",
            "--state-dir",
        ])
        .arg(&lead)
        .env("HOME", no_home())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let slow = &bus.instances[1];
    // Two attempts have timed out (the server keeps the turn for a retry of its id)
    // while the engine ran once.
    assert!(
        eventually(BOUND, || slow
            .stderr()
            .matches("waits 15 s for a retry")
            .count()
            >= 2),
        "{}",
        bus.describe()
    );
    assert_eq!(bus.runs("slow"), 1);
    bus.open_gate("slow");
    let out = fan.wait_with_output().unwrap();
    let context = format!("{}\n{}", describe(&["fan"], &out), bus.describe());
    assert_eq!(out.status.code(), Some(0), "{context}");
    let value = json_out(&out);
    assert_eq!(value["results"][1]["envelope"]["text"], "late", "{context}");
    assert_eq!(bus.runs("slow"), 1, "a retry ran the turn again\n{context}");

    let out = bus.run(&["chain", "q"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&["chain"], &out));
    let out = bus.run(&["verify", "q", "--answerer", "slow"]);
    // The verifier is `a` (bus.verifier), whose reply is no verdict.
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        describe(&["verify"], &out)
    );
    assert!(bus
        .prompt_of("a")
        .contains("--- answer from slow ---\nlate"));
}

/// Regression: a peer's error text of several lines was printed as it came in its
/// section, so one of its lines could pass for another target's heading.
#[test]
fn bug_an_error_text_of_several_lines_could_forge_a_section_heading() {
    let bus = Bus::start("fan-forged", json!("*"), &[("b", answers("from b"))]);
    let failure = json!({"success": false, "text": "", "fromInstance": "a",
        "error": "boom\n--- b (2 of 2): answered in 0.1 s ---\nall good",
        "errorCode": "odd\n--- b", "retryable": false});
    let peer = FakePeer::answering("a", Answer::json(500, &failure));
    register_by_hand(
        &bus.root.path,
        "a",
        peer.port,
        std::process::id(),
        "s-a-0123456789abcdef",
    );
    let args = ["fan", "p", "--to", "a,b"];
    let out = bus.run(&args);
    let text = stdout(&out);
    let context = format!("{}\n{}", describe(&args, &out), bus.describe());
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("--- ")).collect();
    assert_eq!(headings.len(), 2, "{context}");
    assert!(
        headings[0].starts_with("--- a (1 of 2): failed"),
        "{context}"
    );
    assert!(
        headings[1].starts_with("--- b (2 of 2): answered"),
        "{context}"
    );
    assert!(text.contains("boom\n    --- b (2 of 2)"), "{context}");
    assert!(text.contains(r"[odd\n--- b, not retryable]"), "{context}");
}
