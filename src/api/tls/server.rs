//! The server's TLS, reloaded while serving. Certificates are short-lived (cert-manager
//! renews them at two thirds of their life) and a Kubernetes Secret volume replaces its files
//! in place, so the files are read again every `tls_reload_seconds`: changed files that form a
//! usable configuration serve every new connection from then on, while open connections keep
//! the certificate they started with. Changed files that do not (a key that does not fit its
//! certificate, a half-written file) leave the previous configuration in place, with a
//! warning that names the setting and file, never their content.

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::{Pem, ServerTlsFiles, TlsError, provider};

/// ALPN protocol of gRPC; tonic's clients insist on it.
const ALPN_H2: &[u8] = b"h2";
/// Default time between reads of the files.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// The server's TLS configuration, built from [`ServerTlsFiles`] and rebuilt when they change.
/// Clones share one current configuration.
#[derive(Clone)]
pub struct ServerTls {
    files: ServerTlsFiles,
    current: Arc<RwLock<Loaded>>,
    reload_interval: Duration,
    /// The protocols offered by ALPN instead of the loaded configuration's (gRPC's `h2`).
    alpn: Option<Vec<Vec<u8>>>,
}

/// One configuration and the digest of the file contents it was built from.
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    digest: [u8; 32],
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .field("reload_interval", &self.reload_interval)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads and checks the files.
    ///
    /// Errors: a file that cannot be read, holds no certificate or key, or a key that does
    /// not fit the certificate; the message names the setting.
    pub fn load(files: &ServerTlsFiles) -> Result<Self, TlsError> {
        let (digest, contents) = read(files)?;
        Ok(Self {
            current: Arc::new(RwLock::new(Loaded {
                config: Arc::new(build(files, &contents)?),
                digest,
            })),
            files: files.clone(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            alpn: None,
        })
    }

    /// The same certificates and client-certificate rule, shared with this configuration
    /// and reloaded with it, offering `protocols` by ALPN instead (the review console offers
    /// HTTP/2 and HTTP/1.1).
    pub fn with_alpn(&self, protocols: &[&[u8]]) -> Self {
        Self {
            alpn: Some(protocols.iter().map(|p| p.to_vec()).collect()),
            ..self.clone()
        }
    }

    /// The same, with the files read every `interval` while serving.
    pub fn reload_every(mut self, interval: Duration) -> Self {
        self.reload_interval = interval;
        self
    }

    /// Whether client certificates are required (mutual TLS).
    pub fn is_mutual(&self) -> bool {
        self.files.client_ca_file.is_some()
    }

    /// The configuration for the next connection.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        let config = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .config
            .clone();
        match &self.alpn {
            None => config,
            Some(protocols) => {
                let mut config = (*config).clone();
                config.alpn_protocols = protocols.clone();
                Arc::new(config)
            }
        }
    }

    /// Reads the files again and, if they changed, serves new connections from them.
    /// Returns whether they changed.
    ///
    /// Errors: as [`ServerTls::load`]; the current configuration stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (digest, contents) = read(&self.files)?;
        if self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .digest
            == digest
        {
            return Ok(false);
        }
        let config = Arc::new(build(&self.files, &contents)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Loaded { config, digest };
        Ok(true)
    }

    /// Reloads every reload interval until `shutdown`, logging each change and each unusable
    /// set of files (once until it changes).
    pub async fn watch(self, shutdown: CancellationToken) {
        let mut last_error = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.reload_interval) => {}
            }
            // A Secret volume swaps all its files at once, but a read may straddle the swap
            // (a new certificate with the old key): read again before keeping the old ones.
            match self.reload().or_else(|_| self.reload()) {
                Ok(changed) => {
                    if changed {
                        tracing::info!(
                            cert_file = %self.files.cert_file.display(),
                            "TLS: changed certificate files loaded; new connections use them"
                        );
                    }
                    last_error = None;
                }
                Err(error) => {
                    let message = error.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(
                            error = %message,
                            "TLS: the certificate files cannot be used; still serving the \
                             previous certificate"
                        );
                        last_error = Some(message);
                    }
                }
            }
        }
    }
}

/// What the files held when they were read.
struct Contents {
    cert: Pem,
    key: Pem,
    client_ca: Option<Pem>,
}

/// The files' contents and a digest of them all.
fn read(files: &ServerTlsFiles) -> Result<([u8; 32], Contents), TlsError> {
    let contents = Contents {
        cert: Pem::read("tls_cert_file", &files.cert_file)?,
        key: Pem::read("tls_key_file", &files.key_file)?,
        client_ca: match &files.client_ca_file {
            Some(path) => Some(Pem::read("tls_client_ca_file", path)?),
            None => None,
        },
    };
    let mut hasher = Sha256::new();
    for pem in [
        Some(&contents.cert),
        Some(&contents.key),
        contents.client_ca.as_ref(),
    ] {
        let bytes = pem.map_or(&[][..], |pem| &pem.bytes[..]);
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }
    Ok((hasher.finalize().into(), contents))
}

/// A rustls server configuration from the files' contents.
fn build(files: &ServerTlsFiles, contents: &Contents) -> Result<rustls::ServerConfig, TlsError> {
    let certs = contents
        .cert
        .certificates("tls_cert_file", &files.cert_file)?;
    let key = contents.key.private_key("tls_key_file", &files.key_file)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("tls_cert_file", &files.cert_file, e))?;
    let builder = match (&contents.client_ca, &files.client_ca_file) {
        (Some(ca), Some(path)) => builder.with_client_cert_verifier(client_verifier(ca, path)?),
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError::new(
            "tls_key_file",
            &files.key_file,
            format!("does not fit the certificate: {e}"),
        )
    })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// Requires a client certificate that chains to one of the CAs in `ca`.
fn client_verifier(
    ca: &Pem,
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    const SETTING: &str = "tls_client_ca_file";
    let mut roots = RootCertStore::empty();
    for cert in ca.certificates(SETTING, path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::new(SETTING, path, format!("not a usable CA: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::new(SETTING, path, e))
}
