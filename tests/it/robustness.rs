//! Hostile and sloppy clients (contract section 3, "Limits of the HTTP layer"): every
//! case is followed by a health check that must still answer, and the big ones watch
//! the server's RSS. Floods run until the server has shown the behaviour under test
//! (answers came, sockets filled up), never for a fixed time, and no check measures
//! speed: under load a flooded server answers late, and only one that stopped
//! answering fails ([`HANG_GUARD`]).
//!
//! The HTTP layer's timeouts are tested with a fake clock in `src/http/conn.rs`; one
//! real-time timeout stays here ([`a_kept_alive_connection_that_sends_nothing_more_is_closed`]).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The RSS ceiling of the issue's acceptance check.
const RSS_LIMIT_KIB: u64 = 64 * 1024;

/// CPU-heavy tests take turns. On a small machine two of them at once starve each
/// other's server of CPU, and the liveness bound would measure the test machine rather
/// than loopbus. Light tests still run beside them.
fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a health check may take while a test floods the server. Not a speed
/// bound (the benchmarks measure speed): long enough that on a loaded machine only a
/// server that stopped serving other connections fails.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Asserts the server still runs and answers `/api/health` on a new connection while
/// a test floods it (within [`HANG_GUARD`]).
fn assert_serving(w: &mut Instance, context: &str) {
    if let Some(status) = w.child.as_mut().unwrap().try_wait().unwrap() {
        panic!(
            "{context}: loopbus exited with {status}\nstderr:\n{}",
            w.stderr()
        );
    }
    if let Err(e) = health_within(w.port, HANG_GUARD) {
        panic!("{context}: health failed: {e}\nstderr:\n{}", w.stderr());
    }
}

/// Waits until `done` holds, failing after [`HANG_GUARD`] with `what`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

fn start(root: &TestRoot) -> Instance {
    root.start("target", &open_config("robust-secret-0123456789abcdef"))
}

fn talk_body(prompt: &str) -> Value {
    json!({"fromInstance": "alice", "prompt": prompt, "depth": 0, "protocolVersion": 1,
           "capabilities": CAPABILITIES})
}

/// Asserts a v1 failure envelope from the HTTP layer: status, headers, the envelope's
/// fields, and a code whose `retryable` matches the retry table.
fn assert_http_error(r: &HttpResponse, status: u16, context: &str) {
    let v = r.json();
    let code = v["errorCode"].as_str().unwrap_or_default().to_owned();
    assert!(!code.is_empty(), "{context}: errorCode: {v}");
    assert_failure(r, "target", status, &code, context);
}

#[test]
fn huge_content_length_on_get_health() {
    let root = TestRoot::new("cl-get");
    let mut w = start(&root);
    let mut stream = connect(w.port);
    stream
        .write_all(
            format!(
                "GET /api/health HTTP/1.1\r\nHost: {}\r\nContent-Length: 99999999999999\r\n\r\n",
                w.host()
            )
            .as_bytes(),
        )
        .unwrap();
    let r = read_response(&mut stream).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
    // The announced body is never read: the connection is not reused.
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    w.assert_alive("after Content-Length 99999999999999 on GET");
    drop(stream);
    w.assert_alive("after closing it");
}

#[test]
fn huge_content_length_on_post_talk() {
    let root = TestRoot::new("cl-post");
    let mut w = start(&root);
    for authorized in [true, false] {
        let mut req = Req::talk(&w)
            .body(Vec::new())
            .set("Content-Length", "99999999999999");
        if !authorized {
            req = req.without("Authorization");
        }
        let r = req.send(w.port);
        assert_failure(&r, "target", 413, "request_too_large", "huge POST");
        w.assert_alive("after Content-Length 99999999999999 on POST");
    }
}

