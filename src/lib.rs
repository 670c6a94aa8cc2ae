//! opjournal: an operation journal that makes side-effecting tool calls safe to retry.
//!
//! The crate is layered: [`domain`] holds the state machine, request hashing, leases and
//! policy and knows nothing of gRPC or SQL; [`store`] persists the journal behind the
//! [`store::JournalStore`] trait; [`journal`] holds the use cases; [`reconcile`] asks
//! providers what really happened through provider adapters; [`api`] exposes it all over
//! gRPC; [`ops`] holds the operator commands, gRPC clients of that API. [`sandbox`] is a
//! fake HTTP provider for tests, demos and local stands. [`telemetry`] holds traces, metrics
//! and logs. [`children`] starts the binaries as child processes (demo, benchmark).

pub mod api;
pub mod app;
pub mod children;
pub mod cli;
/// The Rust client, the `opjournal-client` crate, under its former path.
pub use opjournal_client as client;
pub mod config;
pub mod domain;
pub mod journal;
pub mod ops;
pub mod proto;
pub mod reconcile;
pub mod sandbox;
pub mod store;
pub mod telemetry;
