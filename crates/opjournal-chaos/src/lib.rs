//! The opjournal fault-injection suite (`opjournal-chaos`, run by `scripts/chaos`).
//!
//! It starts its own Postgres cluster on a free port, two server replicas, two reconcile
//! workers and the sandbox provider; drives intents through the Rust client's `execute` while
//! the provider, the network and the processes fail in every way the journal claims to
//! survive; then checks, key by key, the journal against the provider's effects. See
//! `docs/reliability.md`.

pub mod agent;
pub mod chaos;
pub mod check;
pub mod netproxy;
pub mod plan;
pub mod postgres;
pub mod process;
pub mod relay;
pub mod report;
pub mod reviewer;
pub mod run;
pub mod stand;
