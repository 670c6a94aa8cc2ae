//! The review console over plain HTTP (no browser): sign-in, CSRF and role refusals, the
//! compare-and-set on the attempt a page showed, what a page shows and never shows, search
//! and the queue's filters. The real server with its console, real Postgres, the sandbox
//! provider; every refusal is checked against the journal's rows, not only the answer.

use crate::common;

use std::time::Duration;

use common::console::*;
use common::{decision, process};
use opjournal::api::console::ConsoleLimits;
use opjournal::proto::Decision;
use sqlx::PgPool;

const KEY: &str = "email:order-817:shipped-v1";

/// The resolve form of `KEY` as the page showed it, with `csrf`, deciding `decision`.
fn resolve_form<'a>(
    csrf: &'a str,
    attempt: &'a str,
    decision: &'a str,
    reason: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("csrf", csrf),
        ("namespace", SHOP),
        ("key", KEY),
        ("expected_attempt", attempt),
        ("decision", decision),
        ("external_id", "em_1"),
        ("result_json", r#"{"status":"sent"}"#),
        ("error_code", "bounced"),
        ("reason", reason),
    ]
}

/// The row is still escalated at attempt 1, with no reviewer in its history.
async fn assert_untouched(console: &ConsoleApp) {
    assert_eq!(console.row(KEY).await, ("unknown".into(), 1, true));
    let events = console.events(KEY).await;
    assert_eq!(
        events.len(),
        3,
        "registered, unknown, escalated: {events:?}"
    );
    assert!(events.iter().all(|(_, kind, _, _)| kind != "reviewer"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn signing_in_takes_a_configured_token_and_sets_a_strict_session_cookie(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    let visitor = Visitor::new(&console.url);
    // No session: pages send to the sign-in form.
    let queue = visitor.get("/queue").await;
    assert_eq!((queue.status, queue.location.as_str()), (303, "/sign-in"));

    let wrong = visitor.sign_in("token", "tok-alice.guessed").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("not configured on this server"));
    assert_eq!(visitor.get("/queue").await.status, 303, "still signed out");

    // A sign-in form from elsewhere (no double-submit cookie match) is refused.
    let forged = visitor
        .post("/sign-in", &[("csrf", "made-up"), ("token", ALICE)])
        .await;
    assert_eq!(forged.status, 403);
    assert_eq!(visitor.get("/queue").await.status, 303, "still signed out");

    let signed_in = visitor.sign_in("token", ALICE).await;
    assert_eq!(
        (signed_in.status, signed_in.location.as_str()),
        (303, "/queue")
    );
    let session_cookie = visitor
        .set_cookies
        .lock()
        .unwrap()
        .iter()
        .find(|c| c.starts_with("opjournal_console="))
        .cloned()
        .unwrap();
    assert!(session_cookie.contains("HttpOnly"), "{session_cookie}");
    assert!(
        session_cookie.contains("SameSite=Strict"),
        "{session_cookie}"
    );
    assert!(
        !session_cookie.contains(ALICE),
        "the token is never a cookie"
    );
    let queue = visitor.get("/queue").await;
    assert_eq!(queue.status, 200);
    assert!(queue.body.contains(r#"id="signed-in-as">alice<"#));
    // The page's headers keep it out of frames and caches, and scripts to its own.
    let page = reqwest::get(format!("{}sign-in", console.url))
        .await
        .unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
    assert_eq!(page.headers()["cache-control"], "no-store");

    // Signing out ends the session on the server: the old cookie no longer works.
    let csrf = visitor.csrf().await;
    let out = visitor.post("/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, 303);
    assert_eq!(visitor.get("/queue").await.status, 303);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_resolution_without_the_sessions_csrf_token_changes_nothing(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;

    for csrf in ["", "not-the-sessions-token"] {
        let refused = visitor
            .post(
                "/operation/resolve",
                &resolve_form(csrf, "1", "succeeded", "seen"),
            )
            .await;
        assert_eq!(refused.status, 403, "csrf {csrf:?}");
        assert!(refused.body.contains("nothing was changed"));
    }
    // Another session's token is not this session's.
    let other = Visitor::new(&console.url);
    other.sign_in("token", ALICE).await;
    let others_csrf = other.csrf().await;
    let refused = visitor
        .post(
            "/operation/resolve",
            &resolve_form(&others_csrf, "1", "succeeded", "seen"),
        )
        .await;
    assert_eq!(refused.status, 403);
    // The right token, but the browser says the form came from another site.
    let csrf = visitor.csrf().await;
    let cross_site = visitor
        .post_with(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "succeeded", "seen"),
            &[("sec-fetch-site", "cross-site")],
        )
        .await;
    assert_eq!(cross_site.status, 403);
    // No session at all.
    let stranger = Visitor::new(&console.url);
    let anonymous = stranger
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "succeeded", "seen"),
        )
        .await;
    assert_eq!(anonymous.status, 401);
    assert_untouched(&console).await;
    assert_eq!(console.emails_sent(KEY), 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_client_token_may_read_an_operation_but_never_resolve_it(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    assert_eq!(visitor.sign_in("token", ORCHESTRATOR).await.status, 303);

    // The queue is ListOperationsForReview: reviewers and admins only.
    let queue = visitor.get("/queue").await;
    assert_eq!(queue.status, 403);
    assert!(queue.body.contains("ListOperationsForReview"));
    // GetOperation is allowed; the history and the resolve forms are not shown.
    let page = visitor.get(&operation_path(KEY)).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(r#"id="resolve-not-allowed""#));
    assert!(!page.body.contains(r#"action="/operation/resolve""#));
    assert!(
        page.body
            .contains("Reading the history needs the reviewer or admin role")
    );
    // Posting the form anyway, with the session's own CSRF token: refused by role.
    let csrf = csrf_of(&page.body);
    let refused = visitor
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "release_for_retry", "try again"),
        )
        .await;
    assert_eq!(refused.status, 403);
    assert!(refused.body.contains("ResolveOperation"));
    assert_untouched(&console).await;

    // A reviewer of another tenant sees nothing of this one.
    let bob = Visitor::new(&console.url);
    bob.sign_in("token", BOB).await;
    let page = bob.get(&operation_path(KEY)).await;
    assert_eq!(page.status, 403);
    assert!(!page.body.contains(KEY));
    let csrf = bob.csrf().await;
    let refused = bob
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "release_for_retry", "try again"),
        )
        .await;
    assert_eq!(refused.status, 403);
    assert_eq!(bob.get("/queue?namespace=shop").await.status, 403);
    assert_untouched(&console).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_page_left_open_while_the_operation_changed_cannot_resolve_it(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let first = Visitor::new(&console.url);
    first.sign_in("token", ALICE).await;
    let page = first.get(&operation_path(KEY)).await;
    assert!(page.body.contains(r#"name="expected_attempt" value="1""#));
    let csrf = csrf_of(&page.body);

    let released = first
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "release_for_retry", "bounced at the provider"),
        )
        .await;
    assert_eq!(released.status, 303);
    assert_eq!(console.row(KEY).await, ("pending".into(), 1, false));

    // The same page, sent again: the operation is no longer unknown at attempt 1.
    let stale = first
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "succeeded", "it went out after all"),
        )
        .await;
    assert_eq!(stale.status, 409);
    assert!(stale.body.contains(r#"id="banner-changed""#));
    assert!(
        stale
            .body
            .contains("Your page showed it unknown at attempt 1; it is now pending at attempt 1."),
        "{}",
        stale.body
    );
    assert!(stale.body.contains("reviewer alice"));
    assert!(stale.body.contains("bounced at the provider"));
    // What the reviewer typed is kept in the form.
    assert!(stale.body.contains("it went out after all"));
    assert_eq!(console.row(KEY).await, ("pending".into(), 1, false));
    let reviewers: Vec<_> = console
        .events(KEY)
        .await
        .into_iter()
        .filter(|(_, kind, _, _)| kind == "reviewer")
        .collect();
    assert_eq!(reviewers.len(), 1, "one resolution applied: {reviewers:?}");
    // A page older than a new attempt: the attempt it shows is compared too.
    let begin = console.begin_email(KEY, Some(ORCHESTRATOR)).await.unwrap();
    assert_eq!(decision(&begin), Decision::Execute);
    assert_eq!(console.row(KEY).await.1, 2);
    let older = first
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "failed_final", "no"),
        )
        .await;
    assert_eq!(older.status, 409);
    assert!(older.body.contains("it is now in_progress at attempt 2"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_resolution_needs_a_reason_and_is_recorded_with_the_token_name(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;
    let csrf = visitor.csrf().await;

    let no_reason = visitor
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "succeeded", "  "),
        )
        .await;
    assert_eq!(no_reason.status, 422);
    assert!(no_reason.body.contains("reason: is required"));
    let bad_json = visitor
        .post(
            "/operation/resolve",
            &[
                ("csrf", csrf.as_str()),
                ("namespace", SHOP),
                ("key", KEY),
                ("expected_attempt", "1"),
                ("decision", "succeeded"),
                ("result_json", r#"{"a":1,"a":2}"#),
                ("reason", "seen"),
            ],
        )
        .await;
    assert_eq!(bad_json.status, 422);
    assert!(bad_json.body.contains("succeeded.result_json"));
    assert_untouched(&console).await;

    let resolved = visitor
        .post(
            "/operation/resolve",
            &resolve_form(&csrf, "1", "succeeded", "seen in the provider log"),
        )
        .await;
    assert_eq!(resolved.status, 303);
    let page = visitor.get(&resolved.location).await;
    assert!(page.body.contains(r#"id="banner-ok""#));
    assert!(page.body.contains("reviewer alice"));
    assert!(page.body.contains("seen in the provider log"));
    assert_eq!(console.row(KEY).await, ("succeeded".into(), 1, false));
    let last = console.events(KEY).await.pop().unwrap();
    assert_eq!(
        last,
        (
            "succeeded".into(),
            "reviewer".into(),
            "alice".into(),
            Some("seen in the provider log".into())
        )
    );
    // The next Begin replays what the reviewer recorded; the e-mail is never sent again.
    let replay = console.begin_email(KEY, Some(ORCHESTRATOR)).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    let operation = replay.operation.unwrap();
    assert_eq!(operation.external_id.as_deref(), Some("em_1"));
    assert_eq!(
        operation.result_json.as_deref(),
        Some(r#"{"status":"sent"}"#)
    );
    assert_eq!(console.emails_sent(KEY), 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn pages_show_what_the_journal_stores_and_never_the_payload(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;

    let queue = visitor.get("/queue").await;
    assert!(queue.body.contains(KEY));
    assert!(queue.body.contains("no_provider_lookup"));
    let page = visitor.get(&operation_path(KEY)).await;
    for shown in [
        "send_email",
        "order_id",
        "C-817",
        "no_lookup; escalated:no_provider_lookup",
        "worker worker-a",
        "registered",
    ] {
        assert!(page.body.contains(shown), "{shown} missing");
    }
    let search = visitor
        .get("/search?namespace=shop&by=reference&q=order_id%3D817")
        .await;
    assert!(search.body.contains(KEY));
    for body in [&queue.body, &page.body, &search.body] {
        assert!(!body.contains(PAYLOAD_MARKER), "a page shows the payload");
        assert!(!body.contains("order-shipped"), "a page shows the payload");
    }
    // Nor the secret part of the lease's fencing token.
    let lease_id: String =
        sqlx::query_scalar("SELECT lease_id::text FROM agent_operations WHERE operation_key = $1")
            .bind(KEY)
            .fetch_one(console.app.pool())
            .await
            .unwrap();
    assert!(!page.body.contains(&lease_id));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn search_finds_operations_by_key_external_id_or_business_reference(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;
    let csrf = visitor.csrf().await;
    let resolve = resolve_form(&csrf, "1", "succeeded", "seen");
    assert_eq!(
        visitor.post("/operation/resolve", &resolve).await.status,
        303
    );

    let found = |body: &str| body.matches("<td class=\"key\">").count();
    for query in [
        "by=key&q=email%3Aorder-817%3Ashipped-v1",
        "by=external_id&q=em_1",
        "by=reference&q=order_id%3D817",
        "by=reference&q=case.id%3DC-817",
    ] {
        let page = visitor
            .get(&format!("/search?namespace=shop&{query}"))
            .await;
        assert_eq!((page.status, found(&page.body)), (200, 1), "{query}");
    }
    for query in [
        "by=key&q=email%3Aorder-818",
        "by=external_id&q=em_2",
        "by=reference&q=order_id%3D81",
        "by=reference&q=case%3DC-817",
    ] {
        let page = visitor
            .get(&format!("/search?namespace=shop&{query}"))
            .await;
        assert_eq!(page.status, 200, "{query}");
        assert!(page.body.contains(r#"id="search-empty""#), "{query}");
    }
    let malformed = visitor
        .get("/search?namespace=shop&by=reference&q=no-equals")
        .await;
    assert_eq!(malformed.status, 400);
    let bad_name = visitor
        .get("/search?namespace=shop&by=reference&q=a%20b%3D1")
        .await;
    assert_eq!(bad_name.status, 400);
    assert!(bad_name.body.contains(r#"id="search-problem""#));
    // Another namespace is not the token's.
    let other = visitor
        .get("/search?namespace=other-shop&by=external_id&q=em_1")
        .await;
    assert_eq!(other.status, 403);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_queue_counts_and_filters_by_action_type_and_age(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;

    let count = |body: &str, id: &str| {
        let re = regex::Regex::new(&format!(r#"id="{id}">\s*<span class="n">(\d+)<"#)).unwrap();
        re.captures(body).unwrap()[1].parse::<i64>().unwrap()
    };
    let queue = visitor.get("/queue").await;
    assert_eq!(count(&queue.body, "count-review"), 1);
    assert_eq!(count(&queue.body, "count-unknown"), 1);
    assert_eq!(
        count(&queue.body, "count-due"),
        0,
        "under review: no lookups"
    );
    assert_eq!(count(&queue.body, "count-in-progress"), 0);
    assert!(queue.body.contains(KEY));

    let other_action = visitor
        .get("/queue?namespace=shop&action_type=create_payment")
        .await;
    assert!(other_action.body.contains(r#"id="queue-empty""#));
    let this_action = visitor
        .get("/queue?namespace=shop&action_type=send_email")
        .await;
    assert!(this_action.body.contains(KEY));
    let an_hour = visitor.get("/queue?namespace=shop&min_age=60").await;
    assert!(
        an_hour.body.contains(r#"id="queue-empty""#),
        "escalated just now"
    );
    console.app.clock.advance(Duration::from_secs(2 * 3600));
    let two_hours_later = visitor.get("/queue?namespace=shop&min_age=60").await;
    assert!(two_hours_later.body.contains(KEY));
    assert!(
        two_hours_later
            .body
            .contains("oldest 2h 0m since escalation")
    );
    let bad_age = visitor.get("/queue?namespace=shop&min_age=soon").await;
    assert_eq!(bad_age.status, 400);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn without_tokens_the_console_signs_in_by_name_and_records_it(pool: PgPool) {
    let console = ConsoleApp::spawn_open(pool).await;
    console.escalated_email(KEY, None).await;
    let visitor = Visitor::new(&console.url);
    let unnamed = visitor.sign_in("name", "   ").await;
    assert_eq!(unnamed.status, 400);
    assert_eq!(visitor.sign_in("name", "Dana").await.status, 303);
    let csrf = visitor.csrf().await;
    let form = resolve_form(&csrf, "1", "failed_final", "bounced: no such mailbox");
    let resolved = visitor.post("/operation/resolve", &form).await;
    assert_eq!(resolved.status, 303);
    let last = console.events(KEY).await.pop().unwrap();
    assert_eq!(
        last,
        (
            "failed_final".into(),
            "reviewer".into(),
            "Dana".into(),
            Some("bounced: no such mailbox".into())
        )
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it, as PEM files in `dir`.
fn certificates(dir: &std::path::Path) -> opjournal::api::tls::ServerTlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    server.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server-key.pem"), key.serialize_pem()).unwrap();
    opjournal::api::tls::ServerTlsFiles {
        cert_file: dir.join("server.pem"),
        key_file: dir.join("server-key.pem"),
        client_ca_file: None,
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn under_tls_the_console_speaks_https_only_with_renewed_certificates_and_a_secure_cookie(
    pool: PgPool,
) {
    opjournal::app::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let files = certificates(dir.path());
    let tls = opjournal::api::tls::server_config(&files).unwrap();
    let console = ConsoleApp::spawn_https(pool, tls.clone()).await;
    assert!(
        console.url.starts_with("https://127.0.0.1:"),
        "{}",
        console.url
    );
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let trusting =
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()]);
    let visitor = Visitor::with_client(&console.url, trusting);
    let signed_in = visitor.sign_in("token", ALICE).await;
    assert_eq!(signed_in.status, 303);
    let cookie = visitor
        .set_cookies
        .lock()
        .unwrap()
        .iter()
        .find(|c| c.starts_with("__Host-opjournal_console="))
        .cloned()
        .unwrap();
    assert!(
        cookie.contains("Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    assert!(
        cookie.contains("Path=/") && !cookie.contains("Domain"),
        "{cookie}"
    );
    assert_eq!(visitor.get("/queue").await.status, 200);
    // Plain HTTP on the same port gets no page.
    let plain = console.url.replace("https://", "http://");
    let answer = reqwest::Client::new()
        .get(format!("{plain}queue"))
        .send()
        .await;
    assert!(
        answer.is_err() || !answer.unwrap().status().is_success(),
        "plain HTTP served a page"
    );
    // HTTP/1.1-only clients are served too (the console offers h2 and http/1.1 by ALPN).
    let http1 = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .http1_only()
        .build()
        .unwrap();
    let page = http1.get(format!("{}sign-in", console.url)).send().await;
    assert_eq!(page.unwrap().version(), reqwest::Version::HTTP_11);

    // A renewed certificate (another CA here) serves new connections once the server's TLS
    // files are read again, with no restart: the console shares the gRPC port's TLS.
    let renewed = tempfile::tempdir().unwrap();
    certificates(renewed.path());
    for file in ["server.pem", "server-key.pem"] {
        std::fs::copy(renewed.path().join(file), dir.path().join(file)).unwrap();
    }
    assert!(tls.reload().unwrap());
    let new_ca = std::fs::read(renewed.path().join("ca.pem")).unwrap();
    let trusting_new = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&new_ca).unwrap()])
        .build()
        .unwrap();
    let page = trusting_new
        .get(format!("{}sign-in", console.url))
        .send()
        .await;
    assert_eq!(page.unwrap().status(), 200);
    let trusting_old = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .build()
        .unwrap();
    let refused = trusting_old
        .get(format!("{}sign-in", console.url))
        .send()
        .await;
    assert!(refused.is_err(), "the old certificate is still served");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_server_binary_serves_the_console_and_stops_it_on_sigterm(pool: PgPool) {
    let app = common::TestApp::spawn(pool).await;
    let (child, mut lines) = process::spawn_piped(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(["--console-listen", "127.0.0.1:0", "--database-url"])
            .arg(app.database_url())
            .env("RUST_LOG", "warn"),
    );
    let [url] = <[String; 1]>::try_from(
        process::announced_all(
            &mut lines,
            &["opjournal console on "],
            Duration::from_secs(30),
        )
        .await,
    )
    .unwrap();
    let sign_in = reqwest::get(format!("{url}sign-in")).await.unwrap();
    assert_eq!(sign_in.status(), 200);
    // Without tokens the form asks for a name.
    assert!(sign_in.text().await.unwrap().contains(r#"name="name""#));
    let htmx = reqwest::get(format!("{url}assets/htmx.min.js"))
        .await
        .unwrap();
    assert_eq!(htmx.status(), 200);
    assert!(
        htmx.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(htmx.text().await.unwrap().starts_with("var htmx="));

    process::terminate(child).await;
}

#[tokio::test]
async fn without_tokens_the_server_refuses_a_console_other_hosts_can_reach() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "check-config",
            "--database-url",
            "sqlite://unused/journal.db",
        ])
        .env("OPJOURNAL_CONSOLE__LISTEN", "0.0.0.0:8090")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("console.listen"), "{stderr}");
    let allowed = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "check-config",
            "--database-url",
            "sqlite://unused/journal.db",
        ])
        .env("OPJOURNAL_CONSOLE__LISTEN", "0.0.0.0:8090")
        .env("OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED", "true")
        .output()
        .await
        .unwrap();
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_operations_page_shows_where_its_webhook_deliveries_stand(pool: PgPool) {
    use opjournal::domain::model::{Namespace, OperationKey};
    use opjournal::store::DeliveryOutcome;

    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;
    let store = console.app.db.database().store();
    let deliveries = || async {
        let (namespace, key) = (
            Namespace::parse(SHOP).unwrap(),
            OperationKey::parse(KEY).unwrap(),
        );
        store.deliveries(&namespace, &key).await.unwrap()
    };
    let panel = |body: &str| {
        let start = body
            .find(r#"id="deliveries""#)
            .expect("the deliveries panel");
        body[start..].split("</section>").next().unwrap().to_owned()
    };

    // Escalated, no webhook configured: the event waits in the outbox, never attempted.
    let escalated = deliveries().await;
    assert_eq!(escalated.len(), 1);
    let page = panel(&visitor.get(&operation_path(KEY)).await.body);
    assert!(page.contains("operation.review_required"));
    assert!(page.contains(&escalated[0].event.event_id.to_string()));
    assert!(page.contains(">pending<"), "{page}");
    assert!(page.contains("due now"), "{page}");

    // The worker's first attempt fails with a 503: the page shows the answer and the retry.
    let claimed = store
        .claim_deliveries(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let failed = DeliveryOutcome::Failed {
        status_code: Some(503),
        error: "http_503".into(),
        retry_after: Duration::from_secs(300),
    };
    assert!(
        store
            .record_delivery(claimed[0].event.event_id, claimed[0].attempts, &failed)
            .await
            .unwrap()
    );
    let page = panel(&visitor.get(&operation_path(KEY)).await.body);
    assert!(page.contains("HTTP 503 (http_503)"), "{page}");
    assert!(page.contains("next attempt in 4m"), "{page}");

    // The reviewer resolves it: a second event. The first is then delivered, the second
    // given up on: each row shows its own state.
    let csrf = visitor.csrf().await;
    let form = resolve_form(&csrf, "1", "failed_final", "bounced: no such mailbox");
    assert_eq!(visitor.post("/operation/resolve", &form).await.status, 303);
    let delivered = DeliveryOutcome::Delivered { status_code: 204 };
    assert!(
        store
            .record_delivery(claimed[0].event.event_id, claimed[0].attempts, &delivered)
            .await
            .unwrap()
    );
    let resolution = store
        .claim_deliveries(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(resolution.len(), 1, "only the resolution's event is due");
    let dead = DeliveryOutcome::Dead {
        status_code: None,
        error: "connect".into(),
    };
    assert!(
        store
            .record_delivery(resolution[0].event.event_id, resolution[0].attempts, &dead)
            .await
            .unwrap()
    );
    let page = panel(&visitor.get(&operation_path(KEY)).await.body);
    assert!(page.contains("operation.review_resolved"), "{page}");
    assert!(
        page.contains(r#"class="delivery delivery-delivered""#),
        "{page}"
    );
    assert!(page.contains(r#"class="delivery delivery-dead""#), "{page}");
    assert!(
        page.contains("HTTP 204") && page.contains("given up"),
        "{page}"
    );
    let states: Vec<_> = deliveries()
        .await
        .iter()
        .map(|d| d.state.as_str())
        .collect();
    assert_eq!(states, ["delivered", "dead"]);

    // The outbox's totals span namespaces: a token scoped to the shop does not see them.
    let queue = visitor.get("/queue").await;
    assert!(!queue.body.contains("count-webhook-pending"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_queue_shows_the_webhook_outbox_to_callers_of_every_namespace(pool: PgPool) {
    let console = ConsoleApp::spawn_open(pool).await;
    console.escalated_email(KEY, None).await;
    console
        .escalated_email("email:order-818:shipped-v1", None)
        .await;
    let visitor = Visitor::new(&console.url);
    assert_eq!(visitor.sign_in("name", "Dana").await.status, 303);
    let queue = visitor.get("/queue?namespace=shop").await;
    let count = |id: &str| {
        let re = regex::Regex::new(&format!(r#"id="{id}">\s*<span class="n">(\d+)<"#)).unwrap();
        re.captures(&queue.body).unwrap()[1].parse::<i64>().unwrap()
    };
    assert_eq!(count("count-webhook-pending"), 2, "{}", queue.body);
    assert_eq!(count("count-webhook-dead"), 0);
    assert!(queue.body.contains("oldest waiting"));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn requests_the_console_cannot_read_get_its_own_page_and_change_nothing(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let visitor = Visitor::new(&console.url);
    visitor.sign_in("token", ALICE).await;

    // A query parameter given twice: refused before any handler, as the console's page.
    let twice = visitor.get("/queue?namespace=shop&namespace=other").await;
    assert_eq!(twice.status, 400);
    assert!(twice.body.contains("Invalid request"), "{}", twice.body);
    assert!(twice.body.contains("<html"), "a page, not axum's text");
    // A search mode the form does not offer is refused, not searched as a key.
    let bogus = visitor.get("/search?namespace=shop&by=bogus&q=x").await;
    assert_eq!(bogus.status, 400);
    assert!(
        bogus.body.contains(r#"id="search-problem""#),
        "{}",
        bogus.body
    );
    // A form over the size limit: 413, the console's page, nothing resolved.
    let csrf = visitor.csrf().await;
    let huge = "x".repeat(4 * 1024 * 1024);
    let form: Vec<_> = resolve_form(&csrf, "1", "succeeded", "found in the provider's dashboard")
        .into_iter()
        .map(|(name, value)| match name {
            "result_json" => (name, huge.as_str()),
            _ => (name, value),
        })
        .collect();
    let too_large = visitor.post("/operation/resolve", &form).await;
    assert_eq!(too_large.status, 413);
    assert!(
        too_large.body.contains("Request too large"),
        "{}",
        too_large.body
    );
    assert_untouched(&console).await;
    // The server keeps serving.
    assert_eq!(visitor.get("/queue").await.status, 200);
}

// Bounded before authentication: connections, timeouts, the sign-in form's size and rate.

/// Timeouts short enough for a test to see them act, and a sign-in rate out of the way.
fn quick_limits() -> ConsoleLimits {
    ConsoleLimits {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        sign_in_burst: 1000,
        sign_in_per_minute: 1000,
        ..ConsoleLimits::default()
    }
}

/// Time allowed past a timeout for the server to act on it.
const MARGIN: Duration = Duration::from_secs(3);

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_slow_loris_and_unfinished_sign_ins_are_closed_by_the_timeouts(pool: PgPool) {
    use tokio::io::AsyncWriteExt as _;
    let console = ConsoleApp::spawn_limited(pool, quick_limits()).await;
    let address = console.address();

    // A slow-loris: a request head trickled a byte every 100 ms, never finished.
    let (mut read, mut write) = connect_from(address, [127, 0, 0, 1]).await.into_split();
    let trickle = tokio::spawn(async move {
        let head = format!("GET /sign-in HTTP/1.1\r\nHost: {address}\r\nX-Padding: ");
        let bytes = head.bytes().chain(std::iter::repeat_n(b'a', 1000));
        for byte in bytes {
            if write.write_all(&[byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // A connection that never says anything, and one kept alive after an answer.
    let mut silent = connect_from(address, [127, 0, 0, 1]).await;
    let mut kept = connect_from(address, [127, 0, 0, 1]).await;
    kept.write_all(format!("GET /sign-in HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Unfinished sign-in POSTs: the whole head, 10 bytes of a 200-byte form, then nothing.
    let mut unfinished = Vec::new();
    for _ in 0..20 {
        let mut stream = connect_from(address, [127, 0, 0, 1]).await;
        let head = format!(
            "POST /sign-in HTTP/1.1\r\nHost: {address}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\n\
             csrf=aaaaa"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        unfinished.push(stream);
    }
    // Meanwhile gRPC callers of the same process are served.
    let begin = console
        .begin_email("email:order-901:shipped-v1", Some(ORCHESTRATOR))
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);

    let loris = read_until_closed(&mut read, Duration::from_secs(1) + MARGIN).await;
    assert!(loris.is_some(), "the slow-loris is still open");
    assert!(!loris.unwrap().contains("200 OK"));
    trickle.abort();
    assert!(
        read_until_closed(&mut silent, Duration::from_secs(1) + MARGIN)
            .await
            .is_some(),
        "a silent connection is still open"
    );
    let kept = read_until_closed(&mut kept, Duration::from_secs(1) + MARGIN).await;
    assert!(
        kept.as_deref()
            .is_some_and(|k| k.starts_with("HTTP/1.1 200")),
        "answered, then closed while idle: {kept:?}"
    );
    for stream in &mut unfinished {
        let answer = read_until_closed(stream, Duration::from_secs(1) + MARGIN).await;
        let answer = answer.expect("an unfinished sign-in is still open");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("did not arrive in time"), "{answer}");
    }
    // Nobody was signed in, and the console keeps serving.
    let page = exchange_from(address, [127, 0, 0, 1], &get_request(address, "/sign-in")).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn connections_past_the_cap_are_accepted_and_closed_and_others_still_served(pool: PgPool) {
    let limits = ConsoleLimits {
        max_connections: 6,
        max_connections_per_peer: 4,
        header_timeout: Duration::from_secs(60),
        ..ConsoleLimits::default()
    };
    let console = ConsoleApp::spawn_limited(pool, limits).await;
    let address = console.address();
    let sign_in = get_request(address, "/sign-in");
    let quick = Duration::from_millis(500);

    // One peer's four silent connections take its whole share: a fifth is accepted and
    // closed at once, before anything is read from it.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from(address, [127, 0, 0, 1]).await);
    }
    let mut fifth = connect_from(address, [127, 0, 0, 1]).await;
    assert_eq!(
        read_until_closed(&mut fifth, quick).await.as_deref(),
        Some(""),
        "past the peer's share: closed without a word"
    );
    // Another peer is still served, and so are gRPC callers.
    let page = exchange_from(address, [127, 0, 0, 2], &sign_in).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let begin = console
        .begin_email("email:order-902:shipped-v1", Some(ORCHESTRATOR))
        .await
        .unwrap();
    assert_eq!(decision(&begin), Decision::Execute);

    // A third peer fills the console (its connections stay open: admitted).
    while held.len() < 6 {
        let mut stream = connect_from(address, [127, 0, 0, 3]).await;
        if read_until_closed(&mut stream, quick).await.is_none() {
            held.push(stream);
        }
    }
    let mut full = connect_from(address, [127, 0, 0, 4]).await;
    assert_eq!(
        read_until_closed(&mut full, quick).await.as_deref(),
        Some(""),
        "past the cap: closed without a word"
    );
    // Once an attacker's connection closes, a legitimate request is served again.
    held.remove(0);
    let mut served = String::new();
    for _ in 0..50 {
        served = exchange_from(address, [127, 0, 0, 4], &sign_in).await;
        if !served.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert_eq!(
        console
            .app
            .counts("shop/email:order-902:shipped-v1")
            .effects,
        0
    );
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_sign_in_form_over_the_small_limit_is_refused_unread(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let address = console.address();
    // A declared megabyte, none of it sent: refused at once from the head alone.
    let declared = format!(
        "POST /sign-in HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000\r\n\r\n"
    );
    let started = std::time::Instant::now();
    let answer = exchange_from(address, [127, 0, 0, 1], &declared).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("Request too large"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not the body timeout"
    );
    // A form without a length is cut at the same limit.
    let chunk = "x".repeat(8 * 1024);
    let chunked = format!(
        "POST /sign-in HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\ntoken={chunk}\r\n0\r\n\r\n",
        chunk.len() + 6
    );
    let answer = exchange_from(address, [127, 0, 0, 1], &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Signed-in forms keep their larger limit: a 20 KiB result is accepted.
    let visitor = Visitor::new(&console.url);
    assert_eq!(visitor.sign_in("token", ALICE).await.status, 303);
    let csrf = visitor.csrf().await;
    let result = format!(r#"{{"status":"sent","note":"{}"}}"#, "n".repeat(20 * 1024));
    let form: Vec<_> = resolve_form(&csrf, "1", "succeeded", "seen in the provider's log")
        .into_iter()
        .map(|(name, value)| match name {
            "result_json" => (name, result.as_str()),
            _ => (name, value),
        })
        .collect();
    let resolved = visitor.post("/operation/resolve", &form).await;
    assert_eq!(resolved.status, 303, "{}", resolved.body);
    assert_eq!(console.row(KEY).await.0, "succeeded");
    assert_eq!(console.emails_sent(KEY), 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn sign_in_attempts_past_the_rate_are_answered_429_per_peer(pool: PgPool) {
    let limits = ConsoleLimits {
        sign_in_burst: 3,
        sign_in_per_minute: 1,
        ..ConsoleLimits::default()
    };
    let console = ConsoleApp::spawn_limited(pool, limits).await;
    let guesser = Visitor::new(&console.url);
    for attempt in 0..3 {
        let wrong = guesser
            .sign_in("token", &format!("tok-guess.{attempt}"))
            .await;
        assert_eq!(wrong.status, 401, "attempt {attempt}");
    }
    let page = guesser.get("/sign-in").await;
    let csrf = csrf_of(&page.body);
    let client = reqwest::Client::new();
    let limited = client
        .post(format!("{}sign-in", console.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("opjournal_console_sign_in={csrf}"))
        .body(form_body(&[("csrf", &csrf), ("token", ALICE)]))
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429, "even the right token waits");
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_security_headers(limited.headers(), false);
    assert!(limited.headers().get("set-cookie").is_none());
    let body = limited.text().await.unwrap();
    assert!(body.contains("Too many sign-in attempts"), "{body}");
    // Pages are not rate limited, and another peer signs in.
    assert_eq!(guesser.get("/sign-in").await.status, 200);
    let local = std::net::IpAddr::from([127, 0, 0, 2]);
    let other = Visitor::with_client(
        &console.url,
        reqwest::Client::builder().local_address(local),
    );
    assert_eq!(other.sign_in("token", ALICE).await.status, 303);
    assert_eq!(other.get("/queue").await.status, 200);
}

// Only its own address: DNS rebinding and cross-site forms.

/// The headers of every answer, refusals included; HSTS over HTTPS only.
fn assert_security_headers(headers: &reqwest::header::HeaderMap, https: bool) {
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(
        headers.get("strict-transport-security").is_some(),
        https,
        "HSTS over HTTPS only"
    );
}

/// A page of another site rebinding its name to the console (`Host: evil.example:PORT`)
/// gets the refusal page and no session; the console's own names are answered.
async fn assert_only_its_own_names_are_answered(url: &str, client: reqwest::ClientBuilder) {
    let https = url.starts_with("https://");
    // HTTP/1.1, where the `Host` header is sent as given.
    let client = client
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let port = url.trim_end_matches('/').rsplit(':').next().unwrap();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
    ] {
        let page = client
            .get(format!("{url}sign-in"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 421, "{host}");
        assert_security_headers(page.headers(), https);
        assert!(page.headers().get("set-cookie").is_none());
        let body = page.text().await.unwrap();
        assert!(body.contains("answers only to its own address"), "{body}");
        assert!(!body.contains(r#"name="csrf""#));
        let sign_in = client
            .post(format!("{url}sign-in"))
            .header("host", &host)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(&[
                ("csrf", "x"),
                ("token", ALICE),
                ("name", "mallory"),
            ]))
            .send()
            .await
            .unwrap();
        assert_eq!(sign_in.status(), 421, "{host}");
        assert!(sign_in.headers().get("set-cookie").is_none());
        let queue = client
            .get(format!("{url}queue"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(queue.status(), 421, "{host}");
    }
    // Its own names: the address it listens on, and for a loopback console `localhost` on
    // any port (what `kubectl port-forward` gives a browser).
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost:18090".to_owned(),
    ] {
        let page = client
            .get(format!("{url}sign-in"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "{host}");
        assert_security_headers(page.headers(), https);
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_rebound_host_is_refused_without_tokens(pool: PgPool) {
    let console = ConsoleApp::spawn_open(pool).await;
    console.escalated_email(KEY, None).await;
    assert_only_its_own_names_are_answered(&console.url, reqwest::Client::builder()).await;
    assert_eq!(console.row(KEY).await, ("unknown".into(), 1, true));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_rebound_host_is_refused_with_tokens(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    assert_only_its_own_names_are_answered(&console.url, reqwest::Client::builder()).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_rebound_host_is_refused_over_https_and_every_answer_carries_hsts(pool: PgPool) {
    opjournal::app::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let files = certificates(dir.path());
    let tls = opjournal::api::tls::server_config(&files).unwrap();
    let console = ConsoleApp::spawn_https(pool, tls).await;
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let trusting = || {
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
    };
    assert_only_its_own_names_are_answered(&console.url, trusting()).await;
    // Over HTTP/2 as well: every answer carries HSTS.
    let page = trusting()
        .build()
        .unwrap()
        .get(format!("{}sign-in", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.version(), reqwest::Version::HTTP_2);
    assert_security_headers(page.headers(), true);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_form_whose_origin_is_another_site_changes_nothing(pool: PgPool) {
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    let own_origin = console.url.trim_end_matches('/').to_owned();
    let visitor = Visitor::new(&console.url);
    // Sign-in from another site's page (another name, another port), or from an opaque
    // origin the browser says is another site: refused.
    for (origin, fetch_site) in [
        ("http://evil.example", None),
        ("http://127.0.0.1:1", None),
        ("null", Some("cross-site")),
    ] {
        let page = visitor.get("/sign-in").await;
        let csrf = csrf_of(&page.body);
        let mut headers = vec![("origin", origin)];
        headers.extend(fetch_site.map(|site| ("sec-fetch-site", site)));
        let refused = visitor
            .post_with("/sign-in", &[("csrf", &csrf), ("token", ALICE)], &headers)
            .await;
        assert_eq!(refused.status, 403, "{origin}");
        assert!(refused.body.contains("came from another site"), "{origin}");
        assert_eq!(visitor.get("/queue").await.status, 303, "still signed out");
    }
    // Its own origin, or `null` from its own page (what browsers send under the pages'
    // `no-referrer` policy): signed in.
    for origin in [own_origin.as_str(), "null"] {
        let visitor = Visitor::new(&console.url);
        let page = visitor.get("/sign-in").await;
        let csrf = csrf_of(&page.body);
        let signed_in = visitor
            .post_with(
                "/sign-in",
                &[("csrf", &csrf), ("token", ALICE)],
                &[("origin", origin), ("sec-fetch-site", "same-origin")],
            )
            .await;
        assert_eq!(signed_in.status, 303, "{origin}");
    }
    let page = visitor.get("/sign-in").await;
    let csrf = csrf_of(&page.body);
    let signed_in = visitor
        .post_with(
            "/sign-in",
            &[("csrf", &csrf), ("token", ALICE)],
            &[("origin", &own_origin)],
        )
        .await;
    assert_eq!(signed_in.status, 303, "its own origin");
    // A resolution with the session's CSRF token but another site's origin: refused, and
    // the refusal page carries the headers of every page.
    let csrf = visitor.csrf().await;
    let form = resolve_form(&csrf, "1", "succeeded", "seen");
    let refused = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{}operation/resolve", console.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", "http://evil.example")
        .header("cookie", visitor.cookie_header())
        .body(form_body(&form))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert_security_headers(refused.headers(), false);
    assert_untouched(&console).await;
    let resolved = visitor
        .post_with("/operation/resolve", &form, &[("origin", &own_origin)])
        .await;
    assert_eq!(resolved.status, 303, "{}", resolved.body);
    assert_eq!(console.emails_sent(KEY), 1);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn an_idle_https_connection_is_closed_after_the_idle_timeout(pool: PgPool) {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    opjournal::app::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let files = certificates(dir.path());
    let tls = opjournal::api::tls::server_config(&files).unwrap();
    let limits = ConsoleLimits {
        idle_timeout: Duration::from_secs(2),
        ..ConsoleLimits::default()
    };
    let console = ConsoleApp::spawn_https_limited(pool, tls, limits).await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.path().join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(console.address())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut client, connection) = h2::client::handshake(stream).await.unwrap();
    let mut connection = tokio::spawn(connection);
    // One page over HTTP/2, then nothing: no stream open, no byte either way.
    let request = http::Request::get(format!("{}sign-in", console.url))
        .body(())
        .unwrap();
    let (answer, _) = client.send_request(request, true).unwrap();
    let answer = answer.await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().contains_key("strict-transport-security"));
    let mut body = answer.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(2) + MARGIN, &mut connection)
        .await
        .expect("the idle connection is still open")
        .unwrap()
        .ok();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "closed for idleness, not at once"
    );
    // The console keeps serving new connections.
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let page = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .build()
        .unwrap()
        .get(format!("{}sign-in", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
}
