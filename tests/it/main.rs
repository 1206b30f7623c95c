//! The one integration test binary. Every former `tests/NAME.rs` is a module here
//! (`tests/it/NAME.rs`), so cargo links one binary and libtest runs all integration
//! tests side by side instead of one binary after another.
//!
//! A new integration test goes here as a module (`tests/it/NAME.rs` and a `mod NAME;`
//! line below), never as a new `tests/*.rs` file (each would be another binary, linked
//! and run on its own). Tests run concurrently with every other module's: keep all state
//! per test (a `TestRoot` temp dir, port 0, environment passed to the child process with
//! `Command::env`, never `std::env::set_var` or `set_current_dir` on the test process).
//! Shared helpers live in `tests/common` and `tests/client_support`.

#[path = "../client_support/mod.rs"]
mod client_support;
#[path = "../common/mod.rs"]
mod common;

mod chain_cancel;
mod check_table;
mod client_examples;
mod client_lifetime;
mod client_talk;
mod config_reload;
mod config_strict;
mod connection_classes;
mod containment;
mod discovery;
mod docs_links;
mod embedding;
mod engine_mistakes;
mod engine_presets;
mod engine_turns;
mod first_hour;
mod foreign_files;
mod layering;
mod lifetime;
mod mcp;
mod never_blocks;
mod newcomer_commands;
mod newcomer_defaults;
mod original_peer;
mod peer_safety;
mod public_api;
mod registry_lifecycle;
mod robustness;
mod secret_proof;
mod security_guide;
mod shared_registry;
mod smoke;
mod talk_output;
mod trace_tree;
mod troubleshooting;
mod walkthrough;
mod workflows;
