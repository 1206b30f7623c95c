//! What `loopbus talk` prints (issue 13): a reply ends with a newline on a pipe as
//! on a terminal, `--raw` prints the exact bytes, and nothing meant for a terminal
//! (the time waited, the cost line, the note that the prompt is read from stdin)
//! reaches a pipe. The terminal side of each is a unit test in `commands/talk.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use crate::client_support;
use crate::common;

use client_support::*;
use common::*;
use serde_json::json;
use std::path::PathBuf;

/// A caller `me` and a stand-in `worker` that answers every talk with `text`.
fn setup(label: &str, text: &str) -> (TestRoot, PathBuf, FakePeer) {
    let root = TestRoot::new(label);
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let me = root.state_dir("me");
    let peer = FakePeer::answering(
        "worker",
        Answer::json(
            200,
            &json!({"success": true, "text": text, "fromInstance": "worker", "durationMs": 2500,
                    "protocolVersion": 1, "capabilities": ["structured-errors", "retryable-errors"],
                    "usage": {"costUsd": 0.5, "inputTokens": 10, "outputTokens": 20,
                              "cachedTokens": 0}}),
        ),
    );
    register_by_hand(
        &root.path,
        "worker",
        peer.port,
        std::process::id(),
        "w-secret",
    );
    (root, me, peer)
}

#[test]
fn talk_output_ends_with_a_newline_on_a_pipe() {
    let (_root, me, _peer) = setup("out-newline", "no newline at the end");
    let t = talk(&me, &["worker", "hi"], &[], None);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    assert_eq!(t.stdout(), "no newline at the end\n", "{}", t.describe());
}

#[test]
fn a_reply_that_ends_with_a_newline_gets_no_second_one() {
    let (_root, me, _peer) = setup("out-one-newline", "two lines\nend\n");
    let t = talk(&me, &["worker", "hi"], &[], None);
    assert_eq!(t.stdout(), "two lines\nend\n", "{}", t.describe());
}

#[test]
fn talk_raw_prints_the_exact_bytes() {
    for text in ["no newline", "with newline\n", "", "\u{1b}[31mred\u{1b}[0m"] {
        let (_root, me, _peer) = setup("out-raw", text);
        let t = talk(&me, &["worker", "hi", "--raw"], &[], None);
        assert_eq!(t.code(), Some(0), "{}", t.describe());
        assert_eq!(t.stdout(), text, "{}", t.describe());
    }
}

#[test]
fn nothing_meant_for_a_terminal_reaches_a_pipe() {
    let (_root, me, _peer) = setup("out-quiet", "ok");
    // The prompt from stdin (not a terminal): no note about Ctrl-D; stderr is a pipe:
    // no cost line, no time waited.
    let t = talk(&me, &["worker"], &[], Some("from stdin"));
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    assert_eq!(t.stdout(), "ok\n");
    assert_eq!(t.stderr(), "", "{}", t.describe());
}

#[test]
fn a_bad_retries_value_is_a_usage_error() {
    let (_root, me, peer) = setup("out-retries", "ok");
    for bad in ["-1", "x", "101", "1.5"] {
        let t = talk(&me, &["worker", "hi", "--retries", bad], &[], None);
        assert_eq!(t.code(), Some(2), "{}", t.describe());
        assert!(t.stderr().contains("--retries"), "{}", t.describe());
    }
    assert!(peer.requests().is_empty());
}
