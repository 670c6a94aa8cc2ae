//! Runs a client library's own test suite (clients/python, clients/typescript) as a child
//! process against the harness's real server and sandbox, then lets the Rust test check the
//! journal rows and the provider's counts itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::TestApp;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `variable` if set, else `default` under the repository when it exists, else `fallback`.
pub fn tool(variable: &str, default: &str, fallback: &str) -> PathBuf {
    if let Ok(path) = std::env::var(variable) {
        return path.into();
    }
    let prepared = repo().join(default);
    if prepared.exists() {
        prepared
    } else {
        fallback.into()
    }
}

/// Runs `program args` in `dir` with `OPJOURNAL_TEST_SERVER` (host:port),
/// `OPJOURNAL_TEST_SANDBOX_URL` and `OPJOURNAL_TEST_TOKEN` (the token
/// [`spawn_with_client_token`] accepts) set for `app`, asserts that it exited 0, and returns its
/// standard output. `setup` names what prepares the program's environment.
pub async fn run_suite(
    app: &TestApp,
    program: &Path,
    args: &[&str],
    dir: &Path,
    setup: &str,
) -> String {
    let env = [
        ("OPJOURNAL_TEST_SERVER", app.addr.to_string()),
        ("OPJOURNAL_TEST_SANDBOX_URL", app.sandbox_url.clone()),
        ("OPJOURNAL_TEST_TOKEN", CLIENT_TOKEN.to_owned()),
    ];
    run_program(program, args, dir, &env, setup).await
}

/// Runs `program args` in `dir` with `env` added, within 300 s; asserts that it exited 0 and
/// returns its standard output. `setup` names what prepares the program's environment.
pub async fn run_program(
    program: &Path,
    args: &[&str],
    dir: &Path,
    env: &[(&str, String)],
    setup: &str,
) -> String {
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), child)
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in 300 s", program.display()))
        .unwrap_or_else(|error| panic!("cannot run {} ({error}); {setup}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{stderr}\n(environment: {setup})",
        program.display(),
        output.status
    );
    stdout
}

/// A journal row as the article's audit queries see it.
#[derive(Debug, PartialEq, Eq)]
pub struct Row {
    pub status: String,
    pub attempt_count: i32,
    pub external_id: Option<String>,
    pub error_code: Option<String>,
}

/// The row of `key` in the default namespace, or None.
pub async fn row(app: &TestApp, key: &str) -> Option<Row> {
    sqlx::query_as::<_, (String, i32, Option<String>, Option<String>)>(
        "SELECT status, attempt_count, external_id, error_code FROM agent_operations
         WHERE namespace = 'default' AND operation_key = $1",
    )
    .bind(key)
    .fetch_optional(app.pool())
    .await
    .unwrap()
    .map(|(status, attempt_count, external_id, error_code)| Row {
        status,
        attempt_count,
        external_id,
        error_code,
    })
}

/// The rows a client's lease suite leaves under `prefix` (`py`, `ts`): the stale holders'
/// reports were refused, so the stale-holder and taken-over keys were each completed by their
/// second holder, and the taken-over payment took effect once.
pub async fn check_stale_and_taken_over_leases(app: &TestApp, prefix: &str) {
    let stale = row(app, &format!("{prefix}:leases:stale-holder"))
        .await
        .unwrap();
    assert_eq!(
        (stale.status.as_str(), stale.attempt_count),
        ("succeeded", 2)
    );
    assert_ne!(stale.external_id.as_deref(), Some("pay_stale"));
    let taken = row(app, &format!("{prefix}:leases:taken-over"))
        .await
        .unwrap();
    assert_eq!(
        (taken.status.as_str(), taken.attempt_count),
        ("succeeded", 2)
    );
    let counts = app.counts(&format!("{prefix}:leases:taken-over"));
    assert_eq!((counts.requests, counts.effects), (2, 1));
}

/// The (from, to) statuses of `key`'s history, oldest first.
pub async fn transitions(app: &TestApp, key: &str) -> Vec<(Option<String>, String)> {
    sqlx::query_as(
        "SELECT from_status, to_status FROM operation_events
         WHERE namespace = 'default' AND operation_key = $1 ORDER BY event_id",
    )
    .bind(key)
    .fetch_all(app.pool())
    .await
    .unwrap()
}

