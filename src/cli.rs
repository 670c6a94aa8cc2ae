//! Command-line flags shared by the binaries; each flag overrides the file and environment.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

use crate::config::LogFormat;

/// Flags common to the server and the reconcile worker.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct CommonFlags {
    /// Configuration file (TOML); settings are documented in docs/configuration.md.
    #[arg(long, env = "OPJOURNAL_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Database URL: postgres://… for Postgres, sqlite://PATH for an embedded journal file
    /// (default: sqlite://opjournal-data/journal.db).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    /// Action policy file (YAML).
    #[arg(long = "policy")]
    #[serde(rename = "policy_file", skip_serializing_if = "Option::is_none")]
    pub policy_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// Flags of `opjournal serve`.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct ServeFlags {
    /// Common flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonFlags,
    /// gRPC listen address (default: 127.0.0.1:50051).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Admin HTTP address serving Prometheus metrics at /metrics (default: 127.0.0.1:9464).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// A second, plaintext address serving only gRPC health, for probes that cannot speak
    /// TLS (default: none, health is served on the gRPC address only).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_listen: Option<SocketAddr>,
    /// Address of the review console, an HTTP(S) port of its own (default: off).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console_listen: Option<SocketAddr>,
    /// Without authentication (no tokens, no client certificates), let the server listen
    /// where other hosts can reach it (the gRPC address, the review console's): only behind
    /// something that authenticates callers for it, such as a service mesh's authorization
    /// policy.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub insecure_allow_unauthenticated: bool,
    /// Create the database if missing and apply migrations before serving (Postgres; the
    /// embedded SQLite journal is always prepared at start).
    #[arg(long)]
    #[serde(
        rename = "migrate_on_start",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub migrate: bool,
}
