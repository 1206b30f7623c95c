//! The `GET /api/health` answer: one [`Health`] type that the server serializes and a
//! probe parses.

use serde_json::Value;

use super::{non_negative_integer, CAPABILITIES, PROTOCOL_VERSION};

/// What `GET /api/health` answers (contract section 4). More fields may be added, so
/// a parser keeps the ones it knows and ignores the rest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Health {
    /// The instance's fingerprint (`bus.kind`).
    pub kind: String,
    /// The instance's name (peer-supplied when parsed: not validated).
    pub instance: String,
    /// [`Health::OK`] when the instance is serving, [`Health::STOPPING`] while it
    /// shuts down; a peer may send other values.
    pub status: String,
    /// The serving process's id (0 when a peer left it out).
    pub pid: u32,
    /// `protocolVersion`, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<u64>,
    /// The advertised capabilities (empty when absent).
    pub capabilities: Vec<String>,
    /// The turn counters, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<TurnLoad>,
    /// `busEnabled`: whether the instance's bus takes talks (a disabled bus still
    /// answers health, with 200); `None` when a peer left it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_enabled: Option<bool>,
    /// `proof`: the answer to the probe's nonce (contract section 6.1), when the server
    /// gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// The `turns` object of a health answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct TurnLoad {
    /// Turns being run now.
    pub running: usize,
    /// Turns waiting for a worker.
    pub queued: usize,
    /// Worker count.
    pub max: usize,
}

impl Health {
    /// `status` of an instance that is serving.
    pub const OK: &'static str = "ok";
    /// `status` of an instance that is shutting down.
    pub const STOPPING: &'static str = "stopping";

    /// The answer of an instance of this build: `protocolVersion` and `capabilities`
    /// are this build's, `turns` and `busEnabled` are left out until
    /// [`Health::with_turns`] and [`Health::with_bus_enabled`].
    pub fn new(kind: &str, instance: &str, status: &str, pid: u32) -> Health {
        Health {
            kind: kind.to_owned(),
            instance: instance.to_owned(),
            status: status.to_owned(),
            pid,
            protocol_version: Some(PROTOCOL_VERSION),
            capabilities: CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
            turns: None,
            bus_enabled: None,
            proof: None,
        }
    }

    /// The same answer with a `proof` of the probe's nonce.
    pub fn with_proof(self, proof: String) -> Health {
        Health {
            proof: Some(proof),
            ..self
        }
    }

    /// The same answer with turn counters.
    pub fn with_turns(self, turns: TurnLoad) -> Health {
        Health {
            turns: Some(turns),
            ..self
        }
    }

    /// The same answer saying whether the bus is enabled.
    pub fn with_bus_enabled(self, enabled: bool) -> Health {
        Health {
            bus_enabled: Some(enabled),
            ..self
        }
    }

    /// Whether `status` is [`Health::OK`].
    pub fn is_ok(&self) -> bool {
        self.status == Health::OK
    }

