//! Opaque keys derived from an intent with a server secret, stable across calls, servers and
//! restarts.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{
    BeginOperationRequest, CompleteOperationRequest, Decision, DeriveOperationKeyRequest,
};
use opjournal::sandbox::SandboxConfig;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::Code;
use tonic::transport::Channel;

const SECRET: &str = "test-secret-0123456789abcdef0123456789";

/// Everything the journal's tables hold, as text.
async fn stored_text(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT string_agg(o::text, ' ') FROM agent_operations o), '') || ' ' || \
         coalesce((SELECT string_agg(e::text, ' ') FROM operation_events e), '')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
        ])
        .env("OPJOURNAL_KEY_DERIVATION_SECRET", secret)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server printed its address")
        .unwrap()
        .unwrap();
    assert!(line.contains("opjournal listening on"), "{line}");
    let address = line.rsplit(' ').next().unwrap().to_owned();
    (child, address)
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

async fn terminate(mut child: Child) {
    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("the server stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status}");
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
