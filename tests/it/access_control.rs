//! Namespaces isolate tenants, bearer tokens name a principal with namespaces and roles, over
//! real gRPC and Postgres. Every refusal is checked by its code and `ErrorInfo` reason.

use crate::common;

use common::*;
use opjournal::api::Authenticator;
use opjournal::config::Config;
use opjournal::proto::resolve_operation_request::Resolution;
use opjournal::proto::{
    self, CompleteOperationRequest, Decision, FailOperationRequest, GetOperationHistoryRequest,
    GetOperationRequest, ListOperationsForReviewRequest, ListOperationsRequest, OperationStatus,
    ReconcileOperationRequest, RenewLeaseRequest, ReportUnknownOutcomeRequest,
    ResolveOperationRequest,
};
use sha2::Digest as _;
use sqlx::PgPool;
use tonic::Code;

const TOKEN_A: &str = "tok-a.0f3c9d2e71b84a6f";
const TOKEN_B: &str = "tok-b.8e1d4c7a09b25f36";
const TOKEN_REVIEWER_A: &str = "tok-ra.5a7e2b9c14d06f83";
const TOKEN_REVIEWER_B: &str = "tok-rb.c3f81e6a2d9b4075";
const TOKEN_ADMIN: &str = "tok-admin.9b6d0e4f2a7c1358";

