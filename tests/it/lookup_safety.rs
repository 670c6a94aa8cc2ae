//! Lookups that cannot be misled, over real gRPC, Postgres and the sandbox provider: a
//! redirect is a failed lookup (and carries no credentials anywhere), a lookup asks about the
//! key the provider was called with in every namespace, an operation recorded under a
//! `kind: none` adapter is never looked up by a later file, and another route's "not found"
//! never releases an operation. In each, the provider's effect count stays 1.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::*;
use futures::StreamExt as _;
use opjournal::domain::policy::Policy;
use opjournal::proto::{Decision, OperationStatus};
use opjournal::reconcile::worker::{Worker, WorkerConfig};
use opjournal::reconcile::{AdapterSet, Reconciler};
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;

/// The requests an HTTP server received: path and headers, oldest first.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, HeaderMap)>>>);

impl Seen {
    fn requests(&self) -> Vec<(String, HeaderMap)> {
        self.0.lock().unwrap().clone()
    }
}

/// Serves `answer` for every request on a free loopback port, recording each request;
/// returns the origin (`http://127.0.0.1:PORT`).
async fn recording_server(
    seen: Seen,
    answer: impl Fn(&Uri) -> Response + Clone + Send + Sync + 'static,
) -> String {
    let router = Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let (seen, answer) = (seen.clone(), answer.clone());
        async move {
            seen.0
                .lock()
                .unwrap()
                .push((uri.path().to_owned(), headers));
            answer(&uri)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

/// The last path segment, percent-decoded: the key a by-key lookup asked about.
fn last_segment(uri: &Uri) -> String {
    let segment = uri.path().rsplit('/').next().unwrap_or_default();
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

/// A worker over `app`'s database and clock under the policy `yaml` (a later file than the
/// one the operations were registered under, when it differs).
fn worker_under(app: &TestApp, yaml: &str) -> Worker {
    let policy = Arc::new(Policy::parse(yaml, "later-policy.yaml").unwrap());
    let adapters = AdapterSet::from_policy(&policy).unwrap();
    let store = app.db.database().with_clock(app.clock.clone()).store();
    Worker::new(
        Reconciler::new(store, policy, adapters, "worker-a"),
        WorkerConfig {
            poll_interval: Duration::from_millis(100),
            claim_hold: Duration::from_secs(60),
            ..WorkerConfig::default()
        },
    )
}

/// The history's reasons for the default namespace's `key`, oldest first.
async fn history(app: &TestApp, key: &str) -> Vec<String> {
    app.reconciler
        .clone()
        .get_operation_history(opjournal::proto::GetOperationHistoryRequest {
            operation_key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
        .into_iter()
        .map(|event| event.reason)
        .collect()
}

/// What the last worker lookup of `key` in `namespace` saw and did, as recorded on the row
/// (`last_reason`; the history gets an entry when it changes).
async fn last_reason(app: &TestApp, namespace: &str, key: &str) -> String {
    let namespace = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    sqlx::query_scalar(
        "SELECT last_reason FROM agent_operations WHERE namespace = $1 AND operation_key = $2",
    )
    .bind(namespace)
    .bind(key)
    .fetch_one(app.pool())
    .await
    .unwrap()
}

/// The operation `key` of `namespace`.
async fn operation(app: &TestApp, namespace: &str, key: &str) -> opjournal::proto::Operation {
    app.journal
        .clone()
        .get_operation(opjournal::proto::GetOperationRequest {
            namespace: namespace.into(),
            operation_key: key.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap()
}

/// Begins a payment in `namespace`, pays at the sandbox with the provider key the Begin
/// named (the answer is lost after the payment is stored) and reports the outcome unknown.
/// Returns the provider key.
async fn lost_payment(app: &TestApp, namespace: &str, key: &str, action: &str) -> String {
    let begin = app
        .begin_in(namespace, key, action, PAY_817, 0)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    let provider_key = begin.operation.as_ref().unwrap().provider_key.clone();
    assert!(
        app.pay(&provider_key, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&begin.lease_token).await;
    assert_eq!(app.counts(&provider_key).effects, 1);
    provider_key
}

/// Begins `send_email` in `namespace`, sends the e-mail at the sandbox with the provider
/// key the Begin named (the answer is lost after it is sent) and reports the outcome
/// unknown. Returns the provider key.
async fn email_of_unknown_outcome(app: &TestApp, namespace: &str, key: &str) -> String {
    let begin = app
        .begin_in(namespace, key, "send_email", r#"{"case":"1"}"#, 0)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    let reference = begin.operation.as_ref().unwrap().provider_key.clone();
    assert_eq!(
        app.send_email(&reference, Some("commit-then-timeout"))
            .await,
        None
    );
    app.report_unknown(&begin.lease_token).await;
    reference
}

/// The payment lookup of the tests, at `url` (with `{provider_key}`), sending `X-Api-Key`
/// from the environment, declaring its search complete, with no grace window: a "not found"
/// it believed would release the operation at the first lookup.
fn payments_policy(url: &str) -> String {
    format!(
        r#"
actions:
  create_payment:
    reconcile:
      adapter: payments
      first_check_after_seconds: 0
      absence_grace_seconds: 0
    unknown_after_seconds: 600
adapters:
  payments:
    kind: http
    url: "{url}"
    headers:
      X-Api-Key: {{ env: PATH, prefix: "secret-" }}
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    response: {{ status_pointer: /status, succeeded_values: [succeeded], external_id_pointer: /id }}
"#
    )
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_redirect_to_another_origin_is_a_failed_lookup_and_carries_no_secret(pool: PgPool) {
    // Another origin whose "not found" matches the absence rule exactly, key included.
    let target_seen = Seen::default();
    let target = recording_server(target_seen.clone(), |uri| {
        let body = serde_json::json!({"error": "not_found", "idempotency_key": last_segment(uri)});
        (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
    })
    .await;
    // The configured origin answers every lookup with a redirect there (a gateway, a moved
    // endpoint, a login page).
    let gateway_seen = Seen::default();
    let gateway = recording_server(gateway_seen.clone(), move |uri| {
        let location = format!("{target}{}", uri.path());
        (StatusCode::FOUND, [("location", location)]).into_response()
    })
    .await;
    let url = format!("{gateway}/v1/payments/by-idempotency-key/{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    let provider_key = lost_payment(&app, "", PAYMENT_KEY, "create_payment").await;

    let worker = app.worker("worker-a");
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.released), (1, 0), "{stats:?}");
    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op_status(&op), OperationStatus::Unknown);
    assert_eq!(
        last_reason(&app, "", PAYMENT_KEY).await,
        "lookup_failed:redirect_302"
    );
    // The history says what the lookup met, though the status stayed unknown.
    let first = history(&app, PAYMENT_KEY).await;
    assert_eq!(
        first.last().unwrap(),
        "lookup_failed:redirect_302",
        "{first:?}"
    );

    let again = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::VerificationRequired);
    assert_eq!(app.counts(&provider_key).effects, 1);
    assert_eq!(app.counts(&provider_key).requests, 1);

    // Still redirected at the deadline: a person decides, and the history says why.
    app.clock.advance(Duration::from_secs(601));
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.escalated, stats.released), (1, 0), "{stats:?}");
    let history = history(&app, PAYMENT_KEY).await;
    assert_eq!(
        history.last().unwrap(),
        "lookup_failed:redirect_302; escalated:unresolved_after_deadline",
        "{history:?}"
    );
    // Every lookup in between met the same redirect: one entry for it, not one per lookup.
    let redirected = history
        .iter()
        .filter(|reason| *reason == "lookup_failed:redirect_302")
        .count();
    assert_eq!(redirected, 1, "{history:?}");
    let again = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::VerificationRequired);
    assert_eq!(app.counts(&provider_key).effects, 1);

    // The configured origin got the lookup with its credential; the redirect target got
    // nothing at all: no request, so no X-Api-Key and no Referer.
    let asked = gateway_seen.requests();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(
        asked[0].0,
        format!("/v1/payments/by-idempotency-key/{provider_key}").replace(':', "%3A")
    );
    for (_, headers) in &asked {
        assert!(
            headers
                .get("x-api-key")
                .is_some_and(|v| v.to_str().unwrap().starts_with("secret-"))
        );
        assert!(headers.get("referer").is_none());
    }
    let followed = target_seen.requests();
    assert!(
        followed
            .iter()
            .all(|(_, h)| h.get("x-api-key").is_none() && h.get("referer").is_none()),
        "{followed:?}"
    );
    assert!(
        followed.is_empty(),
        "the redirect was followed: {followed:?}"
    );
}

#[tokio::test]
async fn a_lookup_template_naming_another_key_is_refused_at_start_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    let name = file.display().to_string();
    for (template, reason) in [
        (
            "{operation_key}",
            "adapters.payments.url: {operation_key} names the journal's key, which is not the key the provider was called with",
        ),
        (
            "{external_id}",
            "adapters.payments.url: {external_id} asks about the provider's id",
        ),
        (
            "{namespace}",
            "adapters.payments.url: {namespace} is part of the provider key already",
        ),
    ] {
        let url = format!("http://127.0.0.1:9/v1/payments/by-idempotency-key/{template}");
        std::fs::write(&file, payments_policy(&url)).unwrap();
        for (binary, command) in [
            (env!("CARGO_BIN_EXE_opjournal"), vec!["check-config"]),
            (
                env!("CARGO_BIN_EXE_opjournal"),
                vec!["serve", "--listen", "127.0.0.1:0"],
            ),
            (env!("CARGO_BIN_EXE_opjournal-reconciler"), vec![]),
        ] {
            let output = tokio::process::Command::new(binary)
                .args(&command)
                .arg("--policy")
                .arg(&file)
                .kill_on_drop(true)
                .output();
            let output = tokio::time::timeout(Duration::from_secs(30), output)
                .await
                .expect("the process refused the file at once")
                .unwrap();
            assert!(!output.status.success(), "{binary} {command:?} {template}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            let expected = format!("{name}:12: {reason}");
            assert!(stderr.contains(&expected), "{expected}\n{stderr}");
        }
    }
}

#[tokio::test]
async fn check_config_prints_the_warnings_of_a_policy_it_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    let url = "http://127.0.0.1:9/v1/payments/by-idempotency-key/{provider_key}";
    std::fs::write(&file, payments_policy(url)).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "check-config",
            "--database-url",
            "postgres://postgres@127.0.0.1:9/x",
        ])
        .arg("--policy")
        .arg(&file)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let expected = format!(
        "warning: {}:7: actions.create_payment.reconcile.absence_grace_seconds: 0 lets the first",
        file.display()
    );
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_lookup_asks_about_the_provider_key_in_another_namespace_and_for_keys_with_a_slash(
    pool: PgPool,
) {
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        |sandbox| {
            payments_policy(&format!(
                "{sandbox}/v1/payments/by-idempotency-key/{{provider_key}}"
            ))
        },
        None,
    )
    .await;
    for (namespace, key, expected) in [
        ("t1", "payment:order-1", "t1/payment:order-1"),
        ("", "payment/a/b", "default/payment/a/b"),
    ] {
        let provider_key = lost_payment(&app, namespace, key, "create_payment").await;
        assert_eq!(provider_key, expected);
        // Nothing was ever paid under the journal's own key.
        assert_eq!(app.counts(key).requests, 0);
    }
    let stats = app.worker("worker-a").tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.settled), (2, 2), "{stats:?}");
    for (namespace, key, provider_key) in [
        ("t1", "payment:order-1", "t1/payment:order-1"),
        ("", "payment/a/b", "default/payment/a/b"),
    ] {
        let op = operation(&app, namespace, key).await;
        assert_eq!(op_status(&op), OperationStatus::Succeeded, "{key}");
        assert!(op.external_id.as_deref().unwrap().starts_with("pay_"));
        let counts = app.counts(provider_key);
        assert_eq!((counts.effects, counts.lookups), (1, 1), "{provider_key}");
        assert_eq!(app.counts(key).lookups, 0, "never asked about {key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operation_recorded_without_lookup_goes_to_review_whatever_a_later_file_names(
    pool: PgPool,
) {
    // The sent e-mails stay invisible to the provider's search: a lookup would read "not
    // found" and, believed, release the operation for a second e-mail.
    let config = SandboxConfig {
        lookup_lag: Duration::from_secs(3600),
        ..SandboxConfig::default()
    };
    let app = TestApp::spawn_with(pool, config, 0).await;
    // Later files: one names an http lookup for the action (the recorded `kind: none`
    // adapter is gone), the other redefines the recorded adapter itself as an http lookup.
    let lookup = |sandbox: &str, adapter: &str| {
        format!(
            r#"
actions:
  send_email:
    reconcile:
      adapter: {adapter}
      first_check_after_seconds: 0
      absence_grace_seconds: 0
adapters:
  {adapter}:
    kind: http
    url: "{sandbox}/v1/emails/by-reference/{{provider_key}}"
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /external_reference }}
    response: {{ status_pointer: /status, succeeded_values: [sent] }}
"#
        )
    };
    for (round, adapter) in ["email_lookup", "email_no_lookup"].into_iter().enumerate() {
        // Registered under the test policy: send_email has the `kind: none` adapter.
        let keys = [
            ("t1", format!("email:case-{round}:confirm")),
            ("", format!("email:case-{round}:receipt")),
        ];
        let mut references = Vec::new();
        for (namespace, key) in &keys {
            references.push(email_of_unknown_outcome(&app, namespace, key).await);
        }
        // Past every grace window.
        app.clock.advance(Duration::from_secs(3600));

        let yaml = lookup(&app.sandbox_url, adapter);
        let stats = worker_under(&app, &yaml).tick().await.unwrap();
        assert_eq!(
            (stats.escalated, stats.released),
            (2, 0),
            "{adapter}: {stats:?}"
        );
        for ((namespace, key), reference) in keys.iter().zip(&references) {
            let op = operation(&app, namespace, key).await;
            assert_eq!(op_status(&op), OperationStatus::Unknown);
            assert_eq!(op.review_reason, "no_provider_lookup", "{key}");
            assert_eq!(op.reconcile_attempts, 0, "{key}");
            let again = app
                .begin_in(namespace, key, "send_email", r#"{"case":"1"}"#, 0)
                .await
                .unwrap();
            assert_eq!(decision(&again), Decision::VerificationRequired);
            let counts = app.counts(reference);
            assert_eq!((counts.effects, counts.lookups), (1, 0), "{reference}");
        }
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_by_id_routes_not_found_for_a_by_reference_key_never_releases(pool: PgPool) {
    // The lookup URL points at the provider's other route, by payment id: it answers an
    // honest 404 `not_found` for a key that is no id.
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        |sandbox| payments_policy(&format!("{sandbox}/v1/payments/{{provider_key}}")),
        None,
    )
    .await;
    let cases = [("t1", "payment:order-2"), ("", "payment/c/d")];
    let mut provider_keys = Vec::new();
    for (namespace, key) in cases {
        provider_keys.push(lost_payment(&app, namespace, key, "create_payment").await);
    }
    let worker = app.worker("worker-a");
    let stats = worker.tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.released), (2, 0), "{stats:?}");
    for ((namespace, key), provider_key) in cases.into_iter().zip(&provider_keys) {
        let op = operation(&app, namespace, key).await;
        assert_eq!(op_status(&op), OperationStatus::Unknown, "{key}");
        assert_eq!(
            last_reason(&app, namespace, key).await,
            "lookup_failed:absent_404_for_another_key"
        );
        let again = app
            .begin_in(namespace, key, "create_payment", PAY_817, 0)
            .await
            .unwrap();
        assert_eq!(decision(&again), Decision::VerificationRequired);
        assert_eq!(app.counts(provider_key).effects, 1);
    }

    // The same route with an absence rule that does not name the key is refused.
    let yaml = payments_policy(&format!("{}/v1/payments/{{provider_key}}", app.sandbox_url))
        .replace(", key_pointer: /idempotency_key", "");
    let error = Policy::parse(&yaml, "policy.yaml").unwrap_err().to_string();
    assert!(
        error.contains("adapters.payments.absent_match: key_pointer is required"),
        "{error}"
    );
}

