//! `loopbus mcp` driven as an MCP client would drive it (contract 10): a scripted client
//! speaks newline-delimited JSON-RPC to the child's stdin and reads its stdout, against
//! real `loopbus serve` instances. The client is written from the MCP specification's
//! facts (revisions 2025-06-18, 2025-11-25 and 2026-07-28), not from any SDK.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Generous bound for anything that should happen soon.
const BOUND: Duration = Duration::from_secs(20);

/// The `_meta` of a 2026-07-28 request.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "scripted", "version": "0"},
    })
}

/// A `loopbus mcp` child and the lines it wrote.
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Result<Value, String>>,
    stderr: PathBuf,
    next_id: u64,
    /// Notifications read while looking for a response.
    notes: Vec<Value>,
    /// Responses read while looking for another.
    early: Vec<Value>,
    /// The tools as `tools/list` gave them, once asked.
    tools: Option<Vec<Value>>,
}

impl Client {
    /// `loopbus mcp --state-dir DIR`.
    fn start(root: &TestRoot, state_dir: &Path) -> Client {
        let stderr = root.path.join(format!(
            "mcp-{}.stderr",
            state_dir.file_name().unwrap().to_string_lossy()
        ));
        let mut child = Command::new(bin())
            .arg("mcp")
            .arg("--state-dir")
            .arg(state_dir)
            .env("HOME", no_home())
            .env("RUST_LOG", "debug")
            .env_remove("LOOPBUS_ROOT")
            .env_remove("LOOPBUS_STATE_DIR")
            .env_remove("LOOPBUS_DEPTH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parsed = serde_json::from_str(&line).map_err(|_| line);
                if send.send(parsed).is_err() {
                    break;
                }
            }
        });
        Client {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            next_id: 0,
            notes: Vec::new(),
            early: Vec::new(),
            tools: None,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, message: &Value) {
        self.send_raw(message.to_string().as_bytes());
    }

    /// The next message on stdout, which must be JSON.
    fn recv(&mut self, limit: Duration) -> Option<Value> {
        match self.lines.recv_timeout(limit) {
            Ok(Ok(value)) => Some(value),
            Ok(Err(line)) => panic!("not JSON-RPC on stdout: {line:?}\n{}", self.stderr()),
            Err(_) => None,
        }
    }

    /// The response to `id`, keeping what comes before it.
    fn response(&mut self, id: &Value) -> Value {
        if let Some(i) = self.early.iter().position(|r| &r["id"] == id) {
            return self.early.remove(i);
        }
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(message) = self.recv(left) else {
                panic!("no response to {id} in time\n{}", self.stderr());
            };
            if message.get("method").is_some() {
                self.notes.push(message);
            } else if &message["id"] == id {
                return message;
            } else {
                self.early.push(message);
            }
        }
    }

    fn fresh_id(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    /// Sends a request and returns its id.
    fn send_request(&mut self, method: &str, params: Value) -> Value {
        let id = self.fresh_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.response(&id)
    }

    /// The legacy handshake; returns the initialize result.
    fn initialize(&mut self, version: &str) -> Value {
        let answer = self.request(
            "initialize",
            json!({"protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "scripted", "version": "0"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        answer["result"].clone()
    }

    /// `tools/call` (legacy session), returning the result, whose `structuredContent`
    /// must fit the tool's `outputSchema`.
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert!(
            answer.get("result").is_some(),
            "{answer}\n{}",
            self.stderr()
        );
        if let Some(structured) = answer["result"].get("structuredContent") {
            if self.tools.is_none() {
                let listed = self.request("tools/list", json!({}));
                self.tools = Some(listed["result"]["tools"].as_array().unwrap().clone());
            }
            let tools = self.tools.as_ref().unwrap();
            let schema = &tools.iter().find(|t| t["name"] == tool).unwrap()["outputSchema"];
            let problems = schema_problems(schema, structured, tool);
            assert!(problems.is_empty(), "{problems:?}\n{answer}");
        }
        answer["result"].clone()
    }

    /// Closes stdin and waits (at most `limit`) for the exit.
    fn close(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        None
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where `value` breaks `schema`, for the JSON Schema keywords the tools' output
/// schemas use; any other keyword is a problem too (it would go unchecked).
fn schema_problems(schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let known = [
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "minimum",
        "description",
    ];
    let mut problems: Vec<String> = schema
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| format!("{at}: keyword {k} is not checked here"))
        .collect();
    let is = |t: &Value| match t.as_str().unwrap() {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        other => panic!("type {other}"),
    };
    let typed = match &schema["type"] {
        Value::Null => true,
        Value::Array(types) => types.iter().any(is),
        t => is(t),
    };
    let listed = schema["enum"]
        .as_array()
        .is_none_or(|allowed| allowed.contains(value));
    let above = schema["minimum"]
        .as_f64()
        .is_none_or(|min| value.as_f64().is_none_or(|n| n >= min));
    if !(typed && listed && above) {
        problems.push(format!("{at}: {value} does not fit {schema}"));
    }
    for key in schema["required"].as_array().into_iter().flatten() {
        if value.get(key.as_str().unwrap()).is_none() {
            problems.push(format!("{at}: no {key}"));
        }
    }
    if let (Some(properties), Some(fields)) = (schema["properties"].as_object(), value.as_object())
    {
        for (key, field) in fields {
            if let Some(property) = properties.get(key) {
                problems.extend(schema_problems(property, field, &format!("{at}.{key}")));
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, item) in list.iter().enumerate() {
            problems.extend(schema_problems(items, item, &format!("{at}[{i}]")));
        }
    }
    problems
}

/// A channel root with the calling instance `boss` (not running: `mcp` acts as it)
/// and a running `worker` with the engine `engine` makes for the root (`Null`: the
/// echo engine) and a reattach window longer than any test, after the legacy
/// handshake.
fn setup(label: &str, engine: impl FnOnce(&Path) -> Value) -> (TestRoot, Instance, Client) {
    let root = TestRoot::new(label);
    root.write_config("boss", &open_config("boss-secret-0123456789"));
    let mut config = open_config("worker-secret-0123456789");
    // A hung-up delegation is kept this long: an engine gone sooner was cancelled.
    config["bus"]["reattachSecs"] = json!(600);
    let engine = engine(&root.path);
    if !engine.is_null() {
        config["engine"] = engine;
    }
    let worker = root.start("worker", &config);
    let mut client = Client::start(&root, &root.state_dir("boss"));
    client.initialize("2025-11-25");
    (root, worker, client)
}

/// An engine that waits for the file `gate` in `root` before answering
/// `gated: PROMPT`.
fn gated(root: &Path) -> Value {
    let script = format!("{}/tests/engines/gate.sh", env!("CARGO_MANIFEST_DIR"));
    let gate = root.join("gate");
    json!({"command": ["/bin/sh", script], "env": {"GATE": gate.to_str().unwrap()}})
}

/// Lets the turns of [`gated`] engines answer.
fn open_gate(root: &TestRoot) {
    std::fs::write(root.path.join("gate"), "").unwrap();
}

/// An engine that writes its pid to `engine.pid` in `root`, then sleeps a minute.
fn stuck(root: &Path) -> Value {
    json!({
        "command": ["sh", "-c", "cat > /dev/null; echo $$ > \"$PID_FILE\"; exec sleep 60"],
        "env": {"PID_FILE": root.join("engine.pid").to_str().unwrap()},
    })
}

fn no_engine(_: &Path) -> Value {
    Value::Null
}

/// The pid a [`stuck`] engine wrote, once it did.
fn engine_pid(root: &TestRoot) -> u32 {
    let pid_file = root.path.join("engine.pid");
    let mut pid = None;
    assert!(
        eventually(BOUND, || {
            pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        }),
        "the engine never started"
    );
    pid.unwrap()
}

/// Whether `pid` is gone (a zombie counts as gone).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap()
}

#[test]
fn the_handshake_of_every_revision_and_discover_then_initialize() {
    let root = TestRoot::new("mcp-handshake");
    root.write_config("boss", &open_config("boss-secret-0123456789"));
    for (asked, answered) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
    ] {
        let mut client = Client::start(&root, &root.state_dir("boss"));
        // Only ping is served before initialize.
        let early = client.request("tools/list", json!({}));
        assert_eq!(early["error"]["code"], -32602, "{early}");
        assert_eq!(client.request("ping", json!({}))["result"], json!({}));
        let init = client.initialize(asked);
        assert_eq!(init["protocolVersion"], answered, "{init}");
        assert_eq!(init["serverInfo"]["name"], "loopbus");
        assert!(init["capabilities"]["tools"].is_object(), "{init}");
        let list = client.request("tools/list", json!({}));
        assert!(list["result"]["tools"].as_array().unwrap().len() >= 4);
        assert!(list["result"].get("resultType").is_none(), "{list}");
        assert_eq!(client.request("ping", json!({}))["result"], json!({}));
        assert_eq!(client.close(BOUND).map(|s| s.code()), Some(Some(0)));
    }

    // 2026-07-28: no handshake; discover, then tools/list, each with its _meta.
    let mut client = Client::start(&root, &root.state_dir("boss"));
    let discover = client.request("server/discover", json!({"_meta": modern_meta()}));
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete", "{discover}");
    assert_eq!(
        result["supportedVersions"],
        json!(["2026-07-28", "2025-11-25", "2025-06-18"])
    );
    assert!(result["capabilities"]["tools"].is_object());
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "loopbus"
    );
    let list = client.request("tools/list", json!({"_meta": modern_meta()}));
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    assert_eq!(list["result"]["cacheScope"], "public");
    assert!(list["result"]["ttlMs"].as_u64().is_some());
    let mut call = json!({"name": "list_instances", "arguments": {}});
    call["_meta"] = modern_meta();
    let listed = client.request("tools/call", call);
    assert_eq!(listed["result"]["resultType"], "complete", "{listed}");
    assert_eq!(
        listed["result"]["structuredContent"]["instances"],
        json!([])
    );
    // ping is not part of 2026-07-28; an unknown revision is -32022 with ours.
    let ping = client.request("ping", json!({"_meta": modern_meta()}));
    assert_eq!(ping["error"]["code"], -32601, "{ping}");
    let mut old = modern_meta();
    old["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let refused = client.request("tools/list", json!({"_meta": old}));
    assert_eq!(refused["error"]["code"], -32022, "{refused}");
    assert_eq!(refused["error"]["data"]["requested"], "2099-01-01");
    assert_eq!(refused["error"]["data"]["supported"][0], "2026-07-28");

    // A client that probes with discover and falls back to initialize: both work.
    let init = client.initialize("2025-11-25");
    assert_eq!(init["protocolVersion"], "2025-11-25");
    let list = client.request("tools/list", json!({}));
    assert!(list["result"]["tools"].is_array(), "{list}");
    let modern = client.request("tools/list", json!({"_meta": modern_meta()}));
    assert_eq!(modern["result"]["resultType"], "complete", "{modern}");
}

#[test]
fn list_instances_talk_result_and_cancel_against_a_real_instance() {
    let (_root, worker, mut client) = setup("mcp-tools", no_engine);
    let listed = client.call("list_instances", json!({}));
    let instances = listed["structuredContent"]["instances"].as_array().unwrap();
    let entry = instances.iter().find(|i| i["name"] == "worker").unwrap();
    assert_eq!(entry["alive"], true, "{listed}");
    assert_eq!(entry["kind"], "loopbus");
    assert_eq!(entry["busy"], false);
    assert!(text(&listed).contains("worker: alive"), "{listed}");

    let talk = client.call("talk", json!({"target": "worker", "prompt": "hello there"}));
    assert_eq!(talk["isError"], false, "{talk}");
    assert_eq!(text(&talk), "hello there");
    let s = &talk["structuredContent"];
    assert_eq!(s["status"], "done");
    assert!(
        s.get("handle").is_none(),
        "a whole answer needs no handle: {s}"
    );
    let envelope = &s["replies"][0]["envelope"];
    assert_eq!(envelope["success"], true, "{s}");
    assert_eq!(envelope["fromInstance"], "worker");
    assert_eq!(envelope["textChars"], 11);
    assert_eq!(s["replies"][0]["requestId"].as_str().unwrap().len(), 32);

    // A failure is a tool error with its code and retryable flag.
    let missing = client.call("talk", json!({"target": "nobody", "prompt": "hi"}));
    assert_eq!(missing["isError"], true, "{missing}");
    assert_eq!(
        missing["structuredContent"]["errorCode"],
        "instance_unavailable"
    );
    assert_eq!(missing["structuredContent"]["retryable"], true);
    assert!(text(&missing).contains("[instance_unavailable, retryable]"));

    for tool in ["result", "cancel"] {
        let unknown = client.call(tool, json!({"handle": "0123456789abcdef0123456789abcdef"}));
        assert_eq!(unknown["isError"], true, "{unknown}");
        assert!(
            text(&unknown).contains("unknown or expired handle"),
            "{unknown}"
        );
    }
    drop(worker);
}

#[test]
fn a_turn_longer_than_wait_secs_returns_a_handle_that_result_fetches() {
    let (root, _worker, mut client) = setup("mcp-handle", gated);
    let first = client.call(
        "talk",
        json!({"target": "worker", "prompt": "slow one", "waitSecs": 0.3}),
    );
    let s = &first["structuredContent"];
    assert_eq!(s["status"], "running", "{first}");
    let handle = s["handle"].as_str().unwrap().to_owned();
    assert_eq!(handle.len(), 32, "128 random bits as hex");
    assert!(text(&first).contains("Call `result`"), "{first}");
    // The work goes on, and other calls are answered meanwhile.
    let mut listed = Value::Null;
    assert!(
        eventually(BOUND, || {
            listed = client.call("list_instances", json!({}));
            listed["structuredContent"]["instances"][0]["busy"] == true
        }),
        "{listed}"
    );
    let again = client.call("result", json!({"handle": handle, "waitSecs": 0.1}));
    assert_eq!(again["structuredContent"]["status"], "running", "{again}");
    open_gate(&root);
    let done = client.call("result", json!({"handle": handle, "waitSecs": 20}));
    assert_eq!(done["structuredContent"]["status"], "done", "{done}");
    assert_eq!(text(&done), "gated: slow one");
    assert_eq!(done["isError"], false);
}

#[test]
fn progress_is_notified_during_a_slow_turn() {
    let (root, _worker, mut client) = setup("mcp-progress", gated);
    let id = client.send_request(
        "tools/call",
        json!({"name": "talk", "arguments": {"target": "worker", "prompt": "p", "waitSecs": 30},
            "_meta": {"progressToken": "tok-1"}}),
    );
    let note = client.recv(BOUND).expect("a progress notification");
    assert_eq!(note["method"], "notifications/progress", "{note}");
    assert_eq!(note["params"]["progressToken"], "tok-1");
    assert_eq!(note["params"]["total"], 1);
    let first = note["params"]["progress"].as_f64().unwrap();
    assert!(first > 0.0 && first < 1.0, "{note}");
    assert!(
        note["params"]["message"]
            .as_str()
            .unwrap()
            .starts_with("talk to worker: 0 of 1 answered"),
        "{note}"
    );
    open_gate(&root);
    let answer = client.response(&id);
    assert_eq!(answer["result"]["structuredContent"]["status"], "done");
    // Any further notification came before the answer, each with a greater value.
    let mut last = first;
    for note in &client.notes {
        let progress = note["params"]["progress"].as_f64().unwrap();
        assert!(progress > last, "{note}");
        last = progress;
    }
    assert!(
        client.recv(Duration::from_millis(200)).is_none(),
        "none after the answer"
    );
}

#[test]
fn notifications_cancelled_stops_the_call_and_its_engine() {
    let (root, worker, mut client) = setup("mcp-cancelled", stuck);
    let id = client.send_request(
        "tools/call",
        json!({"name": "talk", "arguments": {"target": "worker", "prompt": "p", "waitSecs": 60}}),
    );
    let pid = engine_pid(&root);
    client.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "the user pressed Esc"}}),
    );
    assert!(eventually(BOUND, || gone(pid)), "engine {pid} still runs");
    assert!(eventually(BOUND, || children(worker.pid()).is_empty()));
    // The cancelled call gets no answer: the next answer is the ping's.
    let ping = client.request("ping", json!({}));
    assert_eq!(ping["result"], json!({}));
    assert!(client.early.is_empty(), "{:?}", client.early);
    assert!(client.recv(Duration::from_millis(300)).is_none());
}

