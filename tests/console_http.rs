//! The review console over plain HTTP (no browser): sign-in, CSRF and role refusals, the
//! compare-and-set on the attempt a page showed, what a page shows and never shows, search
//! and the queue's filters. The real server with its console, real Postgres, the sandbox
//! provider; every refusal is checked against the journal's rows, not only the answer.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::Duration;

use common::console::*;
use common::decision;
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
    use tokio::io::{AsyncBufReadExt, BufReader};
    let app = common::TestApp::spawn(pool).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(["--console-listen", "127.0.0.1:0", "--database-url"])
        .arg(app.database_url())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut url = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(rest) = line.strip_prefix("opjournal console on ") {
            url = Some(rest.to_owned());
            break;
        }
    }
    let url = url.expect("the server announced its console");
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

    let pid = child.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the server stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn without_tokens_the_server_refuses_a_console_other_hosts_can_reach() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "check-config",
            "--database-url",
            "sqlite://unused/journal.db",
        ])
        .env("OPJOURNAL_CONSOLE_LISTEN", "0.0.0.0:8090")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("console_listen"), "{stderr}");
    let allowed = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "check-config",
            "--database-url",
            "sqlite://unused/journal.db",
        ])
        .env("OPJOURNAL_CONSOLE_LISTEN", "0.0.0.0:8090")
        .env("OPJOURNAL_INSECURE_ALLOW_UNAUTHENTICATED", "true")
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