    /// The answer as JSON: `kind`, `instance`, `status`, `pid`, `protocolVersion`
    /// (when set), `capabilities`, `turns` (when set), `busEnabled` (when set), `proof`
    /// (when set), in that order.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing strings and integers into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Parses a health answer, ignoring fields this build does not know. Only `kind`,
/// `instance` and `status` are required; `pid`, `protocolVersion`, `capabilities`,
/// `turns`, `busEnabled` and `proof` are read when they have the right shape and left out
/// otherwise.
///
/// # Errors
/// The body is not a JSON object with string `kind`, `instance` and `status`.
pub fn parse_health(body: &[u8]) -> Result<Health, super::ResponseError> {
    use super::ResponseError;
    let value: Value = serde_json::from_slice(body).map_err(|_| ResponseError::NotJson)?;
    let Value::Object(object) = value else {
        return Err(ResponseError::NotObject);
    };
    let field = |name: &'static str| -> Result<String, ResponseError> {
        match object.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ResponseError::FieldType(name)),
        }
    };
    let counter = |turns: &Value, name: &str| {
        turns
            .get(name)
            .and_then(non_negative_integer)
            .and_then(|n| usize::try_from(n).ok())
    };
    let turns = object.get("turns").and_then(|turns| {
        Some(TurnLoad {
            running: counter(turns, "running")?,
            queued: counter(turns, "queued")?,
            max: counter(turns, "max")?,
        })
    });
    Ok(Health {
        kind: field("kind")?,
        instance: field("instance")?,
        status: field("status")?,
        pid: object
            .get("pid")
            .and_then(non_negative_integer)
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        protocol_version: object.get("protocolVersion").and_then(non_negative_integer),
        capabilities: match object.get("capabilities") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        },
        turns,
        bus_enabled: object.get("busEnabled").and_then(Value::as_bool),
        proof: object
            .get("proof")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_parsing() {
        let h =
            parse_health(br#"{"kind":"loopbus","instance":"a","status":"ok","pid":7,"extra":1}"#)
                .unwrap();
        assert_eq!(
            (
                h.kind.as_str(),
                h.instance.as_str(),
                h.status.as_str(),
                h.pid
            ),
            ("loopbus", "a", "ok", 7)
        );
        assert_eq!(
            (h.protocol_version, h.turns, h.bus_enabled),
            (None, None, None)
        );
        assert!(h.capabilities.is_empty());
        assert!(parse_health(br#"{"kind":"loopbus","status":"ok"}"#).is_err());
        assert!(parse_health(br#"{"kind":"loopbus","instance":null,"status":"ok"}"#).is_err());
        // Fields of the wrong shape are left out, not refused.
        let odd = parse_health(
            br#"{"kind":"k","instance":"a","status":"ok","pid":-1,"protocolVersion":"1","capabilities":7,"turns":{"running":1},"busEnabled":"no"}"#,
        )
        .unwrap();
        assert_eq!(
            (odd.pid, odd.protocol_version, odd.turns, odd.bus_enabled),
            (0, None, None, None)
        );
        for (json, want) in [("true", Some(true)), ("false", Some(false)), ("0", None)] {
            let body =
                format!(r#"{{"kind":"k","instance":"a","status":"ok","busEnabled":{json}}}"#);
            assert_eq!(
                parse_health(body.as_bytes()).unwrap().bus_enabled,
                want,
                "{json}"
            );
        }
    }

    #[test]
    fn the_server_body_keeps_its_field_order_and_round_trips() {
        let health = Health::new("loopbus", "w", Health::OK, 42).with_turns(TurnLoad {
            running: 1,
            queued: 2,
            max: 4,
        });
        assert_eq!(
            String::from_utf8(health.to_json()).unwrap(),
            r#"{"kind":"loopbus","instance":"w","status":"ok","pid":42,"protocolVersion":1,"capabilities":["structured-errors","retryable-errors","idempotent-requests","cancel-on-hangup","usage-report","secret-proof"],"turns":{"running":1,"queued":2,"max":4}}"#
        );
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        let health = health.with_bus_enabled(false);
        assert_eq!(
            String::from_utf8(health.to_json()).unwrap(),
            r#"{"kind":"loopbus","instance":"w","status":"ok","pid":42,"protocolVersion":1,"capabilities":["structured-errors","retryable-errors","idempotent-requests","cancel-on-hangup","usage-report","secret-proof"],"turns":{"running":1,"queued":2,"max":4},"busEnabled":false}"#
        );
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        let health = health.with_proof("ab".to_owned());
        assert!(String::from_utf8(health.to_json())
            .unwrap()
            .ends_with(r#""busEnabled":false,"proof":"ab"}"#));
        assert_eq!(parse_health(&health.to_json()).unwrap(), health);
        assert!(health.is_ok());
        assert!(!Health::new("loopbus", "w", Health::STOPPING, 1).is_ok());
    }
}
