//! `<root>/.bus-registry.json`: who is listening where (contract section 6).
//!
//! ```json
//! {"instances": {"<name>": {"port": 1234, "pid": 42, "secret": "...", "updatedAt": "2026-01-01T00:00:00.000Z", "host": "::1", "proof": true}}}
//! ```
//!
//! (`host` is left out for 127.0.0.1; `proof: true` marks an instance that answers the
//! health proof of contract 6.1.)
//!
//! The [`store`](mod@store) reads, validates and rewrites the file (forgiving on read:
//! a missing, torn or malformed file is an empty registry and invalid entries are
//! skipped; every write a read-modify-write under the registry lock, written
//! atomically, keeping every entry and field it does not change, so concurrent
//! `serve` processes and other programs sharing the root never lose each other's
//! entries); the [`lock`](mod@lock) is the original implementation's lock directory;
//! the [`probe`](mod@probe) asks an entry's port whether that instance still answers
//! there (with the proof of contract 6.1), and lists and prunes; the
//! [`owner`](mod@owner) check tells whose socket a secret would go to (`/proc/net/tcp*`);
//! `warnings` says each problem of the file once. None of them imports `client`.

pub mod lock;
pub mod owner;
pub mod probe;
pub mod store;
mod warnings;

pub use owner::{check_owner, OwnerRefusal};
pub use probe::{
    holds_name, list, probe, probe_instance, probe_port, prune, running, HealthAnswer, Listed,
    ProbeError, PROBE_TIMEOUT,
};
pub use store::{
    channel_root, default_channel_root, default_name, deregister, ensure_registered, lookup, read,
    register_at, registry_path, RegistryEntry, DEFAULT_ROOT_DIR,
};