/// Regression: a cancel read right after its call, before the call's thread had started
/// the delegation, stopped only the wait, and the delegation ran on.
#[test]
fn a_cancel_sent_with_its_call_stops_the_delegation() {
    let (root, worker, mut client) = setup("mcp-cancel-race", stuck);
    for i in 0..3 {
        let call = json!({"jsonrpc": "2.0", "id": format!("r{i}"), "method": "tools/call",
            "params": {"name": "talk", "arguments": {"target": "worker", "prompt": "p"}}});
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": format!("r{i}")}});
        client.send_raw(format!("{call}\n{cancel}").as_bytes());
    }
    // A later call whose turn has started: the cancelled calls' work started before it.
    let later = client.call(
        "talk",
        json!({"target": "worker", "prompt": "later", "waitSecs": 0.2}),
    );
    let handle = later["structuredContent"]["handle"].as_str().unwrap();
    let pid = engine_pid(&root);
    let cancelled = client.call("cancel", json!({"handle": handle}));
    assert_eq!(cancelled["structuredContent"]["errorCode"], "cancelled");
    assert!(eventually(BOUND, || gone(pid)), "engine {pid} still runs");
    assert!(
        eventually(BOUND, || children(worker.pid()).is_empty()),
        "an engine of a cancelled call still runs"
    );
    assert!(client.early.is_empty(), "{:?}", client.early);
}

