//! Duplicate keys in config.json: JSON parsers (serde_json among them) keep the last
//! of two equal keys, so `{"bus":{"peers":["a"],"peers":"*"}}` would silently open the
//! instance. This reads the document before it is parsed for use, each object's members
//! in order as raw text, and names the first key that appears twice in one object.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::fmt;

/// The dotted path of the first key repeated within one object (`bus.peers`; array
/// items as `[index]`), or `None` when every object's keys are distinct. Bytes that are
/// not JSON give `None` too: the parse that follows reports them.
pub(super) fn first_duplicate(bytes: &[u8]) -> Option<String> {
    // Parsed whole first, so that serde_json's nesting limit (128) bounds the walk's
    // depth: raw values are skipped over without one.
    serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    within(std::str::from_utf8(bytes).ok()?, "")
}

/// The first duplicate in the JSON value `text`, which stands at `path`. Each level
/// reads its own text again: at most 128 levels ([`first_duplicate`] checked).
fn within(text: &str, path: &str) -> Option<String> {
    match text.trim_start().as_bytes().first() {
        Some(b'{') => {
            let Members(members) = serde_json::from_str(text).ok()?;
            let mut seen = HashSet::new();
            members.into_iter().find_map(|(key, value)| {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if seen.insert(key) {
                    within(value.get(), &at)
                } else {
                    Some(at)
                }
            })
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            let mut items = items.into_iter().enumerate();
            items.find_map(|(i, item)| within(item.get(), &format!("{path}[{i}]")))
        }
        _ => None,
    }
}

/// An object's members in document order, a repeated key kept each time.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Read;
        impl<'de> Visitor<'de> for Read {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bug_a_repeated_key_let_the_last_value_open_the_instance() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"bus":{"peers":["a"],"peers":"*"}}"#, Some("bus.peers")),
            (r#"{"bus":{"peers":[]},"bus":{"peers":"*"}}"#, Some("bus")),
            (
                r#"{"bus":{"maxDepth":1,"maxDepth":100}}"#,
                Some("bus.maxDepth"),
            ),
            (
                r#"{"engine":{"env":{"A":"1","A":"2"}}}"#,
                Some("engine.env.A"),
            ),
            (r#"{"x":[{"k":1},{"k":1,"k":2}]}"#, Some("x[1].k")),
            // An escaped spelling is the same key.
            (
                r#"{"bus":{"peers":"*","pe\u0065rs":[]}}"#,
                Some("bus.peers"),
            ),
            (r#"{"bus":{"peers":["a","a"]}}"#, None),
            (r#"{"bus":{"peers":"*"},"budgetUsd":1}"#, None),
            (r#"{"a":{"k":1},"b":{"k":1}}"#, None),
            ("not json", None),
            ("[]", None),
        ];
        for (text, want) in cases {
            assert_eq!(first_duplicate(text.as_bytes()).as_deref(), *want, "{text}");
        }
    }

    /// Regression: the walk over raw members recursed once per level of nesting, which
    /// serde_json does not bound when it skips a raw value: a config of 100,000 nested
    /// arrays overflowed the stack. Past serde_json's limit there is no duplicate to
    /// name; the parse that follows reports the nesting.
    #[test]
    fn bug_a_deeply_nested_config_overflowed_the_stack() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(first_duplicate(deep.as_bytes()), None);
        let nested = format!("{}{{\"k\":1,\"k\":2}}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(
            first_duplicate(nested.as_bytes()).as_deref(),
            Some(&*format!("{}.k", "[0]".repeat(100)))
        );
    }
}
