//! The flat keys of the first configuration format (`max_in_flight_requests = 128` at the
//! top of the file, `OPJOURNAL_MAX_IN_FLIGHT_REQUESTS`), still read: each is moved to its
//! place in the sectioned form before the configuration is extracted, and reported once as
//! deprecated, naming the new key. Command-line flags use the same table, silently.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::ConfigError;

/// One flat key and where it lives now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// The old, flat key (`reconcile_poll_seconds`).
    pub old: &'static str,
    /// The section it moved to (`reconcile`).
    pub section: &'static str,
    /// Its name in the section (`poll_interval`).
    pub key: &'static str,
}

impl Moved {
    /// The notice for the key found in a file.
    pub fn in_file(&self) -> String {
        format!(
            "{} is deprecated: use [{}] {}",
            self.old, self.section, self.key
        )
    }

    /// The notice for the key found in the environment.
    pub fn in_environment(&self) -> String {
        format!(
            "{} is deprecated: use {}",
            legacy_variable(self.old),
            variable(self.section, self.key)
        )
    }
}

/// `OPJOURNAL_<SECTION>__<KEY>`, the environment variable of a sectioned key.
pub fn variable(section: &str, key: &str) -> String {
    format!(
        "OPJOURNAL_{}__{}",
        section.to_ascii_uppercase(),
        key.to_ascii_uppercase()
    )
}

/// `OPJOURNAL_<KEY>`, the environment variable of a flat key.
pub fn legacy_variable(old: &str) -> String {
    format!("OPJOURNAL_{}", old.to_ascii_uppercase())
}

const fn moved(old: &'static str, section: &'static str, key: &'static str) -> Moved {
    Moved { old, section, key }
}

/// Every flat key, in the order of the old documentation.
pub const MOVED: &[Moved] = &[
    moved("listen", "server", "listen"),
    moved("health_listen", "server", "health_listen"),
    moved("metrics_listen", "server", "metrics_listen"),
    moved("readiness_interval_seconds", "server", "readiness_interval"),
    moved("drain_delay_seconds", "server", "drain_delay"),
    moved("policy_file", "server", "policy_file"),
    moved("key_derivation_secret", "server", "key_derivation_secret"),
    moved("database_url", "database", "url"),
    moved("max_connections", "database", "max_connections"),
    moved("group_commit_lanes", "database", "group_commit_lanes"),
    moved("migrate_on_start", "database", "migrate_on_start"),
    moved(
        "insecure_allow_unauthenticated",
        "auth",
        "insecure_allow_unauthenticated",
    ),
    moved("tokens", "auth", "tokens"),
    moved("tokens_file", "auth", "tokens_file"),
    moved("max_message_bytes", "limits", "max_message_bytes"),
    moved("max_payload_bytes", "limits", "max_payload_bytes"),
    moved("max_result_bytes", "limits", "max_result_bytes"),
    moved("max_json_depth", "limits", "max_json_depth"),
    moved("max_page_size", "limits", "max_page_size"),
    moved("max_concurrent_streams", "limits", "max_concurrent_streams"),
    moved("max_header_list_bytes", "limits", "max_header_list_bytes"),
    moved("max_in_flight_requests", "limits", "max_in_flight_requests"),
    moved(
        "max_in_flight_requests_per_caller",
        "limits",
        "max_in_flight_requests_per_caller",
    ),
    moved("max_health_streams", "limits", "max_health_streams"),
    moved(
        "max_health_streams_per_peer",
        "limits",
        "max_health_streams_per_peer",
    ),
    moved("max_grpc_connections", "limits", "max_grpc_connections"),
    moved(
        "max_grpc_connections_per_peer",
        "limits",
        "max_grpc_connections_per_peer",
    ),
    moved(
        "first_request_timeout_seconds",
        "limits",
        "first_request_timeout",
    ),
    moved(
        "max_connection_idle_seconds",
        "limits",
        "max_connection_idle",
    ),
    moved(
        "request_body_timeout_seconds",
        "limits",
        "request_body_timeout",
    ),
    moved(
        "http2_keepalive_interval_seconds",
        "limits",
        "http2_keepalive_interval",
    ),
    moved(
        "http2_keepalive_timeout_seconds",
        "limits",
        "http2_keepalive_timeout",
    ),
    moved("max_connection_age_seconds", "limits", "max_connection_age"),
    moved(
        "max_connection_age_grace_seconds",
        "limits",
        "max_connection_age_grace",
    ),
    moved("tls_cert_file", "tls", "cert_file"),
    moved("tls_key_file", "tls", "key_file"),
    moved("tls_client_ca_file", "tls", "client_ca_file"),
    moved("tls_reload_seconds", "tls", "reload_interval"),
    moved("reconcile_poll_seconds", "reconcile", "poll_interval"),
    moved("reconcile_batch_size", "reconcile", "batch_size"),
    moved("reconcile_concurrency", "reconcile", "concurrency"),
    moved("reconcile_claim_hold_seconds", "reconcile", "claim_hold"),
    moved("reconciler_health_listen", "reconcile", "health_listen"),
    moved("reconciler_metrics_listen", "reconcile", "metrics_listen"),
    moved(
        "backlog_sample_seconds",
        "reconcile",
        "backlog_sample_interval",
    ),
    moved("purge_interval_seconds", "reconcile", "purge_interval"),
    moved("purge_batch_size", "reconcile", "purge_batch_size"),
    moved("webhook_url", "webhook", "url"),
    moved("webhook_secret", "webhook", "secret"),
    moved("webhook_timeout_seconds", "webhook", "timeout"),
    moved("webhook_claim_seconds", "webhook", "claim_hold"),
    moved("webhook_retry_base_seconds", "webhook", "retry_base"),
    moved("webhook_retry_cap_seconds", "webhook", "retry_cap"),
    moved("webhook_max_age_seconds", "webhook", "max_age"),
    moved("webhook_poll_seconds", "webhook", "poll_interval"),
    moved("webhook_batch_size", "webhook", "batch_size"),
    moved("console_listen", "console", "listen"),
    moved("console_allowed_hosts", "console", "allowed_hosts"),
    moved("console_max_connections", "console", "max_connections"),
    moved(
        "console_max_connections_per_peer",
        "console",
        "max_connections_per_peer",
    ),
    moved(
        "console_header_timeout_seconds",
        "console",
        "header_timeout",
    ),
    moved("console_body_timeout_seconds", "console", "body_timeout"),
    moved("console_idle_timeout_seconds", "console", "idle_timeout"),
    moved("console_sign_in_max_bytes", "console", "sign_in_max_bytes"),
    moved("console_sign_in_burst", "console", "sign_in_burst"),
    moved(
        "console_sign_in_per_minute",
        "console",
        "sign_in_per_minute",
    ),
    moved("log_format", "telemetry", "log_format"),
];