/// Regression: a list the library refused before sending (the caller itself, a target
/// not among its peers) was a failure without `errorCode` and `retryable`.
#[test]
fn a_list_the_library_refuses_is_a_failure_with_a_code() {
    let (root, _worker, mut client) = setup("mcp-refused", no_engine);
    let itself = client.call("fan", json!({"targets": ["worker", "boss"], "prompt": "p"}));
    assert_eq!(itself["isError"], true, "{itself}");
    assert_eq!(itself["structuredContent"]["errorCode"], "invalid_request");
    assert_eq!(itself["structuredContent"]["retryable"], false);
    let mut config = open_config("boss-secret-0123456789");
    config["bus"]["peers"] = json!(["someone"]);
    root.write_config("boss", &config);
    let stranger = client.call("talk", json!({"target": "worker", "prompt": "p"}));
    assert_eq!(
        stranger["structuredContent"]["errorCode"],
        "peer_not_allowed"
    );
    assert!(text(&stranger).ends_with("[peer_not_allowed, not retryable]"));
}

#[test]
fn cancel_of_a_handle_stops_its_engine() {
    let (root, worker, mut client) = setup("mcp-cancel", stuck);
    let first = client.call(
        "talk",
        json!({"target": "worker", "prompt": "p", "waitSecs": 0.2}),
    );
    let handle = first["structuredContent"]["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    let pid = engine_pid(&root);
    let cancelled = client.call("cancel", json!({"handle": handle}));
    let s = &cancelled["structuredContent"];
    assert_eq!(s["status"], "done", "{cancelled}");
    assert_eq!(s["errorCode"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["isError"], true);
    assert!(eventually(BOUND, || gone(pid)), "engine {pid} still runs");
    assert!(eventually(BOUND, || children(worker.pid()).is_empty()));
    // The handle keeps its answer.
    let later = client.call("result", json!({"handle": handle}));
    assert_eq!(later["structuredContent"]["errorCode"], "cancelled");
}

#[test]
fn a_100000_character_reply_is_paged_through_result() {
    let (_root, _worker, mut client) = setup("mcp-paging", no_engine);
    // The echo engine replies with the prompt; characters of 1 to 4 bytes.
    let unit = "abcdé€😀\n";
    let prompt: String = unit.chars().cycle().take(100_000).collect();
    let first = client.call("talk", json!({"target": "worker", "prompt": prompt}));
    let s = &first["structuredContent"];
    assert_eq!(s["totalChars"], 100_000, "{s}");
    assert_eq!(s["nextOffset"], 20_000);
    let handle = s["handle"].as_str().unwrap().to_owned();
    let mut got: String = text(&first).chars().take(20_000).collect();
    assert!(text(&first).contains("offset 20000 for the rest"));
    let mut offset = 20_000;
    let mut pages = 1;
    while offset < 100_000 {
        let page = client.call(
            "result",
            json!({"handle": handle, "offset": offset, "maxChars": 30_000}),
        );
        let s = &page["structuredContent"];
        assert_eq!(s["offset"], offset);
        let next = s["nextOffset"].as_u64().map(|n| n as usize);
        let chars = next.unwrap_or(100_000) - offset;
        got.extend(text(&page).chars().take(chars));
        offset = next.unwrap_or(100_000);
        pages += 1;
    }
    assert_eq!(pages, 4);
    assert!(got == prompt, "the pages put together are the reply");
}

#[test]
fn twenty_concurrent_calls_sixteen_run_and_four_are_told_the_limit() {
    let (root, _worker, mut client) = setup("mcp-twenty", gated);
    let ids: Vec<Value> = (0..20)
        .map(|i| {
            client.send_request(
                "tools/call",
                json!({"name": "talk", "arguments":
                    {"target": "worker", "prompt": format!("n{i}"), "waitSecs": 30}}),
            )
        })
        .collect();
    // The four over the limit are answered at once, the others wait for the gate.
    for _ in 0..4 {
        let message = client
            .recv(BOUND)
            .expect("four answers before the gate opens");
        assert_eq!(message["result"]["isError"], true, "{message}");
        assert!(text(&message["result"]).contains("[server_busy, retryable]"));
        client.early.push(message);
    }
    open_gate(&root);
    let answers: Vec<Value> = ids.iter().map(|id| client.response(id)).collect();
    let done = answers
        .iter()
        .filter(|a| a["result"]["structuredContent"]["status"] == "done")
        .count();
    assert_eq!(done, 16, "{answers:?}");
}

#[test]
fn malformed_messages_get_their_errors_and_the_next_call_works() {
    let root = TestRoot::new("mcp-malformed");
    root.write_config("boss", &open_config("boss-secret-0123456789"));
    let mut client = Client::start(&root, &root.state_dir("boss"));
    client.initialize("2025-11-25");
    let too_long = format!("{{\"x\":\"{}\"}}", "y".repeat(1 << 20));
    let mut unknown = modern_meta();
    unknown["io.modelcontextprotocol/protocolVersion"] = json!("1999-01-01");
    let cases: Vec<(&str, Vec<u8>, i64, Value)> = vec![
        ("bad JSON", b"{\"jsonrpc\":".to_vec(), -32700, Value::Null),
        ("not UTF-8", b"\xff\xfe".to_vec(), -32700, Value::Null),
        ("a batch", br#"[{"jsonrpc":"2.0","id":9,"method":"ping"}]"#.to_vec(), -32600, Value::Null),
        ("not an object", b"\"ping\"".to_vec(), -32600, Value::Null),
        ("no jsonrpc", br#"{"id":"a","method":"ping"}"#.to_vec(), -32600, json!("a")),
        ("null id", br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.to_vec(), -32600, Value::Null),
        ("no method", br#"{"jsonrpc":"2.0","id":"b"}"#.to_vec(), -32600, json!("b")),
        ("unknown method", br#"{"jsonrpc":"2.0","id":"c","method":"resources/list"}"#.to_vec(), -32601, json!("c")),
        ("params not an object", br#"{"jsonrpc":"2.0","id":"d","method":"tools/list","params":[1]}"#.to_vec(), -32602, json!("d")),
        ("unknown tool", br#"{"jsonrpc":"2.0","id":"e","method":"tools/call","params":{"name":"rm"}}"#.to_vec(), -32602, json!("e")),
        ("no tool name", br#"{"jsonrpc":"2.0","id":"f","method":"tools/call","params":{}}"#.to_vec(), -32602, json!("f")),
        ("a cursor we never gave", br#"{"jsonrpc":"2.0","id":"g","method":"tools/list","params":{"cursor":"x"}}"#.to_vec(), -32602, json!("g")),
        ("initialize without a version", br#"{"jsonrpc":"2.0","id":"h","method":"initialize","params":{}}"#.to_vec(), -32602, json!("h")),
        ("an unsupported revision", json!({"jsonrpc": "2.0", "id": "i", "method": "tools/list", "params": {"_meta": unknown}}).to_string().into_bytes(), -32022, json!("i")),
        ("a line over 1 MiB", too_long.into_bytes(), -32600, Value::Null),
    ];
    for (what, bytes, code, id) in cases {
        client.send_raw(&bytes);
        let answer = client
            .recv(BOUND)
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(answer["error"]["code"], code, "{what}: {answer}");
        assert_eq!(answer["id"], id, "{what}: {answer}");
        assert_eq!(answer["jsonrpc"], "2.0", "{what}");
        assert!(answer["error"]["message"].as_str().is_some(), "{what}");
        let ping = client.request("ping", json!({}));
        assert_eq!(ping["result"], json!({}), "after {what}: {ping}");
    }
    // Arguments a tool's schema refuses are a tool error (2025-11-25 and later).
    let bad = client.call("talk", json!({"target": "worker"}));
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(text(&bad).contains("missing `prompt`"), "{bad}");
    // A notification, known or not, is never answered; nor is a response.
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/whatever"}));
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]}));
    client.send(&json!({"jsonrpc": "2.0", "id": 77, "result": {}}));
    let ping = client.request("ping", json!({}));
    assert_eq!(ping["result"], json!({}));
    assert!(client.early.is_empty(), "{:?}", client.early);

    // In 2025-06-18 the same arguments are a protocol error.
    let mut old = Client::start(&root, &root.state_dir("boss"));
    old.initialize("2025-06-18");
    let bad = old.request(
        "tools/call",
        json!({"name": "talk", "arguments": {"target": "w"}}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

#[test]
fn closing_stdin_ends_the_process_and_cancels_its_work() {
    let (root, worker, mut client) = setup("mcp-stdin", stuck);
    let first = client.call(
        "talk",
        json!({"target": "worker", "prompt": "p", "waitSecs": 0.2}),
    );
    assert_eq!(first["structuredContent"]["status"], "running", "{first}");
    let pid = engine_pid(&root);
    let status = client.close(BOUND).expect("mcp exits when stdin closes");
    assert_eq!(status.code(), Some(0), "{}", client.stderr());
    assert!(eventually(BOUND, || gone(pid)), "engine {pid} still runs");
    assert!(eventually(BOUND, || children(worker.pid()).is_empty()));
}

/// Regression: with a call's answer blocked on a client that does not read stdout, the
/// end of stdin cancelled the work but the process never exited (it waited on stdout).
#[test]
fn closing_stdin_ends_the_process_even_while_an_answer_waits_for_the_reader() {
    use std::io::Read;
    let root = TestRoot::new("mcp-unread");
    root.write_config("boss", &open_config("boss-secret-0123456789"));
    let mut child = Command::new(bin())
        .args(["mcp", "--state-dir"])
        .arg(root.state_dir("boss"))
        .env("HOME", no_home())
        .env_remove("LOOPBUS_ROOT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    writeln!(stdin, "{init}").unwrap();
    stdout.read_line(&mut String::new()).unwrap();
    // The unknown handle is quoted in the answer: 200 KB, more than a pipe holds.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "result", "arguments": {"handle": "h".repeat(200_000)}}});
    writeln!(stdin, "{call}").unwrap();
    stdout.read_exact(&mut [0; 100]).unwrap();
    drop(stdin);
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    assert_eq!(status.and_then(|s| s.code()), Some(0), "no exit");
}

#[test]
/// Regression (SIGHUP): a closed terminal killed the process without a cancel, and its
/// delegations ran on for their targets' `reattachSecs`.
fn sigterm_and_sighup_cancel_the_work_then_end_the_process() {
    for (name, code) in [("TERM", 143), ("HUP", 129)] {
        let (root, worker, mut client) = setup(&format!("mcp-sig{name}"), stuck);
        let first = client.call(
            "talk",
            json!({"target": "worker", "prompt": "p", "waitSecs": 0.2}),
        );
        assert_eq!(first["structuredContent"]["status"], "running", "{first}");
        let pid = engine_pid(&root);
        signal(client.child.id(), name);
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(status) = client.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "mcp still runs after SIG{name}\n{}",
                client.stderr()
            );
            std::thread::sleep(POLL_INTERVAL);
        };
        assert_eq!(status.code(), Some(code), "SIG{name}\n{}", client.stderr());
        assert!(eventually(BOUND, || gone(pid)), "engine {pid} still runs");
        assert!(eventually(BOUND, || children(worker.pid()).is_empty()));
    }
}

#[test]
fn fan_chain_and_verify_against_real_instances() {
    let root = TestRoot::new("mcp-workflows");
    let mut boss = open_config("boss-secret-0123456789");
    boss["bus"]["parallel"] = json!(["a", "b"]);
    boss["bus"]["chain"] = json!(["a", "b"]);
    boss["bus"]["verifier"] = json!("judge");
    root.write_config("boss", &boss);
    let echo = |name: &str| root.start(name, &open_config(&format!("{name}-secret-0123456789")));
    let (_a, _b) = (echo("a"), echo("b"));
    let mut judge = open_config("judge-secret-0123456789");
    judge["engine"] =
        json!({"command": ["sh", "-c", "cat > /dev/null; echo 'VERDICT: PASS'; echo looks right"]});
    let _judge = root.start("judge", &judge);
    let mut gated_config = open_config("slow-secret-0123456789");
    gated_config["engine"] = gated(&root.path);
    let _slow = root.start("slow", &gated_config);
    let mut client = Client::start(&root, &root.state_dir("boss"));
    client.initialize("2025-11-25");

    // fan: the config's list, one section per target in its order.
    let fan = client.call("fan", json!({"prompt": "q"}));
    assert_eq!(fan["isError"], false, "{fan}");
    assert_eq!(text(&fan), "--- a (1 of 2) ---\nq\n\n--- b (2 of 2) ---\nq");
    let replies = fan["structuredContent"]["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 2);
    assert!(
        replies.iter().all(|r| r["envelope"]["success"] == true),
        "{fan}"
    );

    // chain: stage 2 gets the prompt and stage 1's reply.
    let chain = client.call("chain", json!({"prompt": "q", "targets": ["b", "a"]}));
    assert_eq!(
        text(&chain),
        "--- b (stage 1 of 2) ---\nq\n\n--- a (stage 2 of 2) ---\nq\n\n--- output of b (stage 1 of 2) ---\nq"
    );

    // verify: the config's verifier; the verdict first and in structuredContent.
    let verify = client.call("verify", json!({"prompt": "2+2?", "answerer": "a"}));
    assert_eq!(verify["structuredContent"]["verdict"], "PASS", "{verify}");
    assert!(text(&verify).starts_with("VERDICT: PASS\n\n--- answer from a ---\n2+2?"));
    assert!(text(&verify).ends_with("--- check by judge ---\nVERDICT: PASS\nlooks right"));

    // One target failing: an error with its code, the other reply kept.
    let partial = client.call("fan", json!({"prompt": "q", "targets": ["a", "ghost"]}));
    assert_eq!(partial["isError"], true, "{partial}");
    let s = &partial["structuredContent"];
    assert_eq!(s["errorCode"], "instance_unavailable");
    assert_eq!(s["retryable"], true);
    assert_eq!(s["replies"][0]["envelope"]["success"], true);
    // A list naming the caller is refused before anything is sent.
    let refused = client.call("fan", json!({"prompt": "q", "targets": ["boss"]}));
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(text(&refused).contains("the caller itself"), "{refused}");

    // Progress counts the targets that answered.
    let id = client.send_request(
        "tools/call",
        json!({"name": "fan", "arguments": {"prompt": "p", "targets": ["a", "slow"], "waitSecs": 30},
            "_meta": {"progressToken": 7}}),
    );
    // The first may come before `a` answered; one comes when it has.
    let note = loop {
        let note = client.recv(BOUND).expect("a progress notification");
        assert_eq!(note["params"]["progressToken"], 7, "{note}");
        assert_eq!(note["params"]["total"], 2);
        if note["params"]["progress"].as_f64().unwrap() >= 1.0 {
            break note;
        }
    };
    let message = note["params"]["message"].as_str().unwrap();
    assert!(message.contains("1 of 2 answered"), "{note}");
    open_gate(&root);
    let answer = client.response(&id);
    assert_eq!(answer["result"]["isError"], false, "{answer}");
}

#[test]
fn a_traceparent_joins_its_trace_and_the_trace_tool_shows_its_tree() {
    let (_root, _worker, mut client) = setup("mcp-trace", no_engine);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer = client.request(
        "tools/call",
        json!({"name": "talk", "arguments": {"target": "worker", "prompt": "traced"},
            "_meta": {"traceparent": format!("00-{trace_id}-00f067aa0ba902b7-01")}}),
    );
    assert_eq!(
        answer["result"]["structuredContent"]["traceId"], trace_id,
        "{answer}"
    );
    // Without one, each call starts its own trace, and says which.
    let other = client.call("talk", json!({"target": "worker", "prompt": "untraced"}));
    let other_id = other["structuredContent"]["traceId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(other_id.len(), 32);
    assert_ne!(other_id, trace_id);

    // The audit line is written by a thread of its own: poll for it.
    let mut shown = Value::Null;
    assert!(
        eventually(BOUND, || {
            shown = client.call("trace", json!({"traceId": trace_id}));
            shown["isError"] == false
        }),
        "{shown}"
    );
    let turns = shown["structuredContent"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{shown}");
    assert_eq!(turns[0]["instance"], "worker");
    assert_eq!(turns[0]["fromInstance"], "boss");
    assert_eq!(turns[0]["outcome"], "success");
    assert!(text(&shown).contains("boss -> worker  success"), "{shown}");
    assert!(
        !text(&shown).contains("traced"),
        "no prompt in a trace: {shown}"
    );
    // No traceId: the caller's last trace.
    let mut last = Value::Null;
    assert!(eventually(BOUND, || {
        last = client.call("trace", json!({}));
        last["structuredContent"]["traceId"] == other_id.as_str()
    }));
    let unknown = client.call(
        "trace",
        json!({"traceId": "0123456789abcdef0123456789abcdef"}),
    );
    assert_eq!(unknown["isError"], true, "{unknown}");
}

/// The cells of the rows of the table that starts with `header` in docs/agents.md
/// whose first cell is code.
fn doc_rows(header: &str) -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/agents.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc
        .find(header)
        .unwrap_or_else(|| panic!("no table {header}"));
    doc[start..]
        .lines()
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            line.split('|')
                .map(|c| c.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.get(1).is_some_and(|c| c.starts_with('`')))
        .map(|cells| cells[1..].to_vec())
        .collect()
}

/// The code spans of `cell`, and those of them in bold.
fn spans(cell: &str) -> (Vec<String>, Vec<String>) {
    let names: Vec<String> = cell
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let bold = names
        .iter()
        .filter(|n| cell.contains(&format!("**`{n}`**")))
        .cloned()
        .collect();
    (names, bold)
}

fn sorted_keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[test]
fn the_documented_tools_and_fields_are_the_served_ones() {
    let root = TestRoot::new("mcp-docs");
    root.write_config("boss", &open_config("boss-secret-0123456789"));
    let mut client = Client::start(&root, &root.state_dir("boss"));
    client.initialize("2025-11-25");
    let list = client.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    let rows = doc_rows("| tool | arguments |");
    let documented: Vec<String> = rows.iter().map(|r| spans(&r[0]).0[0].clone()).collect();
    let served: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(documented, served, "the tools, in tools/list's order");
    for (tool, row) in tools.iter().zip(&rows) {
        let (mut arguments, mut required) = spans(&row[1]);
        arguments.sort();
        required.sort();
        let schema = &tool["inputSchema"];
        assert_eq!(arguments, sorted_keys(&schema["properties"]), "{row:?}");
        let mut want: Vec<String> = serde_json::from_value(schema["required"].clone()).unwrap();
        want.sort();
        assert_eq!(required, want, "{row:?}: the bold ones are required");
    }
    // A row of the fields' table may name several: `answered`, `total`.
    let mut fields: Vec<String> = doc_rows("| field | what |")
        .iter()
        .flat_map(|row| spans(&row[0]).0)
        .collect();
    fields.sort();
    assert_eq!(fields, sorted_keys(&tools[1]["outputSchema"]["properties"]));
}
