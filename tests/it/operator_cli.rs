//! The operator commands as a person or a script runs them: the real `opjournal` binary
//! against the real gRPC server on port 0 over Postgres, with the sandbox provider.
//! Assertions are on exit codes, JSON fields and `ErrorInfo` reasons, never on messages.

use crate::common;

use common::*;
use futures::StreamExt as _;
use opjournal::proto::CompleteOperationRequest;
use serde_json::Value;
use sqlx::PgPool;

/// What one run of the binary printed and how it exited.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", self.stdout))
    }

    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        self
    }
}

/// Runs `opjournal <args> --server http://<app>`. The child runs beside the test's runtime
/// (tokio::process), so the in-process server keeps answering.
async fn opjournal(app: &TestApp, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(args)
        .arg("--server")
        .arg(format!("http://{}", app.addr))
        .env_remove("OPJOURNAL_SERVER")
        .output()
        .await
        .unwrap();
    Run {
        code: output.status.code().unwrap(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Begins `key` and reports its outcome unknown; returns the lease token it used.
async fn make_unknown(app: &TestApp, key: &str, action: &str) -> String {
    let begin = app.begin(key, action, "{}").await.unwrap();
    app.report_unknown(&begin.lease_token).await;
    begin.lease_token
}

async fn make_succeeded(app: &TestApp, key: &str) {
    let begin = app.begin(key, "create_payment", "{}").await.unwrap();
    app.journal
        .clone()
        .complete_operation(CompleteOperationRequest {
            lease_token: begin.lease_token,
            external_id: "pay_done".into(),
            result_json: r#"{"id":"pay_done"}"#.into(),
        })
        .await
        .unwrap();
}

fn statuses_by_key(rows: &Value) -> Vec<(String, String)> {
    let mut pairs: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["operation_key"].as_str().unwrap().to_owned(),
                row["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, s)| ((*k).to_owned(), (*s).to_owned()))
        .collect()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn list_json_returns_every_operation_with_its_status(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    app.begin("op-a", "create_payment", "{}").await.unwrap();
    make_unknown(&app, "op-b", "create_payment").await;
    make_succeeded(&app, "op-c").await;

    let all = opjournal(&app, &["list", "--json"]).await.ok().json();
    assert_eq!(
        statuses_by_key(&all),
        pairs(&[
            ("op-a", "in_progress"),
            ("op-b", "unknown"),
            ("op-c", "succeeded")
        ])
    );
    let row = all.as_array().unwrap()[0].as_object().unwrap();
    assert!(row["updated_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(row["namespace"], "default");

    let unknown = opjournal(&app, &["list", "--status", "unknown", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(statuses_by_key(&unknown), pairs(&[("op-b", "unknown")]));

    let limited = opjournal(&app, &["list", "--limit", "2", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(limited.as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn list_follows_pages_past_the_servers_largest_page(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begins = (0..520).map(|i| {
        let app = &app;
        async move {
            app.begin(&format!("payment:bulk-{i:03}"), "create_payment", "{}")
                .await
                .unwrap()
        }
    });
    futures::stream::iter(begins)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;

    let some = opjournal(&app, &["list", "--limit", "510", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(some.as_array().unwrap().len(), 510);
    let all = opjournal(&app, &["list", "--limit", "1000", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(all.as_array().unwrap().len(), 520);
    let mut keys: Vec<_> = statuses_by_key(&all).into_iter().map(|(k, _)| k).collect();
    keys.dedup();
    assert_eq!(keys.len(), 520);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn show_json_includes_the_history_and_never_the_lease_token(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let token = make_unknown(&app, PAYMENT_KEY, "create_payment").await;

    let shown = opjournal(&app, &["show", PAYMENT_KEY, "--json"]).await.ok();
    assert!(!shown.stdout.contains(&token));
    let shown = shown.json();
    assert_eq!(shown["operation"]["status"], "unknown");
    assert_eq!(shown["operation"]["attempt_count"], 1);
    assert_eq!(shown["operation"]["references"]["order_id"], "817");
    let history = shown["history"].as_array().unwrap();
    let registration = &history[0];
    assert_eq!(registration["from_status"], Value::Null);
    assert_eq!(registration["to_status"], "in_progress");
    assert_eq!(registration["actor_kind"], "client");
    let last = history.last().unwrap();
    assert_eq!(
        (&last["from_status"], &last["to_status"], &last["reason"]),
        (
            &Value::from("in_progress"),
            &Value::from("unknown"),
            &Value::from("timeout")
        )
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn resolving_an_unknown_operation_as_succeeded_records_the_reviewer_and_reason(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    make_unknown(&app, PAYMENT_KEY, "create_payment").await;
    let reason = "provider dashboard shows pay_1 captured";

    let resolved = opjournal(
        &app,
        &[
            "resolve",
            PAYMENT_KEY,
            "--succeeded",
            "--external-id",
            "pay_1",
            "--reviewer",
            "alice",
            "--reason",
            reason,
            "--expected-attempt",
            "1",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(resolved["status"], "succeeded");

    let shown = opjournal(&app, &["show", PAYMENT_KEY, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(shown["operation"]["status"], "succeeded");
    assert_eq!(shown["operation"]["external_id"], "pay_1");
    let last = shown["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["from_status"], "unknown");
    assert_eq!(last["to_status"], "succeeded");
    assert_eq!(last["actor_kind"], "reviewer");
    assert_eq!(last["actor"], "alice");
    assert_eq!(last["reason"], reason);

    let text = opjournal(&app, &["show", PAYMENT_KEY]).await.ok().stdout;
    assert!(text.contains(PAYMENT_KEY), "{text}");
    assert!(text.contains("succeeded"), "{text}");
    assert!(text.contains("reviewer/alice"), "{text}");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn resolving_with_a_stale_expected_attempt_exits_2_and_changes_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    make_unknown(&app, PAYMENT_KEY, "create_payment").await;
    let resolve = |json: bool| {
        let mut args = vec![
            "resolve",
            PAYMENT_KEY,
            "--release",
            "--reviewer",
            "alice",
            "--reason",
            "provider has no such payment",
            "--expected-attempt",
            "2",
        ];
        if json {
            args.push("--json");
        }
        args
    };

    let text = opjournal(&app, &resolve(false)).await;
    assert_eq!(text.code, 2);
    assert!(
        text.stderr
            .starts_with("error: FAILED_PRECONDITION OPERATION_CHANGED: "),
        "{}",
        text.stderr
    );
    assert!(text.stdout.is_empty());

    let json = opjournal(&app, &resolve(true)).await;
    assert_eq!(json.code, 2);
    let error = &json.json()["error"];
    assert_eq!(error["code"], "FAILED_PRECONDITION");
    assert_eq!(error["reason"], "OPERATION_CHANGED");

    let shown = opjournal(&app, &["show", PAYMENT_KEY, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(shown["operation"]["status"], "unknown");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn showing_a_missing_key_exits_2_with_operation_not_found(pool: PgPool) {
    let app = TestApp::spawn(pool).await;

    let text = opjournal(&app, &["show", "payment:no-such-order"]).await;
    assert_eq!(text.code, 2);
    assert!(
        text.stderr
            .starts_with("error: NOT_FOUND OPERATION_NOT_FOUND: "),
        "{}",
        text.stderr
    );

    let json = opjournal(&app, &["show", "payment:no-such-order", "--json"]).await;
    assert_eq!(json.code, 2);
    assert_eq!(json.json()["error"]["reason"], "OPERATION_NOT_FOUND");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn reconcile_prints_the_observation_and_the_action_taken(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    app.pay(PAYMENT_KEY, PAY_817, None).await.unwrap();
    app.report_unknown(&begin.lease_token).await;

    let reconciled = opjournal(&app, &["reconcile", PAYMENT_KEY, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(reconciled["observation"]["outcome"], "succeeded");
    assert_eq!(reconciled["action"], "marked_succeeded");
    assert_eq!(reconciled["operation"]["status"], "succeeded");

    // Once terminal there is nothing to reconcile: a refusal, exit 2.
    let again = opjournal(&app, &["reconcile", PAYMENT_KEY]).await;
    assert_eq!(again.code, 2);
    assert!(
        again.stderr.contains("OPERATION_NOT_RECONCILABLE"),
        "{}",
        again.stderr
    );
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn review_lists_escalated_operations_until_a_reviewer_releases_them(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    make_unknown(&app, "email:welcome:42", "send_email").await;
    assert_eq!(
        app.worker("reconciler-1").tick().await.unwrap().escalated,
        1
    );

    let queue = opjournal(&app, &["review", "--json"]).await.ok().json();
    let queue = queue.as_array().unwrap();
    assert_eq!(queue.len(), 1);
    assert_eq!(queue[0]["operation_key"], "email:welcome:42");
    assert_eq!(queue[0]["review_reason"], "no_provider_lookup");
    let text = opjournal(&app, &["review"]).await.ok().stdout;
    assert!(text.contains("no_provider_lookup"), "{text}");

    let shown = opjournal(&app, &["show", "email:welcome:42"])
        .await
        .ok()
        .stdout;
    assert!(shown.lines().any(|l| l.ends_with("review")), "{shown}");

    opjournal(
        &app,
        &[
            "resolve",
            "email:welcome:42",
            "--release",
            "--reviewer",
            "bob",
            "--reason",
            "mail log shows no delivery",
            "--expected-attempt",
            "1",
        ],
    )
    .await
    .ok();
    let queue = opjournal(&app, &["review", "--json"]).await.ok().json();
    assert_eq!(queue, Value::Array(vec![]));
    let list = opjournal(&app, &["list", "--json"]).await.ok().json();
    assert_eq!(
        statuses_by_key(&list),
        pairs(&[("email:welcome:42", "pending")])
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn resolve_needs_exactly_one_decision(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let base = [
        "resolve",
        "k",
        "--reviewer",
        "alice",
        "--reason",
        "r",
        "--expected-attempt",
        "1",
    ];
    let none = opjournal(&app, &base).await;
    assert_eq!(none.code, 2);
    let mut two = base.to_vec();
    two.extend(["--release", "--failed-final", "card_declined"]);
    assert_eq!(opjournal(&app, &two).await.code, 2);
    let mut stray = base.to_vec();
    stray.extend(["--release", "--external-id", "pay_1"]);
    assert_eq!(opjournal(&app, &stray).await.code, 2);
}

#[tokio::test]
async fn an_unreachable_server_exits_1_with_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(["list", "--json", "--server"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(stdout["error"]["code"], "UNAVAILABLE");
    assert_eq!(stdout["error"]["reason"], Value::Null);
}
