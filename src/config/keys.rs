//! The keys `config.json` may hold, and the check that refuses every other one
//! (contract section 2). A typo must never widen access or drop a limit: `"peer"` left
//! to its default would open the bus to every caller, `"budgetUSD"` would mean no
//! budget. So an unknown key, at any level, is an error that names it and, where one
//! is close, the key meant.

use serde_json::{Map, Value};

use super::error::Problem;

/// One object of the config whose keys are checked: the path that names its keys in
/// errors, the keys it may hold, and the keys it may hold that are ignored (never
/// suggested).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Object {
    path: &'static str,
    keys: &'static [&'static str],
    ignored: &'static [&'static str],
}

/// The top-level object.
pub(super) const TOP: Object = Object {
    path: "",
    keys: &["bus", "budgetUsd", "engine"],
    ignored: &[],
};

/// `bus`. `crew` is written by the original implementation: known and ignored.
pub(super) const BUS: Object = Object {
    path: "bus",
    keys: &[
        "peers",
        "maxDepth",
        "port",
        "secret",
        "kind",
        "acceptKinds",
        "maxConcurrentTurns",
        "maxQueuedTurns",
        "cancelOnHangup",
        "reattachSecs",
        "parallel",
        "chain",
        "verifier",
    ],
    ignored: &["crew"],
};

/// `engine`. (The names under `env` are the operator's, not checked here.)
pub(super) const ENGINE: Object = Object {
    path: "engine",
    keys: &[
        "preset",
        "command",
        "prompt",
        "output",
        "timeoutSecs",
        "maxOutputBytes",
        "maxTurnCostUsd",
        "cwd",
        "env",
    ],
    ignored: &[],
};

/// Every object whose keys are checked.
const ALL: [&Object; 3] = [&TOP, &BUS, &ENGINE];

impl Object {
    /// `key`'s path in this object, as errors name it.
    pub(super) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

/// Most edits (insertions, deletions, substitutions, ignoring case) between an unknown
/// key and the known key it is taken for. A suggestion also needs at most half the
/// unknown key's characters changed, so that `"x"` suggests nothing.
pub const MAX_SUGGESTION_EDITS: usize = 2;

/// The keys of `fields` (in the map's order) that `object` does not know, each named by
/// its path, with the path of the key probably meant.
pub(super) fn unknown<'a>(
    fields: &'a Map<String, Value>,
    object: &'a Object,
) -> impl Iterator<Item = Problem> + 'a {
    let known = |key: &str| object.keys.contains(&key) || object.ignored.contains(&key);
    fields
        .keys()
        .filter(move |key| !known(key))
        .map(|key| Problem::UnknownKey {
            path: object.path_of(key),
            suggestion: suggestion(key, object),
        })
}

/// The path of the key `key` was probably meant to be: a key of the same object that
/// differs only in case, else the closest one within [`MAX_SUGGESTION_EDITS`], else a
/// key of another object spelt the same ignoring case (a key in the wrong place, like
/// a top-level `maxDepth`).
fn suggestion(key: &str, object: &Object) -> Option<String> {
    let lower = key.to_lowercase();
    let allowed = MAX_SUGGESTION_EDITS.min(lower.chars().count() / 2);
    let closest = object
        .keys
        .iter()
        .filter_map(|known| {
            let edits = edit_distance(&lower, &known.to_lowercase(), allowed)?;
            Some((edits, *known))
        })
        // `min_by_key` keeps the first of equals: the order of the lists decides ties.
        .min_by_key(|(edits, _)| *edits);
    if let Some((_, known)) = closest {
        return Some(object.path_of(known));
    }
    ALL.into_iter()
        .filter(|other| *other != object)
        .find_map(|other| {
            let known = other.keys.iter().find(|k| k.eq_ignore_ascii_case(key))?;
            Some(other.path_of(known))
        })
}

