//! The client side of the bus: one delegation to another instance, exactly as contract
//! section 5 tables it.
//!
//! [`delegate`] runs the caller's local checks first (own bus enabled, target among own
//! peers, depth below own `maxDepth`, body within [`MAX_BODY_BYTES`]), then looks the
//! target up in the registry and probes its health, and only on the connection whose
//! probe matched sends `POST /api/talk` with the bearer secret and `depth + 1`. The
//! answer becomes a [`Reply`] or a [`DelegateError`]; [`DelegateError::code`] is the
//! one place where client failures get their wire code.
//!
//! ```no_run
//! use loopbus::{delegate, BusConfig, DelegateOptions, InstanceName};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), loopbus::InvalidInstanceName> {
//! let bus = BusConfig::open();
//! let options = DelegateOptions::new(
//!     "/home/me/.loopbus",
//!     InstanceName::new("reviewer")?,
//!     bus,
//!     InstanceName::new("worker")?,
//!     "Please verify this answer",
//! )
//! .with_timeout(Duration::from_secs(60));
//! match delegate(&options) {
//!     Ok(reply) => println!("{}", reply.text),
//!     Err(e) => eprintln!("{} (retryable: {}): {e}", e.code(), e.retryable()),
//! }
//! # Ok(())
//! # }
//! ```

use crate::config::BusConfig;
use crate::http::client::{ClientError, Connection, ReceivedResponse};
use crate::protocol::{
    self, encode_talk_request, encode_talk_request_with, Envelope, InstanceName, TalkRequest,
    MAX_BODY_BYTES,
};
use crate::registry::owner::OwnerRefusal;
use crate::registry::{self};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod error;

pub use error::DelegateError;

/// How long `loopbus talk` waits for an answer unless told otherwise (contract
/// section 5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// One delegation, built with [`DelegateOptions::new`] and the `with_` setters.
/// `Debug` shows the prompt's length, never its text.
#[derive(Clone)]
#[non_exhaustive]
pub struct DelegateOptions {
    /// The channel root whose registry names the target.
    pub root: PathBuf,
    /// The calling instance's name, sent as `fromInstance`.
    pub caller: InstanceName,
    /// The caller's own `bus` config: `enabled`, `peers`, `maxDepth`, `acceptKinds`.
    pub bus: BusConfig,
    /// The instance to ask.
    pub target: InstanceName,
    /// The prompt.
    pub prompt: String,
    /// The caller's current depth; the request carries `depth + 1`.
    pub depth: u64,
    /// How long to wait for the answer once the request is sent.
    pub timeout: Duration,
}

impl DelegateOptions {
    /// A delegation of `prompt` from `caller` to `target`, found in the registry of
    /// the channel root `root`, checked against the caller's own `bus` config; at
    /// depth 0 and with [`DEFAULT_TIMEOUT`] until set otherwise.
    pub fn new(
        root: impl Into<PathBuf>,
        caller: InstanceName,
        bus: BusConfig,
        target: InstanceName,
        prompt: impl Into<String>,
    ) -> DelegateOptions {
        DelegateOptions {
            root: root.into(),
            caller,
            bus,
            target,
            prompt: prompt.into(),
            depth: 0,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The caller's current delegation depth (the request carries `depth + 1`).
    pub fn with_depth(self, depth: u64) -> DelegateOptions {
        DelegateOptions { depth, ..self }
    }

    /// How long to wait for the answer once the request is sent.
    pub fn with_timeout(self, timeout: Duration) -> DelegateOptions {
        DelegateOptions { timeout, ..self }
    }
}

impl fmt::Debug for DelegateOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelegateOptions")
            .field("root", &self.root)
            .field("caller", &self.caller)
            .field("bus", &self.bus)
            .field("target", &self.target)
            .field("prompt_chars", &self.prompt.chars().count())
            .field("depth", &self.depth)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A successful delegation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The reply text.
    pub text: String,
    /// The answering instance (the target's name when a legacy peer left it out).
    pub from_instance: String,
    /// How long the peer says the answer took.
    pub duration_ms: u64,
    /// What the peer's envelope said of its protocol.
    pub peer: PeerProtocol,
}

/// What a peer's envelope said of its protocol, kept so that `loopbus talk --json`
/// prints the peer's own answer, not ours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerProtocol {
    /// The peer's `protocolVersion` (`None`: a legacy peer left it out).
    pub protocol_version: Option<u64>,
    /// The peer's `capabilities` (`None`: a legacy peer left them out).
    pub capabilities: Option<Vec<String>>,
}

