//! The bus server, in the order a reader meets it: [`Instance`] (the composition root:
//! lock, name, bind, register, run, deregister), the [`Bus`] that plugs into the HTTP
//! loop as its [`Service`](crate::http::Service) (routing and the check order), the
//! pure head checks, the turn table (every turn's state, its waiters and the stored
//! answers, pure; its states drawn at its top), the answers (envelopes, health, audit
//! lines), the upkeep between requests (config reload, deadlines, shutdown), the
//! registration with its self-check on its own thread, and the one table of refusals.
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

pub use bus::{Bus, ServerSettings};
pub use error::ServeError;
pub use instance::{EngineOverride, Instance, InstanceOptions, ShutdownHandle};
pub use refusal::Refusal;