/// Streams `total` bytes of one header line, 64 KiB at a time, until the server has
/// answered (a reader thread watches) or closed. Returns the answer, the bytes sent and
/// the highest RSS seen.
fn stream_header_line(w: &Instance, total: usize) -> (Option<HttpResponse>, usize, u64) {
    let mut stream = connect(w.port);
    let mut reader = stream.try_clone().unwrap();
    let answered = Arc::new(AtomicBool::new(false));
    let answer = Arc::new(Mutex::new(None));
    let watcher = {
        let answered = Arc::clone(&answered);
        let answer = Arc::clone(&answer);
        thread::spawn(move || {
            *answer.lock().unwrap() = read_response(&mut reader);
            answered.store(true, Ordering::SeqCst);
        })
    };
    stream
        .write_all(format!("GET /api/health HTTP/1.1\r\nHost: {}\r\nX-Big: ", w.host()).as_bytes())
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0;
    let mut max_rss = w.rss_kib();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sent < total && !answered.load(Ordering::SeqCst) && Instant::now() < deadline {
        match stream.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break, // the server closed: stop sending
        }
        if sent % (1 << 20) < chunk.len() {
            max_rss = max_rss.max(w.rss_kib());
        }
    }
    max_rss = max_rss.max(w.rss_kib());
    drop(stream);
    watcher.join().unwrap();
    let answer = answer.lock().unwrap().take();
    (answer, sent, max_rss)
}

#[test]
fn header_line_of_200_mb() {
    let _heavy = heavy();
    let root = TestRoot::new("bighead");
    let mut w = start(&root);
    let total = 200 * 1024 * 1024;
    let (answer, sent, max_rss) = stream_header_line(&w, total);
    let r = answer.expect("the server answers before the client stops sending");
    assert_http_error(&r, 431, "200 MB header line");
    assert!(sent < total, "the answer came only after all {sent} bytes");
    assert!(
        max_rss < RSS_LIMIT_KIB,
        "RSS reached {max_rss} KiB\nstderr:\n{}",
        w.stderr()
    );
    w.assert_alive("after a 200 MB header line");
}

