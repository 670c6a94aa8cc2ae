//! The configuration's loading and validation: the sectioned form, the old flat keys, and
//! what `check-config` prints.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;

fn load(toml: &str) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opjournal.toml");
    std::fs::write(&file, toml).unwrap();
    Config::load(Some(&file), serde_json::json!({}))
}

fn error(toml: &str) -> String {
    load(toml).unwrap_err().to_string()
}

/// A flat file of the first format, one key of every section, durations in seconds.
const FLAT: &str = r#"
listen = "127.0.0.1:50061"
database_url = "postgres://app:hunter2@db.internal:5432/journal"
max_connections = 7
drain_delay_seconds = 2.5
log_format = "json"
reconcile_poll_seconds = 0.5
reconciler_health_listen = "127.0.0.1:50062"
max_in_flight_requests = 9
max_connection_age_seconds = 0
tls_reload_seconds = 30
webhook_timeout_seconds = 5
console_listen = "127.0.0.1:8091"
console_body_timeout_seconds = 2.5
insecure_allow_unauthenticated = true
"#;

/// [`FLAT`] in the sectioned form.
const SECTIONED: &str = r#"
[server]
listen = "127.0.0.1:50061"
drain_delay = "2s 500ms"

[database]
url = "postgres://app:hunter2@db.internal:5432/journal"
max_connections = 7

[auth]
insecure_allow_unauthenticated = true

[limits]
max_in_flight_requests = 9
max_connection_age = "0s"

[tls]
reload_interval = "30s"

[reconcile]
poll_interval = "500ms"
health_listen = "127.0.0.1:50062"

[webhook]
timeout = "5s"

[console]
listen = "127.0.0.1:8091"
body_timeout = "2.5s"

[telemetry]
log_format = "json"
"#;

#[test]
fn an_old_flat_file_reads_as_the_sectioned_one_with_one_notice_per_key() {
    let flat = load(FLAT).unwrap();
    let sectioned = load(SECTIONED).unwrap();
    assert_eq!(flat.to_toml(), sectioned.to_toml());
    assert!(
        sectioned.deprecations().is_empty(),
        "{:?}",
        sectioned.deprecations()
    );
    let keys = FLAT.lines().filter(|l| l.contains(" = ")).count();
    assert_eq!(flat.deprecations().len(), keys, "{:?}", flat.deprecations());
    assert!(flat.deprecations().contains(
        &"max_in_flight_requests is deprecated: use [limits] max_in_flight_requests".to_owned()
    ));
    assert!(flat.deprecations().contains(
        &"reconcile_poll_seconds is deprecated: use [reconcile] poll_interval".to_owned()
    ));
    assert_eq!(flat.server.drain_delay, Duration::from_millis(2500));
    assert_eq!(flat.reconcile.poll_interval, Duration::from_millis(500));
    assert_eq!(flat.limits.transport_limits().max_connection_age, None);
    assert_eq!(flat.telemetry.log_format, LogFormat::Json);
}

#[test]
fn a_new_key_wins_over_its_old_flat_name_in_one_file() {
    let config = load("max_page_size = 10\n[limits]\nmax_page_size = 20\n").unwrap();
    assert_eq!(config.limits.max_page_size, 20);
    assert_eq!(config.deprecations().len(), 1);
}

#[test]
fn flags_use_the_flat_names_without_a_notice() {
    let config = Config::load(
        None,
        serde_json::json!({"listen": "127.0.0.1:1", "reconcile_poll_seconds": 0.25}),
    )
    .unwrap();
    assert_eq!(config.server.listen, SocketAddr::from(([127, 0, 0, 1], 1)));
    assert_eq!(config.reconcile.poll_interval, Duration::from_millis(250));
    assert!(config.deprecations().is_empty());
}

