//! Layered configuration: typed defaults, then a TOML file, then `OPJOURNAL_*` environment
//! variables, then command-line flags; validated once at start.
//!
//! The file has one section per concern (`[server]`, `[database]`, `[auth]`, `[limits]`,
//! `[tls]`, `[reconcile]`, `[webhook]`, `[console]`, `[telemetry]`), each a struct of its
//! own file here; a section's key is also the variable `OPJOURNAL_<SECTION>__<KEY>`.
//! Durations are written `"10s"`, `"5m"` (or a number of seconds). The flat keys of the
//! first format and their `OPJOURNAL_<KEY>` variables are still read ([`legacy`]), each
//! reported once as deprecated ([`Config::deprecations`]). Secrets ([`Secret`],
//! [`DatabaseUrl`]) never appear in `Debug` output or in what `check-config` prints.

use std::path::PathBuf;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format as _, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::api::TransportLimits;
use crate::api::console::ConsoleLimits;
use crate::domain::access::TokenRegistry;
use crate::journal::RequestLimits;

mod auth;
mod console;
mod database;
mod duration;
pub mod legacy;
mod limits;
mod reconcile;
mod secret;
mod server;
mod telemetry;
mod tls;
mod tokens_file;
mod webhook;

pub use auth::{AuthSettings, TokenSettings};
pub use console::{ConsoleSettings, MAX_CONSOLE_SIGN_IN_BYTES, MIN_CONSOLE_SIGN_IN_BYTES};
pub use database::{Backend, DEFAULT_DATABASE_URL, DatabaseSettings, SqliteUrlError, parse_url};
pub use limits::{
    LimitsSettings, MAX_JSON_DEPTH, MAX_PAGE_SIZE, MESSAGE_HEADROOM_BYTES, MIN_HEADER_LIST_BYTES,
};
pub use reconcile::ReconcileSettings;
pub use secret::{DatabaseUrl, Secret};
pub use server::ServerSettings;
pub use telemetry::{LogFormat, TelemetrySettings};
pub use tls::TlsSettings;
pub use webhook::{LEGACY_WEBHOOK_SECRET_VARIABLE, WEBHOOK_SECRET_VARIABLE, WebhookSettings};

/// The environment variable holding `[server] key_derivation_secret`, read as it is.
pub const SECRET_VARIABLE: &str = "OPJOURNAL_SERVER__KEY_DERIVATION_SECRET";
/// The old name of [`SECRET_VARIABLE`], still read, with a deprecation warning.
pub const LEGACY_SECRET_VARIABLE: &str = "OPJOURNAL_KEY_DERIVATION_SECRET";

/// Settings of the server and of the reconcile worker, one field per section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// `[server]`: addresses, drain, policy file, key-derivation secret.
    pub server: ServerSettings,
    /// `[database]`: where the journal lives, its pool.
    pub database: DatabaseSettings,
    /// `[auth]`: bearer tokens, and the switch for a server without authentication.
    pub auth: AuthSettings,
    /// `[limits]`: request sizes and the gRPC port's admission limits and timeouts.
    pub limits: LimitsSettings,
    /// `[tls]`: certificate, key, client CAs.
    pub tls: TlsSettings,
    /// `[reconcile]`: the reconcile worker and retention purges.
    pub reconcile: ReconcileSettings,
    /// `[webhook]`: escalation events POSTed to a receiver.
    pub webhook: WebhookSettings,
    /// `[console]`: the review console.
    pub console: ConsoleSettings,
    /// `[telemetry]`: the log format.
    pub telemetry: TelemetrySettings,
    /// One notice per deprecated key or variable that was read, naming its replacement.
    #[serde(skip)]
    deprecations: Vec<String>,
}

/// A configuration that cannot be used; the message names the setting.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

/// `value` must be above zero.
fn positive(name: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError(format!("{name}: must be a duration above 0")));
    }
    Ok(())
}

