//! Layered configuration: typed defaults, then a TOML file, then `OPJOURNAL_*` environment
//! variables, then command-line flags; validated once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format as _, Serialized, Toml};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::SqliteConnectOptions;

use crate::api::TransportLimits;
use crate::api::console::ConsoleLimits;
use crate::domain::access::{NamespaceScope, Principal, Role, TokenDigest, TokenRegistry};
use crate::domain::derived_key::MIN_SECRET_BYTES;
use crate::domain::model::Namespace;
use crate::journal::RequestLimits;

mod tokens_file;

/// Settings of the server and of the reconcile worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// gRPC listen address (`OPJOURNAL_LISTEN`).
    pub listen: SocketAddr,
    /// Where the journal lives (`OPJOURNAL_DATABASE_URL`): `postgres://…` (or
    /// `postgresql://…`) for Postgres, `sqlite://PATH` for the embedded journal file (one
    /// node; see docs/storage.md). Default: [`DEFAULT_DATABASE_URL`].
    pub database_url: String,
    /// Action policy file, YAML (`OPJOURNAL_POLICY_FILE`); without one every action type is
    /// allowed and timeouts are reconciled before retry.
    pub policy_file: Option<PathBuf>,
    /// Largest database pool per process (`OPJOURNAL_MAX_CONNECTIONS`).
    pub max_connections: u32,
    /// Postgres group commit (`OPJOURNAL_GROUP_COMMIT_LANES`): how many batches of
    /// registrations, and as many of reports, run at once, each one statement and one commit
    /// for every call that queued while the previous ones ran; `0` sends every call alone.
    /// At most `(max_connections - 1) / 2` are used, so that reads always find a connection.
    /// Ignored on SQLite. Default 2.
    pub group_commit_lanes: usize,
    /// Seconds between readiness checks of the database.
    pub readiness_interval_seconds: f64,
    /// Seconds between NOT_SERVING and closing the listener on SIGTERM.
    pub drain_delay_seconds: f64,
    /// Log format: `text` or `json` (`OPJOURNAL_LOG_FORMAT`).
    pub log_format: LogFormat,
    /// Create the database if missing and apply migrations before serving (Postgres; the
    /// embedded SQLite journal is always prepared at start).
    pub migrate_on_start: bool,
    /// Reconcile worker: seconds between polls when idle.
    pub reconcile_poll_seconds: f64,
    /// Reconcile worker: operations claimed per poll.
    pub reconcile_batch_size: i64,
    /// Reconcile worker: lookups running at once.
    pub reconcile_concurrency: usize,
    /// Reconcile worker: seconds a claimed operation stays hidden from other replicas.
    pub reconcile_claim_hold_seconds: f64,
    /// Reconcile worker: gRPC health listen address (`liveness`, `readiness`).
    pub reconciler_health_listen: SocketAddr,
    /// Server: the admin HTTP address serving Prometheus metrics at `/metrics`
    /// (`OPJOURNAL_METRICS_LISTEN`); not served when `OTEL_METRICS_EXPORTER` leaves out
    /// `prometheus`.
    pub metrics_listen: SocketAddr,
    /// Reconcile worker: the admin HTTP address serving Prometheus metrics at `/metrics`.
    pub reconciler_metrics_listen: SocketAddr,
    /// Server: the address of the review console, an HTTP(S) port of its own
    /// (`OPJOURNAL_CONSOLE_LISTEN`); unset, the console is off. It takes the same tokens and
    /// roles as the gRPC API and TLS when the server has it; without tokens it is served only
    /// on a loopback address unless `insecure_allow_unauthenticated` (docs/review-console.md).
    pub console_listen: Option<SocketAddr>,
    /// Server: names the review console answers to besides its own address: `host` (any
    /// port) or `host:port`, e.g. the name a proxy or a DNS record gives it
    /// (`OPJOURNAL_CONSOLE_ALLOWED_HOSTS='["console.example.com"]'`). A request for any other
    /// `Host` is refused (DNS rebinding; docs/review-console.md, "Limits and timeouts").
    pub console_allowed_hosts: Vec<String>,
    /// Server: review console connections open at once; one more is accepted and closed.
    pub console_max_connections: usize,
    /// Server: review console connections open at once from one peer (an IPv4 address or an
    /// IPv6 /64).
    pub console_max_connections_per_peer: usize,
    /// Server: seconds the review console waits for a request's line and headers.
    pub console_header_timeout_seconds: f64,
    /// Server: seconds the review console waits for a request's whole body after its
    /// headers (408 past it).
    pub console_body_timeout_seconds: f64,
    /// Server: seconds after which a review console connection on which nothing moves is
    /// closed.
    pub console_idle_timeout_seconds: f64,
    /// Server: largest review console sign-in form, in bytes (413 past it, unread).
    pub console_sign_in_max_bytes: usize,
    /// Server: review console sign-in attempts one peer may make in a burst.
    pub console_sign_in_burst: u32,
    /// Server: review console sign-in attempts per minute per peer after its burst (429 with
    /// `Retry-After` past it).
    pub console_sign_in_per_minute: u32,
    /// Without authentication (no tokens, no client certificates), let the server listen
    /// where other hosts can reach it anyway: the gRPC `listen` address
    /// ([`Config::check_exposure`]) and the review console's `console_listen`
    /// (`OPJOURNAL_INSECURE_ALLOW_UNAUTHENTICATED`, `--insecure-allow-unauthenticated`).
    /// Everyone who reaches it can then read and change every namespace: only for a server
    /// behind something that authenticates for it (a mesh's authorization policy).
    pub insecure_allow_unauthenticated: bool,
    /// Reconcile worker: seconds between samples of the backlog gauges (unknown operations,
    /// the oldest one's age, those past their deadline, the review queue and its longest
    /// wait); one indexed query per sample.
    pub backlog_sample_seconds: f64,
    /// Reconcile worker: seconds between purges of operations past retention.
    pub purge_interval_seconds: f64,
    /// Operations deleted per purge statement.
    pub purge_batch_size: i64,
    /// Bearer tokens, known by their SHA-256 only; none (here and in `tokens_file`) means
    /// authentication is off.
    pub tokens: Vec<TokenSettings>,
    /// A TOML file holding more `[[tokens]]` entries (`OPJOURNAL_TOKENS_FILE`), e.g. mounted
    /// from a Kubernetes Secret; read at start, added to `tokens`, and never logged.
    pub tokens_file: Option<PathBuf>,
    /// The server's certificate chain, PEM; with `tls_key_file` it turns TLS on.
    pub tls_cert_file: Option<PathBuf>,
    /// The server's private key, PEM.
    pub tls_key_file: Option<PathBuf>,
    /// CAs for client certificates, PEM; set, it requires mutual TLS.
    pub tls_client_ca_file: Option<PathBuf>,
    /// Seconds between reads of the TLS files: changed files (a renewed certificate) are
    /// used for new connections without a restart.
    pub tls_reload_seconds: f64,
    /// Server: a second, plaintext address serving only gRPC health (`OPJOURNAL_HEALTH_LISTEN`),
    /// for probes that cannot speak TLS (Kubernetes' native `grpc` probes); unset, health is
    /// served on `listen` only.
    pub health_listen: Option<SocketAddr>,
    /// Largest request message the server decodes, in bytes.
    pub max_message_bytes: usize,
    /// Largest `payload_json`, in bytes.
    pub max_payload_bytes: usize,
    /// Largest `result_json` (a holder's or a reviewer's), in bytes.
    pub max_result_bytes: usize,
    /// Deepest JSON nesting in payloads and results.
    pub max_json_depth: usize,
    /// Largest page of `ListOperations` and `ListOperationsForReview`.
    pub max_page_size: u32,
    /// Server secret of `DeriveOperationKey`, at least 32 bytes
    /// (`OPJOURNAL_KEY_DERIVATION_SECRET`); never logged or printed. Without it that RPC
    /// answers `FAILED_PRECONDITION`/`KEY_DERIVATION_DISABLED`. Every server of one
    /// deployment needs the same value, and changing it changes every derived key.
    #[serde(skip_serializing)]
    pub key_derivation_secret: Option<Secret>,
    /// Streams (calls) one HTTP/2 connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header list, in bytes (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`).
    pub max_header_list_bytes: u32,
    /// Calls served at once over all connections; one more is answered
    /// `RESOURCE_EXHAUSTED`/`SERVER_OVERLOADED` with a `RetryInfo`.
    pub max_in_flight_requests: usize,
    /// Calls in flight one caller may hold (a token's principal; the peer's address without
    /// a valid token); at most `max_in_flight_requests`.
    pub max_in_flight_requests_per_caller: usize,
    /// Health calls served at once per listener (a `Watch` holds its place while open).
    pub max_health_streams: usize,
    /// Health calls served at once from one peer address, per listener.
    pub max_health_streams_per_peer: usize,
    /// gRPC connections open at once per listener; past it a new connection pushes out the
    /// idlest one, or is closed at once.
    pub max_grpc_connections: usize,
    /// gRPC connections open at once from one peer address, per listener.
    pub max_grpc_connections_per_peer: usize,
    /// Seconds a new connection may take to send its first request (TLS handshake included).
    pub first_request_timeout_seconds: f64,
    /// Seconds a connection may have no call open before it is closed; 0 never.
    pub max_connection_idle_seconds: f64,
    /// Seconds a call's request message may take to arrive in full; past it the call ends
    /// with `DEADLINE_EXCEEDED`/`REQUEST_BODY_TIMEOUT`.
    pub request_body_timeout_seconds: f64,
    /// Seconds between HTTP/2 PINGs on a connection; 0 sends none.
    pub http2_keepalive_interval_seconds: f64,
    /// Seconds an unanswered PING waits before the connection is closed.
    pub http2_keepalive_timeout_seconds: f64,
    /// Seconds after which a connection is asked to go away (GOAWAY); 0 never.
    pub max_connection_age_seconds: f64,
    /// Seconds a connection past its age may still finish its calls before it is closed;
    /// 0 waits for them however long they take.
    pub max_connection_age_grace_seconds: f64,
    /// Reconcile worker: where escalation events are POSTed (`http://` or `https://`;
    /// docs/webhooks.md); unset, events wait in the outbox. Never logged: incoming-webhook
    /// URLs often carry a token.
    pub webhook_url: Option<String>,
    /// The webhook signing secret, `whsec_` and the base64 of at least 32 random bytes, read
    /// only from `OPJOURNAL_WEBHOOK_SECRET` (a file's value is ignored); never logged or
    /// printed. Required with `webhook_url`.
    #[serde(skip)]
    pub webhook_secret: Option<Secret>,
    /// Seconds to wait for the receiver's answer to one delivery.
    pub webhook_timeout_seconds: f64,
    /// Seconds a claimed event stays hidden from other workers; at least twice
    /// `webhook_timeout_seconds`.
    pub webhook_claim_seconds: f64,
    /// Seconds before the first retry of a failed event; doubled per attempt.
    pub webhook_retry_base_seconds: f64,
    /// Longest wait between two attempts, in seconds.
    pub webhook_retry_cap_seconds: f64,
    /// Age in seconds after which a failed event is marked dead (kept, counted) instead of
    /// tried again.
    pub webhook_max_age_seconds: f64,
    /// Seconds between polls of the outbox when nothing was due.
    pub webhook_poll_seconds: f64,
    /// Most events claimed and sent at once per poll.
    pub webhook_batch_size: i64,
}

