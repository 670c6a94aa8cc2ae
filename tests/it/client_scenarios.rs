//! Every client runs `clients/scenarios.yaml` — one behaviour written once — against the real
//! server and the real sandbox provider, so the clients cannot drift apart. Each runner checks
//! its own answers; afterwards this test reads the journal rows and the provider's effect
//! counts itself and holds them against each scenario's `final`.
//!
//! The runners reach a journal server that the harness can restart (the scenario of a report
//! whose answer is lost while the journal restarts) through a relay that can lose a Begin's
//! answer after the journal processed it (the scenario of a Begin whose answer is lost), and a
//! control endpoint through which a scenario makes another holder appear, a lease be taken
//! over, a reconcile run or a Begin answer be lost.

use crate::common;
mod harness;
mod rust_runner;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::TestApp;
use common::client_suites::{repo, run_program, tool};
use common::relay::Relay;
use harness::{RestartableServer, check_finals, spawn_control};
use sqlx::PgPool;

/// The app, the relay in front of the restartable server that the runners use, and the
/// control endpoint's URL.
async fn stand(pool: PgPool) -> (TestApp, Arc<Relay>, String) {
    let app = TestApp::spawn(pool).await;
    let server = RestartableServer::start(&app).await;
    let relay = Relay::start(server.addr).await;
    let control = spawn_control(&app, server, relay.clone()).await;
    (app, relay, control)
}

/// Runs one language's runner as a child process with the scenario environment and asserts
/// that it exited 0; returns its output.
async fn run_runner(
    server: &Relay,
    app: &TestApp,
    control: &str,
    prefix: &str,
    command: (&Path, &[&str]),
    dir: &Path,
    setup: &str,
) -> String {
    let env = [
        ("OPJOURNAL_TEST_SERVER", server.addr.to_string()),
        ("OPJOURNAL_TEST_SANDBOX_URL", app.sandbox_url.clone()),
        ("OPJOURNAL_TEST_CONTROL_URL", control.to_owned()),
        ("OPJOURNAL_SCENARIO_PREFIX", prefix.to_owned()),
    ];
    run_program(command.0, command.1, dir, &env, setup).await
}

fn assert_finals(prefix: &str, mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "the journal or the provider disagrees with clients/scenarios.yaml for {prefix}:\n{}",
        mismatches.join("\n")
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_rust_client_passes_every_scenario(pool: PgPool) {
    let (app, relay, control) = stand(pool).await;
    let addr = relay.addr.to_string();
    if let Err(failures) = rust_runner::run_all(&addr, &app.sandbox_url, &control, "rust").await {
        panic!("the Rust client failed scenarios:\n{failures}");
    }
    assert_finals("rust", &check_finals(&app, &relay, "rust").await);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_python_clients_sync_and_asyncio_pass_every_scenario(pool: PgPool) {
    let (app, relay, control) = stand(pool).await;
    let python = tool(
        "OPJOURNAL_TEST_CLIENT_PYTHON",
        "target/python-client-venv/bin/python",
        "python3",
    );
    let args = ["-m", "pytest", "-q", "-rA", "tests/test_scenarios.py"];
    let stdout = run_runner(
        &relay,
        &app,
        &control,
        "py",
        (&python, &args),
        &repo().join("clients/python"),
        "./scripts/test prepares it with scripts/client-envs python",
    )
    .await;
    let summary = stdout.lines().rev().find(|line| !line.trim().is_empty());
    assert!(
        summary.is_some_and(|line| line.contains(" passed") && !line.contains("skipped")),
        "pytest did not pass every scenario:\n{stdout}"
    );
    assert_finals("py-sync", &check_finals(&app, &relay, "py-sync").await);
    assert_finals("py-async", &check_finals(&app, &relay, "py-async").await);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_typescript_client_passes_every_scenario(pool: PgPool) {
    let (app, relay, control) = stand(pool).await;
    let node = std::env::var_os("OPJOURNAL_TEST_NODE").map_or_else(|| "node".into(), PathBuf::from);
    let compiled = "dist/test/scenarios.test.js";
    let args = ["--test", "--test-reporter=spec", compiled];
    let stdout = run_runner(
        &relay,
        &app,
        &control,
        "ts",
        (&node, &args),
        &repo().join("clients/typescript"),
        "./scripts/test prepares it with scripts/client-envs typescript",
    )
    .await;
    assert!(stdout.contains("ℹ pass "), "{stdout}");
    for line in ["ℹ fail 0", "ℹ skipped 0", "ℹ todo 0", "ℹ cancelled 0"] {
        assert!(
            stdout.contains(line),
            "node --test did not say '{line}':\n{stdout}"
        );
    }
    assert_finals("ts", &check_finals(&app, &relay, "ts").await);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_go_client_passes_every_scenario(pool: PgPool) {
    let (app, relay, control) = stand(pool).await;
    let go_env = repo().join("scripts/go-env");
    let args = [
        "run",
        "go",
        "test",
        "-count=1",
        "-v",
        "-run",
        "^TestScenarios$",
        ".",
    ];
    let stdout = run_runner(
        &relay,
        &app,
        &control,
        "go",
        (&go_env, &args),
        &repo().join("clients/go"),
        "scripts/go-env install prepares it (Debian packages)",
    )
    .await;
    assert!(
        stdout.contains("--- PASS: TestScenarios ")
            && !stdout.contains("--- SKIP")
            && !stdout.contains("--- FAIL"),
        "go test did not pass every scenario:\n{stdout}"
    );
    assert_finals("go", &check_finals(&app, &relay, "go").await);
}
