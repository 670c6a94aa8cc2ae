//! TLS and mutual TLS from PEM certificate files, for the server and for gRPC clients
//! (rustls with ring). Files are read and checked at start, so that a missing file, a file
//! without a certificate, or a key that does not belong to the certificate stops the process
//! with a message naming the setting, not the first connection. The server reads its files
//! again while serving and takes up renewed certificates without a restart ([`ServerTls`]).

mod incoming;
mod server;

pub use incoming::{HANDSHAKE_TIMEOUT, incoming, incoming_from};
pub use server::{DEFAULT_RELOAD_INTERVAL, ServerTls};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The server's certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The server's certificate chain, PEM (`tls_cert_file`).
    pub cert_file: PathBuf,
    /// The server's private key, PEM (`tls_key_file`).
    pub key_file: PathBuf,
    /// The CAs client certificates must chain to, PEM (`tls_client_ca_file`); set, it turns
    /// on mutual TLS: a client without a valid certificate cannot connect.
    pub client_ca_file: Option<PathBuf>,
}

/// A certificate file that cannot be used; the message names the setting and the file,
/// never the file's content.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {path}: {problem}")]
pub struct TlsError {
    setting: &'static str,
    path: String,
    problem: String,
}

impl TlsError {
    fn new(setting: &'static str, path: &Path, problem: impl ToString) -> Self {
        Self {
            setting,
            path: path.display().to_string(),
            problem: problem.to_string(),
        }
    }
}

/// A PEM file read whole, with its certificates or key checked.
struct Pem {
    bytes: Vec<u8>,
}

impl Pem {
    fn read(setting: &'static str, path: &Path) -> Result<Self, TlsError> {
        std::fs::read(path)
            .map(|bytes| Self { bytes })
            .map_err(|e| TlsError::new(setting, path, e))
    }

    fn certificates(
        &self,
        setting: &'static str,
        path: &Path,
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::new(setting, path, format!("not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(TlsError::new(setting, path, "holds no CERTIFICATE block"));
        }
        Ok(certs)
    }

    fn private_key(
        &self,
        setting: &'static str,
        path: &Path,
    ) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.bytes)
            .map_err(|_| TlsError::new(setting, path, "holds no PEM private key"))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Checks that `key` belongs to the first certificate of `certs`.
fn check_pair(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    key_file: &Path,
    key_setting: &'static str,
) -> Result<(), TlsError> {
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new(key_setting, key_file, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map(|_| ())
        .map_err(|e| {
            TlsError::new(
                key_setting,
                key_file,
                format!("does not fit the certificate: {e}"),
            )
        })
}

fn roots(setting: &'static str, path: &Path, pem: &Pem) -> Result<(), TlsError> {
    let mut store = RootCertStore::empty();
    for cert in pem.certificates(setting, path)? {
        store
            .add(cert)
            .map_err(|e| TlsError::new(setting, path, format!("not a usable CA: {e}")))?;
    }
    Ok(())
}

/// The server's TLS configuration: its identity and, with a client CA, mutual TLS with a
/// client certificate required; read again every [`DEFAULT_RELOAD_INTERVAL`] while serving
/// (see [`ServerTls::reload_every`]).
///
/// Errors: a file that cannot be read, holds no certificate or key, or a key that does not
/// fit the certificate.
pub fn server_config(files: &ServerTlsFiles) -> Result<ServerTls, TlsError> {
    ServerTls::load(files)
}

/// A client's TLS configuration: trust `ca_file` (or, without one, the system's roots) and,
/// with `identity` (certificate and key files), present a client certificate for mutual TLS.
/// Settings are named as the operator CLI's flags.
///
/// Errors: as [`server_config`].
pub fn client_config(
    ca_file: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsError> {
    let mut config = ClientTlsConfig::new();
    config = match ca_file {
        Some(path) => {
            let ca = Pem::read("--ca-file", path)?;
            roots("--ca-file", path, &ca)?;
            config.ca_certificate(Certificate::from_pem(ca.bytes))
        }
        None => config.with_native_roots(),
    };
    if let Some((cert_file, key_file)) = identity {
        let cert = Pem::read("--cert-file", cert_file)?;
        let key = Pem::read("--key-file", key_file)?;
        check_pair(
            cert.certificates("--cert-file", cert_file)?,
            key.private_key("--key-file", key_file)?,
            key_file,
            "--key-file",
        )?;
        config = config.identity(Identity::from_pem(cert.bytes, key.bytes));
    }
    Ok(config)
}
