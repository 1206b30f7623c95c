//! loopbus: a local instance-to-instance bus for AI-agent instances.
//!
//! Instances (each one `loopbus serve` process driving an engine CLI) delegate prompts
//! to each other over loopback HTTP: `POST /api/talk` with a v1 envelope, and
//! `GET /api/health`. See PROTOCOL.md for the protocol, and docs/ for the limits
//! (docs/http.md) and the security model (docs/security.md, SECURITY.md).
//!
//! This crate root is the whole public API; the `loopbus` binary uses nothing else:
//! - start an instance in-process: [`Instance`], [`InstanceOptions`], [`ServeError`],
//!   [`ShutdownHandle`], [`EngineOverride`];
//! - delegate one prompt to a registered instance: [`delegate`], [`DelegateOptions`],
//!   [`Reply`], [`DelegateError`]; cancel it: [`cancel`], [`new_request_id`],
//!   [`CancelOutcome`]; the tree of delegations it belongs to (contract 8.4):
//!   [`TraceContext`] (fresh, or from the environment an instance gives its engine,
//!   with [`TraceEnvWarning`]s), [`TraceId`];
//! - delegate in workflows (contract 9): [`fan`], [`chain`], [`verify`] with
//!   [`WorkflowOptions`], stopped by a [`StopHandle`], watched by an [`Observer`],
//!   returning an [`Outcome`] of [`Stage`]s;
//! - the configuration an instance and a caller read: [`Config`], [`BusConfig`],
//!   [`Peers`], [`EngineConfig`], [`Preset`], [`load_config`], [`parse_config`],
//!   [`ConfigError`]; the checks `serve` makes of an engine before its first turn:
//!   [`engine_findings`]; one turn of an instance's engine, run directly:
//!   [`run_engine_once`];
//! - a channel root's registry: where it is ([`channel_root`], [`registry_path`]), its
//!   entries ([`read_registry`], [`RegistryEntry`]), and whether they answer
//!   ([`list_instances`], [`probe_instance`], [`probe_port`], [`running_instance`],
//!   [`Listed`], [`HealthAnswer`], [`ProbeError`], [`OwnerRefusal`]);
//! - an instance's records: its usage ([`read_usage`], [`Usage`], [`UsageFileError`]) and
//!   its audit log ([`AUDIT_FILE`], one JSON object a line), read back in bounded memory
//!   ([`read_audit_log`] of [`AuditRecord`]s, or line by line with [`AuditLines`]);
//! - the file rules every state file follows: [`check_trusted`] (and [`Untrusted`]),
//!   [`write_atomic`], [`create_dir_private`], [`open_regular_file`];
//! - the wire protocol's types: [`TalkRequest`], [`Envelope`], [`Failure`],
//!   [`ErrorCode`], [`InstanceName`], [`Health`], their parsers and errors; and the
//!   timestamps the state files carry ([`now_iso8601`], [`parse_iso8601`]);
//! - the one escaping rule for outside text shown on a terminal or in a log:
//!   [`escape_for_terminal`].
//!
//! With the `fuzzing` feature (off by default), `loopbus::fuzzing` exposes the parsers
//! the fuzz targets drive; it is not part of the API.
//!
//! ```
//! use loopbus::{parse_talk_request, Envelope, ErrorCode, Failure};
//!
//! let request = parse_talk_request(br#"{"fromInstance":"reviewer","prompt":"hi","depth":1}"#)
//!     .expect("a valid legacy request");
//! assert_eq!(request.depth, 1);
//!
//! let busy = Envelope::failure("worker", Failure::new(ErrorCode::ServerBusy, "try later"), 3);
//! let json: serde_json::Value = serde_json::from_slice(&busy.to_json()).unwrap();
//! assert_eq!(json["errorCode"], "server_busy");
//! assert_eq!(json["retryable"], true);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod audit;
mod client;
mod config;
mod engine;
mod files;
mod http;
mod protocol;
mod registry;
mod secret;
mod server;
mod text;
mod time;
mod turns;
mod usage;
mod workflow;

