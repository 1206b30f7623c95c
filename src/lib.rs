//! loopbus: a local instance-to-instance bus for AI-agent instances.
//!
//! Instances (each one `loopbus serve` process driving an engine CLI) delegate prompts
//! to each other over loopback HTTP: `POST /api/talk` with a v1 envelope, and
//! `GET /api/health`. See the README for the protocol, limits and security model.
//!
//! This crate root is the whole public API:
//! - start an instance in-process: [`Instance`], [`InstanceOptions`], [`ServeError`],
//!   [`ShutdownHandle`], [`EngineOverride`];
//! - delegate one prompt to a registered instance: [`delegate`], [`DelegateOptions`],
//!   [`Reply`], [`DelegateError`]; cancel it: [`cancel`], [`new_request_id`],
//!   [`CancelOutcome`];
//! - the configuration an instance and a caller read: [`Config`], [`BusConfig`],
//!   [`Peers`], [`EngineConfig`], [`load_config`], [`parse_config`], [`ConfigError`];
//! - the wire protocol's types: [`TalkRequest`], [`Envelope`], [`Failure`],
//!   [`ErrorCode`], [`InstanceName`], their parsers and errors.
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
mod cli;
mod client;
mod commands;
mod config;
mod engine;
mod files;
mod http;
mod protocol;
mod registry;
mod secret;
mod server;
mod time;
mod turns;
mod usage;

pub use client::{
    cancel, delegate, new_request_id, CancelOutcome, DelegateError, DelegateOptions, PeerProtocol,
    Reply, CANCEL_TIMEOUT, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_TIMEOUT,
};
pub use config::{
    load as load_config, parse as parse_config, BusConfig, Config, ConfigError, EngineConfig,
    OutputMode, Peers, PromptMode,
};
pub use http::client::ClientError;
pub use protocol::{
    encode_talk_request, parse_response, parse_talk_request, Envelope, ErrorCode, ExtError,
    Failure, InstanceName, InvalidInstanceName, InvalidRequestId, RequestError, RequestExt,
    RequestId, ResponseError, TalkRequest, UsageReport, CAPABILITIES, MAX_BODY_BYTES,
    MAX_FROM_INSTANCE_BYTES, MAX_INSTANCE_NAME_LEN, MAX_REQUEST_ID_LEN, MIN_REQUEST_ID_LEN,
    PROTOCOL_VERSION,
};
pub use registry::owner::{OwnerMismatch, OwnerRefusal};
pub use registry::ProbeError;
pub use secret::{Secret, Weakness, MIN_SECRET_CHARS, SAMPLE_SECRETS, SECRET_BYTES};
pub use server::{EngineOverride, Instance, InstanceOptions, ServeError, ShutdownHandle};

/// The `loopbus` binary's entry; not part of the API.
#[doc(hidden)]
pub mod __cli {
    pub use crate::cli::{CommandError, EXIT_FAILURE, EXIT_USAGE};
    pub use crate::commands::entry::{report, run};
}

/// The parsers the fuzz targets and the benchmark drive, and the replay of a byte
/// stream through one server connection that the differential fuzz target compares
/// whole and split (`http::replay`); not part of the API.
#[doc(hidden)]
pub mod __internals {
    pub use crate::http::client::parse_response_head;
    pub use crate::http::replay::{
        replay, Answers, Pending, Replayed, MAX_EXPIRIES, MAX_REPLAY_BODY,
    };
    pub use crate::http::{parse_request_head, MAX_HEADERS, MAX_HEAD_BYTES};
    pub use crate::protocol::parse_health;
    pub use crate::registry::store::{
        parse as parse_registry, Entry as RegistryEntry, Parsed as ParsedRegistry,
    };
    pub use crate::time::now_iso8601;
}

/// The README's Rust examples, compiled as doctests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