#[test]
fn check_config_prints_sections_and_no_secret() {
    let secret = "a-secret-of-at-least-thirty-two-bytes";
    let config = load(&format!(
        "{SECTIONED}[server]\nkey_derivation_secret = \"{secret}\"\n"
    ));
    // One section twice is not TOML; the secret goes into the existing section.
    assert!(config.is_err());
    let toml = SECTIONED.replace(
        "[server]\n",
        &format!("[server]\nkey_derivation_secret = \"{secret}\"\n"),
    );
    let config = load(&toml).unwrap();
    let printed = config.to_toml();
    for section in [
        "[server]",
        "[database]",
        "[auth]",
        "[limits]",
        "[tls]",
        "[reconcile]",
        "[webhook]",
        "[console]",
        "[telemetry]",
    ] {
        assert!(printed.contains(&format!("\n{section}\n")) || printed.starts_with(section));
    }
    assert!(printed.contains("drain_delay = \"2s 500ms\""), "{printed}");
    assert!(
        printed.contains("key_derivation_secret = \"[redacted]\""),
        "{printed}"
    );
    assert!(printed.contains("db.internal:5432/journal"), "{printed}");
    for shown in [printed, format!("{config:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains(secret), "{shown}");
    }
    // What it prints reads back to the same configuration (secrets aside).
    let again = load(
        &config
            .to_toml()
            .replace("\"[redacted]\"", "\"0123456789abcdef0123456789abcdef\""),
    );
    assert_eq!(
        again.unwrap().limits.transport_limits(),
        config.limits.transport_limits()
    );
}

#[test]
fn the_key_derivation_secret_is_read_and_never_printed() {
    let secret = "a-secret-of-at-least-thirty-two-bytes";
    let config = load(&format!("[server]\nkey_derivation_secret = \"{secret}\"\n")).unwrap();
    assert_eq!(
        config
            .server
            .key_derivation_secret
            .as_ref()
            .map(Secret::expose),
        Some(secret)
    );
    assert!(!format!("{config:?}").contains(secret));
    assert!(format!("{config:?}").contains("[redacted]"));
}

#[test]
fn a_webhook_needs_an_http_url_and_a_secret_from_the_environment_only() {
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let no_secret = error("[webhook]\nurl = \"https://hooks.example.com/t0ken\"\n");
    assert!(no_secret.contains("webhook.secret"), "{no_secret}");
    assert!(!no_secret.contains("t0ken"), "{no_secret}");
    // A secret in the file is not read.
    let in_file = format!("[webhook]\nurl = \"https://h.example/\"\nsecret = \"{secret}\"\n");
    assert!(error(&in_file).contains(WEBHOOK_SECRET_VARIABLE));
    let bad_url = error("[webhook]\nurl = \"ftp://h.example/t0ken\"\n");
    assert!(
        bad_url.starts_with("configuration: webhook.url"),
        "{bad_url}"
    );
    assert!(!bad_url.contains("t0ken"));
    let claim = error("[webhook]\ntimeout = \"40s\"\n");
    assert!(claim.contains("webhook.claim_hold"), "{claim}");
    let mut config = Config::default();
    config.webhook.url = Some(Secret::new("https://h.example/t0ken"));
    config.webhook.secret = Some(Secret::new(secret));
    config.validate().unwrap();
    assert!(!format!("{config:?}").contains(secret));
    assert!(!format!("{config:?}").contains("t0ken"));
    assert!(!config.to_toml().contains("t0ken"));
    config.webhook.secret = Some(Secret::new("whsec_c2hvcnQ="));
    let short = config.validate().unwrap_err().to_string();
    assert!(
        short.contains("32 bytes") && !short.contains("c2hvcnQ"),
        "{short}"
    );
}

#[test]
fn without_a_database_url_the_journal_is_an_embedded_file() {
    let config = load("").unwrap();
    assert_eq!(
        config.database.url.expose(),
        "sqlite://opjournal-data/journal.db"
    );
    assert_eq!(
        Backend::of_url(config.database.url.expose()),
        Some(Backend::Sqlite)
    );
}

#[test]
fn the_database_url_scheme_selects_the_backend_or_is_refused() {
    for (url, backend) in [
        ("postgres://u@h:5432/db", Backend::Postgres),
        ("postgresql://u@h/db", Backend::Postgres),
        ("sqlite:///var/lib/opjournal/journal.db", Backend::Sqlite),
        ("sqlite://data/journal.db", Backend::Sqlite),
    ] {
        let config = load(&format!("[database]\nurl = \"{url}\"\n")).unwrap();
        assert_eq!(
            Backend::of_url(config.database.url.expose()),
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
        let err = error(&format!("[database]\nurl = \"{url}\"\n"));
        assert!(err.contains("database.url"), "{err}");
        assert!(err.contains(says), "{url}: {err}");
        assert!(!err.contains("secret"), "{err}");
    }
}

#[test]
fn the_console_is_off_by_default_and_open_only_on_loopback_without_tokens() {
    assert_eq!(load("").unwrap().console.listen, None);
    let loopback = load("[console]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    assert_eq!(
        loopback.console.listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 0)))
    );
    let err = error("[console]\nlisten = \"0.0.0.0:8080\"\n");
    assert!(err.contains("console.listen"), "{err}");
    let allowed =
        "[console]\nlisten = \"0.0.0.0:8080\"\n[auth]\ninsecure_allow_unauthenticated = true\n";
    assert!(load(allowed).is_ok());
    let with_token = format!(
        "[console]\nlisten = \"0.0.0.0:8080\"\n[[auth.tokens]]\nname = \"alice\"\n\
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
        "[console]\nallowed_hosts = [\"console.example\", \"review.example:8443\"]\n\
         body_timeout = \"2500ms\"\nsign_in_per_minute = 3\n",
    )
    .unwrap()
    .console_limits();
    assert_eq!(set.allowed_hosts.len(), 2);
    assert_eq!(set.body_timeout, Duration::from_millis(2500));
    assert_eq!(set.sign_in_per_minute, 3);
    for (toml, setting) in [
        ("header_timeout = \"0s\"", "console.header_timeout"),
        ("idle_timeout = \"2h\"", "console.idle_timeout"),
        ("max_connections = 0", "console.max_connections"),
        ("sign_in_burst = 0", "console.sign_in_burst"),
        ("sign_in_max_bytes = 300000", "console.sign_in_max_bytes"),
        (
            "allowed_hosts = [\"https://console.example/\"]",
            "console.allowed_hosts[0]",
        ),
        (
            "allowed_hosts = [\"*.example\"]",
            "console.allowed_hosts[0]",
        ),
    ] {
        let err = error(&format!("[console]\n{toml}\n"));
        assert!(err.contains(setting), "{toml}: {err}");
    }
}

