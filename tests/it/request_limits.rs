//! Request limits set from the configuration: payload and result size, JSON depth, page
//! size, and the largest message the transport decodes.

use crate::common;

use common::*;
use opjournal::config::Config;
use opjournal::proto::{self, CompleteOperationRequest, ListOperationsRequest};
use sqlx::PgPool;
use tonic::Code;

fn load(toml: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opjournal.toml");
    std::fs::write(&path, toml).unwrap();
    Config::load(Some(&path), serde_json::json!({})).map_err(|e| e.to_string())
}

const SMALL_LIMITS: &str = r#"
max_payload_bytes = 1024
max_result_bytes = 512
max_json_depth = 4
max_page_size = 2
max_message_bytes = 17408
"#;

async fn spawn_small(pool: PgPool) -> TestApp {
    let config = load(SMALL_LIMITS).unwrap();
    TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            limits: config.request_limits(),
            max_message_bytes: config.limits.max_message_bytes,
            ..SpawnOptions::default()
        },
    )
    .await
}

fn rule(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    status.get_details_error_info().unwrap().metadata["rule"].clone()
}

fn payload_of(bytes: usize) -> String {
    format!(r#"{{"note":"{}"}}"#, "x".repeat(bytes - 11))
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn configured_payload_result_and_depth_limits_are_enforced(pool: PgPool) {
    let app = spawn_small(pool).await;
    assert_eq!(payload_of(1024).len(), 1024);
    let at_limit = app.begin("k-1", "create_payment", &payload_of(1024)).await;
    assert!(at_limit.is_ok(), "{at_limit:?}");

    let too_large = app
        .begin("k-2", "create_payment", &payload_of(1025))
        .await
        .unwrap_err();
    assert_eq!(too_large.code(), Code::InvalidArgument);
    assert_eq!(reason(&too_large), "INVALID_PAYLOAD");
    assert_eq!(rule(&too_large), "too_large");

    let too_deep = app
        .begin("k-3", "create_payment", r#"{"a":{"b":{"c":{"d":{}}}}}"#)
        .await
        .unwrap_err();
    assert_eq!(reason(&too_deep), "INVALID_PAYLOAD");
    assert_eq!(rule(&too_deep), "too_deep");
    assert!(
        app.begin("k-4", "create_payment", r#"{"a":{"b":{"c":{}}}}"#)
            .await
            .is_ok()
    );

    let begun = app.begin("k-5", "create_payment", "{}").await.unwrap();
    let result = format!(r#""{}""#, "r".repeat(600));
    let refused = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begun.lease_token,
            external_id: "pay_5".into(),
            result_json: result,
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "INVALID_RESULT");
    assert_eq!(rule(&refused), "too_large");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn pages_never_exceed_the_configured_largest_page(pool: PgPool) {
    let app = spawn_small(pool).await;
    for i in 0..3 {
        app.begin(&format!("k-{i}"), "create_payment", "{}")
            .await
            .unwrap();
    }
    for page_size in [0, 100] {
        let page = app
            .journal
            .clone()
            .list_operations(ListOperationsRequest {
                page_size,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.operations.len(), 2, "page_size {page_size}");
        assert!(!page.next_page_token.is_empty());
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_message_over_the_limit_is_refused_before_the_journal_sees_it(pool: PgPool) {
    let app = spawn_small(pool).await;
    let refused = app
        .journal
        .clone()
        .begin_operation(proto::BeginOperationRequest {
            operation_key: "big".into(),
            action_type: "create_payment".into(),
            payload_json: payload_of(20_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert_eq!(app.rows_for("big").await, 0);
}

#[test]
fn limits_and_tls_settings_are_validated_naming_the_setting() {
    let cases = [
        (
            "max_message_bytes = 100000\nmax_payload_bytes = 200000",
            "max_message_bytes",
        ),
        ("max_json_depth = 0", "max_json_depth"),
        ("max_json_depth = 1000", "max_json_depth"),
        ("max_page_size = 0", "max_page_size"),
        ("max_result_bytes = 0", "max_result_bytes"),
        ("tls_cert_file = \"server.pem\"", "tls.key_file"),
        ("tls_key_file = \"server-key.pem\"", "tls.cert_file"),
        ("tls_client_ca_file = \"ca.pem\"", "tls.client_ca_file"),
    ];
    for (toml, setting) in cases {
        let error = load(toml).unwrap_err();
        assert!(error.contains(setting), "{toml}: {error}");
    }
    let config = load("").unwrap();
    let limits = config.request_limits();
    assert_eq!(
        (
            limits.max_payload_bytes,
            limits.max_result_bytes,
            limits.max_json_depth,
            limits.max_page_size,
            config.limits.max_message_bytes
        ),
        (256 * 1024, 64 * 1024, 32, 500, 1024 * 1024)
    );
}
