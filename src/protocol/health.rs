//! The `GET /api/health` answer: one [`Health`] type that the server serializes and a
//! probe parses (`response.rs`).

use super::{CAPABILITIES, PROTOCOL_VERSION};

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
    /// are this build's; `turns`, `busEnabled` and `proof` are left out until set.
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

    /// The answer as JSON, fields in the struct's order, those unset left out.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing strings and integers into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}
