//! loopbus: a local instance-to-instance bus for AI-agent instances.
//!
//! Instances (each one `loopbus serve` process driving an engine CLI) delegate prompts
//! to each other over loopback HTTP: `POST /api/talk` with a v1 envelope, and
//! `GET /api/health`. See the README for the protocol, limits and security model.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod audit;
pub mod cli;
pub mod client;
pub mod commands;
pub mod config;
pub mod engine;
pub mod http;
pub mod protocol;
pub mod registry;
pub mod secret;
pub mod server;
pub mod state;
pub mod turns;
pub mod usage;
