//! The HTTP/1.1 layer, for both directions: the server's single-threaded `mio` event
//! loop and the small blocking client, on one set of header rules.
//!
//! It knows nothing about the bus. The server side hands a [`Service`] each complete
//! request head, asks it whether to read the body, hands it the body, and writes
//! whatever [`Response`] comes back, now or later (a deferred answer arrives through
//! [`Control::respond`] after a [`mio::Waker`] woke the loop). Every socket is
//! non-blocking; no callback may block. Memory per connection is bounded by
//! [`MAX_HEAD_BYTES`] plus the body length the service agreed to read, bodies and
//! answers in flight by budgets shared by all connections, and the number of
//! connections by a cap (`MAX_CONNECTIONS`, lower under a low open-files limit) of
//! which [`HEALTH_RESERVE`] are kept from authorized work. When the cap is reached, a
//! connection is evicted by class (`conn::Class`): never one holding authorized work.
//!
//! The parts are listed in the architecture table (docs/architecture.md); `replay` is compiled only
//! with the `fuzzing` feature.

pub mod client;
mod conn;
mod drive;
mod event_loop;
mod headers;
mod listener;
mod message;
#[cfg(feature = "fuzzing")]
pub mod replay;
mod service;

pub use event_loop::EventLoop;
pub use headers::{LengthError, HEALTH_PATH, NONCE_HEADER, TALK_PATH};
#[cfg(feature = "fuzzing")]
pub use headers::{MAX_HEADERS, MAX_HEAD_BYTES};
pub use listener::{bind_loopback, connection_cap, max_authorized, HEALTH_RESERVE};
pub use message::{Head, HttpError, Response};
#[cfg(feature = "fuzzing")]
pub use replay::parse_request_head;
pub use service::{ConnId, Control, HeadAction, Service};
