//! The integration tests, one test binary: each module is one area, run against the real
//! server (over a fresh Postgres database or embedded SQLite journal), the built binaries, and
//! where an area needs them the client toolchains (Python, Node, Go) and headless Chromium.
//!
//! One binary links the crate once instead of once per area. `cargo test --test it <module>`
//! (or `./scripts/test <module>`) runs one area: test names start with their module's.
//! `tests/result_sanitizing.rs` is a binary of its own: it captures the whole process's logs.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

mod access_control;
mod begin_attempt;
mod binaries;
mod client_scenarios;
mod console_browser;
mod console_http;
// `opjournal dev` and `opjournal demo` exist with the feature `dev` (the default).
#[cfg(feature = "dev")]
mod demo;
#[cfg(feature = "dev")]
mod dev_mode;
mod embedded_journal;
mod go_client;
mod group_commit;
mod journal_rules;
mod key_protection;
mod layers;
mod lookup_safety;
mod mesh_contract;
mod monitoring;
mod operator_cli;
mod policy_and_retention;
mod python_adapter;
mod python_agents;
mod python_client;
mod reconcile_worker;
mod request_hash;
mod request_limits;
mod rust_client;
mod server;
mod seven_step_check;
mod store_conformance;
mod store_outage;
mod telemetry_metrics;
mod telemetry_traces;
mod tls;
mod transport_limits;
mod typescript_client;
mod webhooks;
