//! The Python agent integrations (clients/python/src/opjournal_client/integrations: MCP,
//! OpenAI Agents SDK, LangChain/LangGraph) against the real server and sandbox: their pytest
//! files drive each framework's own tool-calling path with no language model, then these
//! tests check the journal rows and the provider's effect counts from Rust.
//! `scripts/client-envs python-agents` prepares `target/python-agents-venv`.

use crate::common;

use std::path::PathBuf;

use common::client_suites::{Row, assert_transitions, repo, row, run_suite, tool, transitions};
use common::*;
use sqlx::PgPool;

const SETUP: &str = "scripts/client-envs python-agents prepares target/python-agents-venv";

/// The interpreter with clients/python and the agent frameworks installed:
/// `OPJOURNAL_TEST_AGENTS_PYTHON`, or the virtual environment `scripts/client-envs
/// python-agents` prepares.
fn python() -> PathBuf {
    tool(
        "OPJOURNAL_TEST_AGENTS_PYTHON",
        "target/python-agents-venv/bin/python",
        "python3",
    )
}

/// Runs pytest files of clients/python/tests/integrations and asserts that every test ran
/// and passed.
async fn pytest(app: &TestApp, files: &[&str]) {
    let mut args = vec!["-m", "pytest", "-q", "-rA"];
    args.extend_from_slice(files);
    let stdout = run_suite(app, &python(), &args, &repo().join("clients/python"), SETUP).await;
    let summary = stdout.lines().rev().find(|line| !line.trim().is_empty());
    let counts = summary.and_then(|line| line.split_once(" passed in "));
    assert!(
        counts.is_some_and(|(passed, _)| passed.parse::<u32>().is_ok_and(|n| n > 0)),
        "pytest did not pass every test:\n{stdout}"
    );
}

fn succeeded_once(row: Option<Row>) -> Row {
    let row = row.expect("the key has a row");
    assert_eq!((row.status.as_str(), row.attempt_count), ("succeeded", 1));
    assert!(row.external_id.is_none(), "the tools record no external id");
    row
}

fn unknown_after_timeout(row: Option<Row>) {
    assert_eq!(
        row,
        Some(Row {
            status: "unknown".into(),
            attempt_count: 1,
            external_id: None,
            error_code: Some("timeout".into()),
        })
    );
}

async fn total_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations")
        .fetch_one(app.pool())
        .await
        .unwrap()
}

