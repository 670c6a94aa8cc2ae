//! Flags of the operator commands (`list`, `show`, `review`, `reconcile`, `resolve`).

use std::path::PathBuf;

use clap::ArgGroup;
use tonic::transport::Uri;

use opjournal_client::ClientError;

use super::client::ClientOptions;

use crate::domain::model::Status;
use crate::proto;
use crate::proto::resolve_operation_request::Resolution;

/// The server the operator commands talk to when neither `--server` nor `OPJOURNAL_SERVER`
/// is given.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

/// The operator commands: gRPC clients of a running `opjournal serve`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum OpsCommand {
    /// List operations of a namespace, newest first.
    List(ListArgs),
    /// Show one operation and its whole history.
    Show(ShowArgs),
    /// List operations waiting for human review, oldest escalation first.
    Review(ReviewArgs),
    /// Ask the provider now what happened to an unknown operation, and apply the answer.
    Reconcile(ReconcileArgs),
    /// Settle an unknown operation by a reviewer's decision.
    Resolve(ResolveArgs),
}

impl CommonArgs {
    /// How to connect: TLS files and token.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            ca_file: self.ca_file.clone(),
            identity: self.cert_file.clone().zip(self.key_file.clone()),
            token: self.token.clone(),
        }
    }
}

impl OpsCommand {
    /// The flags every operator command has.
    pub fn common(&self) -> &CommonArgs {
        match self {
            Self::List(a) => &a.common,
            Self::Show(a) => &a.common,
            Self::Review(a) => &a.common,
            Self::Reconcile(a) => &a.common,
            Self::Resolve(a) => &a.common,
        }
    }
}

/// Where the server is, how to reach it, which namespace, and how to print.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// The opjournal gRPC server: `http://host:port`, or `https://host:port` for TLS.
    #[arg(long, env = "OPJOURNAL_SERVER", default_value = DEFAULT_SERVER, value_parser = parse_server)]
    pub server: Uri,
    /// With https: the CA certificate (PEM) that signed the server's certificate
    /// [default: the system's trusted roots].
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// With https: a client certificate (PEM) for mutual TLS; needs --key-file.
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// With https: the client certificate's private key (PEM); needs --cert-file.
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Bearer token for a server that requires one (prefer OPJOURNAL_TOKEN: flags show up in
    /// process lists).
    #[arg(long, env = "OPJOURNAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Tenant namespace [default: the server's `default`].
    #[arg(long, default_value = "", hide_default_value = true)]
    pub namespace: String,
    /// Print one JSON document on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `opjournal list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// Only operations in this status.
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,
    /// Only operations of this action type.
    #[arg(long)]
    pub action_type: Option<String>,
    /// At most this many operations; pages are followed until it is reached.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Server, namespace and output.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags of `opjournal show`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// The operation's idempotency key.
    pub key: String,
    /// Server, namespace and output.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags of `opjournal review`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReviewArgs {
    /// At most this many operations; pages are followed until it is reached.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Server, namespace and output.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags of `opjournal reconcile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReconcileArgs {
    /// The operation's idempotency key.
    pub key: String,
    /// Server, namespace and output.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags of `opjournal resolve`: who decides, why, on which attempt, and exactly one decision.
#[derive(Debug, Clone, clap::Args)]
#[command(group(
    ArgGroup::new("decision")
        .required(true)
        .multiple(false)
        .args(["succeeded", "failed_final", "release"])
))]
pub struct ResolveArgs {
    /// The operation's idempotency key.
    pub key: String,
    /// Who decides (1-200 characters). Required unless the server requires tokens: there the
    /// reviewer is the token's name, taken when this is left out.
    #[arg(long)]
    pub reviewer: Option<String>,
    /// Why, kept in the history (1-500 characters, no personal data).
    #[arg(long)]
    pub reason: String,
    /// The attempt_count seen in `opjournal show`; the decision applies only if it is unchanged.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    pub expected_attempt: i32,
    /// The provider has the effect: mark the operation succeeded.
    #[arg(long)]
    pub succeeded: bool,
    /// With --succeeded: the provider's id of the effect.
    #[arg(long, value_name = "ID", requires = "succeeded")]
    pub external_id: Option<String>,
    /// With --succeeded: the result to replay, a JSON value.
    #[arg(long, value_name = "JSON", requires = "succeeded")]
    pub result_json: Option<String>,
    /// The effect did not happen and must not be retried: mark it failed_final with CODE.
    #[arg(long, value_name = "CODE")]
    pub failed_final: Option<String>,
    /// The effect did not happen: release the operation for a retry with the same key.
    #[arg(long)]
    pub release: bool,
    /// Server, namespace and output.
    #[command(flatten)]
    pub common: CommonArgs,
}

