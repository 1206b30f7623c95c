//! Engine turns (contract section 8): real engine commands as small shell scripts,
//! budget and usage, timeouts, output limits, the turn pool, audit lines, shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/engines")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn engine_config(engine: Value) -> Value {
    json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": engine})
}

/// An engine (`gate.sh`) whose turns wait until [`Gate::open`]: the test decides when
/// turns finish, instead of an engine that sleeps for long enough.
struct Gate {
    path: PathBuf,
}

impl Gate {
    fn new(root: &TestRoot) -> Gate {
        Gate {
            path: root.path.join("gate"),
        }
    }

    /// The engine section: `gate.sh`, with `env` added to its environment.
    fn engine(&self, mut env: Value) -> Value {
        env["GATE"] = json!(self.path.to_string_lossy());
        json!({"command": ["sh", script("gate.sh")], "env": env})
    }

    /// Lets every waiting and future turn finish.
    fn open(&self) {
        std::fs::write(&self.path, b"").unwrap();
    }
}

/// Polls `instance`'s health until `turns.<field>` is `n`.
fn turns_reach(instance: &Instance, field: &str, n: u64) -> bool {
    eventually(Duration::from_secs(5), || {
        instance.health()["turns"][field] == n
    })
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

/// The audit lines once `ready` holds for them. Lines are written by the instance's
/// writer thread, a moment after the answer they record: a test that reads the log
/// right after an answer waits for the line it looks for (bounded) instead of racing
/// the writer.
fn audit_lines_once(instance: &Instance, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut lines = audit_lines(instance);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ready(&lines) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        lines = audit_lines(instance);
    }
    lines
}

/// The state letter of process `pid` (R, S, T, Z, ...), from /proc.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// How many sockets process `pid` has open, from /proc (files it opens for a moment,
/// such as config.json, don't count).
fn open_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// The state (hex, as in /proc/net/tcp: 01 established, 08 close-wait) and receive
/// queue length of the IPv4 socket whose local port is `local` and remote port
/// `remote`.
fn tcp_socket(local: u16, remote: u16) -> Option<(String, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |address: &str| u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok();
        if port(fields.get(1)?)? != local || port(fields.get(2)?)? != remote {
            return None;
        }
        let rx_queue = u64::from_str_radix(fields.get(4)?.split_once(':')?.1, 16).ok()?;
        Some(((*fields.get(3)?).to_owned(), rx_queue))
    })
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
    let lines = audit_lines_once(&a, |l| !l.is_empty());
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
    // A missing program cannot start on a retry either (issue 9).
    assert!(!retryable);
    assert!(
        error.contains("`/nonexistent/engine-binary` not found"),
        "{error}"
    );
}

#[test]
fn health_answers_while_turns_run_and_a_full_queue_is_server_busy() {
    let root = TestRoot::new("busy");
    let gate = Gate::new(&root);
    let mut config = engine_config(gate.engine(json!({})));
    config["bus"]["maxConcurrentTurns"] = json!(2);
    config["bus"]["maxQueuedTurns"] = json!(1);
    let a = root.start("worker", &config);
    let callers: Vec<_> = (0..3).map(|i| a.spawn_talk(&format!("p{i}"))).collect();
    assert!(
        turns_reach(&a, "running", 2) && turns_reach(&a, "queued", 1),
        "turns did not reach 2 running + 1 queued: {}",
        a.health()
    );
    health_within(a.port, LIVENESS_BOUND).expect("health answers while turns run");
    assert_eq!(a.health()["turns"]["max"], 2);
    let busy = a.talk("c", "overflow", 0);
    assert_eq!(busy.status, 503);
    let (code, retryable, _) = failure(&busy);
    assert_eq!(code, "server_busy");
    assert!(retryable);
    // Nobody was answered while the turns could not finish.
    assert!(callers.iter().all(|c| !c.is_finished()));
    gate.open();
    let mut texts: Vec<String> = callers
        .into_iter()
        .map(|caller| {
            let r = caller.join().unwrap();
            assert_eq!(r.status, 200, "{r:?}");
            r.json()["text"].as_str().unwrap().to_owned()
        })
        .collect();
    texts.sort();
    assert_eq!(texts, ["gated: p0", "gated: p1", "gated: p2"]);
    let busy = |l: &Value| l["metadata"]["errorCode"] == "server_busy" && l["outcome"] == "refused";
    let lines = audit_lines_once(&a, |lines| lines.iter().any(busy));
    assert!(lines.iter().any(busy));
}

