//! `[server]`: where the gRPC server listens, its probes, its drain, the action policy and
//! the key-derivation secret.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret, duration};
use crate::domain::derived_key::MIN_SECRET_BYTES;

/// `[server]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerSettings {
    /// gRPC listen address (`OPJOURNAL_SERVER__LISTEN`, `--listen`).
    pub listen: SocketAddr,
    /// A second, plaintext address serving only gRPC health, for probes that cannot speak
    /// TLS (Kubernetes' native `grpc` probes); unset, health is served on `listen` only.
    pub health_listen: Option<SocketAddr>,
    /// The admin HTTP address serving Prometheus metrics at `/metrics`; not served when
    /// `OTEL_METRICS_EXPORTER` leaves out `prometheus`.
    pub metrics_listen: SocketAddr,
    /// Time between readiness checks of the database (the reconcile worker's too).
    #[serde(with = "duration")]
    pub readiness_interval: Duration,
    /// Time between NOT_SERVING and closing the listener on SIGTERM.
    #[serde(with = "duration")]
    pub drain_delay: Duration,
    /// Action policy file, YAML (`--policy`); without one every action type is allowed and
    /// timeouts are reconciled before retry. Read by the reconcile worker too.
    pub policy_file: Option<PathBuf>,
    /// Server secret of `DeriveOperationKey`, at least 32 bytes
    /// (`OPJOURNAL_SERVER__KEY_DERIVATION_SECRET`); never logged or printed. Without it that
    /// RPC answers `FAILED_PRECONDITION`/`KEY_DERIVATION_DISABLED`. Every server of one
    /// deployment needs the same value, and changing it changes every derived key.
    pub key_derivation_secret: Option<Secret>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            health_listen: None,
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            readiness_interval: Duration::from_secs(2),
            drain_delay: Duration::ZERO,
            policy_file: None,
            key_derivation_secret: None,
        }
    }
}

impl ServerSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        super::positive("server.readiness_interval", self.readiness_interval)?;
        if let Some(secret) = &self.key_derivation_secret
            && secret.expose().len() < MIN_SECRET_BYTES
        {
            return Err(ConfigError(format!(
                "server.key_derivation_secret: must be at least {MIN_SECRET_BYTES} bytes long"
            )));
        }
        Ok(())
    }
}