impl ResolveArgs {
    /// The ResolveOperation request these flags describe.
    ///
    /// Errors: `INVALID_ARGUMENT` unless exactly one decision is given (clap already refuses
    /// that, so this only guards callers that build the flags by hand).
    pub fn request(&self) -> Result<proto::ResolveOperationRequest, ClientError> {
        let resolution = match (self.succeeded, &self.failed_final, self.release) {
            (true, None, false) => Resolution::Succeeded(proto::ResolveSucceeded {
                external_id: self.external_id.clone().unwrap_or_default(),
                result_json: self.result_json.clone().unwrap_or_default(),
            }),
            (false, Some(code), false) => Resolution::FailedFinal(proto::ResolveFailedFinal {
                error_code: code.clone(),
            }),
            (false, None, true) => Resolution::ReleaseForRetry(proto::ResolveReleaseForRetry {}),
            _ => {
                return Err(tonic::Status::invalid_argument(
                    "choose exactly one of --succeeded, --failed-final CODE, --release",
                )
                .into());
            }
        };
        Ok(proto::ResolveOperationRequest {
            namespace: self.common.namespace.clone(),
            operation_key: self.key.clone(),
            expected_attempt_count: self.expected_attempt,
            reviewer: self.reviewer.clone().unwrap_or_default(),
            reason: self.reason.clone(),
            resolution: Some(resolution),
        })
    }
}

/// A status to filter on, spelled as in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StatusFilter {
    /// Registered, not yet executing.
    Pending,
    /// A lease holder may be calling the provider.
    InProgress,
    /// The outcome is not known.
    Unknown,
    /// The effect is confirmed.
    Succeeded,
    /// Confirmed that no effect happened.
    FailedFinal,
}

impl From<StatusFilter> for Status {
    fn from(filter: StatusFilter) -> Self {
        match filter {
            StatusFilter::Pending => Status::Pending,
            StatusFilter::InProgress => Status::InProgress,
            StatusFilter::Unknown => Status::Unknown,
            StatusFilter::Succeeded => Status::Succeeded,
            StatusFilter::FailedFinal => Status::FailedFinal,
        }
    }
}

/// A `--server` that is not an absolute `http://` or `https://` URL with a host.
#[derive(Debug, thiserror::Error)]
pub enum ServerUrlError {
    /// Not a URL at all.
    #[error("not a URL ({0}); expected http://host:port or https://host:port")]
    NotAUrl(#[from] http::uri::InvalidUri),
    /// A URL of another scheme, or without a host.
    #[error("expected http://host:port or https://host:port")]
    NotHttp,
}

/// Parses `--server`: an absolute `http://` (plaintext) or `https://` (TLS) URL.
fn parse_server(value: &str) -> Result<Uri, ServerUrlError> {
    let uri: Uri = value.parse()?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(ServerUrlError::NotHttp),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_server;

    #[test]
    fn a_server_must_be_an_http_or_https_url_with_a_host() {
        assert!(parse_server("http://127.0.0.1:50051").is_ok());
        assert!(parse_server("https://journal.example:443").is_ok());
        assert!(parse_server("127.0.0.1:50051").is_err());
        assert!(parse_server("ftp://journal.example").is_err());
        assert!(parse_server("/relative").is_err());
    }
}
