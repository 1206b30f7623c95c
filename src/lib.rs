//! loopbus: a local instance-to-instance bus for AI-agent instances.
//!
//! Instances (each one `loopbus serve` process driving an engine CLI) delegate prompts
//! to each other over loopback HTTP: `POST /api/talk` with a v1 envelope, and
//! `GET /api/health`. See the README for the protocol, limits and security model.
//!
//! The embedder's API is re-exported at the crate root: the protocol's types
//! ([`TalkRequest`], [`Envelope`], [`ErrorCode`]), one delegation as a library call
//! ([`delegate`]), and the configuration and registry types it needs. The modules
//! stay public for embedders who build their own server on [`http::EventLoop`];
//! `cli` and `commands` exist for the `loopbus` binary and are hidden from the docs.
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

pub mod audit;
#[doc(hidden)]
pub mod cli;
pub mod client;
#[doc(hidden)]
pub mod commands;
pub mod config;
pub mod engine;
pub mod files;
pub mod http;
pub mod protocol;
pub mod registry;
pub mod secret;
pub mod server;
pub mod time;
pub mod turns;
pub mod usage;

pub use client::{delegate, DelegateError, DelegateOptions, Reply};
pub use config::{BusConfig, Config, Peers};
pub use protocol::{
    parse_response, parse_talk_request, Envelope, ErrorCode, Failure, TalkRequest, CAPABILITIES,
    MAX_BODY_BYTES, PROTOCOL_VERSION,
};
pub use secret::Secret;