/// Writes as fast as it can on `stream` until `stop` is set or the server closes,
/// adding the bytes written to `sent`.
fn flood(mut stream: TcpStream, stop: &AtomicBool, sent: &AtomicUsize) {
    let chunk = vec![b'z'; 64 * 1024];
    stream
        .set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while !stop.load(Ordering::SeqCst) {
        match stream.write(&chunk) {
            Ok(n) => {
                sent.fetch_add(n, Ordering::SeqCst);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
}

#[test]
fn flood_after_an_error_answer_does_not_stall_the_loop() {
    let _heavy = heavy();
    // After answering a request whose body it will not read, the server keeps reading
    // and discarding for a while so the client sees the answer. Clients that keep
    // sending at full speed must not keep the loop from everything else.
    let root = TestRoot::new("flood");
    let mut w = start(&root);
    let stop = Arc::new(AtomicBool::new(false));
    let mut floods = Vec::new();
    for i in 0..2 {
        let mut stream = connect(w.port);
        let head = if i == 0 {
            // 413 from the head, body never read.
            format!(
                "POST /api/talk HTTP/1.1\r\nHost: {}\r\nContent-Length: 99999999999999\r\n\r\n",
                w.host()
            )
        } else {
            // 431 from the HTTP layer, then more "header" bytes.
            format!("GET /api/health HTTP/1.1\r\nHost: {}\r\nX-Big: ", w.host())
        };
        stream.write_all(head.as_bytes()).unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let (stop, counter) = (Arc::clone(&stop), Arc::clone(&sent));
        floods.push((thread::spawn(move || flood(stream, &stop, &counter)), sent));
    }
    // Both floods are under way (or already cut off by the server) before the checks.
    for (handle, sent) in &floods {
        wait_until("a flood got going", || {
            sent.load(Ordering::SeqCst) >= 1 << 20 || handle.is_finished()
        });
    }
    for i in 0..5 {
        assert_serving(
            &mut w,
            &format!("check {i} while two clients flood after an error answer"),
        );
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for (handle, _) in floods {
        handle.join().unwrap();
    }
    assert!(
        w.rss_kib() < RSS_LIMIT_KIB,
        "RSS {} KiB\nstderr:\n{}",
        w.rss_kib(),
        w.stderr()
    );
    w.assert_alive("after the floods");
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Slowloris: 2,000 connections each send a request a byte at a time (a round of one
/// byte on every connection, four rounds). The server holds at most its cap of them,
/// evicting the least recently active, and keeps answering.
#[test]
fn two_thousand_connections_sending_a_byte_at_a_time() {
    let _heavy = heavy();
    let root = TestRoot::new("slowloris");
    let mut w = start(&root);
    let addr = ([127, 0, 0, 1], w.port).into();
    let wanted = connections_to_open(2000);
    let mut conns = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            stream.set_nonblocking(true).unwrap();
            conns.push(stream);
        }
    }
    assert!(
        conns.len() >= wanted * 95 / 100,
        "only {} of {wanted} connections opened",
        conns.len()
    );
    let request = format!("GET /api/health HTTP/1.1\r\nHost: {}\r\n\r\n", w.host());
    let mut max_rss = 0;
    for round in 0..4 {
        let byte = [request.as_bytes()[round]];
        for stream in &mut conns {
            let _ = stream.write(&byte); // evicted connections fail here; fine
        }
        assert_serving(&mut w, &format!("round {round} of 2,000 slow connections"));
        max_rss = max_rss.max(w.rss_kib());
        let fds = open_fds(w.pid());
        // 1,024 connections, plus the listener, poll, waker, signal pipe, stdio, ...
        assert!(fds <= 1024 + 32, "the server holds {fds} descriptors");
    }
    assert!(max_rss < RSS_LIMIT_KIB, "RSS reached {max_rss} KiB");
    drop(conns);
    assert_serving(&mut w, "after 2,000 slow connections");
}

#[test]
fn clients_that_never_read_their_responses() {
    let _heavy = heavy();
    let root = TestRoot::new("noread");
    let mut w = start(&root);
    // Each request's answer echoes a 200 KB prompt; pipeline many, never read.
    let one = Req::talk(&w)
        .json(&talk_body(&"r".repeat(200_000)))
        .to_bytes();
    let many: Vec<u8> = one.repeat(30);
    let mut clients = Vec::new();
    for _ in 0..8 {
        let stream = connect(w.port);
        stream.set_nonblocking(true).unwrap();
        clients.push((stream, 0usize));
    }
    // Write until every client is stuck (the server stopped reading it, since it
    // can't write the answers) or has sent everything: three passes in a row without
    // progress.
    let mut max_rss = 0;
    let mut still = 0;
    while still < 3 {
        let mut progress = false;
        for (stream, offset) in &mut clients {
            while *offset < many.len() {
                match stream.write(&many[*offset..]) {
                    Ok(n) => {
                        *offset += n;
                        progress = true;
                    }
                    Err(_) => break, // full (the server stopped reading) or closed
                }
            }
        }
        still = if progress { 0 } else { still + 1 };
        assert_serving(&mut w, "while clients never read");
        max_rss = max_rss.max(w.rss_kib());
        thread::sleep(Duration::from_millis(50));
    }
    assert!(max_rss < RSS_LIMIT_KIB, "RSS reached {max_rss} KiB");
    drop(clients);
    w.assert_alive("after the non-reading clients left");
}

/// The one timeout left to real time: a kept-alive connection that sends nothing more
/// is closed (after `IDLE_TIMEOUT`, 5 s). The others are unit tests of the connection
/// with a fake clock, in `src/http/conn.rs`:
/// - a head that never completes, or a connection that never sends a byte, closes after
///   `HEAD_TIMEOUT`: `head_timeout_closes_a_head_that_never_completes`;
/// - a body shorter than its `Content-Length` is answered 408 after `BODY_TIMEOUT`, with
///   the request's head (so a talk's 408 is audited like the 503 of
///   [`bug_partial_bodies_on_many_connections_grew_rss_without_bound`]), then the
///   connection closes: `body_timeout_answers_408_then_lingers_and_closes`;
/// - a client that never reads its answer is closed after `WRITE_TIMEOUT`:
///   `write_timeout_closes_a_response_the_client_does_not_read`;
/// - the idle clock gives way to the head clock at the first byte of a next request:
///   `idle_timeout_closes_a_kept_alive_connection_but_not_a_started_head`.
///
/// (Its name sorts first, so that its 5 s wait starts at once, beside the other tests.)
#[test]
fn a_kept_alive_connection_that_sends_nothing_more_is_closed() {
    let root = TestRoot::new("idle");
    let mut w = start(&root);
    let mut stream = connect(w.port);
    stream.write_all(&Req::health(&w).to_bytes()).unwrap();
    let r = read_response(&mut stream).expect("health");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), None, "kept alive: {r:?}");
    assert!(
        closed_within(&mut stream, Duration::from_secs(11)),
        "an idle keep-alive connection was never closed"
    );
    w.assert_alive("after the idle timeout");
}

#[test]
fn chunked_transfer_encoding_is_refused() {
    let root = TestRoot::new("chunked");
    let mut w = start(&root);
    let body = talk_body("chunky").to_string();
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for authorized in [true, false] {
        let mut req = Req::talk(&w)
            .body(chunked.clone())
            .without("Content-Length")
            .header("Transfer-Encoding", "chunked");
        if !authorized {
            req = req.without("Authorization");
        }
        let mut stream = connect(w.port);
        stream.write_all(&req.to_bytes()).unwrap();
        let r = read_response(&mut stream).expect("an answer");
        assert_failure(&r, "target", 400, "invalid_request", "chunked talk");
        assert!(
            closed_within(&mut stream, Duration::from_secs(5)),
            "the chunked body is never read as a next request"
        );
        w.assert_alive("after a chunked request");
    }
    // On health: answered, then the connection closes (the body is never read).
    let mut stream = connect(w.port);
    stream
        .write_all(
            format!(
                "GET /api/health HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                w.host()
            )
            .as_bytes(),
        )
        .unwrap();
    let r = read_response(&mut stream).expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(closed_within(&mut stream, Duration::from_secs(5)));
    w.assert_alive("after a chunked health request");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let root = TestRoot::new("pipeline");
    let mut w = start(&root);
    let health = Req::health(&w).to_bytes();
    let talk = |p: &str| Req::talk(&w).json(&talk_body(p)).to_bytes();
    let not_found = Req::new("GET", "/nope")
        .header("Host", &w.host())
        .to_bytes();
    let big = "b".repeat(100_000);
    let mut all = Vec::new();
    for part in [
        health.clone(),
        talk("one"),
        talk("two"),
        not_found,
        talk(&big),
        health.clone(),
        talk("three"),
    ] {
        all.extend_from_slice(&part);
    }
    let mut stream = connect(w.port);
    stream.write_all(&all).unwrap();
    let mut next = || read_response(&mut stream).expect("a pipelined answer");
    assert_eq!(next().status, 200);
    assert_success(&next(), "target", "one", "pipelined 1");
    assert_success(&next(), "target", "two", "pipelined 2");
    assert_failure(&next(), "target", 404, "invalid_request", "pipelined 404");
    assert_success(&next(), "target", &big, "pipelined big");
    assert_eq!(next().status, 200);
    let last = next();
    assert_success(&last, "target", "three", "pipelined 3");
    assert_eq!(last.header("connection"), None, "still keep-alive");
    // The connection is still usable.
    stream.write_all(&health).unwrap();
    assert_eq!(read_response(&mut stream).expect("health").status, 200);
    // Many small requests in one write, all answered.
    let burst: Vec<u8> = talk("x").repeat(50);
    stream.write_all(&burst).unwrap();
    for i in 0..50 {
        let r = read_response(&mut stream).expect("a burst answer");
        assert_success(&r, "target", "x", &format!("burst {i}"));
    }
    w.assert_alive("after pipelining");
}

#[test]
fn keep_alive_connection_is_reused() {
    let root = TestRoot::new("keepalive");
    let mut w = start(&root);
    let mut stream = connect(w.port);
    for i in 0..6 {
        let (raw, want_talk) = if i % 2 == 0 {
            (Req::health(&w).to_bytes(), false)
        } else {
            (
                Req::talk(&w).json(&talk_body(&format!("n{i}"))).to_bytes(),
                true,
            )
        };
        stream.write_all(&raw).unwrap();
        let r = read_response(&mut stream).expect("an answer on the same connection");
        assert_eq!(r.header("connection"), None, "request {i}: {r:?}");
        if want_talk {
            assert_success(&r, "target", &format!("n{i}"), "keep-alive talk");
        } else {
            assert_eq!(r.status, 200);
        }
    }
    // A refusal without a body keeps the connection too.
    stream
        .write_all(&Req::talk(&w).without("Authorization").body("").to_bytes())
        .unwrap();
    let r = read_response(&mut stream).expect("401");
    assert_failure(&r, "target", 401, "auth_failed", "keep-alive 401");
    stream.write_all(&Req::health(&w).to_bytes()).unwrap();
    assert_eq!(read_response(&mut stream).expect("health").status, 200);
    // `Connection: close` is honoured.
    stream
        .write_all(&Req::health(&w).header("Connection", "close").to_bytes())
        .unwrap();
    let r = read_response(&mut stream).expect("health");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closed_within(&mut stream, Duration::from_secs(5)));
    w.assert_alive("after keep-alive");
}

/// Sends `raw`, expects `status` with a v1 envelope, `Connection: close`, then EOF.
fn expect_error_and_close(w: &mut Instance, raw: &[u8], status: u16, context: &str) {
    let mut stream = connect(w.port);
    stream.write_all(raw).unwrap();
    let r = read_response(&mut stream).unwrap_or_else(|| panic!("{context}: no answer"));
    assert_http_error(&r, status, context);
    assert_eq!(r.header("connection"), Some("close"), "{context}: {r:?}");
    assert!(
        closed_within(&mut stream, Duration::from_secs(5)),
        "{context}: not closed"
    );
    w.assert_alive(context);
}

#[test]
fn malformed_request_heads() {
    let root = TestRoot::new("malformed");
    let mut w = start(&root);
    let host = w.host();
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage line", b"GARBAGE\r\n\r\n".to_vec()),
        ("binary", b"\x00\x01\x02\xff\xfe\r\n\r\n".to_vec()),
        ("no version", b"GET /api/health\r\n\r\n".to_vec()),
        ("HTTP/2.0", format!("GET /api/health HTTP/2.0\r\nHost: {host}\r\n\r\n").into_bytes()),
        ("spaces in target", format!("GET /api/ health HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()),
        ("header without colon", format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\nNoColon\r\n\r\n").into_bytes()),
        ("bad header name", format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\nBad Name: x\r\n\r\n").into_bytes()),
    ];
    for (context, raw) in cases {
        expect_error_and_close(&mut w, &raw, 400, context);
    }
}

#[test]
fn too_many_headers_and_oversized_heads() {
    let root = TestRoot::new("bigheads");
    let mut w = start(&root);
    let host = w.host();
    let with_headers = |n: usize| {
        let mut raw = format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\n");
        for i in 1..n {
            raw.push_str(&format!("X-H{i}: v\r\n"));
        }
        raw.push_str("\r\n");
        raw.into_bytes()
    };
    // 64 headers are fine, 65 are not.
    let r = request_bytes(w.port, &with_headers(64));
    assert_eq!(r.status, 200, "64 headers: {r:?}");
    expect_error_and_close(&mut w, &with_headers(65), 431, "65 headers");
    expect_error_and_close(&mut w, &with_headers(1000), 431, "1000 headers");

    let with_filler = |len: usize| {
        format!(
            "GET /api/health HTTP/1.1\r\nHost: {host}\r\nX-Filler: {}\r\n\r\n",
            "f".repeat(len)
        )
        .into_bytes()
    };
    let r = request_bytes(w.port, &with_filler(15 * 1024));
    assert_eq!(r.status, 200, "15 KiB head: {r:?}");
    expect_error_and_close(&mut w, &with_filler(16 * 1024), 431, "16 KiB + head");
    expect_error_and_close(&mut w, &with_filler(1024 * 1024), 431, "1 MiB head");
    // Many short header lines past 16 KiB are too large as well.
    let mut raw = format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\n");
    for i in 0..40 {
        raw.push_str(&format!("X-{i}: {}\r\n", "m".repeat(500)));
    }
    raw.push_str("\r\n");
    expect_error_and_close(&mut w, raw.as_bytes(), 431, "40 lines of 500 bytes");
}

/// Regression: every connection could hold a 256 KiB body, so authorized clients
/// sending all but the last byte of a maximal body on 400 connections grew the server
/// past 100 MiB RSS (about 260 MiB with 1,000). Bodies being read now share one
/// budget; a head past it is answered 503 `server_busy`.
#[test]
fn bug_partial_bodies_on_many_connections_grew_rss_without_bound() {
    let _heavy = heavy();
    let root = TestRoot::new("bodies");
    let mut w = start(&root);
    let head = Req::talk(&w)
        .body(Vec::new())
        .set("Content-Length", &MAX_BODY.to_string())
        .to_bytes();
    let partial = vec![b' '; MAX_BODY - 1];
    let mut conns = Vec::new();
    for _ in 0..connections_to_open(400) {
        let mut stream = connect(w.port);
        stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // A refused client may see its connection close while it still sends.
        let _ = stream
            .write_all(&head)
            .and_then(|()| stream.write_all(&partial));
        conns.push(stream);
    }
    thread::sleep(Duration::from_millis(500));
    let rss = w.rss_kib();
    assert!(rss < RSS_LIMIT_KIB, "RSS reached {rss} KiB");
    assert_serving(&mut w, "with 400 partial maximal bodies");
    // The last ones were refused as busy rather than buffered.
    for stream in conns.iter_mut().rev().take(5) {
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let r = read_response(stream).expect("an answer to a refused body");
        assert_failure(&r, "target", 503, "server_busy", "body budget exhausted");
    }
    // The HTTP layer refused a talk whose head it had: a talk outcome in the audit log
    // (as a talk's 408 is).
    let audit = w.state_dir.join("audit.log.jsonl");
    assert!(
        eventually(HANG_GUARD, || {
            std::fs::read_to_string(&audit).is_ok_and(|log| {
                log.lines()
                    .any(|l| l.contains("\"status\":503") && l.contains("\"refused\""))
            })
        }),
        "no audit line for the 503"
    );
    drop(conns);
    // Once they are gone, a maximal body is accepted again.
    let skeleton = talk_body("").to_string();
    let prompt = "q".repeat(MAX_BODY - skeleton.len());
    let r = Req::talk(&w).json(&talk_body(&prompt)).send(w.port);
    assert_success(&r, "target", &prompt, "maximal body after the flood");
    w.assert_alive("after partial bodies");
}

/// Runs `clients` connections that each pipeline `raw` as fast as they can while a
/// second thread reads and discards every answer; once every client is getting
/// answers, checks `checks` times that health answers too. Returns the bytes the
/// clients received.
fn greedy_pipeliners(w: &mut Instance, raw: &[u8], clients: usize, checks: usize) -> usize {
    let stop = Arc::new(AtomicBool::new(false));
    let blob = Arc::new(raw.repeat(1000));
    let mut handles = Vec::new();
    let mut counters = Vec::new();
    for _ in 0..clients {
        let mut writer = connect(w.port);
        let mut reader = writer.try_clone().unwrap();
        reader
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        writer
            .set_write_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        counters.push(Arc::clone(&received));
        let (stop_w, stop_r, blob) = (Arc::clone(&stop), Arc::clone(&stop), Arc::clone(&blob));
        handles.push(thread::spawn(move || {
            while !stop_w.load(Ordering::SeqCst) {
                match writer.write(&blob) {
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    }
                    Err(_) => break,
                }
            }
        }));
        handles.push(thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while !stop_r.load(Ordering::SeqCst) {
                match std::io::Read::read(&mut reader, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        received.fetch_add(n, Ordering::SeqCst);
                    }
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    for received in &counters {
        wait_until("a pipelining client got answers", || {
            received.load(Ordering::SeqCst) > 0
        });
    }
    let mut failure = None;
    for _ in 0..checks {
        if let Err(e) = health_within(w.port, HANG_GUARD) {
            failure = Some(e);
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    for handle in handles {
        handle.join().unwrap();
    }
    if let Some(e) = failure {
        panic!(
            "health stopped answering while {clients} client(s) pipelined: {e}\nstderr:\n{}",
            w.stderr()
        );
    }
    counters.iter().map(|c| c.load(Ordering::SeqCst)).sum()
}

/// Regression: the loop served one connection until its socket would block, so a
/// single client that pipelined requests and read the answers as fast as they came
/// kept the loop to itself: `/api/health` never answered while it ran.
#[test]
fn bug_one_pipelining_client_starved_every_other_connection() {
    let _heavy = heavy();
    let root = TestRoot::new("greedy");
    let mut w = start(&root);
    let not_found = Req::new("GET", "/nope")
        .header("Host", &w.host())
        .to_bytes();
    let received = greedy_pipeliners(&mut w, &not_found, 1, 10);
    assert!(received > 0, "the pipelining client got answers too");
    let health = Req::health(&w).to_bytes();
    greedy_pipeliners(&mut w, &health, 3, 10);
    w.assert_alive("after greedy pipelining clients");
}

/// One connection that pipelines health requests without end, reading the answers as
/// they come, must not starve the others. (Formerly `tests/fairness.rs`.)
#[test]
fn endless_pipelining_does_not_starve_health() {
    let _heavy = heavy();
    let root = TestRoot::new("fairness");
    let mut a = root.start("alpha", &open_config("s-0123456789abcdef"));
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = connect(a.port);
    let mut reader = stream.try_clone().unwrap();
    let closer = stream.try_clone().unwrap();
    let request = format!("GET /api/health HTTP/1.1\r\nHost: {}\r\n\r\n", a.host()).repeat(200);
    let writer_stop = Arc::clone(&stop);
    let writer = thread::spawn(move || {
        while !writer_stop.load(Ordering::SeqCst) {
            if stream.write_all(request.as_bytes()).is_err() {
                break;
            }
        }
    });
    // The reader drains until the socket is shut down, so the writer never blocks.
    let answered = Arc::new(AtomicUsize::new(0));
    let drain = {
        let answered = Arc::clone(&answered);
        thread::spawn(move || {
            let mut buf = [0u8; 65536];
            loop {
                match std::io::Read::read(&mut reader, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        answered.fetch_add(n, Ordering::SeqCst);
                    }
                }
            }
        })
    };
    wait_until("the pipelining client got answers", || {
        answered.load(Ordering::SeqCst) > 0
    });
    for i in 0..10 {
        assert_serving(
            &mut a,
            &format!("check {i} while one connection pipelines without end"),
        );
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    closer.shutdown(std::net::Shutdown::Both).unwrap();
    drain.join().unwrap();
}

/// What a client that never read finds on its connection once it looks.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// The start of an answer.
    Answer,
    /// End of stream or a reset before any answer: the server closed it.
    Closed,
}

/// Reads the first bytes on `stream`, waiting until `deadline` at most (then panics:
/// the server neither served nor closed it).
fn first_bytes(stream: &mut TcpStream, deadline: Instant) -> Found {
    stream.set_nonblocking(false).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while got.len() < 12 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "a connection was neither served nor closed"
        );
        stream.set_read_timeout(Some(left)).unwrap();
        match std::io::Read::read(stream, &mut buf) {
            Ok(0) => return Found::Closed,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => return Found::Closed,
        }
    }
    assert!(
        got.starts_with(b"HTTP/1.1 404"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    Found::Answer
}

/// 1,100 connections each pipeline up to 256 KiB of small requests and never read:
/// past its cap the server closes connections to admit new ones (health among them),
/// holds no more descriptors than the cap allows, and serves every connection it kept.
///
/// Regression (a flaky test, not a server bug): this flooded for a fixed 3 s while
/// every health check had to answer within the 2 s liveness bound. A health
/// connection accepted before its request arrives waits for one round of the run queue
/// over about a thousand busy connections, which on a loaded machine took longer than
/// that, so the test failed about half the time there. It now checks what the loop
/// does, not how fast.
#[test]
fn pipelined_floods_on_more_connections_than_the_cap() {
    let _heavy = heavy();
    let root = TestRoot::new("pipeflood");
    let mut w = start(&root);
    let one = Req::new("GET", "/nope")
        .header("Host", &w.host())
        .to_bytes();
    let blob = one.repeat(256 * 1024 / one.len());
    let addr = ([127, 0, 0, 1], w.port).into();
    let mut conns = Vec::new();
    for _ in 0..connections_to_open(1100) {
        if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            stream.set_nonblocking(true).unwrap();
            conns.push(stream);
        }
    }
    // One pass: each connection sends what its socket takes (all of it, or until the
    // server stops reading because this client does not read its answers).
    for stream in &mut conns {
        let mut offset = 0;
        while offset < blob.len() {
            match stream.write(&blob[offset..]) {
                Ok(n) => offset += n,
                Err(_) => break,
            }
        }
    }
    assert_serving(&mut w, "while 1,100 connections pipeline and never read");
    let fds = open_fds(w.pid());
    // 1,024 connections, plus the listener, poll, waker, signal pipe, stdio, ...
    assert!(fds <= 1024 + 32, "the server holds {fds} descriptors");
    assert!(w.rss_kib() < RSS_LIMIT_KIB, "RSS {} KiB", w.rss_kib());
    // Every connection got answers or was closed to make room: none was left out.
    let deadline = Instant::now() + HANG_GUARD;
    let found: Vec<Found> = conns.iter_mut().map(|s| first_bytes(s, deadline)).collect();
    let answered = found.iter().filter(|f| **f == Found::Answer).count();
    assert!(answered > 0, "no connection was served");
    drop(conns);
    assert_serving(&mut w, "after the pipelined floods");
}

/// Regression: the connection cap was 1,024 whatever `ulimit -n` allowed. Under the
/// common soft limit of 1,024 (or lower) the process ran out of descriptors first;
/// accept then failed and new connections were admitted one per 100 ms backoff, so
/// health waited seconds behind the backlog of a connection flood.
#[test]
fn bug_a_low_open_files_limit_left_health_behind_the_backlog() {
    let _heavy = heavy();
    let root = TestRoot::new("fdlimit");
    root.write_config("target", &open_config("robust-secret-0123456789abcdef"));
    let mut w = Instance::spawn_with_fd_limit(&root, "target", 256);
    let addr = ([127, 0, 0, 1], w.port).into();
    let mut conns = Vec::new();
    for _ in 0..connections_to_open(700) {
        if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            conns.push(stream);
        }
    }
    for i in 0..5 {
        w.assert_alive(&format!(
            "health {i} with 700 idle connections, ulimit -n 256"
        ));
    }
    let fds = open_fds(w.pid());
    assert!(fds <= 256, "the server holds {fds} descriptors");
    assert!(
        w.wait_for_log("256", Duration::from_secs(10)),
        "the reduced cap is logged\nstderr:\n{}",
        w.stderr()
    );
    drop(conns);
    let r = Req::talk(&w).send(w.port);
    assert_success(&r, "target", "hi", "talk after the flood");
}

/// Reads a response head (through the blank line) and nothing more.
fn read_head_only(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            std::io::Read::read(stream, &mut byte).unwrap(),
            1,
            "EOF in a head"
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Regression: answers to `HEAD` carried a body, which HTTP forbids; on a keep-alive
/// connection the client then read that body as the start of the next response.
#[test]
fn bug_head_responses_carried_a_body() {
    let root = TestRoot::new("head");
    let mut w = start(&root);
    let mut stream = connect(w.port);
    for (path, status, allow) in [
        ("/api/health", "200", None),
        ("/api/talk", "405", Some("Allow: POST")),
        ("/nope", "404", None),
    ] {
        let pair = [
            Req::new("HEAD", path).header("Host", &w.host()).to_bytes(),
            Req::health(&w).to_bytes(),
        ]
        .concat();
        stream.write_all(&pair).unwrap();
        let head = read_head_only(&mut stream);
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "HEAD {path}: {head}"
        );
        assert!(head.contains("Content-Length: "), "HEAD {path}: {head}");
        if let Some(allow) = allow {
            assert!(head.contains(allow), "HEAD {path}: {head}");
        }
        // The very next bytes are the answer to the GET that followed.
        let next = read_response(&mut stream).expect("the GET's answer");
        assert_eq!(next.status, 200, "after HEAD {path}: {next:?}");
        assert_eq!(next.json()["instance"], "target");
    }
    w.assert_alive("after HEAD requests");
}
