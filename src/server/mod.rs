//! The bus server: [`Instance`] the composition root, the [`Bus`] that plugs into the
//! HTTP loop as its [`Service`](crate::http::Service), and the parts the architecture
//! table (docs/architecture.md) lists.
//!
//! Checks on `POST /api/talk` run in the contract's order (section 3): checks 1-6 on
//! the head alone ([`checks`]), so an unauthorized body is never read; checks 7-10 on
//! the body. [`Refusal::status_and_code`] is the one place where refusals get their
//! status code and wire error code.

mod answer;
mod bus;
mod checks;
mod error;
mod instance;
mod refusal;
mod registry_check;
mod requests;
mod startup;
mod talk;
mod turn_table;
mod upkeep;

pub use bus::Bus;
pub use error::ServeError;
pub use instance::{EngineOverride, Instance, InstanceOptions, ShutdownHandle};
pub use refusal::Refusal;
