//! The client examples of docs/embedding.md (`examples/clients/talk.py`, `talk.mjs`) run against a
//! real instance and against a stand-in that records what they send. Each test skips,
//! with a message, when its interpreter (`python3`, `node`) is not on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::TestRoot;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::Sha256;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one run of an example may take before the test kills it and fails: far
/// more than it needs, bounded so that a hung client cannot hang the suite.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(30);

/// How long the stand-in waits for a client's next bytes before it gives up.
const STAND_IN_READ_LIMIT: Duration = Duration::from_secs(10);

/// The two examples: interpreter and script.
const EXAMPLES: [(&str, &str); 2] = [("python3", "talk.py"), ("node", "talk.mjs")];

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/clients")
        .join(name)
}

/// Whether `interpreter` runs; prints why the test is skipped when it does not.
fn available(interpreter: &str) -> bool {
    let found = Command::new(interpreter)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        println!("skipping: {interpreter} is not on PATH");
    }
    found
}

/// Runs `interpreter file args...` with `env` and `stdin`, killed past
/// [`EXAMPLE_LIMIT`].
fn run_example(
    interpreter: &str,
    file: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &str,
) -> Output {
    let mut child = Command::new(interpreter)
        .arg(file)
        .args(args)
        .env_remove("LOOPBUS_INSTANCE")
        .env_remove("LOOPBUS_DEPTH")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let deadline = Instant::now() + EXAMPLE_LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(common::POLL_INTERVAL);
    }
    child.wait_with_output().unwrap()
}

fn describe(name: &str, output: &Output) -> String {
    format!(
        "{name}: status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Both examples against a real instance whose peers allow `reviewer` only: the reply
/// for an argument and for stdin, and a refusal mapped to exit 1 with its code.
fn examples_talk_to_a_real_instance(interpreter: &str, name: &str) {
    if !available(interpreter) {
        return;
    }
    let root = TestRoot::new("client-examples");
    let worker = root.start("worker", &json!({"bus": {"peers": ["reviewer"]}}));
    let root_arg = root.path.to_str().unwrap();
    let as_reviewer = [("LOOPBUS_INSTANCE", "reviewer")];

    let output = run_example(
        interpreter,
        &script(name),
        &[root_arg, "worker", "hello"],
        &as_reviewer,
        "",
    );
    assert!(
        output.status.success(),
        "{}\n{}",
        describe(name, &output),
        worker.describe()
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\n");

    let output = run_example(
        interpreter,
        &script(name),
        &[root_arg, "worker"],
        &as_reviewer,
        "from stdin\n",
    );
    assert!(output.status.success(), "{}", describe(name, &output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "from stdin\n");

    let output = run_example(
        interpreter,
        &script(name),
        &[root_arg, "worker", "hi"],
        &[],
        "",
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(name, &output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("[peer_not_allowed]"),
        "{}",
        describe(name, &output)
    );

    let output = run_example(
        interpreter,
        &script(name),
        &[root_arg, "nobody", "hi"],
        &[],
        "",
    );
    assert_eq!(
        output.status.code(),
        Some(75),
        "{}",
        describe(name, &output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("nobody is not registered"),
        "{}",
        describe(name, &output)
    );
}

#[test]
fn python_example_prints_the_reply_of_a_real_instance() {
    examples_talk_to_a_real_instance("python3", "talk.py");
}

#[test]
fn node_example_prints_the_reply_of_a_real_instance() {
    examples_talk_to_a_real_instance("node", "talk.mjs");
}

/// One request read off `reader`: its head lines and its body.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let length = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn header<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn respond(stream: &mut TcpStream, body: &serde_json::Value) {
    let body = body.to_string();
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).unwrap();
}

/// What a stand-in for `worker` saw: the health request, and the talk request if one
/// came on the same connection.
struct Seen {
    health: Vec<String>,
    talk: Option<(Vec<String>, Vec<u8>)>,
}

/// A stand-in for the instance `worker` on one connection: answers health with a
/// proof of `secret` (or of another secret when `honest` is false), then records the
/// talk that follows on that connection. It accepts no second connection.
fn stand_in(secret: &'static str, honest: bool) -> (u16, std::thread::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(STAND_IN_READ_LIMIT)).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let (health, _) = read_request(&mut reader).unwrap();
        let nonce = header(&health, "x-loopbus-nonce").unwrap_or("").to_owned();
        let key = if honest { secret } else { "not-the-secret" };
        let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
        mac.update(format!("loopbus-proof-v1\nworker\n127.0.0.1:{port}\n{nonce}").as_bytes());
        let proof: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        respond(
            &mut writer,
            &json!({"kind": "loopbus", "instance": "worker", "status": "ok", "pid": 1,
                "protocolVersion": 1, "busEnabled": true, "proof": proof,
                "capabilities": ["structured-errors", "retryable-errors", "secret-proof"]}),
        );
        let talk = read_request(&mut reader);
        if talk.is_some() {
            respond(
                &mut writer,
                &json!({"success": true, "text": "from the stand-in", "fromInstance": "worker",
                    "durationMs": 1, "protocolVersion": 1,
                    "capabilities": ["structured-errors", "retryable-errors"]}),
            );
        }
        // Dropping the listener resets any second connection a client opened.
        Seen { health, talk }
    });
    (port, handle)
}

fn write_registry(root: &TestRoot, port: u16, secret: &str) {
    let registry = json!({"instances": {"worker": {
        "port": port, "pid": std::process::id(), "secret": secret,
        "updatedAt": "2026-12-01T00:00:00.000Z", "proof": true}}});
    std::fs::write(root.path.join(".bus-registry.json"), registry.to_string()).unwrap();
}

/// The examples send `Content-Type: application/json` (form types get 415) and the
/// secret only on the connection whose health answer proved it.
#[test]
fn client_examples_send_json_and_the_secret_only_on_the_proved_connection() {
    const SECRET: &str = "3d1f0c9b8a7e6d5c4b3a29180f1e2d3c";
    for (interpreter, name) in EXAMPLES {
        if !available(interpreter) {
            continue;
        }
        let root = TestRoot::new("client-examples-stand-in");
        let (port, seen) = stand_in(SECRET, true);
        write_registry(&root, port, SECRET);
        let output = run_example(
            interpreter,
            &script(name),
            &[root.path.to_str().unwrap(), "worker", "ping"],
            &[("LOOPBUS_DEPTH", "1")],
            "",
        );
        let seen = seen.join().unwrap();
        assert!(output.status.success(), "{}", describe(name, &output));
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "from the stand-in\n"
        );
        assert_eq!(seen.health[0], "GET /api/health HTTP/1.1", "{name}");
        let nonce = header(&seen.health, "x-loopbus-nonce").unwrap_or("");
        assert_eq!(nonce.len(), 32, "{name}: nonce {nonce:?}");
        let (head, body) = seen
            .talk
            .unwrap_or_else(|| panic!("{name}: no talk on the proved connection"));
        assert_eq!(head[0], "POST /api/talk HTTP/1.1", "{name}");
        assert_eq!(
            header(&head, "content-type"),
            Some("application/json"),
            "{name}"
        );
        assert_eq!(
            header(&head, "authorization"),
            Some(format!("Bearer {SECRET}").as_str()),
            "{name}"
        );
        assert_eq!(
            header(&head, "host"),
            Some(format!("127.0.0.1:{port}").as_str())
        );
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({"fromInstance": "script", "prompt": "ping", "depth": 2, "protocolVersion": 1,
                "capabilities": ["structured-errors", "retryable-errors"]}),
            "{name}"
        );
    }
}

