//! A first end-to-end check: serve, health, one talk, SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on the first broken expectation")]
mod common;
use common::*;
use std::time::Duration;

#[test]
fn echo_talk_round_trip() {
    let root = TestRoot::new("smoke");
    let mut a = root.start("alpha", &open_config("s3cret"));
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