/// The Levenshtein distance between `a` and `b` (by chars), or `None` when it is
/// over `limit`. Strings whose lengths differ by more than `limit` are not compared,
/// so that a huge key costs nothing.
fn edit_distance(a: &str, b: &str, limit: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > limit {
        return None;
    }
    // One row of the classic table: `row[j]` is the distance between the first `i`
    // chars of `a` and the first `j` of `b`.
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    let distance = row[b.len()];
    (distance <= limit).then_some(distance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    /// The first unknown key of `fields`, as the error that names it.
    fn check(fields: &Map<String, Value>, object: &Object) -> Result<(), ConfigError> {
        unknown(fields, object)
            .next()
            .map(ConfigError::new)
            .map_or(Ok(()), Err)
    }

    fn object(json: &str) -> Map<String, Value> {
        match serde_json::from_str(json).unwrap() {
            Value::Object(map) => map,
            _ => panic!("{json}"),
        }
    }

    #[test]
    fn edit_distances() {
        let cases = [
            ("peer", "peers", 5, Some(1)),
            ("peers", "peers", 0, Some(0)),
            ("chian", "chain", 5, Some(2)),
            ("", "abc", 5, Some(3)),
            ("kitten", "sitting", 5, Some(3)),
            ("kitten", "sitting", 2, None),
            ("a", "abcd", 2, None),
            ("é", "e", 1, Some(1)),
        ];
        for (a, b, limit, want) in cases {
            assert_eq!(edit_distance(a, b, limit), want, "{a} {b} {limit}");
        }
    }

    #[test]
    fn unknown_keys_name_the_key_meant() {
        // (object, its JSON, the error's text, or None when the keys are all known)
        let cases: &[(&Object, &str, Option<&str>)] = &[
            (&TOP, r#"{"bus": 1, "budgetUsd": 1, "engine": 1}"#, None),
            (&BUS, r#"{"crew": {"anything": [1]}}"#, None),
            (
                &BUS,
                r#"{"peer": ["a"]}"#,
                Some("config.json: unknown key bus.peer; did you mean bus.peers?"),
            ),
            (
                &TOP,
                r#"{"budgetUSD": 1}"#,
                Some("config.json: unknown key budgetUSD; did you mean budgetUsd?"),
            ),
            (
                &BUS,
                r#"{"maxdepth": 1}"#,
                Some("config.json: unknown key bus.maxdepth; did you mean bus.maxDepth?"),
            ),
            (
                &BUS,
                r#"{"chian": []}"#,
                Some("config.json: unknown key bus.chian; did you mean bus.chain?"),
            ),
            (
                &TOP,
                r#"{"maxDepth": 1}"#,
                Some("config.json: unknown key maxDepth; did you mean bus.maxDepth?"),
            ),
            (
                &BUS,
                r#"{"budgetusd": 1}"#,
                Some("config.json: unknown key bus.budgetusd; did you mean budgetUsd?"),
            ),
            (&ENGINE, r#"{"preset": "claude"}"#, None),
            (
                &ENGINE,
                r#"{"presets": "claude"}"#,
                Some("config.json: unknown key engine.presets; did you mean engine.preset?"),
            ),
            (
                &ENGINE,
                r#"{"timeout": 5}"#,
                Some("config.json: unknown key engine.timeout"),
            ),
            (&TOP, r#"{"x": 1}"#, Some("config.json: unknown key x")),
            (
                &TOP,
                r#"{"bu": 1}"#,
                Some("config.json: unknown key bu; did you mean bus?"),
            ),
            // `crew` is never suggested, and only known in `bus`.
            (
                &TOP,
                r#"{"crew": 1}"#,
                Some("config.json: unknown key crew"),
            ),
            // Keys that can't be shown as they are are quoted, and long ones cut.
            (
                &TOP,
                r#"{"a\u0000b": 1}"#,
                Some(r#"config.json: unknown key "a\0b""#),
            ),
        ];
        for (object_kind, json, want) in cases {
            let got = check(&object(json), object_kind).map_err(|e| e.to_string());
            assert_eq!(got.err().as_deref(), *want, "{json}");
        }
        let long = format!(r#"{{"{}": 1}}"#, "k".repeat(10_000));
        let err = check(&object(&long), &TOP).unwrap_err();
        assert!(err.to_string().len() < 200, "{err}");
        assert_eq!(err.field().map(str::len), Some(10_000));
    }
}
