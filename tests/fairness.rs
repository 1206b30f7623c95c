//! One connection that pipelines without end must not starve the others.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
mod common;
use common::*;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn endless_pipelining_does_not_starve_health() {
    let root = TestRoot::new("fairness");
    let mut a = root.start("alpha", &open_config("s"));
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = connect(a.port);
    let mut reader = stream.try_clone().unwrap();
    let closer = stream.try_clone().unwrap();
    let request = format!("GET /api/health HTTP/1.1\r\nHost: {}\r\n\r\n", a.host()).repeat(200);
    let writer_stop = stop.clone();
    let writer = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !writer_stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            if stream.write_all(request.as_bytes()).is_err() {
                break;
            }
        }
    });
    // The reader drains until the socket is shut down, so the writer never blocks.
    let drain = thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let mut total = 0usize;
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        total
    });
    thread::sleep(Duration::from_millis(300));
    for _ in 0..10 {
        a.assert_alive("while one connection pipelines without end");
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    closer.shutdown(std::net::Shutdown::Both).unwrap();
    let answered = drain.join().unwrap();
    assert!(answered > 0, "the pipelining client got no answers");
}
