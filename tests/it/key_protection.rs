//! Keys without personal data: keys that look like they hold an e-mail address, a card or
//! phone number or a token are refused before anything is written; per-action key patterns;
//! opaque keys derived from an intent with a server secret, stable across calls, servers and
//! restarts.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::terminate;
use common::*;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{
    BeginOperationRequest, CompleteOperationRequest, Decision, DeriveOperationKeyRequest,
};
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

const SECRET: &str = "test-secret-0123456789abcdef0123456789";

async fn table_rows(app: &TestApp) -> (i64, i64) {
    let operations = sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap();
    let events = sqlx::query_scalar("SELECT COUNT(*) FROM operation_events")
        .fetch_one(app.pool())
        .await
        .unwrap();
    (operations, events)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn keys_holding_an_email_a_card_number_or_a_token_are_refused_and_nothing_is_written(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    for (key, kind, value) in [
        (
            "pay:alice@example.com:1",
            "email_address",
            "alice@example.com",
        ),
        ("card:4111111111111111", "card_number", "4111111111111111"),
        ("tok:Bearer abc.def.ghi", "bearer_token", "abc.def.ghi"),
    ] {
        let err = app.begin(key, "create_payment", PAY_817).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{key}");
        assert_eq!(reason(&err), "KEY_CONTAINS_SENSITIVE_DATA", "{key}");
        assert_eq!(violated_field(&err), "operation_key");
        assert_eq!(err.get_details_error_info().unwrap().metadata["kind"], kind);
        let description = &err.get_details_bad_request().unwrap().field_violations[0].description;
        assert!(!err.message().contains(value), "{}", err.message());
        assert!(!description.contains(value), "{description}");
        assert_eq!(app.rows_for(key).await, 0, "{key}");
    }
    assert_eq!(table_rows(&app).await, (0, 0), "nothing was written");

    // The article's example keys are ordinary keys.
    for (key, action) in [
        ("payment:order-817:intent-01", "create_payment"),
        ("email:case-442:confirmation-v1", "send_email"),
        ("application:user-93:program-2026", "create_payment"),
    ] {
        let begin = app.begin(key, action, PAY_817).await.unwrap();
        assert_eq!(decision(&begin), Decision::Execute, "{key}");
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn keys_beginning_or_ending_with_whitespace_are_refused_and_nothing_is_written(pool: PgPool) {
    // A provider gets the key in an HTTP header, which is trimmed: it would record the effect
    // under another key than the one a reconcile lookup asks for, and "not found" would
    // wrongly prove absence.
    let app = TestApp::spawn(pool).await;
    for key in [
        "payment:order-990:intent-01 ",
        " payment:order-990:intent-01",
    ] {
        let err = app.begin(key, "create_payment", PAY_817).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{key:?}");
        assert_eq!(reason(&err), "INVALID_OPERATION_KEY", "{key:?}");
        assert_eq!(violated_field(&err), "operation_key");
        assert_eq!(app.rows_for(key).await, 0, "{key:?}");
    }
    assert_eq!(table_rows(&app).await, (0, 0), "nothing was written");
    let inner = app
        .begin("payment:order 990:intent-01", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&inner), Decision::Execute, "inner spaces are fine");
}

fn pattern_policy(sandbox_url: &str) -> String {
    format!(
        r#"
actions:
  create_payment:
    key_pattern: 'payment:order-[0-9]+:intent-[0-9]+'
  send_card:
    key_pattern: 'card:[0-9]+'
  send_email:
    key_pattern: '.*'
adapters:
  unused:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
"#
    )
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_key_pattern_refuses_keys_of_another_shape_and_never_admits_personal_data(pool: PgPool) {
    let app =
        TestApp::spawn_with_policy(pool, SandboxConfig::default(), pattern_policy, None).await;
    let ok = app
        .begin("payment:order-817:intent-01", "create_payment", PAY_817)
        .await
        .unwrap();
    assert_eq!(decision(&ok), Decision::Execute);
    for key in ["payment-817", "payment:order-817:intent-01:retry"] {
        let err = app.begin(key, "create_payment", PAY_817).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(reason(&err), "KEY_PATTERN_MISMATCH", "{key}");
        assert_eq!(violated_field(&err), "operation_key");
    }
    // A pattern that admits the shape still does not admit the data.
    for (key, action) in [
        ("card:4111111111111111", "send_card"),
        ("notify:bob@example.com", "send_email"),
    ] {
        let err = app.begin(key, action, PAY_817).await.unwrap_err();
        assert_eq!(reason(&err), "KEY_CONTAINS_SENSITIVE_DATA", "{key}");
    }
    assert_eq!(table_rows(&app).await.0, 1);
}

async fn derive(
    client: &mut OperationJournalClient<Channel>,
    namespace: &str,
    action: &str,
    reference: &str,
) -> Result<String, tonic::Status> {
    client
        .derive_operation_key(DeriveOperationKeyRequest {
            namespace: namespace.into(),
            action_type: action.into(),
            intent_reference: reference.into(),
        })
        .await
        .map(|r| r.into_inner().operation_key)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_derived_key_is_opaque_and_the_same_on_every_call_and_server_sharing_the_secret(
    pool: PgPool,
) {
    let spawn = |pool, secret| async move {
        TestApp::spawn_with_policy(
            pool,
            SandboxConfig::default(),
            |url| policy_yaml(url, 0),
            secret,
        )
        .await
    };
    let first = spawn(pool.clone(), Some(SECRET)).await;
    let second = spawn(pool.clone(), Some(SECRET)).await;
    let other_secret = spawn(pool.clone(), Some("another-secret-0123456789abcdef012345")).await;
    let without = spawn(pool.clone(), None).await;
    let reference = "alice@example.com/order-817/attempt-1";

    let key = derive(&mut first.journal.clone(), "", "create_payment", reference)
        .await
        .unwrap();
    assert!(key.starts_with("ok_") && key.len() == 55, "{key}");
    assert!(
        key[3..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
    );
    assert!(!key.contains("alice") && !key.contains("817"));
    for (app, namespace) in [(&first, ""), (&first, "default"), (&second, "")] {
        let again = derive(
            &mut app.journal.clone(),
            namespace,
            "create_payment",
            reference,
        )
        .await
        .unwrap();
        assert_eq!(again, key, "same secret, same intent, same key");
    }
    for (app, namespace, action, intent) in [
        (&other_secret, "", "create_payment", reference),
        (&first, "tenant-b", "create_payment", reference),
        (&first, "", "create_payment_dedup", reference),
        (
            &first,
            "",
            "create_payment",
            "alice@example.com/order-817/attempt-2",
        ),
    ] {
        let different = derive(&mut app.journal.clone(), namespace, action, intent)
            .await
            .unwrap();
        assert_ne!(different, key, "{namespace} {action} {intent}");
    }

    // The derived key registers like any key; business links go into references.
    let begin = first.begin(&key, "create_payment", PAY_817).await.unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    let seen_from_second = second.begin(&key, "create_payment", PAY_817).await.unwrap();
    assert_eq!(decision(&seen_from_second), Decision::InProgress);
    assert_eq!(
        begin.operation.unwrap().references["order_id"],
        "817",
        "the harness's Begin carries the business link in references"
    );
    let stored = stored_text(&pool).await;
    assert!(
        !stored.contains("alice"),
        "the intent reference is never stored"
    );

    let err = derive(
        &mut without.journal.clone(),
        "",
        "create_payment",
        reference,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "KEY_DERIVATION_DISABLED");
    let err = derive(&mut first.journal.clone(), "", "create_payment", "")
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_FIELD_LENGTH")
    );
    let err = derive(&mut first.journal.clone(), "", "send_fax", reference)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "ACTION_TYPE_NOT_CONFIGURED");
}

/// `opjournal serve` on `database_url` with `secret` in its environment and trace logging to
/// `log`; returns it with its address.
async fn serve(database_url: &str, secret: &str, log: &std::path::Path) -> (Child, String) {
    process::spawn_announcing(
        Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--database-url",
                database_url,
            ])
            .env("OPJOURNAL_SERVER__KEY_DERIVATION_SECRET", secret)
            .env("RUST_LOG", "trace")
            .stderr(Stdio::from(std::fs::File::create(log).unwrap())),
        "opjournal listening on",
    )
    .await
}

async fn connect(address: &str) -> OperationJournalClient<Channel> {
    let started = Instant::now();
    loop {
        match OperationJournalClient::connect(format!("http://{address}")).await {
            Ok(client) => return client,
            Err(e) if started.elapsed() > Duration::from_secs(15) => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn begin(client: &mut OperationJournalClient<Channel>, key: &str) -> (Decision, String) {
    let r = client
        .begin_operation(BeginOperationRequest {
            operation_key: key.into(),
            action_type: "create_payment".into(),
            payload_json: PAY_817.into(),
            references: [("order_id".to_owned(), "817".to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (Decision::try_from(r.decision).unwrap(), r.lease_token)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_derived_key_survives_a_server_restart_and_neither_secret_nor_reference_is_logged(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let dir = tempfile::tempdir().unwrap();
    let reference = "bob@example.com/order-4242/attempt-1";

    let first_log = dir.path().join("first.log");
    let (server, address) = serve(&app.database_url(), SECRET, &first_log).await;
    let mut client = connect(&address).await;
    let key = derive(&mut client, "", "create_payment", reference)
        .await
        .unwrap();
    assert_eq!(
        derive(&mut client, "", "create_payment", reference)
            .await
            .unwrap(),
        key
    );
    let (decided, token) = begin(&mut client, &key).await;
    assert_eq!(decided, Decision::Execute);
    client
        .complete_operation(CompleteOperationRequest {
            lease_token: token,
            external_id: "pay_4242".into(),
            result_json: r#"{"id":"pay_4242"}"#.into(),
        })
        .await
        .unwrap();
    terminate(server).await;

    let second_log = dir.path().join("second.log");
    let (server, address) = serve(&app.database_url(), SECRET, &second_log).await;
    let mut client = connect(&address).await;
    let after_restart = derive(&mut client, "", "create_payment", reference)
        .await
        .unwrap();
    assert_eq!(after_restart, key, "the same secret gives the same key");
    let (decided, _) = begin(&mut client, &after_restart).await;
    assert_eq!(
        decided,
        Decision::Replay,
        "the retry found the first outcome"
    );
    terminate(server).await;
    assert_eq!(app.rows_for(&key).await, 1);

    for log in [first_log, second_log] {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("opjournal serving gRPC"),
            "trace logs captured"
        );
        for secret in [SECRET, reference, "bob@example.com"] {
            assert!(!text.contains(secret), "{secret} in {}", log.display());
        }
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn only_a_client_of_the_namespace_may_derive_its_keys(pool: PgPool) {
    use sha2::Digest as _;
    let digest = |token: &str| hex::encode(sha2::Sha256::digest(token.as_bytes()));
    let toml = format!(
        r#"
[[tokens]]
name = "orchestrator-a"
sha256 = "{}"
namespaces = ["tenant-a"]
roles = ["client"]

[[tokens]]
name = "reviewer-a"
sha256 = "{}"
namespaces = ["tenant-a"]
roles = ["reviewer"]
"#,
        digest("tok-client-a"),
        digest("tok-reviewer-a")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opjournal.toml");
    std::fs::write(&file, toml).unwrap();
    let config = opjournal::config::Config::load(Some(&file), serde_json::json!({})).unwrap();
    let auth = opjournal::api::Authenticator::new(config.token_registry().unwrap());
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            auth,
            key_secret: Some(SECRET.to_owned()),
            ..SpawnOptions::default()
        },
    )
    .await;
    let request = |namespace: &str| DeriveOperationKeyRequest {
        namespace: namespace.into(),
        action_type: "create_payment".into(),
        intent_reference: "order-817".into(),
    };
    let key = app
        .journal_as("tok-client-a")
        .derive_operation_key(request("tenant-a"))
        .await
        .unwrap()
        .into_inner()
        .operation_key;
    assert!(key.starts_with("ok_"));
    for (token, namespace, code, expected) in [
        (
            Some("tok-client-a"),
            "tenant-b",
            Code::PermissionDenied,
            "NAMESPACE_NOT_ALLOWED",
        ),
        (
            Some("tok-reviewer-a"),
            "tenant-a",
            Code::PermissionDenied,
            "ROLE_NOT_ALLOWED",
        ),
        (
            None,
            "tenant-a",
            Code::Unauthenticated,
            "MISSING_CREDENTIALS",
        ),
    ] {
        let err = match token {
            Some(token) => app
                .journal_as(token)
                .derive_operation_key(request(namespace))
                .await
                .unwrap_err(),
            None => derive(&mut app.journal.clone(), namespace, "create_payment", "x")
                .await
                .unwrap_err(),
        };
        assert_eq!((err.code(), reason(&err)), (code, expected.to_owned()));
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn keys_registered_before_the_screening_or_the_pattern_still_get_their_answer(pool: PgPool) {
    // Registered before the screening existed: written straight into the store.
    let app = TestApp::spawn(pool.clone()).await;
    let old_key = "pay:alice@example.com:1";
    let begin = app
        .parts
        .journal
        .parse_begin("", "plain-key", "create_payment", PAY_817, 0, [])
        .unwrap();
    let record = app
        .parts
        .store
        .register(&opjournal::store::NewOperation {
            operation_key: opjournal::domain::model::OperationKey::parse(old_key).unwrap(),
            namespace: begin.namespace,
            action_type: begin.action_type,
            request_hash: begin.request_hash,
            references: Default::default(),
            lease: Duration::from_secs(30),
            lease_id: uuid::Uuid::new_v4(),
            attempt: None,
            action_policy: serde_json::json!({}),
            trace_context: None,
        })
        .await
        .unwrap();
    assert!(matches!(
        record,
        opjournal::store::Registration::Inserted(_)
    ));
    let retry = app.begin(old_key, "create_payment", PAY_817).await.unwrap();
    assert_eq!(
        decision(&retry),
        Decision::InProgress,
        "the old operation answers"
    );
    assert_eq!(app.get(old_key).await.attempt_count, 1);

    // Registered before the action got a key_pattern.
    let begin = app
        .begin("legacy-817", "create_payment", PAY_817)
        .await
        .unwrap();
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token,
            external_id: "pay_817".into(),
            result_json: r#"{"id":"pay_817"}"#.into(),
        })
        .await
        .unwrap();
    let with_pattern =
        TestApp::spawn_with_policy(pool, SandboxConfig::default(), pattern_policy, None).await;
    assert_eq!(
        with_pattern
            .begin_decision("legacy-817", "create_payment", PAY_817)
            .await,
        Decision::Replay
    );
    assert_eq!(
        with_pattern
            .begin_refusal("legacy-818", "create_payment", PAY_817)
            .await,
        "KEY_PATTERN_MISMATCH"
    );
}
