//! `[console]`: the review console's address, the names it answers to, and its limits and
//! timeouts before sign-in (docs/review-console.md).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, duration};
use crate::api::console::ConsoleLimits;

/// Smallest `sign_in_max_bytes` accepted: a long token, a name and the form's own token fit.
pub const MIN_CONSOLE_SIGN_IN_BYTES: usize = 1024;
/// Largest `sign_in_max_bytes` accepted.
pub const MAX_CONSOLE_SIGN_IN_BYTES: usize = 64 * 1024;
/// Longest console timeout accepted.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// `[console]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsoleSettings {
    /// The address of the review console, an HTTP(S) port of its own (`--console-listen`);
    /// unset, the console is off. It takes the same tokens and roles as the gRPC API and TLS
    /// when the server has it; without tokens it is served only on a loopback address
    /// unless `[auth] insecure_allow_unauthenticated`.
    pub listen: Option<SocketAddr>,
    /// Names the console answers to besides its own address: `host` (any port) or
    /// `host:port`, e.g. the name a proxy or a DNS record gives it
    /// (`OPJOURNAL_CONSOLE__ALLOWED_HOSTS='["console.example.com"]'`). A request for any
    /// other `Host` is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Connections open at once; one more is accepted and closed.
    pub max_connections: usize,
    /// Connections open at once from one peer (an IPv4 address or an IPv6 /64).
    pub max_connections_per_peer: usize,
    /// Time the console waits for a request's line and headers.
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// Time the console waits for a request's whole body after its headers (408 past it).
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// Time after which a connection on which nothing moves is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Largest sign-in form, in bytes (413 past it, unread).
    pub sign_in_max_bytes: usize,
    /// Sign-in attempts one peer may make in a burst.
    pub sign_in_burst: u32,
    /// Sign-in attempts per minute per peer after its burst (429 with `Retry-After` past
    /// it).
    pub sign_in_per_minute: u32,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        let console = ConsoleLimits::default();
        Self {
            listen: None,
            allowed_hosts: Vec::new(),
            max_connections: console.max_connections,
            max_connections_per_peer: console.max_connections_per_peer,
            header_timeout: console.header_timeout,
            body_timeout: console.body_timeout,
            idle_timeout: console.idle_timeout,
            sign_in_max_bytes: console.sign_in_max_bytes,
            sign_in_burst: console.sign_in_burst,
            sign_in_per_minute: console.sign_in_per_minute,
        }
    }
}

impl ConsoleSettings {
    /// The console's limits and timeouts, and the names it answers to.
    pub fn limits(&self) -> ConsoleLimits {
        ConsoleLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            idle_timeout: self.idle_timeout,
            sign_in_max_bytes: self.sign_in_max_bytes,
            sign_in_burst: self.sign_in_burst,
            sign_in_per_minute: self.sign_in_per_minute,
            allowed_hosts: self.allowed_hosts.clone(),
        }
    }

    /// The limits; the console without tokens (`open`) lets anyone who reaches it resolve
    /// operations: only on loopback, unless `insecure` says otherwise.
    pub(super) fn validate(&self, open: bool, insecure: bool) -> Result<(), ConfigError> {
        for (name, value) in [
            ("console.header_timeout", self.header_timeout),
            ("console.body_timeout", self.body_timeout),
            ("console.idle_timeout", self.idle_timeout),
        ] {
            if value.is_zero() || value > MAX_TIMEOUT {
                return Err(ConfigError(format!(
                    "{name}: must be a duration above 0 and at most 1h"
                )));
            }
        }
        if self.max_connections == 0 || self.max_connections_per_peer == 0 {
            return Err(ConfigError(
                "console.max_connections, console.max_connections_per_peer: must be at least 1"
                    .into(),
            ));
        }
        if self.sign_in_burst == 0 || self.sign_in_per_minute == 0 {
            return Err(ConfigError(
                "console.sign_in_burst, console.sign_in_per_minute: must be at least 1".into(),
            ));
        }
        if !(MIN_CONSOLE_SIGN_IN_BYTES..=MAX_CONSOLE_SIGN_IN_BYTES)
            .contains(&self.sign_in_max_bytes)
        {
            return Err(ConfigError(format!(
                "console.sign_in_max_bytes: must be between {MIN_CONSOLE_SIGN_IN_BYTES} and \
                 {MAX_CONSOLE_SIGN_IN_BYTES}"
            )));
        }
        self.validate_hosts()?;
        match self.listen {
            Some(address) if open && !insecure && !address.ip().is_loopback() => {
                Err(ConfigError(format!(
                    "console.listen: {address} is reachable from other hosts and no tokens are \
                     configured: configure [[auth.tokens]] (reviewer or admin) or listen on a \
                     loopback address ([auth] insecure_allow_unauthenticated = true overrides)"
                )))
            }
            _ => Ok(()),
        }
    }

    fn validate_hosts(&self) -> Result<(), ConfigError> {
        for (i, host) in self.allowed_hosts.iter().enumerate() {
            let bad = host.trim().is_empty()
                || host
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '/' | '@' | '*' | ',' | '?' | '#'));
            if bad {
                return Err(ConfigError(format!(
                    "console.allowed_hosts[{i}]: a host name, or host:port (no scheme, path \
                     or wildcard)"
                )));
            }
        }
        Ok(())
    }
}