impl Config {
    /// Loads defaults, then `file` (TOML), then `OPJOURNAL_*` variables, then `overrides`
    /// (flags, as a serializable struct of flat keys whose `None` fields are skipped), and
    /// validates. Flat keys and variables are read as their sectioned replacements, each
    /// noted once in [`Config::deprecations`].
    ///
    /// Errors: a value of the wrong type or out of range, naming the setting.
    pub fn load(file: Option<&PathBuf>, overrides: impl Serialize) -> Result<Self, ConfigError> {
        let failed = |e: figment::Error| ConfigError(e.to_string());
        let mut notices = Vec::new();
        let mut figment = Figment::new();
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!("{}: no such file", file.display())));
            }
            let (toml, moved) = legacy::Nested::new(&Toml::file(file))?;
            notices.extend(moved.iter().map(|m| m.in_file()));
            figment = figment.merge(toml);
        }
        let (env, moved) = legacy::Nested::new(&environment())?;
        notices.extend(moved.iter().map(|m| m.in_environment()));
        let (flags, _) = legacy::Nested::new(&Serialized::defaults(overrides))?;
        let mut config: Config = figment.merge(env).merge(flags).extract().map_err(failed)?;
        if let Some(secret) = secret_variable(SECRET_VARIABLE, LEGACY_SECRET_VARIABLE, &mut notices)
        {
            config.server.key_derivation_secret = Some(secret);
        }
        // An empty secret means none.
        config.server.key_derivation_secret = config
            .server
            .key_derivation_secret
            .filter(|secret| !secret.expose().is_empty());
        config.webhook.secret = secret_variable(
            WEBHOOK_SECRET_VARIABLE,
            LEGACY_WEBHOOK_SECRET_VARIABLE,
            &mut notices,
        );
        config.deprecations = notices;
        config.validate()?;
        Ok(config)
    }

    /// One notice per deprecated key or variable the configuration was read from, e.g.
    /// `max_in_flight_requests is deprecated: use [limits] max_in_flight_requests`.
    pub fn deprecations(&self) -> &[String] {
        &self.deprecations
    }

    /// Logs each of [`Config::deprecations`] once, as a warning; call after logging is set
    /// up.
    pub fn warn_deprecations(&self) {
        for notice in &self.deprecations {
            tracing::warn!("configuration: {notice}");
        }
    }

    /// The effective configuration in the sectioned TOML form, secrets redacted (what
    /// `opjournal check-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# the configuration cannot be printed: {e}\n"))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        self.database.validate()?;
        self.reconcile.validate()?;
        self.limits.validate()?;
        self.webhook.validate()?;
        self.tls.validate()?;
        let open = self.auth.token_registry()?.is_empty();
        self.console
            .validate(open, self.auth.insecure_allow_unauthenticated)
    }

    /// The configured tokens ([`AuthSettings::token_registry`]).
    ///
    /// Errors: an invalid token entry or `tokens_file`, named.
    pub fn token_registry(&self) -> Result<TokenRegistry, ConfigError> {
        self.auth.token_registry()
    }

    /// The request limits of the journal and the review path.
    pub fn request_limits(&self) -> RequestLimits {
        self.limits.request_limits()
    }

    /// The limits of the gRPC port.
    pub fn transport_limits(&self) -> TransportLimits {
        self.limits.transport_limits()
    }

    /// The review console's limits and timeouts, and the names it answers to.
    pub fn console_limits(&self) -> ConsoleLimits {
        self.console.limits()
    }

    /// Whether callers must prove who they are: bearer tokens (`[auth] tokens`,
    /// `tokens_file`), or client certificates (mutual TLS).
    pub fn authenticates(&self) -> bool {
        !self.auth.tokens.is_empty()
            || self.auth.tokens_file.is_some()
            || self.tls.client_ca_file.is_some()
    }

    /// Refuses to serve, with no authentication, on an address other hosts can reach,
    /// unless `[auth] insecure_allow_unauthenticated` says so: like Redis's protected mode,
    /// an open journal on a network lets every caller read and change every namespace.
    ///
    /// Errors: a non-loopback `[server] listen`, no tokens, no client CA, and the setting
    /// off; the message says why and the three ways out.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        let listen = self.server.listen;
        if self.authenticates()
            || listen.ip().is_loopback()
            || self.auth.insecure_allow_unauthenticated
        {
            return Ok(());
        }
        Err(ConfigError(format!(
            "server.listen: refusing to serve on {listen} without authentication: no tokens \
             and no client certificates are configured, so every caller that reaches this \
             address could read and change every namespace. Configure tokens \
             (docs/configuration.md#authentication) or mutual TLS, listen on a loopback \
             address, or, when something in front (a service mesh's authorization policy) \
             authenticates callers for this server, set [auth] \
             insecure_allow_unauthenticated = true (--insecure-allow-unauthenticated, \
             OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED=true)"
        )))
    }
}

/// The `OPJOURNAL_*` variables that are settings: sectioned ones (`OPJOURNAL_LIMITS__…`)
/// and the old flat ones, but not the secrets read as they are, nor variables of other
/// programs that share the prefix (the operator CLI's `OPJOURNAL_SERVER`, Kubernetes'
/// `OPJOURNAL_PORT`).
fn environment() -> Env {
    const RAW: [&str; 4] = [
        "server__key_derivation_secret",
        "key_derivation_secret",
        "webhook__secret",
        "webhook_secret",
    ];
    Env::prefixed("OPJOURNAL_")
        .filter(|key| {
            let key = key.as_str();
            !RAW.iter().any(|raw| raw.eq_ignore_ascii_case(key))
                && (key.contains("__") || legacy::find(key).is_some())
        })
        .split("__")
}

/// A secret read as it is from the variable `name`, or from its old name `legacy` (noted as
/// deprecated); empty is none.
fn secret_variable(name: &str, legacy: &str, notices: &mut Vec<String>) -> Option<Secret> {
    let read = |variable: &str| std::env::var(variable).ok().filter(|s| !s.is_empty());
    if let Some(value) = read(name) {
        return Some(Secret::new(value));
    }
    let value = read(legacy)?;
    notices.push(format!("{legacy} is deprecated: use {name}"));
    Some(Secret::new(value))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
