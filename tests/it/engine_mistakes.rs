//! Mistakes that can never succeed are not retryable (contract 4): a missing engine
//! program, a bad `engine.cwd`, a prompt over Linux's argument limit in `arg` mode.
//! Each turn fails `engine_cli` with `retryable: false` and a message naming the cause,
//! and the configuration mistakes are warned about at start-up.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]
use crate::common;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

fn engine_config(engine: Value) -> Value {
    json!({"bus": {"peers": "*", "secret": "s-0123456789abcdef"}, "engine": engine})
}

/// The (code, retryable, error) of a failure envelope.
fn failure(r: &HttpResponse) -> (String, bool, String) {
    let v = r.json();
    assert_eq!(v["success"], false, "{v}");
    (
        v["errorCode"].as_str().unwrap().to_owned(),
        v["retryable"].as_bool().unwrap(),
        v["error"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn bug_a_missing_engine_binary_was_retryable_and_found_only_by_a_caller() {
    let root = TestRoot::new("mistake-binary");
    let instance = root.start(
        "w",
        &engine_config(json!({"command": ["loopbus-no-such-engine-binary"]})),
    );
    assert!(
        instance.wait_for_log("`loopbus-no-such-engine-binary`", Duration::from_secs(5)),
        "no start-up warning:\n{}",
        instance.stderr()
    );
    let (code, retryable, error) = failure(&instance.talk("c", "hi", 0));
    assert_eq!(code, "engine_cli");
    assert!(!retryable, "{error}");
    assert!(
        error.contains("`loopbus-no-such-engine-binary` not found"),
        "{error}"
    );
}

#[test]
fn bug_a_bad_engine_cwd_was_reported_as_the_command_missing() {
    let root = TestRoot::new("mistake-cwd");
    let missing = root.path.join("no-such-dir");
    let instance = root.start(
        "w",
        &engine_config(json!({"command": ["cat"], "cwd": missing.to_str().unwrap()})),
    );
    assert!(
        instance.wait_for_log("engine.cwd", Duration::from_secs(5)),
        "no start-up warning:\n{}",
        instance.stderr()
    );
    let (code, retryable, error) = failure(&instance.talk("c", "hi", 0));
    assert_eq!(code, "engine_cli");
    assert!(!retryable, "{error}");
    assert!(error.contains("engine.cwd"), "{error}");
    assert!(!error.contains("not found (engine.command)"), "{error}");
}

#[test]
fn bug_a_prompt_over_the_argument_limit_was_retryable() {
    let root = TestRoot::new("mistake-arg");
    let instance = root.start(
        "w",
        &engine_config(
            json!({"command": ["sh", "-c", "printf %s \"$0\" | wc -c"], "prompt": "arg"}),
        ),
    );
    let long = "x".repeat(130 * 1024);
    let (code, retryable, error) = failure(&instance.talk("c", &long, 0));
    assert_eq!(code, "engine_cli");
    assert!(!retryable, "{error}");
    assert!(error.contains("MAX_ARG_STRLEN"), "{error}");
    // Under the limit the same engine runs.
    let ok = instance.talk("c", "short", 0).json();
    assert_eq!(ok["success"], true, "{ok}");
}

#[test]
fn bug_loopbus_not_on_a_nested_engines_path_was_not_warned_about() {
    let root = TestRoot::new("mistake-path");
    let instance = root.start(
        "w",
        &engine_config(json!({
            "command": ["/bin/sh", "-c", "loopbus talk other hi"],
            "env": {"PATH": "/nonexistent-loopbus-path"}
        })),
    );
    assert!(
        instance.wait_for_log(
            "`loopbus` is not on the engine's PATH",
            Duration::from_secs(5)
        ),
        "no start-up warning:\n{}",
        instance.stderr()
    );
    // The turn that tries fails for good, naming the cause.
    let (code, retryable, error) = failure(&instance.talk("c", "hi", 0));
    assert_eq!(code, "engine_cli");
    assert!(!retryable, "{error}");
    assert!(error.contains("could not run `loopbus`"), "{error}");
}