/// Executed once, never taken over, never unknown: (none -> in_progress -> succeeded).
async fn straight_to_succeeded(app: &TestApp, key: &str) {
    let expected = [(None, "in_progress"), (Some("in_progress"), "succeeded")];
    assert_transitions(app, key, &expected).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn mcp_tools_are_journaled_through_the_sdks_client_session(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(
        &app,
        &[
            "tests/integrations/test_mcp.py",
            "tests/integrations/test_mcp_stdio.py",
        ],
    )
    .await;

    // The lost answer: the first call finished under its lease; the retry waited and
    // replayed. The same key sent in params._meta named the same row.
    for key in [
        "mcp:create_payment:order-817-payment",
        "mcp:create_payment_async:order-821-payment",
        "mcp:create_payment_no_wait:order-819-payment",
        "mcp:create_payment:order-818-payment",
    ] {
        succeeded_once(row(&app, key).await);
        straight_to_succeeded(&app, key).await;
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    // The derived key's unknown outcome stays unknown: no second provider call.
    unknown_after_timeout(row(&app, "mcp-derived:817").await);
    assert_eq!(app.counts("mcp-derived:817").requests, 1);
    // The example server over stdio: the payment whose answer the relay held back past the
    // client's timeout, recorded by the call the client had abandoned, with its id.
    let held = row(&app, "mcp:create_payment:order-830").await.unwrap();
    assert_eq!((held.status.as_str(), held.attempt_count), ("succeeded", 1));
    assert!(
        held.external_id
            .as_deref()
            .is_some_and(|id| id.starts_with("pay_"))
    );
    straight_to_succeeded(&app, "mcp:create_payment:order-830").await;
    // Two users of one server with one key and the same arguments: a row each (the key is
    // scoped by who calls), each paid once; the unscoped key was never used.
    let scoped: Vec<(String,)> = sqlx::query_as(
        "SELECT operation_key FROM agent_operations
         WHERE operation_key LIKE 'mcp:pay_order:u-%' AND status = 'succeeded'
           AND attempt_count = 1 ORDER BY operation_key",
    )
    .fetch_all(app.pool())
    .await
    .unwrap();
    assert_eq!(scoped.len(), 4, "alice, bob, carol and dave: {scoped:?}");
    for (key,) in &scoped {
        assert_eq!(app.counts(key).effects, 1, "{key}");
    }
    assert!(row(&app, "mcp:pay_order:order-840").await.is_none());
    // Refused calls (no key, malformed or refused keys, the conflicts) wrote nothing.
    assert_eq!(total_rows(&app).await, 10);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn openai_agents_function_tools_are_journaled_through_the_runner(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/integrations/test_openai_agents.py"]).await;

    for key in [
        "oa:intent-900:pay",
        "oa:intent-901:pay",
        "oa:intent-903:pay",
    ] {
        succeeded_once(row(&app, key).await);
        straight_to_succeeded(&app, key).await;
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    unknown_after_timeout(row(&app, "oa:intent-902:pay").await);
    assert_eq!(app.counts("oa:intent-902:pay").requests, 1);
    assert_eq!(total_rows(&app).await, 4);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn langchain_tools_are_journaled_through_langgraph(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(&app, &["tests/integrations/test_langchain.py"]).await;

    for key in ["lc:intent-700:pay", "lc:intent-701:pay"] {
        succeeded_once(row(&app, key).await);
        straight_to_succeeded(&app, key).await;
        let counts = app.counts(key);
        assert_eq!((counts.requests, counts.effects), (1, 1), "{key}");
    }
    unknown_after_timeout(row(&app, "lc:intent-702:pay").await);
    assert_eq!(app.counts("lc:intent-702:pay").requests, 1);
    // The declined payment is final; its repeat did not reach the provider.
    assert_eq!(
        row(&app, "lc:intent-703:pay").await,
        Some(Row {
            status: "failed_final".into(),
            attempt_count: 1,
            external_id: None,
            error_code: Some("card_declined".into()),
        })
    );
    assert_eq!(app.counts("lc:intent-703:pay").requests, 1);
    // The held duplicate wrote nothing; the first intent paid once.
    succeeded_once(row(&app, "lc:intent-704:pay").await);
    assert_eq!(app.rows_for("lc:intent-705:pay").await, 0);
    // The unknown payment the reconciler found: settled by the lookup, then replayed.
    let found = row(&app, "lc:intent-706:pay").await.unwrap();
    assert_eq!(
        (found.status.as_str(), found.attempt_count),
        ("succeeded", 1)
    );
    assert!(found.external_id.is_some_and(|id| id.starts_with("pay_")));
    let history = transitions(&app, "lc:intent-706:pay").await;
    let statuses: Vec<&str> = history.iter().map(|(_, to)| to.as_str()).collect();
    assert_eq!(statuses, ["in_progress", "unknown", "succeeded"]);
    assert_eq!(total_rows(&app).await, 6);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_agent_examples_pay_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    pytest(
        &app,
        &[
            "tests/integrations/test_examples.py",
            "tests/integrations/test_messages.py",
        ],
    )
    .await;

    for key in ["payment:intent-example-oa", "payment:intent-example-lc"] {
        let done = row(&app, key).await.unwrap();
        assert_eq!((done.status.as_str(), done.attempt_count), ("succeeded", 1));
        // The examples record the provider's payment id.
        assert!(
            done.external_id
                .as_deref()
                .is_some_and(|id| id.starts_with("pay_"))
        );
        straight_to_succeeded(&app, key).await;
        assert_eq!(app.counts(key).effects, 1, "{key}");
    }
    assert_eq!(total_rows(&app).await, 2);
}