impl Reply {
    /// The reply as the peer's success envelope, as `loopbus talk --json` prints it:
    /// with the peer's own `protocolVersion` and `capabilities`, absent ones absent.
    pub fn to_envelope(&self) -> Envelope {
        Envelope {
            protocol_version: self.peer.protocol_version,
            capabilities: self.peer.capabilities.clone(),
            ..Envelope::success(&self.from_instance, self.text.clone(), self.duration_ms)
        }
    }
}

/// Delegates `options.prompt` to `options.target` and waits for the answer.
///
/// # Errors
///
/// A [`DelegateError`] for every row of contract section 5's table, decided in this
/// order: own bus disabled, target not among own peers, depth at own `maxDepth`, body
/// too large, registry unreadable, target not registered, health probe not matching
/// (the secret is then never sent), the target's port held by another user's process
/// (nor then), connection refused or broken, no answer within
/// `options.timeout`, an answer that is not an envelope, a failure envelope.
pub fn delegate(options: &DelegateOptions) -> Result<Reply, DelegateError> {
    let bus = &options.bus;
    let target = &options.target;
    if !bus.enabled {
        return Err(DelegateError::BusDisabled);
    }
    if !bus.peers.allows(target) {
        return Err(DelegateError::PeerNotAllowed {
            target: target.to_string(),
        });
    }
    if options.depth >= bus.max_depth {
        return Err(DelegateError::MaxDepth {
            depth: options.depth,
            max: bus.max_depth,
        });
    }
    // `depth < max_depth <= u64::MAX`, so this cannot overflow.
    let request = TalkRequest::new(
        options.caller.to_string(),
        options.prompt.clone(),
        options.depth.saturating_add(1),
    );
    let body = encode_talk_request(&request);
    if body.len() as u64 > MAX_BODY_BYTES {
        return Err(DelegateError::TooLarge { bytes: body.len() });
    }

    let entry = registry::lookup(&options.root, target)
        .map_err(|error| DelegateError::Registry {
            path: registry::registry_path(&options.root),
            error,
        })?
        .ok_or_else(|| DelegateError::NotRegistered {
            target: target.to_string(),
        })?;
    let (mut connection, listed) = connection_for_the_secret(target, &entry, &bus.accept_kinds)?;
    // The request lists the base two plus the extensions the target's health listed
    // that this build implements (contract 4.1): the original accepts no other string.
    let body = encode_talk_request_with(&request, &protocol::negotiate(&listed));
    if body.len() as u64 > MAX_BODY_BYTES {
        return Err(DelegateError::TooLarge { bytes: body.len() });
    }
    log::debug!(
        "delegating to {target} on port {} ({} prompt chars, depth {})",
        entry.port,
        options.prompt.chars().count(),
        options.depth.saturating_add(1)
    );

    // A timeout too large for the clock means "no deadline worth the name": a year.
    let deadline = Instant::now()
        .checked_add(options.timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
    if !connection.is_reusable() {
        if entry.proof {
            // The proof holds for the connection it came on only.
            return Err(DelegateError::Connection {
                target: target.to_string(),
                reason: ClientError::Closed,
            });
        }
        connection = Connection::open_at(entry.host, entry.port, deadline)
            .map_err(|e| transport_error(target, options.timeout, e))?;
    }

    // --- Same-user check (contract section 6.1) --------------------------------------
    // A peer that cannot prove itself gets the secret only when the socket at the other
    // end of the connection the secret goes out on, and the listener on its port,
    // belong to our own uid; where the tables are readable but do not list that end,
    // it gets nothing either.
    if !entry.proof {
        let (peer, local) = connection.addresses().map_err(|e| {
            log::debug!("owner of port {} unknown: {e}", entry.port);
            DelegateError::OwnerUnknown {
                target: target.to_string(),
                port: entry.port,
            }
        })?;
        registry::check_connection_owner(peer, local).map_err(|refusal| match refusal {
            OwnerRefusal::Foreign(mismatch) => DelegateError::ForeignListener {
                target: target.to_string(),
                mismatch,
            },
            OwnerRefusal::Unknown { port } => DelegateError::OwnerUnknown {
                target: target.to_string(),
                port,
            },
        })?;
    }
    // --- end of the same-user check --------------------------------------------------

    let response = connection
        .post_talk(&entry.secret, &body, deadline)
        .map_err(|e| transport_error(target, options.timeout, e))?;
    interpret(target, response)
}

/// The connection the secret may go out on: the one whose health probe of exactly the
/// entry's address matched (name, kind, and for an entry with `proof: true` a valid
/// proof of the entry's secret, contract 6.1), with the capabilities its health
/// listed. Nothing of the secret or the prompt has been sent when this fails.
///
/// # Errors
///
/// [`DelegateError::Unproven`] (not retryable) when the port's holder fails the proof;
/// [`DelegateError::ProbeFailed`] for any other probe failure.
fn connection_for_the_secret(
    target: &InstanceName,
    entry: &registry::Entry,
    accept_kinds: &[String],
) -> Result<(Connection, Vec<String>), DelegateError> {
    let probed = registry::probe_entry(target, entry, Some(accept_kinds)).map_err(|reason| {
        if reason.is_failed_proof() {
            DelegateError::Unproven {
                target: target.to_string(),
                port: entry.port,
                reason,
            }
        } else {
            DelegateError::ProbeFailed {
                target: target.to_string(),
                reason,
            }
        }
    })?;
    Ok((probed.connection, probed.answer.health.capabilities))
}

/// Maps a failed exchange to the table's row.
fn transport_error(target: &str, timeout: Duration, error: ClientError) -> DelegateError {
    let target = target.to_owned();
    match error {
        ClientError::Timeout => DelegateError::Timeout {
            target,
            after: timeout,
        },
        ClientError::Malformed(what) => DelegateError::InvalidResponse {
            target,
            reason: what.to_owned(),
        },
        reason @ (ClientError::NotLoopback(_)
        | ClientError::Connect(_)
        | ClientError::Io(_)
        | ClientError::Closed
        | ClientError::UnsendableSecret) => DelegateError::Connection { target, reason },
    }
}

/// Turns a complete answer into a reply or an error. Any status may carry a failure
/// envelope (refusals come as 4xx/5xx); a success envelope counts only with 200.
fn interpret(target: &str, response: ReceivedResponse) -> Result<Reply, DelegateError> {
    let envelope = protocol::parse_answer(response.status, &response.body).map_err(|e| {
        DelegateError::InvalidResponse {
            target: target.to_owned(),
            reason: format!("HTTP {}: {e}", response.status),
        }
    })?;
    // The probe established that `target` answers on this port.
    let from_instance = if envelope.from_instance.is_empty() {
        target.to_owned()
    } else {
        envelope.from_instance
    };
    let peer = PeerProtocol {
        protocol_version: envelope.protocol_version,
        capabilities: envelope.capabilities,
    };
    match envelope.failure {
        Some(failure) => Err(DelegateError::Remote {
            from_instance,
            failure,
            duration_ms: envelope.duration_ms,
            peer: Box::new(peer),
        }),
        None if response.status == 200 => Ok(Reply {
            text: envelope.text,
            from_instance,
            duration_ms: envelope.duration_ms,
            peer,
        }),
        None => Err(DelegateError::InvalidResponse {
            target: target.to_owned(),
            reason: format!("a success envelope with HTTP {}", response.status),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ErrorCode, Failure};
    use crate::registry::{OwnerMismatch, ProbeError};

    fn io(kind: std::io::ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, "x")
    }

    fn health(instance: &str) -> crate::protocol::Health {
        crate::protocol::Health::new("loopbus", instance, "ok", 1)
    }

    #[test]
    fn error_mapping_table() {
        let t = || "worker".to_owned();
        let remote = |code: &str, retryable| DelegateError::Remote {
            from_instance: "worker".into(),
            failure: Failure {
                error: "e".into(),
                code: ErrorCode::from_wire(code),
                retryable,
            },
            duration_ms: 1,
            peer: Box::new(PeerProtocol {
                protocol_version: Some(1),
                capabilities: None,
            }),
        };
        let cases: Vec<(DelegateError, &str, bool)> = vec![
            (DelegateError::BusDisabled, "bus_disabled", false),
            (
                DelegateError::Unproven {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::NoProof,
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::Unproven {
                    target: t(),
                    port: 7701,
                    reason: ProbeError::WrongProof,
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::PeerNotAllowed { target: t() },
                "peer_not_allowed",
                false,
            ),
            (
                DelegateError::MaxDepth { depth: 3, max: 3 },
                "max_depth_exceeded",
                false,
            ),
            (
                DelegateError::TooLarge { bytes: 300_000 },
                "request_too_large",
                false,
            ),
            (
                DelegateError::Registry {
                    path: "/r/.bus-registry.json".into(),
                    error: io(std::io::ErrorKind::PermissionDenied),
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::Registry {
                    path: "/r/.bus-registry.json".into(),
                    error: io(std::io::ErrorKind::Interrupted),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::NotRegistered { target: t() },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    reason: ProbeError::Http(ClientError::Timeout),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ProbeFailed {
                    target: t(),
                    reason: ProbeError::OtherInstance(Box::new(health("impostor"))),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::Connection {
                    target: t(),
                    reason: ClientError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::ForeignListener {
                    target: t(),
                    mismatch: OwnerMismatch {
                        port: 7701,
                        uid: 65534,
                    },
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::OwnerUnknown {
                    target: t(),
                    port: 7701,
                },
                "instance_unavailable",
                false,
            ),
            (
                DelegateError::Connection {
                    target: t(),
                    reason: ClientError::Closed,
                },
                "instance_unavailable",
                true,
            ),
            (
                DelegateError::Timeout {
                    target: t(),
                    after: Duration::from_secs(1),
                },
                "timeout",
                true,
            ),
            (
                DelegateError::InvalidResponse {
                    target: t(),
                    reason: "x".into(),
                },
                "invalid_response",
                true,
            ),
            (remote("budget_exhausted", false), "budget_exhausted", false),
            (remote("timeout", false), "timeout", false),
            (remote("rate_limited", true), "rate_limited", true),
            (remote("server_busy", true), "server_busy", true),
        ];
        for (error, code, retryable) in cases {
            assert_eq!(error.code().as_str(), code, "{error:?}");
            assert_eq!(error.retryable(), retryable, "{error:?}");
            let envelope = error.to_envelope("caller", 7);
            let failure = envelope.failure.as_ref().unwrap();
            assert_eq!(
                (failure.code.as_str(), failure.retryable),
                (code, retryable)
            );
            let from = if matches!(error, DelegateError::Remote { .. }) {
                "worker"
            } else {
                "caller"
            };
            assert_eq!(envelope.from_instance, from);
            assert_eq!(envelope.protocol_version, Some(1));
            assert!(!failure.error.is_empty());
        }
    }

    #[test]
    fn transport_errors_map_to_table_rows() {
        let cases: Vec<(ClientError, &str)> = vec![
            (ClientError::Timeout, "timeout"),
            (ClientError::Malformed("x"), "invalid_response"),
            (ClientError::Closed, "instance_unavailable"),
            (
                ClientError::Connect(io(std::io::ErrorKind::ConnectionRefused)),
                "instance_unavailable",
            ),
            (
                ClientError::Io(io(std::io::ErrorKind::ConnectionReset)),
                "instance_unavailable",
            ),
        ];
        for (error, code) in cases {
            let shown = format!("{error:?}");
            assert_eq!(
                transport_error("w", Duration::from_secs(1), error)
                    .code()
                    .as_str(),
                code,
                "{shown}"
            );
        }
    }

    #[test]
    fn answers_are_interpreted_table() {
        // (status, body, Ok(text) or Err((code, retryable)))
        type Row = (
            u16,
            &'static str,
            Result<&'static str, (&'static str, bool)>,
        );
        let cases: &[Row] = &[
            (
                200,
                r#"{"success":true,"text":"hi","fromInstance":"worker","durationMs":3,"protocolVersion":1,"capabilities":[]}"#,
                Ok("hi"),
            ),
            (200, r#"{"success":true,"text":"legacy"}"#, Ok("legacy")),
            (
                200,
                r#"{"success":false,"error":"boom"}"#,
                Err(("unknown", true)),
            ),
            (
                200,
                r#"{"success":false,"text":"","error":"Budget exhausted","errorCode":"budget_exhausted","retryable":false,"protocolVersion":1}"#,
                Err(("budget_exhausted", false)),
            ),
            (
                200,
                r#"{"success":false,"error":"x","errorCode":"rate_limited"}"#,
                Err(("rate_limited", true)),
            ),
            (
                401,
                r#"{"success":false,"text":"","error":"no","errorCode":"auth_failed","retryable":false}"#,
                Err(("auth_failed", false)),
            ),
            (
                429,
                r#"{"success":false,"error":"deep","errorCode":"max_depth_exceeded","retryable":false}"#,
                Err(("max_depth_exceeded", false)),
            ),
            (
                503,
                r#"{"success":false,"error":"busy","errorCode":"server_busy","retryable":true}"#,
                Err(("server_busy", true)),
            ),
            (200, "<html>hello</html>", Err(("invalid_response", true))),
            (200, "", Err(("invalid_response", true))),
            (
                200,
                r#"{"text":"no success field"}"#,
                Err(("invalid_response", true)),
            ),
            (502, "Bad Gateway", Err(("invalid_response", true))),
            (
                500,
                r#"{"success":true,"text":"odd"}"#,
                Err(("invalid_response", true)),
            ),
        ];
        for (status, body, want) in cases {
            let got = interpret(
                "worker",
                ReceivedResponse {
                    status: *status,
                    body: body.as_bytes().to_vec(),
                },
            );
            match (got, want) {
                (Ok(reply), Ok(text)) => {
                    assert_eq!(reply.text, *text);
                    assert_eq!(reply.from_instance, "worker");
                }
                (Err(e), Err((code, retryable))) => {
                    assert_eq!(
                        (e.code().as_str(), e.retryable()),
                        (*code, *retryable),
                        "{body}"
                    );
                }
                (got, want) => panic!("{status} {body}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn local_checks_come_first_in_table_order() {
        use crate::config::Peers;
        let name = |s: &str| InstanceName::new(s).unwrap();
        let bus = BusConfig {
            enabled: true,
            ..BusConfig::default()
        };
        // Nothing is registered here; no check below gets as far as the registry.
        let root = std::env::temp_dir().join("loopbus-no-such-root");
        let base = DelegateOptions::new(root, name("me"), bus, name("worker"), "p")
            .with_timeout(Duration::from_secs(1));
        assert_eq!((base.depth, base.prompt.as_str()), (0, "p"));
        let disabled = DelegateOptions {
            bus: BusConfig {
                enabled: false,
                peers: Peers::Only(vec![]),
                max_depth: 1,
                ..base.bus.clone()
            },
            depth: 5,
            ..base.clone()
        };
        let not_peer = DelegateOptions {
            bus: BusConfig {
                peers: Peers::Only(vec!["other".into()]),
                max_depth: 1,
                ..base.bus.clone()
            },
            depth: 5,
            ..base.clone()
        };
        let deep = DelegateOptions {
            depth: 3,
            prompt: "x".repeat(300_000),
            ..base.clone()
        };
        let big = DelegateOptions {
            prompt: "x".repeat(MAX_BODY_BYTES as usize),
            ..base.clone()
        };
        let quote_heavy = DelegateOptions {
            // Escaping doubles every quote: the serialized body is what counts.
            prompt: "\"".repeat(MAX_BODY_BYTES as usize / 2),
            ..base.clone()
        };
        let cases = [
            (disabled, "bus_disabled"),
            (not_peer, "peer_not_allowed"),
            (deep, "max_depth_exceeded"),
            (big, "request_too_large"),
            (quote_heavy, "request_too_large"),
            (base, "instance_unavailable"),
        ];
        for (options, code) in cases {
            let error = delegate(&options).unwrap_err();
            assert_eq!(error.code().as_str(), code, "{error}");
        }
    }

    #[test]
    fn debug_and_errors_never_show_the_prompt() {
        let name = |s: &str| InstanceName::new(s).unwrap();
        let options = DelegateOptions::new(
            "/r",
            name("me"),
            BusConfig::default(),
            name("w"),
            "TOP-SECRET-PROMPT",
        );
        assert_eq!(options.timeout, DEFAULT_TIMEOUT);
        let shown = format!("{options:?}");
        assert!(!shown.contains("TOP-SECRET-PROMPT"), "{shown}");
        assert!(shown.contains("prompt_chars: 17"), "{shown}");
    }

    #[test]
    fn owner_unknown_says_who_holds_the_port_cannot_be_told() {
        let e = DelegateError::OwnerUnknown {
            target: "b".into(),
            port: 7701,
        };
        assert_eq!(
            e.to_string(),
            "instance b is not available: cannot tell who holds port 7701; not sending the secret"
        );
    }
}