// Running an instance.
pub use server::{EngineOverride, Instance, InstanceOptions, ServeError, ShutdownHandle};

// Delegating to one.
pub use client::{
    cancel, delegate, new_request_id, CancelOutcome, DelegateError, DelegateOptions, PeerProtocol,
    Reply, TraceContext, TraceEnvWarning, CANCEL_TIMEOUT, DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP, DEFAULT_TIMEOUT,
};
pub use http::client::ClientError;

// Workflows of delegations.
pub use workflow::{
    chain, fan, verify, Conclusion, Event, Observer, Outcome, Stage, StopHandle, Verdict,
    WorkflowError, WorkflowOptions, FAN_THREADS, MAX_TARGETS,
};

// Configuration.
pub use config::{
    load as load_config, parse as parse_config, parse_file as parse_config_file,
    read_file as read_config_file, BusConfig, Config, ConfigError, EngineConfig, OutputMode, Peers,
    Preset, PromptMode, CONFIG_FILE, DEFAULT_ACCEPT_KINDS, DEFAULT_MAX_DEPTH,
};
pub use engine::{
    findings as engine_findings, run_once as run_engine_once, Findings as EngineFindings,
};
pub use secret::{Secret, Weakness, MIN_SECRET_CHARS, SAMPLE_SECRETS, SECRET_BYTES};

// The registry of a channel root.
pub use registry::{
    channel_root, default_channel_root, default_name, list as list_instances, probe_instance,
    probe_port, read as read_registry, registry_path, running as running_instance, HealthAnswer,
    Listed, OwnerRefusal, ProbeError, RegistryEntry, DEFAULT_ROOT_DIR, PROBE_TIMEOUT,
};

// An instance's records, and the file rules of every state file.
pub use audit::{
    read_audit_log, AuditLine, AuditLines, AuditMetadata, AuditRecord, AUDIT_FILE,
    MAX_AUDIT_LINE_BYTES, ROTATED_AUDIT_FILE,
};
pub use files::{
    check_trusted, create_dir_private, mode_is_wider, open_regular as open_regular_file, untrusted,
    write_atomic, TrustKind, Untrusted, PRIVATE_FILE_MODE,
};
pub use time::{now_iso8601, parse_iso8601};
pub use usage::{peek as read_usage, round_cost, Usage, UsageFileError};

// The wire protocol.
pub use protocol::{
    encode_talk_request, parse_response, parse_talk_request, parse_traceparent, Envelope,
    ErrorCode, ExtError, Failure, Health, InstanceName, InvalidInstanceName, InvalidRequestId,
    InvalidTraceId, RequestError, RequestExt, RequestId, ResponseError, TalkRequest, TraceId,
    TurnLoad, UsageReport, CAPABILITIES, MAX_BODY_BYTES, MAX_FROM_INSTANCE_BYTES,
    MAX_INSTANCE_NAME_LEN, MAX_REQUEST_ID_LEN, MIN_REQUEST_ID_LEN, PROTOCOL_VERSION,
    REQUEST_ID_VAR, TRACEPARENT_VAR, TRACE_ID_LEN, TRACE_ID_VAR,
};

// Outside text on a terminal or in a log.
pub use text::escape_for_terminal;

/// The parsers the fuzz targets drive, and the replay of a byte stream through one
/// server connection that the differential fuzz target compares whole and split. Only
/// with the `fuzzing` feature; not part of the API.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use crate::http::client::parse_response_head;
    pub use crate::http::replay::{
        replay, Answers, Pending, Replayed, MAX_EXPIRIES, MAX_REPLAY_BODY,
    };
    pub use crate::http::{parse_request_head, MAX_HEADERS, MAX_HEAD_BYTES};
    pub use crate::protocol::parse_health;
    pub use crate::registry::store::{
        parse as parse_registry, Parsed as ParsedRegistry, RegistryEntry,
    };
}

/// The Rust examples of docs/embedding.md, compiled (and run) as doctests so that they
/// stay true.
#[doc = include_str!("../docs/embedding.md")]
#[cfg(doctest)]
pub struct EmbeddingDoctests;