/// Begins an operation in `namespace` and reports its outcome unknown without calling any
/// provider (the lookups of these tests go to a test server). Returns the provider key.
async fn lost_begin(app: &TestApp, namespace: &str, key: &str) -> String {
    let begin = app
        .begin_in(namespace, key, "create_payment", PAY_817, 0)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute, "{key}");
    app.report_unknown(&begin.lease_token).await;
    begin.operation.unwrap().provider_key
}

/// A test server's answer naming the key of the lookup at `key_pointer`'s member
/// `idempotency_key`: a provider's own "not found".
fn not_found_naming(key: impl Into<serde_json::Value>) -> Response {
    let body = serde_json::json!({"error": "not_found", "idempotency_key": key.into()});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

#[tokio::test]
async fn an_answer_that_says_the_request_was_not_served_can_never_mean_absent() {
    // An auth failure, a proxy's auth failure, a timeout or a rate limit says nothing about
    // the key (a store that hides what the caller may not list answers 403 for a missing and
    // an existing object alike); only "no such object" may.
    for status in [401, 403, 407, 408, 429] {
        let yaml =
            payments_policy("http://127.0.0.1:9/v1/payments/by-idempotency-key/{provider_key}")
                .replace(
                    "    timeout_seconds: 2\n",
                    &format!("    timeout_seconds: 2\n    absent_statuses: [404, {status}]\n"),
                );
        let error = Policy::parse(&yaml, "policy.yaml").unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "adapters.payments.absent_statuses: {status} cannot mean \"not found\""
            )),
            "{status}: {error}"
        );
    }
    for status in [404, 410] {
        let yaml =
            payments_policy("http://127.0.0.1:9/v1/payments/by-idempotency-key/{provider_key}")
                .replace(
                    "    timeout_seconds: 2\n",
                    &format!("    timeout_seconds: 2\n    absent_statuses: [{status}]\n"),
                );
        Policy::parse(&yaml, "policy.yaml").unwrap();
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_endless_answer_is_cut_off_at_the_size_limit(pool: PgPool) {
    // The lookup's origin streams a body without end, without Content-Length: a "not found"
    // naming the key and a found object, each padded forever.
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let origin = recording_server(Seen::default(), move |uri| {
        let key = last_segment(uri);
        let status = if key.contains("found") {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        let head = format!(
            r#"{{"error":"not_found","status":"succeeded","idempotency_key":"{key}","pad":""#
        );
        let counter = counter.clone();
        let chunks = futures::stream::iter([bytes::Bytes::from(head)])
            .chain(futures::stream::repeat(bytes::Bytes::from(vec![
                b'a';
                64 * 1024
            ])))
            .map(move |chunk| {
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                Ok::<_, std::io::Error>(chunk)
            });
        (status, axum::body::Body::from_stream(chunks)).into_response()
    })
    .await;
    let url = format!("{origin}/v1/payments/by-idempotency-key/{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    for key in ["payment:absent", "payment:found"] {
        lost_begin(&app, "", key).await;
    }
    let stats = tokio::time::timeout(Duration::from_secs(30), app.worker("worker-a").tick())
        .await
        .expect("the lookups ended")
        .unwrap();
    assert_eq!(
        (stats.looked_up, stats.released, stats.settled),
        (2, 0, 0),
        "{stats:?}"
    );
    for key in ["payment:absent", "payment:found"] {
        assert_eq!(op_status(&app.get(key).await), OperationStatus::Unknown);
        assert_eq!(
            last_reason(&app, "", key).await,
            "lookup_failed:response_too_large",
            "{key}"
        );
    }
    // Each lookup stopped reading soon after 1 MiB (socket buffers aside).
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 32 * 1024 * 1024, "{sent} bytes were sent");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_trickling_answer_is_cut_off_by_the_lookup_timeout(pool: PgPool) {
    // Headers at once, then one byte of a matching "not found" every 200 ms, forever.
    let origin = recording_server(Seen::default(), move |uri| {
        let key = last_segment(uri);
        let text = format!(r#"{{"error":"not_found","idempotency_key":"{key}"}}"#).repeat(1000);
        let bytes: Vec<bytes::Bytes> = text
            .into_bytes()
            .into_iter()
            .map(|b| bytes::Bytes::from(vec![b]))
            .collect();
        let chunks = futures::stream::iter(bytes).then(|chunk| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, std::io::Error>(chunk)
        });
        (StatusCode::NOT_FOUND, axum::body::Body::from_stream(chunks)).into_response()
    })
    .await;
    let url = format!("{origin}/v1/payments/by-idempotency-key/{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    lost_begin(&app, "", PAYMENT_KEY).await;
    let stats = tokio::time::timeout(Duration::from_secs(30), app.worker("worker-a").tick())
        .await
        .expect("the lookup ended")
        .unwrap();
    assert_eq!((stats.looked_up, stats.released), (1, 0), "{stats:?}");
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Unknown
    );
    assert_eq!(
        last_reason(&app, "", PAYMENT_KEY).await,
        "lookup_failed:timeout"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_proxy_named_by_the_environment_never_sees_a_lookup(pool: PgPool) {
    // A proxy from HTTP_PROXY/ALL_PROXY answers every request with a "not found" naming the
    // key it sees in the URL: believed, it would release the payment.
    let proxy_seen = Seen::default();
    let proxy = recording_server(proxy_seen.clone(), |uri| {
        not_found_naming(last_segment(uri))
    })
    .await;
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        |sandbox| {
            payments_policy(&format!(
                "{sandbox}/v1/payments/by-idempotency-key/{{provider_key}}"
            ))
        },
        None,
    )
    .await;
    let provider_key = lost_payment(&app, "", PAYMENT_KEY, "create_payment").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, &app.policy_yaml).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal-reconciler"));
    for name in ["NO_PROXY", "no_proxy", "REQUEST_METHOD"] {
        command.env_remove(name);
    }
    for name in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        command.env(name, &proxy);
    }
    let output = command
        .args([
            "--once",
            "--health-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--database-url")
        .arg(app.database_url())
        .arg("--policy")
        .arg(&file)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("the reconciler ran once")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("looked_up=1 settled=1 released=0"),
        "{stdout}"
    );
    assert!(
        proxy_seen.requests().is_empty(),
        "{:?}",
        proxy_seen.requests()
    );
    let op = app.get(PAYMENT_KEY).await;
    assert_eq!(op_status(&op), OperationStatus::Succeeded);
    let counts = app.counts(&provider_key);
    assert_eq!((counts.effects, counts.lookups), (1, 1));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn answers_that_do_not_name_the_key_exactly_prove_nothing(pool: PgPool) {
    // Each key makes the lookup's origin answer one way; none of them is the provider's own
    // "no such object" about that key.
    let origin = recording_server(Seen::default(), |uri| {
        let key = last_segment(uri);
        let html = |status| {
            (
                status,
                [("content-type", "text/html")],
                "<html><form action=/login>Sign in</form></html>",
            )
                .into_response()
        };
        let json = |status, body: serde_json::Value| (status, axum::Json(body)).into_response();
        match key.rsplit(':').next().unwrap() {
            "upper" => not_found_naming(key.to_uppercase()),
            "space" => not_found_naming(format!(" {key} ")),
            "prefix" => not_found_naming(key[..key.len() - 1].to_owned()),
            "12345" => not_found_naming(12345),
            "array" => not_found_naming(serde_json::json!([key])),
            "field" => json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "not_found", "key": key}),
            ),
            "nested" => json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "not_found", "data": {"idempotency_key": key}}),
            ),
            "value-case" => json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "NOT_FOUND", "idempotency_key": key}),
            ),
            "html-404" => html(StatusCode::NOT_FOUND),
            "login" => html(StatusCode::OK),
            "empty" => StatusCode::OK.into_response(),
            "no-content" => StatusCode::NO_CONTENT.into_response(),
            "null" => json(StatusCode::OK, serde_json::Value::Null),
            "list" => json(StatusCode::OK, serde_json::json!([{"status": "succeeded"}])),
            "gone-elsewhere" => json(
                StatusCode::GONE,
                serde_json::json!({"error": "not_found", "idempotency_key": key}),
            ),
            status @ ("301" | "303" | "307" | "308") => (
                StatusCode::from_u16(status.parse().unwrap()).unwrap(),
                [("location", uri.path().to_owned())],
            )
                .into_response(),
            other => panic!("no answer for {other}"),
        }
    })
    .await;
    let url = format!("{origin}/v1/payments/by-idempotency-key/{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    let cases = [
        ("upper", "absent_404_for_another_key"),
        ("space", "absent_404_for_another_key"),
        ("prefix", "absent_404_for_another_key"),
        ("12345", "absent_404_for_another_key"),
        ("array", "absent_404_for_another_key"),
        ("field", "absent_404_for_another_key"),
        ("nested", "absent_404_for_another_key"),
        ("value-case", "unexpected_404"),
        ("html-404", "unexpected_404"),
        ("login", "response_not_json"),
        ("empty", "response_not_json"),
        ("no-content", "response_not_json"),
        ("null", "response_not_object"),
        ("list", "response_not_object"),
        ("gone-elsewhere", "http_410"),
        ("301", "redirect_301"),
        ("303", "redirect_303"),
        ("307", "redirect_307"),
        ("308", "redirect_308"),
    ];
    for (case, _) in cases {
        lost_begin(&app, "", &format!("payment:{case}")).await;
    }
    let stats = app.worker("worker-a").tick().await.unwrap();
    assert_eq!(
        (stats.looked_up, stats.released, stats.settled),
        (cases.len() as u64, 0, 0),
        "{stats:?}"
    );
    for (case, reason) in cases {
        let key = format!("payment:{case}");
        assert_eq!(
            op_status(&app.get(&key).await),
            OperationStatus::Unknown,
            "{key}"
        );
        assert_eq!(
            last_reason(&app, "", &key).await,
            format!("lookup_failed:{reason}")
        );
        let again = app.begin(&key, "create_payment", PAY_817).await.unwrap();
        assert_eq!(decision(&again), Decision::VerificationRequired, "{key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_key_of_any_characters_is_asked_about_whole_at_the_configured_path(pool: PgPool) {
    // The origin answers a found payment only for a request at the configured path prefix,
    // with exactly one more segment and no query; anything else is a 400.
    let seen = Seen::default();
    let origin = recording_server(seen.clone(), |uri| {
        let rest = uri.path().strip_prefix("/v1/payments/by-idempotency-key/");
        match rest {
            Some(segment) if !segment.contains('/') && uri.query().is_none() => {
                let body = serde_json::json!({
                    "id": "pay_1", "status": "succeeded", "idempotency_key": last_segment(uri),
                });
                (StatusCode::OK, axum::Json(body)).into_response()
            }
            _ => StatusCode::BAD_REQUEST.into_response(),
        }
    })
    .await;
    let url = format!("{origin}/v1/payments/by-idempotency-key/{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    let long = "k".repeat(200);
    let keys = [
        ("", "../../admin"),
        ("", "a/../b"),
        ("", "%2e%2e"),
        ("", "%2e%2e%2fadmin"),
        ("", "..%2F..%2Fadmin"),
        ("", "a?x=1&y=2"),
        ("", "a#frag"),
        ("", "@evil.example:443"),
        ("", "a\\..\\b"),
        ("", "ключ/é/😀"),
        ("", "a b+c"),
        ("", "..."),
        ("", long.as_str()),
        ("t1", ".."),
        ("t1", "http://evil.example/x"),
    ];
    let mut provider_keys = Vec::new();
    for (namespace, key) in keys {
        provider_keys.push(lost_begin(&app, namespace, key).await);
    }
    // "." and ".." alone would be dot segments: never requested.
    for key in [".", ".."] {
        lost_begin(&app, "", key).await;
    }
    let stats = app.worker("worker-a").tick().await.unwrap();
    assert_eq!(
        (stats.looked_up, stats.settled, stats.released),
        (keys.len() as u64 + 2, keys.len() as u64, 0),
        "{stats:?}"
    );
    for (namespace, key) in keys {
        let op = operation(&app, namespace, key).await;
        assert_eq!(op_status(&op), OperationStatus::Succeeded, "{key}");
    }
    for key in [".", ".."] {
        assert_eq!(
            last_reason(&app, "", key).await,
            "lookup_failed:not_addressable"
        );
    }
    let mut asked: Vec<String> = seen
        .requests()
        .into_iter()
        .map(|(path, _)| {
            let segment = path.rsplit('/').next().unwrap();
            percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .unwrap()
                .into_owned()
        })
        .collect();
    asked.sort();
    provider_keys.sort();
    assert_eq!(asked, provider_keys);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_found_object_about_another_key_settles_nothing(pool: PgPool) {
    // A wrong route (a list that ignores an unknown filter, a "latest" route) answers another
    // payment's object, succeeded or failed.
    let origin = recording_server(Seen::default(), |uri| {
        let key = last_segment(uri);
        let status = if key.ends_with("failed") {
            "failed"
        } else {
            "succeeded"
        };
        let body = serde_json::json!({
            "id": "pay_someone_else", "status": status, "idempotency_key": "payment:other",
        });
        (StatusCode::OK, axum::Json(body)).into_response()
    })
    .await;
    let url = format!("{origin}/v1/payments?idempotency_key={{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| {
            payments_policy(&url).replace(
                "external_id_pointer: /id }",
                "external_id_pointer: /id, failed_values: [failed], key_pointer: /idempotency_key }",
            )
        },
        None,
    )
    .await;
    for key in ["payment:succeeded", "payment:failed"] {
        lost_begin(&app, "", key).await;
    }
    let stats = app.worker("worker-a").tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.settled), (2, 0), "{stats:?}");
    for key in ["payment:succeeded", "payment:failed"] {
        let op = app.get(key).await;
        assert_eq!(op_status(&op), OperationStatus::Unknown, "{key}");
        assert!(op.external_id.is_none(), "{key}");
        assert_eq!(
            last_reason(&app, "", key).await,
            "lookup_failed:found_another_key"
        );
    }
    // Without the rule, a policy is warned about.
    let (_, warnings) = Policy::parse_with_warnings(
        &payments_policy("http://127.0.0.1:9/v1/payments/by-idempotency-key/{provider_key}"),
        "policy.yaml",
    )
    .unwrap();
    assert!(
        warnings
            .to_string()
            .contains("adapters.payments.response.key_pointer: is not set"),
        "{warnings}"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operation_recorded_before_kinds_were_kept_is_never_released_by_a_later_lookup(
    pool: PgPool,
) {
    // E-mails the provider's search does not show yet: a lookup reads "not found".
    let config = SandboxConfig {
        lookup_lag: Duration::from_secs(3600),
        ..SandboxConfig::default()
    };
    let app = TestApp::spawn_with(pool, config, 0).await;
    let mut references = Vec::new();
    for key in ["email:legacy:1", "email:legacy:2"] {
        references.push(email_of_unknown_outcome(&app, "", key).await);
    }
    // Recorded the way the journal recorded entries before it kept adapter kinds.
    let updated = sqlx::query(
        "UPDATE agent_operations SET action_policy = action_policy #- '{reconcile,adapter_kind}', \
         review_required_at = NULL, review_reason = NULL, next_check_at = now() \
         WHERE action_type = 'send_email'",
    )
    .execute(app.pool())
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(updated, 2);
    app.clock.advance(Duration::from_secs(3600));

    // A later file redefines the recorded `kind: none` adapter, same name, as a complete
    // lookup.
    let yaml = format!(
        r#"
actions:
  send_email:
    reconcile:
      adapter: email_no_lookup
      first_check_after_seconds: 0
      absence_grace_seconds: 0
adapters:
  email_no_lookup:
    kind: http
    url: "{}/v1/emails/by-reference/{{provider_key}}"
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /external_reference }}
    response: {{ status_pointer: /status, succeeded_values: [sent] }}
"#,
        app.sandbox_url
    );
    let stats = worker_under(&app, &yaml).tick().await.unwrap();
    assert_eq!(stats.released, 0, "{stats:?}");
    for (key, reference) in ["email:legacy:1", "email:legacy:2"]
        .into_iter()
        .zip(&references)
    {
        let op = app.get(key).await;
        assert_eq!(op_status(&op), OperationStatus::Unknown, "{key}");
        let again = app
            .begin(key, "send_email", r#"{"case":"1"}"#)
            .await
            .unwrap();
        assert_eq!(decision(&again), Decision::VerificationRequired);
        assert_eq!(app.counts(reference).effects, 1, "{reference}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn reconcile_operation_never_releases_an_operation_recorded_before_kinds_were_kept(
    pool: PgPool,
) {
    // The e-mails stay invisible to the provider's search: its "not found" names the
    // reference and matches the absence rule.
    let config = SandboxConfig {
        lookup_lag: Duration::from_secs(3600),
        ..SandboxConfig::default()
    };
    let app = TestApp::spawn_with_policy(
        pool,
        config,
        |sandbox| {
            format!(
                r#"
actions:
  send_email:
    reconcile:
      adapter: email_no_lookup
      first_check_after_seconds: 3600
      absence_grace_seconds: 0
adapters:
  email_no_lookup:
    kind: http
    url: "{sandbox}/v1/emails/by-reference/{{provider_key}}"
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /external_reference }}
    response: {{ status_pointer: /status, succeeded_values: [sent], key_pointer: /external_reference }}
"#
            )
        },
        None,
    )
    .await;
    let begin = app
        .begin("email:legacy:rpc", "send_email", r#"{"case":"1"}"#)
        .await
        .unwrap();
    let reference = begin.operation.as_ref().unwrap().provider_key.clone();
    assert_eq!(
        app.send_email(&reference, Some("commit-then-timeout"))
            .await,
        None
    );
    app.report_unknown(&begin.lease_token).await;
    // Recorded the way the journal recorded entries before it kept adapter kinds: the
    // adapter of that name may have been `kind: none` then.
    sqlx::query(
        "UPDATE agent_operations SET action_policy = action_policy #- '{reconcile,adapter_kind}'",
    )
    .execute(app.pool())
    .await
    .unwrap();

    // `opjournal reconcile` and the console's callers use this RPC.
    let report = app.reconcile("", "email:legacy:rpc").await.unwrap();
    let op = report.operation.unwrap();
    assert_eq!(op_status(&op), OperationStatus::Unknown);
    let again = app
        .begin("email:legacy:rpc", "send_email", r#"{"case":"1"}"#)
        .await
        .unwrap();
    assert_eq!(decision(&again), Decision::VerificationRequired);
    let counts = app.counts(&reference);
    assert_eq!((counts.effects, counts.lookups), (1, 1));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operation_recorded_without_lookup_goes_to_review_at_once_when_reported_unknown(
    pool: PgPool,
) {
    // Registered by a server whose file names the `kind: none` adapter `email_no_lookup` for
    // send_email, with a first check an hour after the outcome becomes unknown (a setting
    // that means nothing without a lookup).
    let before = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        |_| {
            "actions:\n  send_email:\n    reconcile:\n      adapter: email_no_lookup\n      \
             first_check_after_seconds: 3600\nadapters:\n  email_no_lookup:\n    kind: none\n"
                .to_owned()
        },
        None,
    )
    .await;
    let begin = before
        .begin("email:none:late", "send_email", r#"{"case":"1"}"#)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    // Reported unknown to a server whose file names an http lookup under that name.
    let options = SpawnOptions {
        policy: Some(Arc::new(|sandbox: &str| {
            format!(
                r#"
actions:
  send_email:
    reconcile:
      adapter: email_no_lookup
      first_check_after_seconds: 3600
adapters:
  email_no_lookup:
    kind: http
    url: "{sandbox}/v1/emails/by-reference/{{provider_key}}"
    response: {{ status_pointer: /status, succeeded_values: [sent], key_pointer: /external_reference }}
"#
            )
        })),
        ..SpawnOptions::default()
    };
    let after = TestApp::spawn_on(before.db.clone(), SandboxConfig::default(), 0, options).await;
    after.report_unknown(&begin.lease_token).await;
    // Due at once: the worker escalates it now, without looking it up.
    let stats = after.worker("worker-a").tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.escalated), (1, 1), "{stats:?}");
    let op = after.get("email:none:late").await;
    assert_eq!(op.review_reason, "no_provider_lookup");
    assert_eq!(after.counts(&op.provider_key).lookups, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn no_key_moves_the_lookup_off_the_configured_path(pool: PgPool) {
    // A template whose text before the key ends in "%2": the key "e." would complete "%2e."
    // into a dot segment, and the lookup would climb to the parent path.
    let seen = Seen::default();
    let origin = recording_server(seen.clone(), |uri| not_found_naming(last_segment(uri))).await;
    let url = format!("{origin}/v1/payments/by-idempotency-key/%2{{provider_key}}");
    let app = TestApp::spawn_with_policy(
        pool,
        SandboxConfig::default(),
        move |_| payments_policy(&url),
        None,
    )
    .await;
    for key in ["e.", "E.", "x"] {
        lost_begin(&app, "", key).await;
    }
    let stats = app.worker("worker-a").tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.released), (3, 0), "{stats:?}");
    for key in ["e.", "E."] {
        assert_eq!(
            last_reason(&app, "", key).await,
            "lookup_failed:not_addressable"
        );
    }
    let paths: Vec<String> = seen.requests().into_iter().map(|(path, _)| path).collect();
    assert_eq!(paths, ["/v1/payments/by-idempotency-key/%2x"]);
}
