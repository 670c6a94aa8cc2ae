//! Request hashing and input validation over gRPC: RFC 8785 canonical form, I-JSON refusals
//! with the JSON path named, and bad input that leaves no row behind.

use crate::common;

use common::*;
use opjournal::proto::{CompleteOperationRequest, Decision};
use sqlx::PgPool;
use tonic::Code;

async fn row_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_request_hash_is_sha256_of_the_rfc8785_form_of_action_and_payload(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app
        .begin(
            "k1",
            "create_payment",
            r#"{ "order_id": "817", "currency": "RUB", "amount_minor": 490000 }"#,
        )
        .await
        .unwrap();
    // printf '%s' '{"action_type":"create_payment","payload":{"amount_minor":490000,"currency":"RUB","order_id":"817"}}' | sha256sum
    assert_eq!(
        begin.operation.unwrap().request_hash,
        "6205d87db5ec4ef524cd0f7d5a30b37a957828d3cc5109c2b7fbf39416fe991f"
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn key_order_whitespace_and_number_spelling_do_not_change_the_hash(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app
        .begin("k-order", "create_payment", r#"{"a":1,"to":{"x":1,"y":2}}"#)
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token,
            external_id: "pay_1".into(),
            result_json: "{}".into(),
        })
        .await
        .unwrap();
    let replay = app
        .begin(
            "k-order",
            "create_payment",
            "{\n  \"to\": {\"y\": 2, \"x\": 1},\n  \"a\": 1.0\n}",
        )
        .await
        .unwrap();
    assert_eq!(decision(&replay), Decision::Replay);

    // Array order is significant.
    app.begin("k-array", "create_payment", r#"{"items":[1,2]}"#)
        .await
        .unwrap();
    let err = app
        .begin("k-array", "create_payment", r#"{"items":[2,1]}"#)
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::AlreadyExists, "IDEMPOTENCY_KEY_REUSED")
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn payloads_that_could_hash_alike_are_refused_with_their_json_path(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let cases = [
        (
            r#"{"ref":9007199254740993}"#,
            "/ref",
            "integer_out_of_range",
        ),
        (r#"{"a":1,"a":2}"#, "/a", "duplicate_member"),
        (r#"{"to":{"name":"\ud800"}}"#, "/to/name", "lone_surrogate"),
        (r#"{"n":1e400}"#, "/n", "non_finite_number"),
        (
            r#"{"n":1.00000000000000000001}"#,
            "/n",
            "number_not_representable",
        ),
        (r#"{"list":[1,2,NaN]}"#, "/list/2", "syntax"),
        (r#"[1,2]"#, "", "not_an_object"),
        ("not json", "", "syntax"),
    ];
    for (payload, pointer, rule) in cases {
        let err = app
            .begin("k-bad", "create_payment", payload)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{payload}");
        assert_eq!(reason(&err), "INVALID_PAYLOAD", "{payload}");
        assert_eq!(violated_field(&err), "payload_json");
        assert_eq!(json_pointer(&err), pointer, "{payload}");
        let info = tonic_types::StatusExt::get_details_error_info(&err).unwrap();
        assert_eq!(
            info.metadata.get("rule").map(String::as_str),
            Some(rule),
            "{payload}"
        );
    }
    assert_eq!(row_count(&app).await, 0, "refused input leaves no row");
    // The server keeps serving.
    let ok = app
        .begin("k-bad", "create_payment", r#"{"ref":"9007199254740993"}"#)
        .await
        .unwrap();
    assert_eq!(decision(&ok), Decision::Execute);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn malformed_keys_namespaces_and_action_types_are_invalid_arguments(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let long_key = "k".repeat(201);
    let cases: [(&str, &str, &str, &str); 6] = [
        ("", "", "create_payment", "operation_key"),
        ("", long_key.as_str(), "create_payment", "operation_key"),
        ("", "key\nwith-newline", "create_payment", "operation_key"),
        ("bad namespace!", "k", "create_payment", "namespace"),
        ("", "k", "", "action_type"),
        ("", "k", "create payment", "action_type"),
    ];
    for (namespace, key, action, field) in cases {
        let err = app
            .begin_in(namespace, key, action, "{}", 0)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert_eq!(violated_field(&err), field);
        assert!(!reason(&err).is_empty());
    }
    // 200 characters (not bytes) is the limit.
    let max_key = "ключ".repeat(50);
    assert_eq!(
        decision(&app.begin(&max_key, "create_payment", "{}").await.unwrap()),
        Decision::Execute
    );
    // An action type the policy does not know.
    let err = app.begin("k", "send_fax", "{}").await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "ACTION_TYPE_NOT_CONFIGURED")
    );
    assert_eq!(row_count(&app).await, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_result_that_is_not_strict_json_is_refused_and_the_lease_stays(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app.begin("k", "create_payment", "{}").await.unwrap();
    let err = app
        .journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token.clone(),
            external_id: "pay_1".into(),
            result_json: r#"{"id":1,"id":2}"#.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_RESULT")
    );
    assert_eq!(violated_field(&err), "result_json");
    let again = app.begin("k", "create_payment", "{}").await.unwrap();
    assert_eq!(decision(&again), Decision::InProgress);
}
