//! Result sanitizing: only the fields an action's policy keeps are stored and replayed, the
//! deny-list (card numbers, CVV, tokens, passwords, secrets) is removed at any depth, results
//! have a size limit, and nothing of a payload or a result reaches the logs. Covers every way
//! a result enters the journal: CompleteOperation, a provider adapter (through the sandbox) and
//! a reviewer's ResolveOperation.

#![allow(clippy::unwrap_used, missing_docs)]

// A binary of its own (not a module of `it/`): it captures the logs of its whole process.
// It uses a part of the shared support module, whose other items are dead code here only.
#[allow(dead_code)]
#[path = "it/common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use common::*;
use opjournal::proto::{
    self, CompleteOperationRequest, Decision, ObservationOutcome, OperationStatus, ReconcileAction,
    ResolveOperationRequest, ResolveSucceeded, resolve_operation_request,
};
use opjournal_sandbox::SandboxConfig;
use serde_json::{Value, json};
use sqlx::PgPool;
use tonic::Code;

const CARD: &str = "4000056655665556";
const CVV: &str = "8531";
const ACCESS_TOKEN: &str = "at_Zx9Qm2Lr7Vb4Nc8Kp1Wd";
const PASSWORD: &str = "hunter2-Xq7";

/// Payment results keep five fields; `create_payment_small` stores at most 120 bytes. The
/// sandbox adapter has no `keep_fields`: `result.keep` decides.
fn policy(sandbox_url: &str) -> String {
    format!(
        r#"
defaults:
  result_deny_fields: [customer_email]
actions:
  create_payment:
    result:
      keep: [/id, /status, /amount_minor, /currency, /card]
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
  create_payment_small:
    result:
      keep: [/id, /status, /note, /order_id, /idempotency_key, /created_at]
      max_bytes: 120
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
  send_email:
    result:
      keep: [/id, /status, /delivery]
    reconcile:
      adapter: email_no_lookup
      first_check_after_seconds: 0
adapters:
  email_no_lookup:
    kind: none
  sandbox_payments:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    response:
      status_pointer: /status
      succeeded_values: [succeeded]
      external_id_pointer: /id
"#
    )
}

/// A payment as a careless client or provider would write it: card data and a token at the
/// top level and inside the kept `card` object, under several spellings.
fn payment_with_secrets(order: &str) -> Value {
    json!({
        "order_id": order,
        "amount_minor": 490000,
        "currency": "RUB",
        "card_number": CARD,
        "cvv": CVV,
        "access_token": ACCESS_TOKEN,
        "customer_email": "alice@example.com",
        "card": {"brand": "visa", "last4": "5556", "CVC": CVV, "Card-Number": CARD, "accessToken": ACCESS_TOKEN}
    })
}

/// The tracing output of this whole test process (the servers, the sandboxes and the clients
/// of every test in this file), at TRACE for every target, `log` records included.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

static LOGS: OnceLock<CapturedLogs> = OnceLock::new();

/// Starts capturing, once per process; every test here calls it first. A process-wide
/// subscriber, because a thread-local one can miss events whose call sites other threads
/// registered at the same time.
fn captured_logs() -> &'static CapturedLogs {
    LOGS.get_or_init(|| {
        use tracing_subscriber::util::SubscriberInitExt as _;
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
            .try_init()
            .unwrap();
        logs
    })
}

impl Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_no_secrets(place: &str, text: &str) {
    for secret in [CARD, ACCESS_TOKEN, PASSWORD, "alice@example.com"] {
        assert!(!text.contains(secret), "{secret} in {place}");
    }
    let cvv = regex::Regex::new(&format!(r"\b{CVV}\b")).unwrap();
    assert!(!cvv.is_match(text), "the CVV in {place}");
}

