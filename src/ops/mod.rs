//! The operator commands (`opjournal list|show|review|reconcile|resolve`): gRPC clients of a
//! running server, for people (aligned text) and for scripts (`--json`, one document on
//! stdout).
//!
//! They read and settle operations only through the public API, so they see exactly what an
//! orchestrator would and every rule (compare-and-set on the attempt a reviewer saw, terminal
//! states never change) is enforced by the server, not here. Nothing printed can carry a
//! payload (the journal keeps only its hash) or a lease token (no read returns one).

pub mod client;
pub mod format;
pub mod rows;

pub use client::{ListFilter, OpsClient};
