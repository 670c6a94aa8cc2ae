//! `[tls]`: the server's certificate and key, and the CAs of client certificates.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, duration};

/// `[tls]` settings, PEM files; `cert_file` with `key_file` turns TLS on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TlsSettings {
    /// The server's certificate chain, PEM.
    pub cert_file: Option<PathBuf>,
    /// The server's private key, PEM.
    pub key_file: Option<PathBuf>,
    /// CAs for client certificates, PEM; set, it requires mutual TLS.
    pub client_ca_file: Option<PathBuf>,
    /// Time between reads of the files: changed files (a renewed certificate) are used for
    /// new connections without a restart.
    #[serde(with = "duration")]
    pub reload_interval: Duration,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            reload_interval: Duration::from_secs(60),
        }
    }
}

impl TlsSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        super::positive("tls.reload_interval", self.reload_interval)?;
        match (&self.cert_file, &self.key_file) {
            (Some(_), Some(_)) => Ok(()),
            (None, None) if self.client_ca_file.is_some() => Err(ConfigError(
                "tls.client_ca_file: needs tls.cert_file and tls.key_file (mutual TLS is TLS)"
                    .into(),
            )),
            (None, None) => Ok(()),
            (Some(_), None) => Err(ConfigError(
                "tls.key_file: must be set with tls.cert_file".into(),
            )),
            (None, Some(_)) => Err(ConfigError(
                "tls.cert_file: must be set with tls.key_file".into(),
            )),
        }
    }
}