#[test]
fn an_unauthenticated_server_on_a_reachable_address_is_refused_unless_allowed() {
    let open = load("[server]\nlisten = \"0.0.0.0:50051\"\n").unwrap();
    let err = open.check_exposure().unwrap_err().to_string();
    for says in [
        "server.listen",
        "without authentication",
        "insecure_allow_unauthenticated",
    ] {
        assert!(err.contains(says), "{err}");
    }
    let allowed = load(
        "[server]\nlisten = \"0.0.0.0:50051\"\n[auth]\ninsecure_allow_unauthenticated = true\n",
    );
    allowed.unwrap().check_exposure().unwrap();
    let loopback = load("[server]\nlisten = \"[::1]:50051\"\n").unwrap();
    loopback.check_exposure().unwrap();
    let with_tokens = load(&format!(
        "[server]\nlisten = \"0.0.0.0:50051\"\n[[auth.tokens]]\nname = \"a\"\nsha256 = \"{}\"\n\
         namespaces = [\"*\"]\nroles = [\"client\"]\n",
        "ab".repeat(32)
    ));
    with_tokens.unwrap().check_exposure().unwrap();
}

#[test]
fn transport_limits_are_read_and_zero_turns_an_interval_off() {
    let config = load(
        "[limits]\nmax_concurrent_streams = 7\nmax_in_flight_requests = 9\n\
         max_connection_age = \"0s\"\nhttp2_keepalive_interval = 0\n",
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
        "max_connection_age = -1",
        "http2_keepalive_timeout = \"0s\"",
        "max_in_flight_requests_per_caller = 0",
        "max_health_streams = 0",
        "max_health_streams_per_peer = 0",
        "max_grpc_connections_per_peer = 0",
        "first_request_timeout = 0",
        "request_body_timeout = \"soon\"",
        "max_connection_idle = -1",
        "max_queue_wait = 0",
        "max_queued_requests = -1",
    ] {
        let err = error(&format!("[limits]\n{bad}\n"));
        let key = bad.split(' ').next().unwrap();
        assert!(err.contains(key), "{bad}: {err}");
    }
}

#[test]
fn connection_and_admission_limits_are_read() {
    let config = load(
        "[limits]\nmax_in_flight_requests_per_caller = 3\nmax_health_streams = 5\n\
         max_health_streams_per_peer = 2\nmax_grpc_connections_per_peer = 4\n\
         first_request_timeout = \"1.5s\"\nmax_connection_idle = \"0s\"\n\
         request_body_timeout = \"2s\"\nmax_queued_requests = 0\n\
         max_queue_wait = \"250ms\"\n",
    )
    .unwrap();
    let limits = config.transport_limits();
    assert_eq!(limits.max_queued_requests, 0);
    assert_eq!(limits.max_queue_wait, Duration::from_millis(250));
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
    let err = error("[server]\nkey_derivation_secret = \"short\"\n");
    assert!(err.contains("server.key_derivation_secret"), "{err}");
    assert!(!err.contains("short\""), "{err}");
}

#[test]
fn the_example_file_is_sectioned_and_valid() {
    let config = load(include_str!("../../config/opjournal.example.toml")).unwrap();
    assert!(
        config.deprecations().is_empty(),
        "{:?}",
        config.deprecations()
    );
    assert_eq!(config.webhook.max_age, Duration::from_secs(259_200));
    assert_eq!(config.transport_limits(), TransportLimits::default());
    assert_eq!(
        format!("{:?}", config.console_limits()),
        format!("{:?}", ConsoleLimits::default())
    );
}