/// A secret setting: its `Debug` output is `[redacted]` and it is never serialized.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret's value, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// One bearer token: `[[tokens]]` in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// Who holds it (1-200 characters); a reviewer's name in the history.
    pub name: String,
    /// SHA-256 of the token, 64 hexadecimal characters; the token itself is never configured.
    pub sha256: String,
    /// Namespaces it may touch, or `["*"]` for all.
    pub namespaces: Vec<String>,
    /// Its roles: `client`, `reviewer`, `admin`; never `client` and `reviewer` together (the
    /// configuration is refused, naming the token).
    pub roles: Vec<Role>,
}

impl TokenSettings {
    /// The digest and principal this entry describes.
    ///
    /// Errors: an invalid field, described without quoting the digest.
    fn principal(&self) -> Result<(TokenDigest, Principal), String> {
        let chars = self.name.chars().count();
        if chars == 0 || chars > 200 || self.name.chars().any(char::is_control) {
            return Err("name: must be 1 to 200 characters without control characters".into());
        }
        let digest = TokenDigest::parse_hex(&self.sha256).map_err(|e| format!("sha256: {e}"))?;
        let namespaces = match self.namespaces.as_slice() {
            [] => return Err("namespaces: must name at least one namespace, or \"*\"".into()),
            [all] if all == "*" => NamespaceScope::Any,
            names => {
                let mut scope = std::collections::BTreeSet::new();
                for name in names {
                    if name.is_empty() || name == "*" || Namespace::parse(name).is_err() {
                        return Err(
                            "namespaces: each must be a namespace name, or \"*\" alone".into()
                        );
                    }
                    scope.insert(name.clone());
                }
                NamespaceScope::Only(scope)
            }
        };
        if self.roles.is_empty() {
            return Err("roles: must name at least one of client, reviewer, admin".into());
        }
        if self.roles.contains(&Role::Client) && self.roles.contains(&Role::Reviewer) {
            // The name is the holder's, never a secret; the digest is not quoted.
            return Err(format!(
                "roles: the token named {:?} holds both client and reviewer; one token may \
                 not do both (an agent could approve its own unknown operations): give the \
                 reviewer a token of its own",
                self.name
            ));
        }
        Ok((
            digest,
            Principal {
                name: self.name.clone(),
                namespaces,
                roles: self.roles.iter().copied().collect(),
            },
        ))
    }
}