fn sha256(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The tokens as an operator writes them: a TOML file with digests only.
fn tokens_toml() -> String {
    let client = r#"["client"]"#;
    let reviewer = r#"["reviewer"]"#;
    [
        ("orchestrator-a", TOKEN_A, r#"["tenant-a"]"#, client),
        ("orchestrator-b", TOKEN_B, r#"["tenant-b"]"#, client),
        ("reviewer-a", TOKEN_REVIEWER_A, r#"["tenant-a"]"#, reviewer),
        ("reviewer-b", TOKEN_REVIEWER_B, r#"["tenant-b"]"#, reviewer),
        ("ops", TOKEN_ADMIN, r#"["*"]"#, r#"["admin"]"#),
    ]
    .map(|(name, token, namespaces, roles)| entry(name, &sha256(token), namespaces, roles))
    .concat()
}

fn load(toml: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opjournal.toml");
    std::fs::write(&path, toml).unwrap();
    Config::load(Some(&path), serde_json::json!({})).map_err(|e| e.to_string())
}

async fn spawn(pool: PgPool) -> TestApp {
    let config = load(&tokens_toml()).unwrap();
    let auth = Authenticator::new(config.token_registry().unwrap());
    assert!(auth.is_enabled());
    TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            auth,
            ..SpawnOptions::default()
        },
    )
    .await
}

fn begin_request(namespace: &str, key: &str, payload: &str) -> proto::BeginOperationRequest {
    proto::BeginOperationRequest {
        namespace: namespace.into(),
        operation_key: key.into(),
        action_type: "create_payment".into(),
        payload_json: payload.into(),
        ..Default::default()
    }
}

fn get_request(namespace: &str, key: &str) -> GetOperationRequest {
    GetOperationRequest {
        namespace: namespace.into(),
        operation_key: key.into(),
    }
}

fn list_request(namespace: &str) -> ListOperationsRequest {
    ListOperationsRequest {
        namespace: namespace.into(),
        ..Default::default()
    }
}

fn resolve_request(
    namespace: &str,
    key: &str,
    attempt: i32,
    reviewer: &str,
) -> ResolveOperationRequest {
    ResolveOperationRequest {
        namespace: namespace.into(),
        operation_key: key.into(),
        expected_attempt_count: attempt,
        reviewer: reviewer.into(),
        reason: "no charge at the provider (ticket 42)".into(),
        resolution: Some(Resolution::FailedFinal(proto::ResolveFailedFinal {
            error_code: "not_charged".into(),
        })),
    }
}

#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, why: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason(&status), why, "{status:?}");
}

#[track_caller]
fn namespace_denied<T: std::fmt::Debug>(result: Result<T, tonic::Status>) {
    assert_refused(result, Code::PermissionDenied, "NAMESPACE_NOT_ALLOWED");
}

#[track_caller]
fn role_denied<T: std::fmt::Debug>(result: Result<T, tonic::Status>) {
    assert_refused(result, Code::PermissionDenied, "ROLE_NOT_ALLOWED");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_same_key_in_two_tenants_is_two_operations(pool: PgPool) {
    let app = spawn(pool).await;
    let a = app
        .journal_as(TOKEN_A)
        .begin_operation(begin_request("tenant-a", "order-1", PAY_817))
        .await
        .unwrap()
        .into_inner();
    // Another payload under the same key is no conflict in another namespace.
    let b = app
        .journal_as(TOKEN_B)
        .begin_operation(begin_request("tenant-b", "order-1", PAY_817_OTHER_AMOUNT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&a), Decision::Execute);
    assert_eq!(decision(&b), Decision::Execute);
    let (a_op, b_op) = (a.operation.unwrap(), b.operation.unwrap());
    assert_ne!(a_op.request_hash, b_op.request_hash);
    assert_eq!(a_op.provider_key, "tenant-a/order-1");
    assert_eq!(b_op.provider_key, "tenant-b/order-1");
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT namespace, status FROM agent_operations WHERE operation_key = 'order-1' \
         ORDER BY namespace",
    )
    .fetch_all(app.pool())
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("tenant-a".to_owned(), "in_progress".to_owned()),
            ("tenant-b".to_owned(), "in_progress".to_owned())
        ]
    );

    // Each tenant lists only its own.
    for (token, namespace) in [(TOKEN_A, "tenant-a"), (TOKEN_B, "tenant-b")] {
        let listed = app
            .journal_as(token)
            .list_operations(list_request(namespace))
            .await
            .unwrap()
            .into_inner()
            .operations;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].namespace, namespace);
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn tenant_b_cannot_read_list_begin_or_complete_tenant_a_operations(pool: PgPool) {
    let app = spawn(pool).await;
    let a = app
        .journal_as(TOKEN_A)
        .begin_operation(begin_request("tenant-a", "order-1", PAY_817))
        .await
        .unwrap()
        .into_inner();
    let mut b = app.journal_as(TOKEN_B);

    namespace_denied(b.get_operation(get_request("tenant-a", "order-1")).await);
    // A missing key answers the same: B cannot even learn what A has.
    namespace_denied(
        b.get_operation(get_request("tenant-a", "no-such-key"))
            .await,
    );
    namespace_denied(b.list_operations(list_request("tenant-a")).await);
    namespace_denied(b.list_operations(list_request("")).await);
    namespace_denied(
        b.begin_operation(begin_request("tenant-a", "order-1", PAY_817))
            .await,
    );

    // A's lease token names tenant-a inside it, so B's token cannot report with it.
    let token = a.lease_token.clone();
    namespace_denied(
        b.complete_operation(CompleteOperationRequest {
            lease_token: token.clone(),
            external_id: "pay_forged".into(),
            result_json: "{}".into(),
        })
        .await,
    );
    namespace_denied(
        b.fail_operation(FailOperationRequest {
            lease_token: token.clone(),
            error_code: "card_declined".into(),
        })
        .await,
    );
    namespace_denied(
        b.report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: token.clone(),
            error_code: "timeout".into(),
        })
        .await,
    );
    namespace_denied(
        b.renew_lease(RenewLeaseRequest {
            lease_token: token.clone(),
            lease_seconds: 60,
        })
        .await,
    );

    // Nothing changed: A still holds its lease and completes with it.
    let mut a_client = app.journal_as(TOKEN_A);
    let op = a_client
        .get_operation(get_request("tenant-a", "order-1"))
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(op_status(&op), OperationStatus::InProgress);
    assert_eq!(op.attempt_count, 1);
    let done = a_client
        .complete_operation(CompleteOperationRequest {
            lease_token: token,
            external_id: "pay_1".into(),
            result_json: "{}".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(op_status(&done), OperationStatus::Succeeded);
    assert_eq!(done.external_id.as_deref(), Some("pay_1"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn only_a_reviewer_of_the_tenant_resolves_and_the_history_names_it(pool: PgPool) {
    let app = spawn(pool).await;
    let mut a = app.journal_as(TOKEN_A);
    let begun = a
        .begin_operation(begin_request("tenant-a", "order-1", PAY_817))
        .await
        .unwrap()
        .into_inner();
    a.report_unknown_outcome(ReportUnknownOutcomeRequest {
        lease_token: begun.lease_token,
        error_code: "timeout".into(),
    })
    .await
    .unwrap();

    // A client token cannot resolve, nor reach the reviewer's or admin's RPCs.
    let mut as_client = app.reconciler_as(TOKEN_A);
    role_denied(
        as_client
            .resolve_operation(resolve_request("tenant-a", "order-1", 1, ""))
            .await,
    );
    role_denied(
        as_client
            .get_operation_history(GetOperationHistoryRequest {
                namespace: "tenant-a".into(),
                operation_key: "order-1".into(),
                ..Default::default()
            })
            .await,
    );
    role_denied(
        as_client
            .list_operations_for_review(ListOperationsForReviewRequest {
                namespace: "tenant-a".into(),
                ..Default::default()
            })
            .await,
    );
    role_denied(
        as_client
            .reconcile_operation(ReconcileOperationRequest {
                namespace: "tenant-a".into(),
                operation_key: "order-1".into(),
            })
            .await,
    );
    // A reviewer cannot act as an orchestrator.
    role_denied(
        app.journal_as(TOKEN_REVIEWER_A)
            .begin_operation(begin_request("tenant-a", "order-2", PAY_817))
            .await,
    );

    // Tenant B's reviewer cannot resolve A's operation.
    assert_refused(
        app.reconciler_as(TOKEN_REVIEWER_B)
            .resolve_operation(resolve_request("tenant-a", "order-1", 1, ""))
            .await,
        Code::PermissionDenied,
        "NAMESPACE_NOT_ALLOWED",
    );
    // A's reviewer cannot sign as someone else.
    let mut reviewer = app.reconciler_as(TOKEN_REVIEWER_A);
    assert_refused(
        reviewer
            .resolve_operation(resolve_request("tenant-a", "order-1", 1, "someone-else"))
            .await,
        Code::PermissionDenied,
        "REVIEWER_MISMATCH",
    );
    let still = app
        .journal_as(TOKEN_REVIEWER_A)
        .get_operation(get_request("tenant-a", "order-1"))
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(op_status(&still), OperationStatus::Unknown);

    // A's reviewer resolves; the history records the token's name as the reviewer.
    let resolved = reviewer
        .resolve_operation(resolve_request("tenant-a", "order-1", 1, ""))
        .await
        .unwrap()
        .into_inner()
        .operation
        .unwrap();
    assert_eq!(op_status(&resolved), OperationStatus::FailedFinal);
    let events = reviewer
        .get_operation_history(GetOperationHistoryRequest {
            namespace: "tenant-a".into(),
            operation_key: "order-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let last = events.last().unwrap();
    assert_eq!(last.actor, "reviewer-a");
    assert_eq!(
        proto::ActorKind::try_from(last.actor_kind).unwrap(),
        proto::ActorKind::Reviewer
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_admin_token_reaches_every_rpc_in_every_namespace(pool: PgPool) {
    let app = spawn(pool).await;
    let mut journal = app.journal_as(TOKEN_ADMIN);
    let begun = journal
        .begin_operation(begin_request("tenant-b", "order-9", PAY_817))
        .await
        .unwrap()
        .into_inner();
    journal
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: begun.lease_token,
            error_code: "timeout".into(),
        })
        .await
        .unwrap();
    // The sandbox never saw the payment, and its search is complete: released for retry.
    let reconciled = app
        .reconciler_as(TOKEN_ADMIN)
        .reconcile_operation(ReconcileOperationRequest {
            namespace: "tenant-b".into(),
            operation_key: "order-9".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        op_status(reconciled.operation.as_ref().unwrap()),
        OperationStatus::Pending
    );
    app.reconciler_as(TOKEN_ADMIN)
        .list_operations_for_review(ListOperationsForReviewRequest {
            namespace: "tenant-a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_missing_or_wrong_token_is_unauthenticated(pool: PgPool) {
    let app = spawn(pool).await;
    // The harness's own clients send no token.
    assert_refused(
        app.journal
            .clone()
            .get_operation(get_request("tenant-a", "order-1"))
            .await,
        Code::Unauthenticated,
        "MISSING_CREDENTIALS",
    );
    assert_refused(
        app.reconciler
            .clone()
            .list_operations_for_review(ListOperationsForReviewRequest::default())
            .await,
        Code::Unauthenticated,
        "MISSING_CREDENTIALS",
    );
    // An unknown token, and the configured digest presented as if it were the token.
    for wrong in ["tok-a.0f3c9d2e71b84a6e", &sha256(TOKEN_A)] {
        assert_refused(
            app.journal_as(wrong)
                .get_operation(get_request("tenant-a", "order-1"))
                .await,
            Code::Unauthenticated,
            "INVALID_CREDENTIALS",
        );
    }
    // Malformed headers.
    for header in [
        "Basic b3JjaGVzdHJhdG9yOmE=",
        "Bearer",
        TOKEN_A,
        "Bearer a b",
    ] {
        let mut request = tonic::Request::new(get_request("tenant-a", "order-1"));
        request
            .metadata_mut()
            .insert("authorization", header.parse().unwrap());
        assert_refused(
            app.journal.clone().get_operation(request).await,
            Code::Unauthenticated,
            "INVALID_CREDENTIALS",
        );
    }
    // Nothing was registered by any of these calls.
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn health_and_reflection_need_no_token(pool: PgPool) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1;
    let app = spawn(pool).await;
    let health = HealthClient::new(app.channel.clone())
        .check(HealthCheckRequest {
            service: "liveness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = v1::server_reflection_client::ServerReflectionClient::new(app.channel.clone())
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
}

/// One `[[tokens]]` entry; `namespaces` and `roles` are TOML arrays.
fn entry(name: &str, digest: &str, namespaces: &str, roles: &str) -> String {
    format!(
        "[[tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\nnamespaces = {namespaces}\nroles = {roles}\n\n"
    )
}

#[test]
fn token_entries_are_validated_naming_the_entry_and_field() {
    let digest = sha256(TOKEN_A);
    let client = r#"["client"]"#;
    let x = r#"["x"]"#;
    let cases = [
        (entry("a", "abc", x, client), "tokens[0].sha256"),
        (entry("a", &digest, "[]", client), "tokens[0].namespaces"),
        (
            entry("a", &digest, r#"["*", "x"]"#, client),
            "tokens[0].namespaces",
        ),
        (
            entry("a", &digest, r#"["bad/ns"]"#, client),
            "tokens[0].namespaces",
        ),
        (entry("a", &digest, x, "[]"), "tokens[0].roles"),
        (entry("", &digest, x, r#"["admin"]"#), "tokens[0].name"),
        (
            entry("a", &digest, x, client) + &entry("b", &digest.to_uppercase(), x, client),
            "same sha256",
        ),
        (
            entry("a", &digest, x, client) + &entry("a", &sha256(TOKEN_B), x, client),
            "two tokens are named a",
        ),
        (entry("a", &digest, x, r#"["owner"]"#), "owner"),
        (
            entry(
                "agent-and-approver",
                &digest,
                x,
                r#"["client", "reviewer"]"#,
            ),
            r#"tokens[0].roles: the token named "agent-and-approver" holds both client and reviewer"#,
        ),
    ];
    for (toml, expected) in cases {
        let error = load(&toml).unwrap_err();
        assert!(error.contains(expected), "{expected}: {error}");
        assert!(!error.contains(TOKEN_A));
    }
    let config = load(&tokens_toml()).unwrap();
    assert_eq!(config.token_registry().unwrap().len(), 5);
    assert!(
        load("").unwrap().token_registry().unwrap().is_empty(),
        "no tokens: authentication off"
    );
}

/// Loads `toml` with `tokens_file` naming a file that holds `tokens`; the file lives as long
/// as the returned directory.
fn load_with_tokens_file(
    toml: &str,
    tokens: &str,
) -> (Result<Config, String>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    std::fs::write(&file, tokens).unwrap();
    let path = file.display().to_string();
    let config = load(&format!("tokens_file = \"{path}\"\n{toml}"));
    (config, path, dir)
}

#[test]
fn a_tokens_file_adds_its_entries_and_its_errors_name_the_setting_never_the_content() {
    let client = r#"["client"]"#;
    let in_file = entry(
        "reviewer-a",
        &sha256(TOKEN_REVIEWER_A),
        r#"["tenant-a"]"#,
        r#"["reviewer"]"#,
    ) + &entry(
        "orchestrator-b",
        &sha256(TOKEN_B),
        r#"["tenant-b"]"#,
        client,
    );

    // Alone, and beside the main file's own tokens.
    let (config, _, _dir) = load_with_tokens_file("", &in_file);
    let registry = config.unwrap().token_registry().unwrap();
    assert_eq!(registry.len(), 2);
    let principal = registry.authenticate(TOKEN_REVIEWER_A).unwrap();
    assert_eq!(principal.name, "reviewer-a");
    assert!(registry.authenticate(TOKEN_A).is_none());
    let inline = entry(
        "orchestrator-a",
        &sha256(TOKEN_A),
        r#"["tenant-a"]"#,
        client,
    );
    let (config, _, _dir) = load_with_tokens_file(&inline, &in_file);
    let registry = config.unwrap().token_registry().unwrap();
    assert_eq!(registry.len(), 3);
    assert_eq!(
        registry.authenticate(TOKEN_A).unwrap().name,
        "orchestrator-a"
    );
    assert_eq!(
        registry.authenticate(TOKEN_B).unwrap().name,
        "orchestrator-b"
    );

    let digest = sha256(TOKEN_A);
    let cases = [
        // Not TOML (an unterminated string on the digest's line).
        (
            format!("[[tokens]]\nname = \"a\"\nsha256 = \"{digest}\n"),
            "line 3: not valid TOML",
        ),
        // Anything but [[tokens]].
        (format!("listen = \"{digest}\"\n"), "unknown field"),
        // A value of the wrong type, holding the digest.
        (
            entry("a", &digest, &format!("\"{digest}\""), client),
            "tokens[0].namespaces: invalid type",
        ),
        (
            entry("a", &digest, r#"["x"]"#, &format!("[\"{digest}\"]")),
            "tokens[0].roles",
        ),
        (entry("a", "abc", r#"["x"]"#, client), "tokens[0].sha256"),
        (entry("a", &digest, "[]", client), "tokens[0].namespaces"),
        (String::new(), "holds no [[tokens]] entry"),
        (
            entry(
                "ops",
                &digest,
                r#"["x"]"#,
                r#"["reviewer", "admin", "client"]"#,
            ),
            r#"tokens[0].roles: the token named "ops" holds both client and reviewer"#,
        ),
        (in_file.clone() + &in_file, "have the same sha256"),
    ];
    for (tokens, expected) in cases {
        let (config, path, _dir) = load_with_tokens_file("", &tokens);
        let error = config.unwrap_err();
        assert!(error.contains("tokens_file: "), "{expected}: {error}");
        if !expected.contains("same sha256") {
            assert!(error.contains(&path), "{expected}: {error}");
        }
        assert!(error.contains(expected), "{expected}: {error}");
        assert!(!error.contains(&digest), "the digest is quoted: {error}");
    }
    // A file in the main file and in the tokens file with one digest.
    let (config, _, _dir) = load_with_tokens_file(
        &entry("dup", &sha256(TOKEN_B), r#"["x"]"#, client),
        &in_file,
    );
    assert!(config.unwrap_err().contains("have the same sha256"));
    // A file that is not there, and an empty setting.
    let error = load("tokens_file = \"/nonexistent/tokens.toml\"\n").unwrap_err();
    assert!(
        error.contains("tokens_file: /nonexistent/tokens.toml: "),
        "{error}"
    );
    let error = load("tokens_file = \"\"\n").unwrap_err();
    assert!(error.contains("tokens_file: must name a file"), "{error}");
}
