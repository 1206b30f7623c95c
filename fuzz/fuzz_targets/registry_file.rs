//! The registry file's parser (`.bus-registry.json`): never panics; each entry of the
//! `instances` object is either kept (valid name, port and pid non-zero, a secret) or
//! skipped with a reason that never echoes a value; what it keeps, written back as a
//! registry, parses again to the same entries with nothing skipped.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::fuzzing::parse_registry;
use serde_json::{json, Map, Value};

/// The reasons an entry is skipped for (after `"<name>: "`).
const REASONS: &[&str] = &[
    "port must be an integer from 1 to 65535",
    "pid must be a positive integer",
    "secret must be a non-empty string",
    "updatedAt must be an ISO-8601 time",
];

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = parse_registry(data) else {
        return;
    };
    let document: Value = serde_json::from_slice(data).expect("accepted, so JSON");
    let instances = document["instances"]
        .as_object()
        .expect("accepted, so an object");
    assert_eq!(parsed.entries.len() + parsed.skipped.len(), instances.len());
    for reason in &parsed.skipped {
        let known = reason == "invalid instance name"
            || REASONS.iter().any(|r| {
                reason
                    .strip_suffix(r)
                    .and_then(|name| name.strip_suffix(": "))
                    .is_some_and(|name| instances.contains_key(name))
            });
        assert!(known, "{reason:?}");
    }
    let mut written = Map::new();
    for (name, entry) in &parsed.entries {
        assert!(instances.contains_key(name.as_str()));
        assert!(entry.port != 0 && entry.pid != 0);
        assert!(!entry.secret.expose().is_empty());
        written.insert(
            name.to_string(),
            json!({
                "port": entry.port,
                "pid": entry.pid,
                "secret": entry.secret.expose(),
                "updatedAt": entry.updated_at,
            }),
        );
    }
    let bytes = serde_json::to_vec(&json!({ "instances": written })).expect("a Value encodes");
    let again = parse_registry(&bytes).expect("written back, so valid");
    assert_eq!(again.entries, parsed.entries);
    assert!(again.skipped.is_empty());
});