pub use crate::telemetry::LogFormat;

/// The storage backend a database URL selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `sqlite:` (e.g. `sqlite://opjournal-data/journal.db`): the embedded journal file.
    Sqlite,
}

impl Backend {
    /// The backend of `url`, by its scheme; `None` for any other scheme.
    pub fn of_url(url: &str) -> Option<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else {
            None
        }
    }

    /// `postgres` or `sqlite`, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let limits = RequestLimits::default();
        let transport = TransportLimits::default();
        let console = ConsoleLimits::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            policy_file: None,
            max_connections: 10,
            group_commit_lanes: 2,
            readiness_interval_seconds: 2.0,
            drain_delay_seconds: 0.0,
            log_format: LogFormat::Text,
            migrate_on_start: false,
            reconcile_poll_seconds: 1.0,
            reconcile_batch_size: 50,
            reconcile_concurrency: 8,
            reconcile_claim_hold_seconds: 60.0,
            reconciler_health_listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            reconciler_metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9465)),
            console_listen: None,
            console_allowed_hosts: Vec::new(),
            console_max_connections: console.max_connections,
            console_max_connections_per_peer: console.max_connections_per_peer,
            console_header_timeout_seconds: console.header_timeout.as_secs_f64(),
            console_body_timeout_seconds: console.body_timeout.as_secs_f64(),
            console_idle_timeout_seconds: console.idle_timeout.as_secs_f64(),
            console_sign_in_max_bytes: console.sign_in_max_bytes,
            console_sign_in_burst: console.sign_in_burst,
            console_sign_in_per_minute: console.sign_in_per_minute,
            insecure_allow_unauthenticated: false,
            backlog_sample_seconds: 10.0,
            purge_interval_seconds: 300.0,
            purge_batch_size: 1000,
            tokens: Vec::new(),
            tokens_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            tls_reload_seconds: 60.0,
            health_listen: None,
            max_message_bytes: crate::api::DEFAULT_MAX_MESSAGE_BYTES,
            max_payload_bytes: limits.max_payload_bytes,
            max_result_bytes: limits.max_result_bytes,
            max_json_depth: limits.max_json_depth,
            max_page_size: limits.max_page_size,
            key_derivation_secret: None,
            max_concurrent_streams: transport.max_concurrent_streams,
            max_header_list_bytes: transport.max_header_list_bytes,
            max_in_flight_requests: transport.max_in_flight_requests,
            max_in_flight_requests_per_caller: transport.max_in_flight_requests_per_caller,
            max_health_streams: transport.max_health_streams,
            max_health_streams_per_peer: transport.max_health_streams_per_peer,
            max_grpc_connections: transport.max_connections,
            max_grpc_connections_per_peer: transport.max_connections_per_peer,
            first_request_timeout_seconds: transport.first_request_timeout.as_secs_f64(),
            max_connection_idle_seconds: seconds_or_zero(transport.max_connection_idle),
            request_body_timeout_seconds: transport.request_body_timeout.as_secs_f64(),
            http2_keepalive_interval_seconds: seconds_or_zero(transport.http2_keepalive_interval),
            http2_keepalive_timeout_seconds: transport.http2_keepalive_timeout.as_secs_f64(),
            max_connection_age_seconds: seconds_or_zero(transport.max_connection_age),
            max_connection_age_grace_seconds: seconds_or_zero(transport.max_connection_age_grace),
            webhook_url: None,
            webhook_secret: None,
            webhook_timeout_seconds: 10.0,
            webhook_claim_seconds: 60.0,
            webhook_retry_base_seconds: 5.0,
            webhook_retry_cap_seconds: 600.0,
            webhook_max_age_seconds: 259_200.0,
            webhook_poll_seconds: 1.0,
            webhook_batch_size: 20,
        }
    }
}

fn seconds_or_zero(value: Option<Duration>) -> f64 {
    value.map_or(0.0, |d| d.as_secs_f64())
}

fn zero_is_none(seconds: f64) -> Option<Duration> {
    (seconds > 0.0).then(|| Config::seconds(seconds))
}

