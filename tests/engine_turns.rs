//! Engine turns (contract section 8): real engine commands as small shell scripts,
//! budget and usage, timeouts, output limits, the turn pool, audit lines, shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
mod common;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/engines")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn engine_config(engine: Value) -> Value {
    json!({"bus": {"peers": "*", "secret": "s"}, "engine": engine})
}

fn failure(r: &HttpResponse) -> (String, bool, String) {
    let v = r.json();
    assert_eq!(v["success"], false, "{v}");
    (
        v["errorCode"].as_str().unwrap().to_owned(),
        v["retryable"].as_bool().unwrap(),
        v["error"].as_str().unwrap().to_owned(),
    )
}

fn audit_lines(instance: &Instance) -> Vec<Value> {
    std::fs::read_to_string(instance.state_dir.join("audit.log.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Children of `pid` that are zombies (state Z), from /proc.
fn zombie_children(pid: u32) -> Vec<u32> {
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // Fields after the command (which is in parentheses): state, ppid, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) == Some(&pid.to_string().as_str()) && fields.first() == Some(&"Z") {
            zombies.push(child);
        }
    }
    zombies
}

fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn json_engine_usage_adds_up_and_budget_refuses_without_calling_the_engine() {
    let root = TestRoot::new("budget");
    let calls = root.path.join("calls");
    let mut config = engine_config(json!({
        "command": ["sh", script("json_cost.sh")],
        "output": "json",
        "env": {"CALLS_FILE": calls.to_string_lossy()},
    }));
    config["budgetUsd"] = json!(1.0);
    let a = root.start("worker", &config);
    for i in 0..3 {
        let r = a.talk("caller", &format!("p{i}"), 0);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.json()["text"], format!("ok: p{i}"));
    }
    let usage: Value =
        serde_json::from_slice(&std::fs::read(a.state_dir.join("usage.json")).unwrap()).unwrap();
    assert_eq!(usage["requestCount"], 3);
    assert_eq!(usage["totalInputTokens"], 300);
    assert_eq!(usage["totalOutputTokens"], 60);
    assert_eq!(usage["totalCachedTokens"], 21);
    assert!((usage["totalCostUsd"].as_f64().unwrap() - 1.2).abs() < 1e-9);
    assert!(usage["lastUpdatedAt"].is_string());
    assert_eq!(file_mode(&a.state_dir.join("usage.json")), 0o600);

    let r = a.talk("caller", "one more", 0);
    assert_eq!(r.status, 200);
    let (code, retryable, error) = failure(&r);
    assert_eq!(code, "budget_exhausted");
    assert!(!retryable);
    assert_eq!(error, "Budget exhausted: $1.2000 used of $1.00.");
    let call_count = std::fs::read_to_string(&calls).unwrap().lines().count();
    assert_eq!(
        call_count, 3,
        "the engine must not run once the budget is spent"
    );

    // Raising the budget in config.json takes effect without a restart.
    config["budgetUsd"] = json!(5.0);
    root.write_config("worker", &config);
    assert!(eventually(Duration::from_secs(5), || a
        .talk("caller", "again", 0)
        .json()["success"]
        == true));
}

#[test]
fn corrupt_usage_is_set_aside_and_the_budget_still_holds() {
    let root = TestRoot::new("usage-corrupt");
    let mut config =
        engine_config(json!({"command": ["sh", script("json_cost.sh")], "output": "json"}));
    config["budgetUsd"] = json!(1.0);
    let a = root.start("worker", &config);
    for _ in 0..3 {
        assert_eq!(a.talk("c", "x", 0).json()["success"], true);
    }
    std::fs::write(a.state_dir.join("usage.json"), b"{\"totalCostUsd\": tor").unwrap();
    let (code, _, error) = failure(&a.talk("c", "x", 0));
    assert_eq!(code, "budget_exhausted");
    assert_eq!(error, "Budget exhausted: $1.2000 used of $1.00.");
    let aside = std::fs::read_dir(&a.state_dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("usage.json.corrupt-")
        })
        .count();
    assert_eq!(aside, 1);
}