#[test]
fn sigterm_answers_running_and_queued_turns_then_exits_zero() {
    let root = TestRoot::new("shutdown");
    let gate = Gate::new(&root);
    let mut config = engine_config(gate.engine(json!({})));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    config["bus"]["maxQueuedTurns"] = json!(4);
    let mut a = root.start("worker", &config);
    let running = a.spawn_talk("first");
    assert!(turns_reach(&a, "running", 1));
    let queued = a.spawn_talk("second");
    assert!(turns_reach(&a, "queued", 1));
    signal(a.pid(), "TERM");
    // The queued turn is answered at once; the running one may still finish.
    let queued = queued.join().unwrap();
    assert_eq!(queued.status, 503);
    assert_eq!(queued.json()["errorCode"], "server_busy");
    assert!(!running.is_finished(), "the running turn was cut short");
    assert!(
        a.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "exited with a turn still running\n{}",
        a.describe()
    );
    gate.open();
    let running = running.join().unwrap();
    assert_eq!(running.status, 200);
    assert_eq!(running.json()["text"], "gated: first");
    let status = a.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", a.describe());
    assert!(root.registry()["instances"].get("worker").is_none());
}

#[test]
fn audit_lines_for_success_failure_and_each_refusal() {
    let root = TestRoot::new("audit");
    let secret = "audit-test-secret-4f1c9e";
    let mut config = json!({"bus": {"peers": ["caller"], "secret": secret, "maxDepth": 2}});
    // Engine failures on instances of their own: started with those engines, rather
    // than one instance's config edited and each edit waited for.
    let with_engine = |name: &str, engine: &str| {
        let mut config = config.clone();
        config["engine"] = json!({"command": ["sh", script(engine)]});
        root.start(name, &config)
    };
    let auth_failing = with_engine("auth-failing", "auth_fail.sh");
    let quoting = with_engine("quoting", "quote_prompt_fail.sh");
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
    config["bus"]["peers"] = json!(false);
    root.write_config("worker", &config);
    assert_eq!(
        auth_failing.talk("caller", "x", 0).json()["errorCode"],
        "auth"
    );
    // Regression: an engine that quotes the prompt in its error put the prompt's text
    // into the audit log through the failure's message.
    assert_eq!(
        quoting
            .talk("caller", "quoted secret prompt (engine.maxOutputBytes)", 0)
            .json()["errorCode"],
        "engine_cli"
    );
    assert!(eventually(Duration::from_secs(5), || {
        a.talk("caller", "x", 0).json()["errorCode"] == "bus_disabled"
    }));

    // The last outcome of each instance is in its log: a's bus_disabled refusal, the
    // others' one failure.
    let disabled = |l: &Value| l["metadata"]["errorCode"] == "bus_disabled";
    let mut lines = audit_lines_once(&a, |l| l.iter().any(disabled));
    for instance in [&auth_failing, &quoting] {
        lines.extend(audit_lines_once(instance, |l| !l.is_empty()));
    }
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
    let auth = find("failure", Some("auth")).expect("failure line for auth");
    assert_eq!(auth["instanceName"], "auth-failing");
    let quoted = find("failure", Some("engine_cli")).expect("failure line for engine_cli");
    assert_eq!(quoted["instanceName"], "quoting");
    for instance in [&a, &auth_failing, &quoting] {
        let path = instance.state_dir.join("audit.log.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
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
        assert_eq!(file_mode(&path), 0o600);
    }
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
        command: format!(
            "(in {}) loopbus serve --state-dir worker",
            root.path.display()
        ),
        stdout_path: None,
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
    let gate = Gate::new(&root);
    let mut config = engine_config(gate.engine(json!({"CALLS_FILE": calls.to_string_lossy()})));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    let a = root.start("worker", &config);
    let first = a.spawn_talk("kept");
    assert!(turns_reach(&a, "running", 1));
    for i in 0..3 {
        let mut stream = connect(a.port);
        stream
            .write_all(&a.talk_request("c", &format!("dropped {i}"), 0))
            .unwrap();
        assert!(turns_reach(&a, "queued", 1));
        drop(stream);
        assert!(
            turns_reach(&a, "queued", 0),
            "the turn of hung-up caller {i} stayed queued"
        );
    }
    // A last caller queues behind wherever the hung-up callers' turns could be: once it
    // has its answer, every turn queued before it has had its chance to run.
    let last = a.spawn_talk("last");
    assert!(turns_reach(&a, "queued", 1));
    gate.open();
    assert_eq!(first.join().unwrap().json()["text"], "gated: kept");
    assert_eq!(last.join().unwrap().json()["text"], "gated: last");
    assert!(turns_reach(&a, "running", 0) && turns_reach(&a, "queued", 0));
    let runs = std::fs::read_to_string(&calls).unwrap().lines().count();
    assert_eq!(runs, 2, "turns of callers that hung up were run");
    // Cancelled on hang-up (contract 8.1); no answer went out.
    let cancelled_lines = |lines: &[Value]| {
        lines
            .iter()
            .filter(|l| {
                l["outcome"] == "cancelled"
                    && l["metadata"]["status"].is_null()
                    && l["metadata"]["errorCode"] == "cancelled"
            })
            .count()
    };
    let cancelled = cancelled_lines(&audit_lines_once(&a, |l| cancelled_lines(l) >= 3));
    assert_eq!(cancelled, 3, "one audit line per caller that hung up");
}

/// Regression: an event left over from a connection evicted in the same batch was
/// applied to the new connection that took its slot, closing a caller whose turn was
/// waiting.
#[test]
fn a_stale_event_of_an_evicted_connection_does_not_close_its_successor() {
    use std::io::Write;
    let root = TestRoot::new("stale-event");
    let gate = Gate::new(&root);
    let mut config = engine_config(gate.engine(json!({})));
    config["bus"]["maxConcurrentTurns"] = json!(1);
    config["bus"]["maxQueuedTurns"] = json!(4);
    root.write_config("worker", &config);
    // 93 open files leave room for 40 connections (48 are kept for the instance and 5
    // for its one running engine), 8 of them for talks (32 are kept for health).
    let a = Instance::spawn_with_fd_limit(&root, "worker", 93);
    let sockets = open_sockets(a.pid());
    let mut idle: Vec<_> = (0..40).map(|_| connect(a.port)).collect();
    assert!(
        eventually(Duration::from_secs(5), || open_sockets(a.pid())
            == sockets + 40),
        "the server did not take the 40 connections"
    );
    signal(a.pid(), "STOP");
    assert!(eventually(Duration::from_secs(5), || process_state(
        a.pid()
    ) == Some('T')));
    // The oldest connection hangs up, and a new caller arrives, both while the server
    // is stopped: on waking, one poll reports both, and admitting the caller evicts the
    // oldest slot, the one with the hang-up event pending.
    let gone = idle.remove(0);
    let gone_port = gone.local_addr().unwrap().port();
    drop(gone);
    let mut caller = connect(a.port);
    let request = a.talk_request("c", "still here", 0);
    caller.write_all(&request).unwrap();
    let caller_port = caller.local_addr().unwrap().port();
    // Both are in the kernel's hands before the server wakes.
    assert!(
        eventually(Duration::from_secs(5), || {
            tcp_socket(a.port, gone_port).is_some_and(|(state, _)| state == "08")
                && tcp_socket(a.port, caller_port)
                    .is_some_and(|(_, queued)| queued == request.len() as u64)
        }),
        "the hang-up and the request did not reach the stopped server's sockets"
    );
    signal(a.pid(), "CONT");
    // The caller's turn is running (its engine waits for the gate) before it may end.
    assert!(eventually(Duration::from_secs(5), || !children(a.pid()).is_empty()));
    gate.open();
    let r = read_response(&mut caller).expect("the new caller lost its answer");
    assert_eq!(r.json()["text"], "gated: still here");
}