/// The journal when no `database_url` is configured: an embedded SQLite file under the
/// working directory, created with its directory at start (zero setup, one node).
pub const DEFAULT_DATABASE_URL: &str = "sqlite://opjournal-data/journal.db";

/// Deepest `max_json_depth` accepted: the JSON parser recurses once per level.
pub const MAX_JSON_DEPTH: usize = 128;
/// Largest `max_page_size` accepted.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// Room `max_message_bytes` must leave beyond the largest JSON field, in bytes.
pub const MESSAGE_HEADROOM_BYTES: usize = 16 * 1024;
/// Smallest `max_header_list_bytes` accepted.
pub const MIN_HEADER_LIST_BYTES: u32 = 4096;
/// Smallest `console_sign_in_max_bytes` accepted: a long token, a name and the form's own
/// token fit.
pub const MIN_CONSOLE_SIGN_IN_BYTES: usize = 1024;
/// Largest `console_sign_in_max_bytes` accepted.
pub const MAX_CONSOLE_SIGN_IN_BYTES: usize = 64 * 1024;
/// The environment variable holding `key_derivation_secret`.
pub const SECRET_VARIABLE: &str = "OPJOURNAL_KEY_DERIVATION_SECRET";
/// The environment variable holding `webhook_secret`, its only source.
pub const WEBHOOK_SECRET_VARIABLE: &str = "OPJOURNAL_WEBHOOK_SECRET";

