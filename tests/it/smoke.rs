//! A first end-to-end check: serve, health, one talk, SIGTERM.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
use crate::common;
use common::*;
use std::time::Duration;

#[test]
fn echo_talk_round_trip() {
    let root = TestRoot::new("smoke");
    let mut a = root.start("alpha", &open_config("s3cret-0123456789abcdef"));
    let health = a.health();
    assert_eq!(health["instance"], "alpha");
    assert_eq!(health["status"], "ok");
    let r = a.talk("beta", "hello there", 0);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["text"], "hello there");
    assert_eq!(v["fromInstance"], "alpha");
    let status = a.terminate(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    assert!(root.registry()["instances"].get("alpha").is_none());
}

#[test]
fn expect_100_continue_gets_an_interim_answer() {
    use std::io::Write;
    let root = TestRoot::new("continue");
    let a = root.start("alpha", &open_config("s3cret-0123456789abcdef"));
    let body = r#"{"fromInstance":"c","prompt":"after continue","depth":0}"#;
    let mut stream = connect(a.port);
    write!(
        stream,
        "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer s3cret-0123456789abcdef\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        a.host(),
        body.len()
    )
    .unwrap();
    let interim = read_response(&mut stream).unwrap();
    assert_eq!(interim.status, 100);
    stream.write_all(body.as_bytes()).unwrap();
    let r = read_response(&mut stream).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["text"], "after continue");
}