#[test]
fn auth_failure_is_classified_and_not_retryable() {
    let root = TestRoot::new("authfail");
    let a = root.start(
        "worker",
        &engine_config(json!({"command": ["sh", script("auth_fail.sh")]})),
    );
    let r = a.talk("caller", "hi", 0);
    assert_eq!(r.status, 200);
    let (code, retryable, error) = failure(&r);
    assert_eq!(code, "auth");
    assert!(!retryable);
    assert!(error.contains("Invalid API key"), "{error}");
    let lines = audit_lines(&a);
    let last = lines.last().unwrap();
    assert_eq!(last["outcome"], "failure");
    assert_eq!(last["metadata"]["errorCode"], "auth");
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let root = TestRoot::new("timeout");
    let pid_file = root.path.join("grandchild.pid");
    let a = root.start(
        "worker",
        &engine_config(json!({
            "command": ["sh", script("sleeper.sh")],
            "timeoutSecs": 1,
            "env": {"PID_FILE": pid_file.to_string_lossy()},
        })),
    );
    let r = a.talk("caller", "hi", 0);
    let (code, retryable, _) = failure(&r);
    assert_eq!(code, "timeout");
    assert!(retryable);
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !process_alive(grandchild)),
        "the engine's background process {grandchild} survived the timeout"
    );
    assert!(eventually(Duration::from_secs(5), || zombie_children(
        a.pid()
    )
    .is_empty()));
}

#[test]
fn output_past_the_limit_is_cut_and_memory_stays_bounded() {
    let root = TestRoot::new("flood");
    let a = root.start(
        "worker",
        &engine_config(json!({"command": ["sh", script("flood_stdout.sh")]})),
    );
    let r = a.talk("caller", "hi", 0);
    let (code, retryable, error) = failure(&r);
    assert_eq!(code, "engine_cli");
    assert!(retryable);
    assert!(error.contains("maxOutputBytes"), "{error}");
    assert!(a.rss_kib() < 64 * 1024, "rss {} KiB", a.rss_kib());
    a.health();
    assert!(eventually(Duration::from_secs(5), || zombie_children(
        a.pid()
    )
    .is_empty()));
}

#[test]
fn chatty_stderr_does_not_deadlock() {
    let root = TestRoot::new("stderr");
    let a = root.start(
        "worker",
        &engine_config(json!({"command": ["sh", script("noisy_stderr.sh")]})),
    );
    let r = a.talk("caller", "ping", 0);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["text"], "quiet answer to ping");
}

#[test]
fn prompt_as_argument_and_loopbus_variables() {
    let root = TestRoot::new("argmode");
    let a = root.start(
        "worker",
        &engine_config(
            json!({"command": ["sh", script("arg_echo.sh"), "--flag"], "prompt": "arg"}),
        ),
    );
    let r = a.talk("caller", "the prompt", 2);
    assert_eq!(r.json()["text"], "the prompt|worker|caller|2|worker");
}

#[test]
fn spawn_failure_is_engine_cli() {
    let root = TestRoot::new("nospawn");
    let a = root.start(
        "worker",
        &engine_config(json!({"command": ["/nonexistent/engine-binary"]})),
    );
    let (code, retryable, error) = failure(&a.talk("caller", "x", 0));
    assert_eq!(code, "engine_cli");
    assert!(retryable);
    assert!(error.contains("cannot start engine"), "{error}");
}

#[test]
fn health_answers_while_turns_run_and_a_full_queue_is_server_busy() {
    let root = TestRoot::new("busy");
    let mut config =
        engine_config(json!({"command": ["sh", script("slow.sh")], "env": {"SLOW_SECS": "3"}}));
    config["bus"]["maxConcurrentTurns"] = json!(2);
    config["bus"]["maxQueuedTurns"] = json!(1);
    let a = root.start("worker", &config);
    let callers: Vec<_> = (0..3).map(|i| a.spawn_talk(&format!("p{i}"))).collect();
    assert!(
        eventually(Duration::from_secs(5), || {
            let h = a.health();
            h["turns"]["running"] == 2 && h["turns"]["queued"] == 1
        }),
        "turns did not reach 2 running + 1 queued"
    );
    health_within(a.port, LIVENESS_BOUND).expect("health answers while turns run");
    assert_eq!(a.health()["turns"]["max"], 2);
    let busy = a.talk("c", "overflow", 0);
    assert_eq!(busy.status, 503);
    let (code, retryable, _) = failure(&busy);
    assert_eq!(code, "server_busy");
    assert!(retryable);
    for caller in callers {
        let r = caller.join().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.json()["text"].as_str().unwrap().starts_with("slow: p"));
    }
    let lines = audit_lines(&a);
    assert!(lines
        .iter()
        .any(|l| l["metadata"]["errorCode"] == "server_busy" && l["outcome"] == "refused"));
}