/// A port whose holder cannot prove the secret gets no talk, and the example exits 1.
#[test]
fn client_examples_refuse_a_port_that_cannot_prove_the_secret() {
    const SECRET: &str = "a0b1c2d3e4f5061728394a5b6c7d8e9f";
    for (interpreter, name) in EXAMPLES {
        if !available(interpreter) {
            continue;
        }
        let root = TestRoot::new("client-examples-squatter");
        let (port, seen) = stand_in(SECRET, false);
        write_registry(&root, port, SECRET);
        let output = run_example(
            interpreter,
            &script(name),
            &[root.path.to_str().unwrap(), "worker", "secret prompt"],
            &[],
            "",
        );
        let seen = seen.join().unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", describe(name, &output));
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("did not prove the secret"),
            "{}",
            describe(name, &output)
        );
        assert!(seen.talk.is_none(), "{name} sent a talk to a squatter");
    }
}

/// The fenced block of `language` in docs/embedding.md's section on calling an instance from
/// a script.
fn readme_snippet(language: &str) -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/embedding.md");
    let page = std::fs::read_to_string(page).unwrap();
    let section = page
        .split("\n## ")
        .find(|s| s.starts_with("Calling an instance from a script"))
        .expect("the docs/embedding.md section on calling an instance from a script");
    let fence = format!("```{language}\n");
    let start = section
        .find(&fence)
        .unwrap_or_else(|| panic!("no {language} block"))
        + fence.len();
    let end = start + section[start..].find("```").unwrap();
    section[start..end].to_owned()
}

/// The Python and Node snippets of docs/embedding.md, pasted into a file, print the reply.
#[test]
fn readme_client_snippets_work_when_pasted_into_a_file() {
    let root = TestRoot::new("client-snippets");
    let worker = root.start("worker", &json!({"bus": {"peers": "*"}}));
    for (interpreter, language, file) in [
        ("python3", "python", "snippet.py"),
        ("node", "js", "snippet.mjs"),
    ] {
        if !available(interpreter) {
            continue;
        }
        let path = root.path.join(file);
        std::fs::write(&path, readme_snippet(language)).unwrap();
        let output = run_example(interpreter, &path, &[root.path.to_str().unwrap()], &[], "");
        assert!(
            output.status.success(),
            "{}\n{}",
            describe(file, &output),
            worker.describe()
        );
        assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\n", "{file}");
    }
}
