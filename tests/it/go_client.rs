//! The Go client (clients/go) against the real server and sandbox: its own `go test` tests
//! run as a child process, then these tests check the journal rows and the provider's effect
//! counts from Rust. The Go toolchain and libraries are Debian packages, built offline:
//! `scripts/go-env install` installs them and `scripts/go-env run` runs a command with them.

use crate::common;

use common::client_suites::{repo, row, run_suite, spawn_with_client_token};
use common::*;
use sqlx::PgPool;

const SETUP: &str = "scripts/go-env install prepares it (Debian packages: Go, grpc-go, protoc)";

/// Runs the Go tests whose names match `pattern` with `go test -v`; asserts that each of
/// `tests` ran and passed and that none was skipped.
async fn go_test(app: &TestApp, pattern: &str, tests: &[&str]) -> String {
    let go_env = repo().join("scripts/go-env");
    let args = ["run", "go", "test", "-count=1", "-v", "-run", pattern, "."];
    let stdout = run_suite(app, &go_env, &args, &repo().join("clients/go"), SETUP).await;
    for test in tests {
        assert!(
            stdout.contains(&format!("--- PASS: {test} ")),
            "go test did not pass {test}:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("--- SKIP"),
        "go test skipped a test:\n{stdout}"
    );
    assert!(!stdout.contains("--- FAIL"), "{stdout}");
    stdout
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_go_client_decodes_errors_keeps_deadlines_and_leases_and_protects_functions(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    go_test(
        &app,
        "^TestClient",
        &[
            "TestClientDecodesTypedErrors",
            "TestClientGivesEveryCallADeadline",
            "TestClientRenewsTheLeaseDuringALongCall",
            "TestClientCancelsTheProviderCallWhenTheLeaseEnds",
            "TestClientCutsOffACallThatOutlivesItsUnrenewedLease",
            "TestClientProtectsAFunction",
            "TestClientAnswersARefusedSuccessReportWithVerificationRequired",
        ],
    )
    .await;

    // A success whose report was refused: recorded unknown, one effect, one request.
    let refused = row(&app, "go:refused:external-id").await.unwrap();
    assert_eq!(
        (refused.status.as_str(), refused.attempt_count),
        ("unknown", 1)
    );
    let counts = app.counts("go:refused:external-id");
    assert_eq!((counts.requests, counts.effects), (1, 1));

    // A reused key with another payload never reached the provider.
    let conflict = row(&app, "go:errors:conflict").await.unwrap();
    assert_eq!(
        (conflict.status.as_str(), conflict.attempt_count),
        ("succeeded", 1)
    );
    let counts = app.counts("go:errors:conflict");
    assert_eq!((counts.requests, counts.effects), (1, 1));
    // A malformed payload registered nothing.
    assert!(row(&app, "go:errors:bad-payload").await.is_none());

    // Renewed: one lease, one effect.
    let renewed = row(&app, "go:leases:renewed").await.unwrap();
    assert_eq!(
        (renewed.status.as_str(), renewed.attempt_count),
        ("succeeded", 1)
    );
    let counts = app.counts("go:leases:renewed");
    assert_eq!((counts.requests, counts.effects), (1, 1));

    // Ended and taken over: the new holder completed; the provider saw two requests and made
    // one effect.
    let lost = row(&app, "go:leases:lost").await.unwrap();
    assert_eq!((lost.status.as_str(), lost.attempt_count), ("succeeded", 2));
    let counts = app.counts("go:leases:lost");
    assert_eq!((counts.requests, counts.effects), (2, 1));

    // Cut off: the call that outlived its unrenewed lease was recorded unknown, unpaid.
    let cut_off = row(&app, "go:leases:cut-off").await.unwrap();
    assert_eq!(
        (cut_off.status.as_str(), cut_off.error_code.as_deref()),
        ("unknown", Some("lease_expired"))
    );
    assert_eq!(app.counts("go:leases:cut-off").requests, 0);

    // A protected function called twice for one order, then with another amount: one effect.
    let protected = row(&app, "go:protect:order-817").await.unwrap();
    assert_eq!(
        (protected.status.as_str(), protected.attempt_count),
        ("succeeded", 1)
    );
    let counts = app.counts("go:protect:order-817");
    assert_eq!((counts.requests, counts.effects), (1, 1));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_go_client_sends_its_bearer_token(pool: PgPool) {
    let app = spawn_with_client_token(pool).await;
    go_test(
        &app,
        "^TestAuth",
        &["TestAuthTheTokenReachesItsNamespaceAndNoOther"],
    )
    .await;

    common::client_suites::assert_paid_once_in_tenant_a(&app, "go").await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_go_client_repeats_what_the_transport_refused_and_dials_with_the_service_config(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    go_test(
        &app,
        "^(TestABareCancelled|TestAShedCall|TestTheShippedServiceConfig|TestDialRepeats)",
        &[
            "TestABareCancelledFromAPassedDeadlineIsSafeToRepeat",
            "TestAShedCallIsOverloadedWithItsRetryDelay",
            "TestTheShippedServiceConfigIsTheContracts",
            "TestDialRepeatsACallRefusedWithUnavailableByDefault",
        ],
    )
    .await;
}
