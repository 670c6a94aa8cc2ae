//! How the operator commands reach a server: the channel (TLS from the operator's files),
//! the token and the deadlines of a [`JournalClient`]. The calls themselves, with their
//! paging, are the client crate's.

use std::path::PathBuf;
use std::time::Duration;

use opjournal_client::{ClientError, JournalClient};
use tonic::Status;
use tonic::transport::{Endpoint, Uri};

use crate::api::tls;

/// How long to wait for the TCP connection to the server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call may take; a reconcile includes the provider lookup.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How the operator commands reach a server beyond its URL.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// With `https://`: the CA (PEM) to trust; `None` trusts the system's roots.
    pub ca_file: Option<PathBuf>,
    /// With `https://`: a client certificate and its key (PEM files) for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A bearer token sent with every call.
    pub token: Option<String>,
}

/// A client of the server at `server` (`https://` for TLS) with `options`, each call
/// bounded by [`CALL_TIMEOUT`]. The connection is made by the first call, so an
/// unreachable server shows up as that call's `UNAVAILABLE`.
///
/// Errors: `INVALID_ARGUMENT` (no `ErrorInfo`) for TLS files with an `http://` server, an
/// unusable certificate file (named by its flag), or a token a header cannot carry.
pub fn connect(server: Uri, options: &ClientOptions) -> Result<JournalClient, ClientError> {
    let invalid = |message: String| ClientError::from(Status::invalid_argument(message));
    let mut endpoint = Endpoint::from(server.clone())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    if server.scheme_str() == Some("https") {
        let identity = options
            .identity
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()));
        let config = tls::client_config(options.ca_file.as_deref(), identity)
            .map_err(|e| invalid(e.to_string()))?;
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| invalid(format!("TLS: {e}")))?;
    } else if options.ca_file.is_some() || options.identity.is_some() {
        return Err(invalid(
            "--ca-file, --cert-file and --key-file need an https:// server".into(),
        ));
    }
    let channel = endpoint.connect_lazy();
    let client = match &options.token {
        Some(token) => JournalClient::with_token(channel, token)
            .map_err(|e| invalid(format!("--token: {e}")))?,
        None => JournalClient::new(channel),
    };
    Ok(client.with_call_timeout(CALL_TIMEOUT))
}