/// The flat key `old`, if it is one.
pub fn find(old: &str) -> Option<&'static Moved> {
    MOVED.iter().find(|m| m.old.eq_ignore_ascii_case(old))
}

/// A provider's data with its flat keys moved into their sections; its metadata (which
/// names the file or the environment in errors) is the provider's own.
pub struct Nested {
    metadata: Metadata,
    data: Map<Profile, Dict>,
}

impl Nested {
    /// `provider`'s data with the flat keys moved, and the keys that were moved, each once.
    ///
    /// Errors: the provider's own (a file that is not TOML).
    pub fn new(provider: &impl Provider) -> Result<(Self, Vec<&'static Moved>), ConfigError> {
        let mut data = provider.data().map_err(|e| ConfigError(e.to_string()))?;
        let mut found = Vec::new();
        for dict in data.values_mut() {
            for moved in nest(dict) {
                if !found.contains(&moved) {
                    found.push(moved);
                }
            }
        }
        let metadata = provider.metadata();
        Ok((Self { metadata, data }, found))
    }
}

impl Provider for Nested {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(self.data.clone())
    }
}

/// Moves every flat key of `dict` into its section; a key set both ways keeps the new
/// one's value.
fn nest(dict: &mut Dict) -> Vec<&'static Moved> {
    let mut found = Vec::new();
    for moved in MOVED {
        let Some(value) = dict.remove(moved.old) else {
            continue;
        };
        found.push(moved);
        let section = dict
            .entry(moved.section.to_owned())
            .or_insert_with(|| Value::from(Dict::new()));
        if let Value::Dict(_, section) = section {
            section.entry(moved.key.to_owned()).or_insert(value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flat_key_moves_to_a_distinct_place() {
        let mut seen = std::collections::BTreeSet::new();
        for moved in MOVED {
            assert!(
                seen.insert((moved.section, moved.key)),
                "{} and another key move to one place",
                moved.old
            );
            assert_eq!(find(moved.old), Some(moved));
        }
        assert_eq!(
            find("max_in_flight_requests")
                .map(Moved::in_file)
                .as_deref(),
            Some("max_in_flight_requests is deprecated: use [limits] max_in_flight_requests")
        );
        assert_eq!(
            find("database_url").map(Moved::in_environment).as_deref(),
            Some("OPJOURNAL_DATABASE_URL is deprecated: use OPJOURNAL_DATABASE__URL")
        );
    }
}