#[test]
fn sigterm_answers_running_and_queued_turns_then_exits_zero() {
    let root = TestRoot::new("shutdown");
    let mut config =
        engine_config(json!({"command": ["sh", script("slow.sh")], "env": {"SLOW_SECS": "2"}}));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    config["bus"]["maxQueuedTurns"] = json!(4);
    let mut a = root.start("worker", &config);
    let running = a.spawn_talk("first");
    assert!(eventually(Duration::from_secs(5), || a.health()["turns"]
        ["running"]
        == 1));
    let queued = a.spawn_talk("second");
    assert!(eventually(Duration::from_secs(5), || a.health()["turns"]
        ["queued"]
        == 1));
    let status = a.terminate(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", a.stderr());
    let running = running.join().unwrap();
    assert_eq!(running.status, 200);
    assert_eq!(running.json()["text"], "slow: first");
    let queued = queued.join().unwrap();
    assert_eq!(queued.status, 503);
    assert_eq!(queued.json()["errorCode"], "server_busy");
    assert!(root.registry()["instances"].get("worker").is_none());
}

#[test]
fn audit_lines_for_success_failure_and_each_refusal() {
    let root = TestRoot::new("audit");
    let secret = "audit-test-secret-4f1c9e";
    let mut config = json!({"bus": {"peers": ["caller"], "secret": secret, "maxDepth": 2}});
    let a = root.start("worker", &config);
    assert_eq!(a.talk("caller", "secret prompt text", 0).status, 200);
    assert_eq!(a.talk("stranger", "x", 0).status, 403);
    assert_eq!(a.talk("caller", "x", 5).status, 429);
    let bad_auth = request(
        a.port,
        &format!("POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer nope\r\nContent-Length: 2\r\n\r\n{{}}", a.host()),
    );
    assert_eq!(bad_auth.status, 401);
    assert_eq!(a.talk_body(&json!({"fromInstance": "caller"})).status, 400);
    config["engine"] = json!({"command": ["sh", script("auth_fail.sh")]});
    root.write_config("worker", &config);
    assert!(eventually(Duration::from_secs(5), || a
        .talk("caller", "x", 0)
        .json()["errorCode"]
        == "auth"));
    // Regression: an engine that quotes the prompt in its error put the prompt's text
    // into the audit log through the failure's message.
    config["engine"] = json!({"command": ["sh", script("quote_prompt_fail.sh")]});
    root.write_config("worker", &config);
    assert!(eventually(Duration::from_secs(5), || {
        a.talk("caller", "quoted secret prompt (engine.maxOutputBytes)", 0)
            .json()["errorCode"]
            == "engine_cli"
    }));
    config["bus"]["peers"] = json!(false);
    root.write_config("worker", &config);
    assert!(eventually(Duration::from_secs(5), || {
        a.talk("caller", "x", 0).json()["errorCode"] == "bus_disabled"
    }));

    let lines = audit_lines(&a);
    let find = |outcome: &str, code: Option<&str>| {
        lines.iter().find(|l| {
            l["outcome"] == outcome
                && match code {
                    Some(c) => l["metadata"]["errorCode"] == c,
                    None => l["metadata"]["errorCode"].is_null(),
                }
        })
    };
    let success = find("success", None).expect("success line");
    assert_eq!(success["metadata"]["fromInstance"], "caller");
    assert_eq!(success["metadata"]["promptChars"], 18);
    assert_eq!(success["metadata"]["depth"], 0);
    assert!(success["metadata"]["durationMs"].is_u64());
    assert_eq!(success["instanceName"], "worker");
    assert_eq!(success["type"], "talk");
    assert!(success["timestamp"].is_string());
    for code in [
        "peer_not_allowed",
        "max_depth_exceeded",
        "auth_failed",
        "invalid_request",
        "bus_disabled",
    ] {
        assert!(
            find("refused", Some(code)).is_some(),
            "no refused line for {code}"
        );
    }
    assert!(find("failure", Some("auth")).is_some());
    let text = std::fs::read_to_string(a.state_dir.join("audit.log.jsonl")).unwrap();
    assert!(
        !text.contains("secret prompt text"),
        "the audit log must not hold prompt text"
    );
    assert!(
        !text.contains("quoted secret prompt"),
        "the audit log must not hold prompt text quoted by an engine"
    );
    assert!(
        !text.contains(secret),
        "the audit log must not hold the secret"
    );
    assert_eq!(file_mode(&a.state_dir.join("audit.log.jsonl")), 0o600);
}

#[test]
fn no_zombies_after_many_turns() {
    let root = TestRoot::new("zombies");
    let a = root.start(
        "worker",
        &engine_config(json!({"command": ["sh", script("arg_echo.sh")], "prompt": "arg"})),
    );
    for i in 0..10 {
        assert_eq!(a.talk("c", &format!("n{i}"), 0).status, 200);
    }
    assert!(eventually(Duration::from_secs(5), || zombie_children(
        a.pid()
    )
    .is_empty()));
}

/// Regression: serve kept a relative --state-dir as given, so an engine running in
/// another `engine.cwd` could not find its own state through LOOPBUS_STATE_DIR.
#[test]
fn relative_state_dir_still_reaches_an_engine_in_another_cwd() {
    let root = TestRoot::new("relcwd");
    root.write_config(
        "worker",
        &engine_config(json!({
            "command": ["sh", "-c", "test -f \"$LOOPBUS_STATE_DIR/config.json\" && echo found || echo missing"],
            "cwd": "/",
        })),
    );
    let stderr = std::fs::File::create(root.path.join("rel.stderr")).unwrap();
    let child = std::process::Command::new(bin())
        .args(["serve", "--state-dir", "worker"])
        .current_dir(&root.path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut instance = Instance {
        name: "worker".into(),
        port: 0,
        secret: String::new(),
        child: Some(child),
        stderr_path: root.path.join("rel.stderr"),
        state_dir: root.state_dir("worker"),
    };
    assert!(eventually(Duration::from_secs(10), || {
        root.registry()["instances"]["worker"]["port"]
            .as_u64()
            .is_some()
    }));
    let entry = root.registry()["instances"]["worker"].clone();
    instance.port = u16::try_from(entry["port"].as_u64().unwrap()).unwrap();
    instance.secret = entry["secret"].as_str().unwrap().to_owned();
    let r = instance.talk("caller", "x", 0);
    assert_eq!(r.json()["text"], "found", "{r:?}");
}

/// Regression: a caller that hung up while its turn was queued still had the turn run
/// (spending a worker slot and budget).
#[test]
fn a_queued_turn_whose_caller_hangs_up_never_runs() {
    use std::io::Write;
    let root = TestRoot::new("abandon");
    let calls = root.path.join("calls");
    let mut config = engine_config(json!({
        "command": ["sh", "-c", "echo call >> \"$CALLS_FILE\"; sleep 2; cat"],
        "env": {"CALLS_FILE": calls.to_string_lossy()},
    }));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    let a = root.start("worker", &config);
    let first = a.spawn_talk("kept");
    assert!(eventually(Duration::from_secs(5), || a.health()["turns"]
        ["running"]
        == 1));
    for i in 0..3 {
        let mut stream = connect(a.port);
        stream
            .write_all(&a.talk_request("c", &format!("dropped {i}"), 0))
            .unwrap();
        assert!(eventually(Duration::from_secs(5), || a.health()["turns"]
            ["queued"]
            == 1));
        drop(stream);
        assert!(
            eventually(Duration::from_secs(5), || a.health()["turns"]["queued"]
                == 0),
            "the turn of hung-up caller {i} stayed queued"
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || a.health()["turns"]["queued"]
            == 0),
        "the hung-up callers' turns stayed queued"
    );
    assert_eq!(first.join().unwrap().json()["text"], "kept");
    thread::sleep(Duration::from_millis(300));
    let runs = std::fs::read_to_string(&calls).unwrap().lines().count();
    assert_eq!(runs, 1, "turns of callers that hung up were run");
    let abandoned = audit_lines(&a)
        .iter()
        .filter(|l| l["outcome"] == "abandoned" && l["metadata"]["status"].is_null())
        .count();
    assert_eq!(abandoned, 3, "one audit line per caller that hung up");
}

/// Regression: an event left over from a connection evicted in the same batch was
/// applied to the new connection that took its slot, closing a caller whose turn was
/// waiting.
#[test]
fn a_stale_event_of_an_evicted_connection_does_not_close_its_successor() {
    use std::io::Write;
    let root = TestRoot::new("stale-event");
    let mut config = engine_config(json!({"command": ["sh", "-c", "sleep 1; cat"]}));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    config["bus"]["maxQueuedTurns"] = json!(4);
    root.write_config("worker", &config);
    // 104 open files leave room for 40 connections (64 are kept for everything else),
    // 8 of them for talks (32 are kept for health).
    let a = Instance::spawn_with_fd_limit(&root, "worker", 104);
    let mut idle: Vec<_> = (0..40).map(|_| connect(a.port)).collect();
    thread::sleep(Duration::from_millis(200));
    signal(a.pid(), "STOP");
    // The oldest connection hangs up, and a new caller arrives, both while the server
    // is stopped: on waking, one poll reports both, and admitting the caller evicts the
    // oldest slot, the one with the hang-up event pending.
    drop(idle.remove(0));
    let mut caller = connect(a.port);
    caller
        .write_all(&a.talk_request("c", "still here", 0))
        .unwrap();
    thread::sleep(Duration::from_millis(200));
    signal(a.pid(), "CONT");
    let r = read_response(&mut caller).expect("the new caller lost its answer");
    assert_eq!(r.json()["text"], "still here");
}
