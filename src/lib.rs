//! opjournal: an operation journal that makes side-effecting tool calls safe to retry.
//!
//! # Layers
//!
//! Each module may use its own layer and the layers below it, never one above (lowest first;
//! `tests/it/layers.rs` checks every `crate::` path against this line):
//!
//! ```text
//! proto < domain < telemetry < store < journal < reconcile < api < config < app < cli, ops, children
//! ```
//!
//! [`proto`] is the generated protocol code. [`domain`] holds the state machine
//! (`domain::transition`), request hashing, leases and policy, and knows nothing of gRPC or
//! SQL. [`telemetry`] holds traces, metrics and logs, and knows only the domain. [`store`]
//! persists the journal behind [`store::JournalStore`], one SQL implementation for Postgres
//! and SQLite. [`journal`] holds the use cases; [`reconcile`] asks providers what really
//! happened; [`api`] exposes both over gRPC. [`config`] reads the settings; [`app`] wires the
//! components. Above them stand the products: [`cli`] and [`ops`] (the operator commands,
//! gRPC clients of the API) and [`children`] (the binaries as child processes). The
//! sandbox provider and the benchmark are crates of their own (`crates/`). The binaries (`src/bin/`)
//! stand above every layer. See docs/architecture.md.

pub mod api;
pub mod app;
pub mod children;
pub mod cli;
/// The Rust client, the `opjournal-client` crate, under its former path.
pub use opjournal_client as client;
pub mod config;
/// The journal's rules, the `opjournal-domain` crate (no transport, no storage).
pub use opjournal_domain as domain;
pub mod journal;
pub mod ops;
pub mod proto;
pub mod reconcile;
pub mod store;
pub mod telemetry;