/// A configuration that cannot be used; the message names the setting.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Loads defaults, then `file` (TOML), then `OPJOURNAL_*` variables, then `overrides`
    /// (flags, as a serializable struct whose `None` fields are skipped), and validates.
    ///
    /// Errors: a value of the wrong type or out of range, naming the setting.
    pub fn load(file: Option<&PathBuf>, overrides: impl Serialize) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("{}: no such file", file.display())));
            }
            figment = figment.merge(Toml::file(file));
        }
        figment = figment.merge(Env::prefixed("OPJOURNAL_"));
        // Read as it is: the generic variables are parsed (`123` becomes a number).
        if let Some(secret) = std::env::var(SECRET_VARIABLE)
            .ok()
            .filter(|s| !s.is_empty())
        {
            figment = figment.merge(Serialized::default("key_derivation_secret", secret));
        }
        let mut config: Config = figment
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(|e| ConfigError(e.to_string()))?;
        // An empty secret (`OPJOURNAL_KEY_DERIVATION_SECRET=`) means none.
        config.key_derivation_secret = config
            .key_derivation_secret
            .filter(|secret| !secret.expose().is_empty());
        config.webhook_secret = std::env::var(WEBHOOK_SECRET_VARIABLE)
            .ok()
            .filter(|s| !s.is_empty())
            .map(Secret::new);
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError(format!(
                    "{name}: must be a positive number of seconds"
                )))
            }
        };
        if self.max_connections == 0 {
            return Err(ConfigError("max_connections: must be at least 1".into()));
        }
        if self.reconcile_batch_size < 1 || self.reconcile_concurrency == 0 {
            return Err(ConfigError(
                "reconcile_batch_size, reconcile_concurrency: must be at least 1".into(),
            ));
        }
        if !(self.drain_delay_seconds.is_finite() && self.drain_delay_seconds >= 0.0) {
            return Err(ConfigError("drain_delay_seconds: must be 0 or more".into()));
        }
        positive(
            "readiness_interval_seconds",
            self.readiness_interval_seconds,
        )?;
        positive("reconcile_poll_seconds", self.reconcile_poll_seconds)?;
        positive(
            "reconcile_claim_hold_seconds",
            self.reconcile_claim_hold_seconds,
        )?;
        positive("purge_interval_seconds", self.purge_interval_seconds)?;
        positive("backlog_sample_seconds", self.backlog_sample_seconds)?;
        positive("tls_reload_seconds", self.tls_reload_seconds)?;
        if self.purge_batch_size < 1 {
            return Err(ConfigError("purge_batch_size: must be at least 1".into()));
        }
        self.validate_database_url()?;
        self.validate_limits()?;
        self.validate_transport()?;
        self.validate_webhook()?;
        self.validate_tls()?;
        self.validate_console()?;
        if let Some(secret) = &self.key_derivation_secret
            && secret.expose().len() < MIN_SECRET_BYTES
        {
            return Err(ConfigError(format!(
                "key_derivation_secret: must be at least {MIN_SECRET_BYTES} bytes long"
            )));
        }
        Ok(())
    }

    /// The URL's scheme picks the backend; a `sqlite:` URL must name a writable file. The
    /// message never repeats the URL, which may hold a password.
    fn validate_database_url(&self) -> Result<(), ConfigError> {
        match Backend::of_url(&self.database_url) {
            Some(Backend::Postgres) => Ok(()),
            Some(Backend::Sqlite) => parse_url(&self.database_url)
                .map(|_| ())
                .map_err(|e| ConfigError(format!("database_url: {e}"))),
            None if self.database_url.is_empty() => {
                Err(ConfigError("database_url: must be set".into()))
            }
            None => Err(ConfigError(
                "database_url: must start with postgres://, postgresql:// or sqlite: \
                 (e.g. sqlite://opjournal-data/journal.db)"
                    .into(),
            )),
        }
    }

    /// The webhook settings; the messages never repeat the URL or the secret.
    fn validate_webhook(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("webhook_timeout_seconds", self.webhook_timeout_seconds),
            ("webhook_claim_seconds", self.webhook_claim_seconds),
            (
                "webhook_retry_base_seconds",
                self.webhook_retry_base_seconds,
            ),
            ("webhook_retry_cap_seconds", self.webhook_retry_cap_seconds),
            ("webhook_max_age_seconds", self.webhook_max_age_seconds),
            ("webhook_poll_seconds", self.webhook_poll_seconds),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError(format!(
                    "{name}: must be a positive number of seconds"
                )));
            }
        }
        if self.webhook_claim_seconds < 2.0 * self.webhook_timeout_seconds {
            return Err(ConfigError(
                "webhook_claim_seconds: must be at least twice webhook_timeout_seconds".into(),
            ));
        }
        if self.webhook_batch_size < 1 {
            return Err(ConfigError("webhook_batch_size: must be at least 1".into()));
        }
        if let Some(secret) = &self.webhook_secret {
            crate::domain::escalation::WebhookSecret::parse(secret.expose()).map_err(|e| {
                ConfigError(format!("webhook_secret ({WEBHOOK_SECRET_VARIABLE}): {e}"))
            })?;
        }
        let Some(url) = &self.webhook_url else {
            return Ok(());
        };
        match reqwest::Url::parse(url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
            _ => {
                return Err(ConfigError(
                    "webhook_url: must be an http:// or https:// URL".into(),
                ));
            }
        }
        if self.webhook_secret.is_none() {
            return Err(ConfigError(format!(
                "webhook_secret: {WEBHOOK_SECRET_VARIABLE} must be set with webhook_url"
            )));
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.max_payload_bytes == 0 || self.max_result_bytes == 0 {
            return Err(ConfigError(
                "max_payload_bytes, max_result_bytes: must be at least 1".into(),
            ));
        }
        if !(1..=MAX_JSON_DEPTH).contains(&self.max_json_depth) {
            return Err(ConfigError(format!(
                "max_json_depth: must be 1 to {MAX_JSON_DEPTH}"
            )));
        }
        if !(1..=MAX_PAGE_SIZE).contains(&self.max_page_size) {
            return Err(ConfigError(format!(
                "max_page_size: must be 1 to {MAX_PAGE_SIZE}"
            )));
        }
        let needed = self.max_payload_bytes.max(self.max_result_bytes) + MESSAGE_HEADROOM_BYTES;
        if self.max_message_bytes < needed {
            return Err(ConfigError(format!(
                "max_message_bytes: must be at least {needed} (the larger of max_payload_bytes \
                 and max_result_bytes plus {MESSAGE_HEADROOM_BYTES} for the other fields)"
            )));
        }
        Ok(())
    }

    fn validate_transport(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            (
                "max_concurrent_streams",
                self.max_concurrent_streams as usize,
            ),
            ("max_in_flight_requests", self.max_in_flight_requests),
            (
                "max_in_flight_requests_per_caller",
                self.max_in_flight_requests_per_caller,
            ),
            ("max_health_streams", self.max_health_streams),
            (
                "max_health_streams_per_peer",
                self.max_health_streams_per_peer,
            ),
            ("max_grpc_connections", self.max_grpc_connections),
            (
                "max_grpc_connections_per_peer",
                self.max_grpc_connections_per_peer,
            ),
        ] {
            if value == 0 {
                return Err(ConfigError(format!("{name}: must be at least 1")));
            }
        }
        if self.max_header_list_bytes < MIN_HEADER_LIST_BYTES {
            return Err(ConfigError(format!(
                "max_header_list_bytes: must be at least {MIN_HEADER_LIST_BYTES} (gRPC's own \
                 headers, a bearer token and a traceparent must fit)"
            )));
        }
        for (name, value) in [
            (
                "http2_keepalive_interval_seconds",
                self.http2_keepalive_interval_seconds,
            ),
            (
                "max_connection_age_seconds",
                self.max_connection_age_seconds,
            ),
            (
                "max_connection_age_grace_seconds",
                self.max_connection_age_grace_seconds,
            ),
            (
                "max_connection_idle_seconds",
                self.max_connection_idle_seconds,
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ConfigError(format!(
                    "{name}: must be 0 (off) or a positive number of seconds"
                )));
            }
        }
        for (name, value) in [
            (
                "http2_keepalive_timeout_seconds",
                self.http2_keepalive_timeout_seconds,
            ),
            (
                "first_request_timeout_seconds",
                self.first_request_timeout_seconds,
            ),
            (
                "request_body_timeout_seconds",
                self.request_body_timeout_seconds,
            ),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError(format!(
                    "{name}: must be a positive number of seconds"
                )));
            }
        }
        Ok(())
    }

    /// The limits of the gRPC port.
    pub fn transport_limits(&self) -> TransportLimits {
        TransportLimits {
            max_concurrent_streams: self.max_concurrent_streams,
            max_header_list_bytes: self.max_header_list_bytes,
            max_in_flight_requests: self.max_in_flight_requests,
            max_in_flight_requests_per_caller: self.max_in_flight_requests_per_caller,
            max_health_streams: self.max_health_streams,
            max_health_streams_per_peer: self.max_health_streams_per_peer,
            max_connections: self.max_grpc_connections,
            max_connections_per_peer: self.max_grpc_connections_per_peer,
            first_request_timeout: Config::seconds(self.first_request_timeout_seconds),
            max_connection_idle: zero_is_none(self.max_connection_idle_seconds),
            request_body_timeout: Config::seconds(self.request_body_timeout_seconds),
            http2_keepalive_interval: zero_is_none(self.http2_keepalive_interval_seconds),
            http2_keepalive_timeout: Config::seconds(self.http2_keepalive_timeout_seconds),
            max_connection_age: zero_is_none(self.max_connection_age_seconds),
            max_connection_age_grace: zero_is_none(self.max_connection_age_grace_seconds),
            ..TransportLimits::default()
        }
    }

    /// Whether callers must prove who they are: bearer tokens (`tokens`, `tokens_file`), or
    /// client certificates (mutual TLS).
    pub fn authenticates(&self) -> bool {
        !self.tokens.is_empty() || self.tokens_file.is_some() || self.tls_client_ca_file.is_some()
    }

    /// Refuses to serve, with no authentication, on an address other hosts can reach,
    /// unless `insecure_allow_unauthenticated` says so: like Redis's protected mode, an
    /// open journal on a network lets every caller read and change every namespace.
    ///
    /// Errors: a non-loopback `listen`, no tokens, no client CA, and the setting off; the
    /// message says why and the three ways out.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        if self.authenticates()
            || self.listen.ip().is_loopback()
            || self.insecure_allow_unauthenticated
        {
            return Ok(());
        }
        Err(ConfigError(format!(
            "listen: refusing to serve on {} without authentication: no tokens and no client \
             certificates are configured, so every caller that reaches this address could read \
             and change every namespace. Configure tokens (docs/configuration.md#authentication) \
             or mutual TLS, listen on a loopback address, or, when something in front (a \
             service mesh's authorization policy) authenticates callers for this server, set \
             insecure_allow_unauthenticated = true (--insecure-allow-unauthenticated, \
             OPJOURNAL_INSECURE_ALLOW_UNAUTHENTICATED=true)",
            self.listen
        )))
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), Some(_)) => Ok(()),
            (None, None) if self.tls_client_ca_file.is_some() => Err(ConfigError(
                "tls_client_ca_file: needs tls_cert_file and tls_key_file (mutual TLS is TLS)"
                    .into(),
            )),
            (None, None) => Ok(()),
            (Some(_), None) => Err(ConfigError(
                "tls_key_file: must be set with tls_cert_file".into(),
            )),
            (None, Some(_)) => Err(ConfigError(
                "tls_cert_file: must be set with tls_key_file".into(),
            )),
        }
    }

    /// The console without tokens lets anyone who reaches it resolve operations: only on
    /// loopback, unless the operator says otherwise.
    fn validate_console(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            (
                "console_header_timeout_seconds",
                self.console_header_timeout_seconds,
            ),
            (
                "console_body_timeout_seconds",
                self.console_body_timeout_seconds,
            ),
            (
                "console_idle_timeout_seconds",
                self.console_idle_timeout_seconds,
            ),
        ] {
            if !(value.is_finite() && value > 0.0 && value <= 3600.0) {
                return Err(ConfigError(format!(
                    "{name}: must be a number of seconds above 0 and at most 3600"
                )));
            }
        }
        if self.console_max_connections == 0 || self.console_max_connections_per_peer == 0 {
            return Err(ConfigError(
                "console_max_connections, console_max_connections_per_peer: must be at least 1"
                    .into(),
            ));
        }
        if self.console_sign_in_burst == 0 || self.console_sign_in_per_minute == 0 {
            return Err(ConfigError(
                "console_sign_in_burst, console_sign_in_per_minute: must be at least 1".into(),
            ));
        }
        if !(MIN_CONSOLE_SIGN_IN_BYTES..=MAX_CONSOLE_SIGN_IN_BYTES)
            .contains(&self.console_sign_in_max_bytes)
        {
            return Err(ConfigError(format!(
                "console_sign_in_max_bytes: must be between {MIN_CONSOLE_SIGN_IN_BYTES} and \
                 {MAX_CONSOLE_SIGN_IN_BYTES}"
            )));
        }
        for (i, host) in self.console_allowed_hosts.iter().enumerate() {
            let bad = host.trim().is_empty()
                || host
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '/' | '@' | '*' | ',' | '?' | '#'));
            if bad {
                return Err(ConfigError(format!(
                    "console_allowed_hosts[{i}]: a host name, or host:port (no scheme, path \
                     or wildcard)"
                )));
            }
        }
        let open = self.token_registry()?.is_empty();
        match self.console_listen {
            Some(address) if open && !address.ip().is_loopback() => {
                if self.insecure_allow_unauthenticated {
                    Ok(())
                } else {
                    Err(ConfigError(format!(
                        "console_listen: {address} is reachable from other hosts and no tokens are \
                         configured: configure [[tokens]] (reviewer or admin) or listen on a \
                         loopback address (insecure_allow_unauthenticated = true overrides)"
                    )))
                }
            }
            _ => Ok(()),
        }
    }

    /// The configured tokens, `tokens` then those of `tokens_file`; empty when
    /// authentication is off.
    ///
    /// Errors: an unreadable or invalid `tokens_file`, or one without entries; an invalid
    /// entry (named by its position and field, and its file); two entries with one digest or
    /// name. No message quotes a digest or the file's content.
    pub fn token_registry(&self) -> Result<TokenRegistry, ConfigError> {
        let mut entries = principals(&self.tokens, |e| format!("tokens{e}"))?;
        if let Some(path) = &self.tokens_file {
            let tokens =
                tokens_file::read(path).map_err(|e| ConfigError(format!("tokens_file: {e}")))?;
            let at = path.display();
            entries.extend(principals(&tokens, |e| {
                format!("tokens_file: {at}: tokens{e}")
            })?);
        }
        let settings = match self.tokens_file {
            Some(_) => "tokens and tokens_file",
            None => "tokens",
        };
        TokenRegistry::new(entries).map_err(|e| ConfigError(format!("{settings}: {e}")))
    }

    /// The request limits of the journal and the review path.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_payload_bytes: self.max_payload_bytes,
            max_result_bytes: self.max_result_bytes,
            max_json_depth: self.max_json_depth,
            max_page_size: self.max_page_size,
            ..RequestLimits::default()
        }
    }

    /// Seconds as a duration.
    pub fn seconds(value: f64) -> Duration {
        Duration::from_secs_f64(value.max(0.0))
    }

    /// The review console's limits and timeouts, and the names it answers to.
    pub fn console_limits(&self) -> ConsoleLimits {
        ConsoleLimits {
            max_connections: self.console_max_connections,
            max_connections_per_peer: self.console_max_connections_per_peer,
            header_timeout: Self::seconds(self.console_header_timeout_seconds),
            body_timeout: Self::seconds(self.console_body_timeout_seconds),
            idle_timeout: Self::seconds(self.console_idle_timeout_seconds),
            sign_in_max_bytes: self.console_sign_in_max_bytes,
            sign_in_burst: self.console_sign_in_burst,
            sign_in_per_minute: self.console_sign_in_per_minute,
            allowed_hosts: self.console_allowed_hosts.clone(),
        }
    }
}