/// Asserts that the operation `key` of the `default` namespace moved through exactly
/// `expected` (from, to) statuses, in order.
pub async fn assert_transitions(app: &TestApp, key: &str, expected: &[(Option<&str>, &str)]) {
    let history = transitions(app, key).await;
    let history: Vec<(Option<&str>, &str)> = history
        .iter()
        .map(|(from, to)| (from.as_deref(), to.as_str()))
        .collect();
    assert_eq!(history, expected, "{key}");
}

/// The bearer token the client suites' authentication tests send: a client of `tenant-a`.
pub const CLIENT_TOKEN: &str = "tok-clients.4d9e1f7a2b6c0835";

/// The app with bearer tokens on, knowing only [`CLIENT_TOKEN`] (by its SHA-256), as a
/// `client` of the namespace `tenant-a`.
pub async fn spawn_with_client_token(pool: sqlx::PgPool) -> TestApp {
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(CLIENT_TOKEN.as_bytes()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opjournal.toml");
    std::fs::write(
        &path,
        format!(
            "[[tokens]]\nname = \"orchestrator-a\"\nsha256 = \"{digest}\"\n\
             namespaces = [\"tenant-a\"]\nroles = [\"client\"]\n"
        ),
    )
    .unwrap();
    let config = opjournal::config::Config::load(Some(&path), serde_json::json!({})).unwrap();
    let auth = opjournal::api::Authenticator::new(config.token_registry().unwrap());
    assert!(auth.is_enabled());
    let options = super::SpawnOptions {
        auth,
        ..super::SpawnOptions::default()
    };
    TestApp::spawn_with_options(pool, options).await
}

/// What a client's auth test leaves behind (`{prefix}:auth:payment`): one succeeded row at
/// attempt 1 in `tenant-a`, none in `tenant-b`, one request and one effect at the sandbox.
pub async fn assert_paid_once_in_tenant_a(app: &TestApp, prefix: &str) {
    let key = format!("{prefix}:auth:payment");
    let done: (String, i32) = sqlx::query_as(
        "SELECT status, attempt_count FROM agent_operations
         WHERE namespace = 'tenant-a' AND operation_key = $1",
    )
    .bind(&key)
    .fetch_one(app.pool())
    .await
    .unwrap();
    assert_eq!(done, ("succeeded".to_owned(), 1));
    assert_eq!(app.rows_for(&key).await, 1, "nothing in tenant-b");
    let counts = app.counts(&format!("tenant-a/{key}"));
    assert_eq!((counts.requests, counts.effects), (1, 1));
}

/// What a client's outcomes suite (`{prefix}:outcomes:*` keys) must leave in the journal and
/// at the provider: a success, a confirmed decline with no effect, a 5xx settled by reconcile
/// and retried under the same key (attempt 2), one effect per paid key, a held duplicate
/// intent completed under its second key, and nothing written for a malformed payload.
pub async fn assert_outcomes_recorded(app: &TestApp, prefix: &str) {
    let key = |name: &str| format!("{prefix}:outcomes:{name}");
    assert_eq!(row(app, &key("success")).await.unwrap().status, "succeeded");
    assert_eq!(
        row(app, &key("declined")).await,
        Some(Row {
            status: "failed_final".into(),
            attempt_count: 1,
            external_id: None,
            error_code: Some("card_declined".into()),
        })
    );
    let retried = row(app, &key("unavailable")).await.unwrap();
    assert_eq!(
        (retried.status.as_str(), retried.attempt_count),
        ("succeeded", 2)
    );
    for name in ["success", "unavailable", "in-progress"] {
        assert_eq!(app.counts(&key(name)).effects, 1, "{name}");
    }
    assert_eq!(app.counts(&key("declined")).effects, 0);
    assert_eq!(row(app, &key("hold-2")).await.unwrap().status, "succeeded");
    assert_eq!(app.rows_for(&key("bad-json")).await, 0, "nothing written");
}
