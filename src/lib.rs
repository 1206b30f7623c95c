//! loopbus: a local instance-to-instance bus for AI-agent instances.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
pub mod http;
pub mod protocol;
pub mod registry;
pub mod secret;
pub mod turns;
pub mod state;