fn result_of(operation: &proto::Operation) -> Value {
    serde_json::from_str(operation.result_json.as_deref().unwrap()).unwrap()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_result_with_card_data_and_a_token_is_stored_and_replayed_with_only_the_kept_fields_and_never_logged(
    pool: PgPool,
) {
    let logs = captured_logs();
    let app =
        TestApp::spawn_with_policy(pool.clone(), SandboxConfig::default(), policy, None).await;

    // 1. The lease holder reports a result full of secrets.
    let payload = payment_with_secrets("817").to_string();
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", &payload)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    let mut reported = payment_with_secrets("817");
    reported["id"] = json!("pay_holder");
    reported["status"] = json!("succeeded");
    let done = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token.clone(),
            external_id: "pay_holder".into(),
            result_json: reported.to_string(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    let kept = json!({
        "id": "pay_holder",
        "status": "succeeded",
        "amount_minor": 490000,
        "currency": "RUB",
        "card": {"brand": "visa", "last4": "5556"}
    });
    assert_eq!(result_of(&done), kept);
    let replay = app
        .begin(PAYMENT_KEY, "create_payment", &payload)
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(result_of(replay.operation.as_ref().unwrap()), kept);

    // 2. The provider has the payment and echoes the secrets; the answer to the caller was
    //    lost, and the reconcile path finds the payment through the sandbox adapter.
    let key = "payment:order-818:intent-01";
    let payload = payment_with_secrets("818").to_string();
    let begin = app.begin(key, "create_payment", &payload).await.unwrap();
    let (status, payment) = app.pay(key, &payload, None).await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(payment["card_number"], CARD, "the provider echoes the card");
    app.report_unknown(&begin.lease_token).await;
    let reconciled = app.reconcile("", key).await.unwrap();
    assert_eq!(reconciled.action, ReconcileAction::MarkedSucceeded as i32);
    let kept = json!({
        "id": payment["id"],
        "status": "succeeded",
        "amount_minor": 490000,
        "currency": "RUB",
        "card": {"brand": "visa", "last4": "5556"}
    });
    assert_eq!(result_of(reconciled.operation.as_ref().unwrap()), kept);
    let replay = app.begin(key, "create_payment", &payload).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(result_of(replay.operation.as_ref().unwrap()), kept);
    assert_eq!(app.counts(key).effects, 1);

    // Neither the journal's tables nor anything logged by the servers, the sandboxes or the
    // clients so far (this test's and the others') holds a secret.
    assert_no_secrets("the journal's tables", &stored_text(&pool).await);
    let logged = logs.text();
    assert!(logged.contains("sandbox request"), "the logs were captured");
    assert!(logged.contains("TRACE"), "the logs were captured at TRACE");
    assert_no_secrets("the logs", &logged);
    for name in ["card_number", "access_token", "Card-Number", "\"cvv\""] {
        assert!(!logged.contains(name), "{name} in the logs");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_result_over_the_size_limit_is_refused_and_a_provider_result_over_it_is_a_failed_lookup(
    pool: PgPool,
) {
    captured_logs();
    let app = TestApp::spawn_with_policy(pool, SandboxConfig::default(), policy, None).await;
    let begin = app
        .begin(PAYMENT_KEY, "create_payment_small", PAY_817)
        .await
        .unwrap();
    let too_large = json!({"id": "pay_1", "note": "x".repeat(200), "password": PASSWORD});
    let err = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token.clone(),
            external_id: String::new(),
            result_json: too_large.to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(reason(&err), "RESULT_TOO_LARGE");
    assert_eq!(violated_field(&err), "result_json");
    assert!(!err.message().contains("xxxx") && !err.message().contains(PASSWORD));
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::InProgress,
        "nothing was recorded"
    );
    // Within the limit once the denied field is gone.
    let fits = json!({"id": "pay_1", "password": "p".repeat(500)});
    let done = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token,
            external_id: String::new(),
            result_json: fits.to_string(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(done.result_json.as_deref(), Some(r#"{"id":"pay_1"}"#));

    // The sandbox's payment, even with only the kept fields, is larger than 120 bytes.
    let key = "payment:order-819:intent-01";
    let payload = payment_with_secrets("819").to_string();
    let begin = app
        .begin(key, "create_payment_small", &payload)
        .await
        .unwrap();
    app.pay(key, &payload, None).await.unwrap();
    app.report_unknown(&begin.lease_token).await;
    let reconciled = app.reconcile("", key).await.unwrap();
    let observation = reconciled.observation.unwrap();
    assert_eq!(observation.outcome, ObservationOutcome::LookupFailed as i32);
    assert_eq!(observation.detail_code, "result_too_large");
    assert_eq!(reconciled.action, ReconcileAction::KeptUnknown as i32);
    let op = reconciled.operation.unwrap();
    assert_eq!(op_status(&op), OperationStatus::Unknown);
    assert_eq!(op.result_json, None);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_reviewers_result_is_sanitized_like_any_other(pool: PgPool) {
    captured_logs();
    let app = TestApp::spawn_with_policy(pool, SandboxConfig::default(), policy, None).await;
    let key = "email:case-442:confirmation-v1";
    let begin = app.begin(key, "send_email", "{}").await.unwrap();
    app.report_unknown(&begin.lease_token).await;
    let stats = app.worker("worker-1").tick().await.unwrap();
    assert_eq!(stats.escalated, 1, "no lookup: a person decides");
    let attempt = app.get(key).await.attempt_count;
    let resolved = app
        .reconciler
        .clone()
        .resolve_operation(ResolveOperationRequest {
            namespace: String::new(),
            operation_key: key.into(),
            expected_attempt_count: attempt,
            reviewer: "reviewer@ops".into(),
            reason: "found in the provider's console".into(),
            resolution: Some(resolve_operation_request::Resolution::Succeeded(
                ResolveSucceeded {
                    external_id: "em_1".into(),
                    result_json: json!({
                        "id": "em_1",
                        "status": "sent",
                        "to": "alice@example.com",
                        "delivery": {"relay": "mx1", "auth_token": ACCESS_TOKEN, "Password": PASSWORD}
                    })
                    .to_string(),
                },
            )),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(
        result_of(&resolved),
        json!({"id": "em_1", "status": "sent", "delivery": {"relay": "mx1"}})
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_result_follows_the_rules_its_operation_was_registered_under(pool: PgPool) {
    captured_logs();
    let before =
        TestApp::spawn_with_policy(pool.clone(), SandboxConfig::default(), policy, None).await;
    let begin = before
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    // The file changes: create_payment now keeps id and note.
    let keep_other = |url: &str| {
        policy(url).replacen(
            "keep: [/id, /status, /amount_minor, /currency, /card]",
            "keep: [/id, /note]",
            1,
        )
    };
    let after = TestApp::spawn_with_policy(pool, SandboxConfig::default(), keep_other, None).await;
    let done = after
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token,
            external_id: "pay_1".into(),
            result_json: json!({"id": "pay_1", "status": "succeeded", "note": "n"}).to_string(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(
        result_of(&done),
        json!({"id": "pay_1", "status": "succeeded"}),
        "the recorded result.keep applies, not today's"
    );
}
