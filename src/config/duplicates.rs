//! Duplicate keys in config.json: JSON parsers (serde_json among them) keep the last
//! of two equal keys, so `{"bus":{"peers":["a"],"peers":"*"}}` would silently open the
//! instance. This walks the document once, before it is parsed for use, and names the
//! first key that appears twice in one object.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The dotted path of the first key repeated within one object (`bus.peers`; array
/// items as `[index]`), or `None` when every object's keys are distinct. Bytes that are
/// not JSON give `None` too: the parse that follows reports them.
pub(super) fn first_duplicate(bytes: &[u8]) -> Option<String> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let walk = Walk {
        path: String::new(),
    };
    walk.deserialize(&mut deserializer).unwrap_or_default()
}

/// Walks one value at `path`; yields the first duplicate found under it.
struct Walk {
    path: String,
}

impl Walk {
    fn child(&self, key: &str) -> Walk {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Walk { path }
    }
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if found.is_some() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let child = self.child(&key);
            if !seen.insert(key) {
                found = Some(child.path);
                map.next_value::<IgnoredAny>()?;
            } else {
                found = map.next_value_seed(child)?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut index = 0usize;
        while found.is_none() {
            let item = Walk {
                path: format!("{}[{index}]", self.path),
            };
            match seq.next_element_seed(item)? {
                Some(inner) => found = inner,
                None => return Ok(None),
            }
            index += 1;
        }
        // Found: the rest of the array is read past.
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(found)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
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
}