/// The principals of `tokens`; an invalid entry's error is `[i].field: reason`, put in
/// context by `describe`.
fn principals(
    tokens: &[TokenSettings],
    describe: impl Fn(String) -> String,
) -> Result<Vec<(TokenDigest, Principal)>, ConfigError> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, token)| {
            token
                .principal()
                .map_err(|e| ConfigError(describe(format!("[{i}].{e}"))))
        })
        .collect()
}

/// Why a `sqlite:` URL cannot hold the journal.
#[derive(Debug, thiserror::Error)]
pub enum SqliteUrlError {
    /// No file named.
    #[error("a sqlite: database_url must name a file, e.g. sqlite://opjournal-data/journal.db")]
    NoFile,
    /// An in-memory database: the journal would vanish with the process.
    #[error(
        "an in-memory SQLite database loses the journal when the process exits; name a file, \
         e.g. sqlite://opjournal-data/journal.db"
    )]
    InMemory,
    /// Read-only or immutable: the journal must be written.
    #[error("the journal's SQLite file must be writable (remove mode=ro / immutable)")]
    ReadOnly,
    /// The URL does not parse.
    #[error("invalid sqlite: URL: {0}")]
    Invalid(String),
}

/// The file a `sqlite:` URL names (`sqlite://relative/path.db`, `sqlite:///absolute/path.db`
/// or `sqlite:path.db`), as connection options.
///
/// Errors: no file, an in-memory or read-only database, an unknown URL parameter.
pub fn parse_url(url: &str) -> Result<SqliteConnectOptions, SqliteUrlError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| SqliteUrlError::Invalid("not a sqlite: URL".into()))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(SqliteUrlError::NoFile);
    }
    if path == ":memory:" || query.split('&').any(|pair| pair == "mode=memory") {
        return Err(SqliteUrlError::InMemory);
    }
    let options =
        SqliteConnectOptions::from_str(url).map_err(|e| SqliteUrlError::Invalid(e.to_string()))?;
    if query
        .split('&')
        .any(|pair| matches!(pair, "mode=ro" | "immutable=true" | "immutable=1"))
    {
        return Err(SqliteUrlError::ReadOnly);
    }
    Ok(options)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load(toml: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("opjournal.toml");
        std::fs::write(&file, toml).unwrap();
        Config::load(Some(&file), serde_json::json!({}))
    }

    #[test]
    fn the_key_derivation_secret_is_read_and_never_printed() {
        let secret = "a-secret-of-at-least-thirty-two-bytes";
        let config = load(&format!("key_derivation_secret = \"{secret}\"\n")).unwrap();
        assert_eq!(
            config.key_derivation_secret.as_ref().map(Secret::expose),
            Some(secret)
        );
        assert!(!format!("{config:?}").contains(secret));
        assert!(format!("{config:?}").contains("[redacted]"));
    }

    #[test]
    fn a_webhook_needs_an_http_url_and_a_secret_from_the_environment_only() {
        let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let error = |toml: &str| load(toml).unwrap_err().to_string();
        let no_secret = error("webhook_url = \"https://hooks.example.com/t0ken\"\n");
        assert!(no_secret.contains("webhook_secret"), "{no_secret}");
        assert!(!no_secret.contains("t0ken"), "{no_secret}");
        // A secret in the file is not read.
        let in_file =
            format!("webhook_url = \"https://h.example/\"\nwebhook_secret = \"{secret}\"\n");
        assert!(error(&in_file).contains("OPJOURNAL_WEBHOOK_SECRET"));
        let bad_url = error("webhook_url = \"ftp://h.example/t0ken\"\n");
        assert!(
            bad_url.starts_with("configuration: webhook_url"),
            "{bad_url}"
        );
        assert!(!bad_url.contains("t0ken"));
        let claim = error("webhook_timeout_seconds = 40\n");
        assert!(claim.contains("webhook_claim_seconds"), "{claim}");
        let mut config = Config {
            webhook_url: Some("https://h.example/".into()),
            webhook_secret: Some(Secret::new(secret)),
            ..Config::default()
        };
        config.validate().unwrap();
        assert!(!format!("{config:?}").contains(secret));
        config.webhook_secret = Some(Secret::new("whsec_c2hvcnQ="));
        let short = config.validate().unwrap_err().to_string();
        assert!(
            short.contains("32 bytes") && !short.contains("c2hvcnQ"),
            "{short}"
        );
    }

    #[test]
    fn without_a_database_url_the_journal_is_an_embedded_file() {
        let config = load("").unwrap();
        assert_eq!(config.database_url, "sqlite://opjournal-data/journal.db");
        assert_eq!(Backend::of_url(&config.database_url), Some(Backend::Sqlite));
    }

    #[test]
    fn the_database_url_scheme_selects_the_backend_or_is_refused() {
        for (url, backend) in [
            ("postgres://u@h:5432/db", Backend::Postgres),
            ("postgresql://u@h/db", Backend::Postgres),
            ("sqlite:///var/lib/opjournal/journal.db", Backend::Sqlite),
            ("sqlite://data/journal.db", Backend::Sqlite),
        ] {
            let config = load(&format!("database_url = \"{url}\"\n")).unwrap();
            assert_eq!(
                Backend::of_url(&config.database_url),
                Some(backend),
                "{url}"
            );
        }
        for (url, says) in [
            ("mysql://u:secret@h/db", "must start with postgres://"),
            ("sqlite::memory:", "in-memory"),
            ("sqlite://journal.db?mode=ro", "writable"),
            ("", "must be set"),
        ] {
            let err = load(&format!("database_url = \"{url}\"\n")).unwrap_err();
            assert!(err.to_string().contains("database_url"), "{err}");
            assert!(err.to_string().contains(says), "{url}: {err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }

    #[test]
    fn the_console_is_off_by_default_and_open_only_on_loopback_without_tokens() {
        assert_eq!(load("").unwrap().console_listen, None);
        let loopback = load("console_listen = \"127.0.0.1:0\"\n").unwrap();
        assert_eq!(
            loopback.console_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        let err = load("console_listen = \"0.0.0.0:8080\"\n").unwrap_err();
        assert!(err.to_string().contains("console_listen"), "{err}");
        let allowed = "console_listen = \"0.0.0.0:8080\"\ninsecure_allow_unauthenticated = true\n";
        assert!(load(allowed).is_ok());
        let with_token = format!(
            "console_listen = \"0.0.0.0:8080\"\n[[tokens]]\nname = \"alice\"\n\
             sha256 = \"{}\"\nnamespaces = [\"*\"]\nroles = [\"reviewer\"]\n",
            "a".repeat(64)
        );
        assert!(load(&with_token).is_ok());
    }

    #[test]
    fn the_console_limits_have_safe_defaults_and_refuse_nonsense() {
        let limits = load("").unwrap().console_limits();
        assert_eq!(limits.sign_in_max_bytes, 4096);
        assert!(limits.header_timeout <= Duration::from_secs(10));
        assert!(limits.max_connections_per_peer < limits.max_connections);
        let set = load(
            "console_allowed_hosts = [\"console.example\", \"review.example:8443\"]\n\
             console_body_timeout_seconds = 2.5\nconsole_sign_in_per_minute = 3\n",
        )
        .unwrap()
        .console_limits();
        assert_eq!(set.allowed_hosts.len(), 2);
        assert_eq!(set.body_timeout, Duration::from_millis(2500));
        assert_eq!(set.sign_in_per_minute, 3);
        for (toml, setting) in [
            (
                "console_header_timeout_seconds = 0",
                "console_header_timeout_seconds",
            ),
            (
                "console_idle_timeout_seconds = 1e9",
                "console_idle_timeout_seconds",
            ),
            ("console_max_connections = 0", "console_max_connections"),
            ("console_sign_in_burst = 0", "console_sign_in_burst"),
            (
                "console_sign_in_max_bytes = 300000",
                "console_sign_in_max_bytes",
            ),
            (
                "console_allowed_hosts = [\"https://console.example/\"]",
                "console_allowed_hosts[0]",
            ),
            (
                "console_allowed_hosts = [\"*.example\"]",
                "console_allowed_hosts[0]",
            ),
        ] {
            let err = load(&format!("{toml}\n")).unwrap_err().to_string();
            assert!(err.contains(setting), "{toml}: {err}");
        }
    }

    #[test]
    fn an_unauthenticated_server_on_a_reachable_address_is_refused_unless_allowed() {
        let open = load("listen = \"0.0.0.0:50051\"\n").unwrap();
        let err = open.check_exposure().unwrap_err().to_string();
        for says in [
            "listen",
            "without authentication",
            "insecure_allow_unauthenticated",
        ] {
            assert!(err.contains(says), "{err}");
        }
        let allowed = load("listen = \"0.0.0.0:50051\"\ninsecure_allow_unauthenticated = true\n");
        allowed.unwrap().check_exposure().unwrap();
        let loopback = load("listen = \"[::1]:50051\"\n").unwrap();
        loopback.check_exposure().unwrap();
        let with_tokens = load(&format!(
            "listen = \"0.0.0.0:50051\"\n[[tokens]]\nname = \"a\"\nsha256 = \"{}\"\n\
             namespaces = [\"*\"]\nroles = [\"client\"]\n",
            "ab".repeat(32)
        ));
        with_tokens.unwrap().check_exposure().unwrap();
    }

    #[test]
    fn transport_limits_are_read_and_zero_turns_an_interval_off() {
        let config = load(
            "max_concurrent_streams = 7\nmax_in_flight_requests = 9\n\
             max_connection_age_seconds = 0\nhttp2_keepalive_interval_seconds = 0\n",
        )
        .unwrap();
        let limits = config.transport_limits();
        assert_eq!(limits.max_concurrent_streams, 7);
        assert_eq!(limits.max_in_flight_requests, 9);
        assert_eq!(limits.max_connection_age, None);
        assert_eq!(limits.http2_keepalive_interval, None);
        assert_eq!(
            load("").unwrap().transport_limits(),
            TransportLimits::default()
        );
        for bad in [
            "max_concurrent_streams = 0",
            "max_header_list_bytes = 100",
            "max_connection_age_seconds = -1",
            "http2_keepalive_timeout_seconds = 0",
            "max_in_flight_requests_per_caller = 0",
            "max_health_streams = 0",
            "max_health_streams_per_peer = 0",
            "max_grpc_connections_per_peer = 0",
            "first_request_timeout_seconds = 0",
            "request_body_timeout_seconds = -1",
            "max_connection_idle_seconds = -1",
        ] {
            let err = load(&format!("{bad}\n")).unwrap_err().to_string();
            let key = bad.split(' ').next().unwrap();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn connection_and_admission_limits_are_read() {
        let config = load(
            "max_in_flight_requests_per_caller = 3
max_health_streams = 5
\
             max_health_streams_per_peer = 2
max_grpc_connections_per_peer = 4
\
             first_request_timeout_seconds = 1.5
max_connection_idle_seconds = 0
\
             request_body_timeout_seconds = 2
",
        )
        .unwrap();
        let limits = config.transport_limits();
        assert_eq!(limits.max_in_flight_requests_per_caller, 3);
        assert_eq!(limits.max_health_streams, 5);
        assert_eq!(limits.max_health_streams_per_peer, 2);
        assert_eq!(limits.max_connections_per_peer, 4);
        assert_eq!(limits.first_request_timeout, Duration::from_millis(1500));
        assert_eq!(limits.max_connection_idle, None);
        assert_eq!(limits.request_body_timeout, Duration::from_secs(2));
    }

    #[test]
    fn a_short_key_derivation_secret_is_refused_by_name() {
        let err = load("key_derivation_secret = \"short\"\n").unwrap_err();
        assert!(err.to_string().contains("key_derivation_secret"), "{err}");
        assert!(!err.to_string().contains("short\""), "{err}");
    }
}
