//! The review console in a real browser: headless Chromium from Debian's packages, driven
//! through WebDriver (chromedriver), against the real server and its console, Postgres and
//! the sandbox provider. `scripts/test` installs the browser (`scripts/browser-env`).
//!
//! An e-mail the provider sent while its answer was lost is escalated through the real API;
//! a reviewer signs in, finds it in the queue, resolves it with a reason; the next Begin
//! replays and the provider sent one e-mail; a second tab still holding the old page is told
//! the operation changed meanwhile; a client-role token cannot resolve. Each page's
//! screenshot is written to `target/console-screenshots/` (and, with
//! `OPJOURNAL_UPDATE_DOCS_SCREENSHOTS=1`, copied to `docs/images/console-*.png`).
//!
//! Without Chromium the test says so and passes, except under `CI=true`, where a missing
//! browser fails it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::console::*;
use common::decision;
use fantoccini::{Client, ClientBuilder, Locator};
use opjournal::proto::Decision;
use sqlx::PgPool;
use tokio::process::{Child, Command};

const KEY: &str = "email:order-817:shipped-v1";
const SECOND_KEY: &str = "email:order-818:shipped-v1";
const WIDTH: u32 = 1360;

/// Chromium and chromedriver: `OPJOURNAL_TEST_CHROMIUM` / `OPJOURNAL_TEST_CHROMEDRIVER`, or
/// found on `PATH`.
fn browser_tools() -> Option<(PathBuf, PathBuf)> {
    let on_path = |names: &[&str]| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    };
    let chromium = std::env::var_os("OPJOURNAL_TEST_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| on_path(&["chromium", "chromium-browser"]))?;
    let driver = std::env::var_os("OPJOURNAL_TEST_CHROMEDRIVER")
        .map(PathBuf::from)
        .or_else(|| on_path(&["chromedriver"]))?;
    Some((chromium, driver))
}

/// A chromedriver on a free local port, stopped with the test.
struct Driver {
    _process: Child,
    url: String,
    chromium: PathBuf,
}

impl Driver {
    async fn start(chromium: PathBuf, chromedriver: &Path) -> Self {
        // The free port may be taken again before chromedriver binds it (other processes
        // open connections meanwhile): a driver that exited is started again on another.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut process = Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let url = format!("http://127.0.0.1:{port}");
            // Ready when /status answers (bounded: chromedriver starts in well under a
            // second, a loaded machine given a minute).
            let client = reqwest::Client::new();
            for _ in 0..600 {
                if client
                    .get(format!("{url}/status"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    return Self {
                        _process: process,
                        url,
                        chromium,
                    };
                }
                if process.try_wait().unwrap().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("chromedriver did not start");
    }

    /// A new browser session (its own cookies: another person).
    async fn browser(&self) -> Client {
        let capabilities = serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--hide-scrollbars", "--force-device-scale-factor=1", "--lang=en-US",
                    format!("--window-size={WIDTH},900"),
                ],
            },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap()
    }
}

/// Where screenshots go: `<target>/console-screenshots/`.
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The window height that shows the whole page: its content's height, at least 480, plus
/// what the window takes besides the page (CSS pixels).
async fn fitting_height(browser: &Client) -> u32 {
    let script = "return Math.ceil(Math.max(480, document.body.getBoundingClientRect().height) \
                  + window.outerHeight - window.innerHeight);";
    let height = browser
        .execute(script, vec![])
        .await
        .unwrap()
        .as_u64()
        .unwrap();
    u32::try_from(height).unwrap().min(5000)
}

/// Writes a screenshot of the whole page as `<name>.png`; returns its path.
async fn snap(browser: &Client, name: &str) -> PathBuf {
    let height = fitting_height(browser).await;
    browser.set_window_size(WIDTH, height).await.unwrap();
    let png = browser.screenshot().await.unwrap();
    browser.set_window_size(WIDTH, 900).await.unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name} is a PNG");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, &png).unwrap();
    if std::env::var_os("OPJOURNAL_UPDATE_DOCS_SCREENSHOTS").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::copy(&path, docs.join(format!("console-{name}.png"))).unwrap();
    }
    path
}

/// The text of the element `css` once it is there (htmx may replace it meanwhile: then the
/// new one's).
async fn text(browser: &Client, css: &str) -> String {
    for _ in 0..10 {
        let element = browser
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        match element.text().await {
            Ok(text) => return text,
            Err(fantoccini::error::CmdError::Standard(e))
                if e.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
            Err(e) => panic!("{css}: {e}"),
        }
    }
    panic!("{css} kept being replaced")
}

async fn fill(browser: &Client, css: &str, value: &str) {
    let field = browser.find(Locator::Css(css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
}

async fn click(browser: &Client, css: &str) {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Signs `browser` in with `token` from the page a signed-out visit is sent to.
async fn sign_in(browser: &Client, console: &ConsoleApp, token: &str) {
    browser
        .goto(&format!("{}queue", console.url))
        .await
        .unwrap();
    assert!(
        browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/sign-in")
    );
    fill(browser, "#token", token).await;
    click(browser, "form.stack button").await;
    text(browser, "#signed-in-as").await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_reviewer_resolves_an_escalated_operation_in_the_browser(pool: PgPool) {
    let Some((chromium, chromedriver)) = browser_tools() else {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !ci,
            "chromium and chromedriver are missing (scripts/browser-env installs them)"
        );
        eprintln!("skipped: no chromium/chromedriver (run scripts/browser-env)");
        return;
    };
    let console = ConsoleApp::spawn(pool).await;
    console.escalated_email(KEY, Some(ORCHESTRATOR)).await;
    console
        .escalated_email(SECOND_KEY, Some(ORCHESTRATOR))
        .await;
    // Work in flight besides the queue: an e-mail being sent right now.
    let begin = console
        .begin_email("email:order-819:shipped-v1", Some(ORCHESTRATOR))
        .await;
    assert_eq!(decision(&begin.unwrap()), Decision::Execute);

    let driver = Driver::start(chromium, &chromedriver).await;
    let reviewer = driver.browser().await;

    // Signed out, the console shows its sign-in form.
    reviewer
        .goto(&format!("{}queue", console.url))
        .await
        .unwrap();
    text(&reviewer, "#token").await;
    snap(&reviewer, "sign-in").await;
    sign_in(&reviewer, &console, ALICE).await;

    // The queue: counts, then both escalations, oldest first.
    assert_eq!(text(&reviewer, "#signed-in-as").await, "alice");
    assert!(
        text(&reviewer, "#count-review")
            .await
            .starts_with("2\nwaiting for review")
    );
    assert!(
        text(&reviewer, "#count-review")
            .await
            .contains("since escalation")
    );
    assert!(text(&reviewer, "#count-in-progress").await.starts_with('1'));
    let keys = reviewer
        .find_all(Locator::Css("table.ops td.key"))
        .await
        .unwrap();
    let mut shown = Vec::new();
    for key in keys {
        shown.push(key.text().await.unwrap());
    }
    assert_eq!(shown, [KEY, SECOND_KEY]);
    // htmx is loaded from the console itself and filters in place.
    let htmx = reviewer
        .execute("return htmx.version;", vec![])
        .await
        .unwrap();
    assert_eq!(htmx, opjournal::api::console::assets::HTMX_VERSION);
    snap(&reviewer, "queue").await;
    fill(&reviewer, "input[name=action_type]", "create_payment").await;
    click(&reviewer, "#filters button").await;
    text(&reviewer, "#queue-empty").await;
    assert!(
        reviewer
            .current_url()
            .await
            .unwrap()
            .query()
            .unwrap()
            .contains("action_type=create_payment")
    );
    reviewer
        .goto(&format!("{}queue", console.url))
        .await
        .unwrap();

    // The operation's page, in this tab and in a second one.
    reviewer
        .wait()
        .for_element(Locator::LinkText(KEY))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&reviewer, "#operation-status").await, "unknown");
    let history = text(&reviewer, "#history").await;
    assert!(history.contains("no_lookup; escalated:no_provider_lookup"));
    assert!(text(&reviewer, "#references").await.contains("C-817"));
    snap(&reviewer, "operation").await;
    let operation_url = reviewer.current_url().await.unwrap();
    let first_tab = reviewer.window().await.unwrap();
    let second_tab = reviewer.new_window(true).await.unwrap().handle;
    reviewer.switch_to_window(second_tab.clone()).await.unwrap();
    reviewer.goto(operation_url.as_str()).await.unwrap();
    text(&reviewer, "#resolve-release").await;

    // The reviewer checked the provider: the e-mail went out. Resolve it, with a reason.
    reviewer.switch_to_window(first_tab).await.unwrap();
    fill(
        &reviewer,
        "#resolve-succeeded input[name=external_id]",
        "em_1",
    )
    .await;
    fill(
        &reviewer,
        "#resolve-succeeded textarea[name=result_json]",
        r#"{"status": "sent"}"#,
    )
    .await;
    fill(
        &reviewer,
        "#resolve-succeeded textarea[name=reason]",
        "Delivered per the provider's message log",
    )
    .await;
    click(&reviewer, "#resolve-succeeded button").await;
    assert!(
        text(&reviewer, "#banner-ok")
            .await
            .contains("Resolved: succeeded")
    );
    assert_eq!(text(&reviewer, "#operation-status").await, "succeeded");
    let history = text(&reviewer, "#history").await;
    assert!(history.contains("reviewer alice"));
    assert!(history.contains("Delivered per the provider's message log"));
    snap(&reviewer, "resolved").await;
    assert_eq!(console.row(KEY).await, ("succeeded".into(), 1, false));
    let last = console.events(KEY).await.pop().unwrap();
    assert_eq!(
        (last.1.as_str(), last.2.as_str()),
        ("reviewer", "alice"),
        "{last:?}"
    );

    // The next Begin replays the recorded outcome: the provider sent one e-mail, ever.
    let replay = console.begin_email(KEY, Some(ORCHESTRATOR)).await.unwrap();
    assert_eq!(decision(&replay), Decision::Replay);
    assert_eq!(
        replay.operation.unwrap().external_id.as_deref(),
        Some("em_1")
    );
    assert_eq!(console.emails_sent(KEY), 1);

    // The second tab still shows the old page; acting on it is refused, and says why.
    reviewer.switch_to_window(second_tab).await.unwrap();
    fill(
        &reviewer,
        "#resolve-release textarea[name=reason]",
        "Not in the provider's log",
    )
    .await;
    click(&reviewer, "#resolve-release button").await;
    let changed = text(&reviewer, "#banner-changed").await;
    assert!(
        changed.contains("changed while your page was open"),
        "{changed}"
    );
    assert!(
        changed.contains("it is now succeeded at attempt 1"),
        "{changed}"
    );
    assert!(changed.contains("reviewer alice"), "{changed}");
    snap(&reviewer, "changed-meanwhile").await;
    assert_eq!(console.row(KEY).await, ("succeeded".into(), 1, false));
    let reviewer_events = console
        .events(KEY)
        .await
        .into_iter()
        .filter(|e| e.1 == "reviewer")
        .count();
    assert_eq!(reviewer_events, 1);

    // Search by the provider's id.
    reviewer
        .goto(&format!("{}search", console.url))
        .await
        .unwrap();
    reviewer
        .find(Locator::Css("select[name=by]"))
        .await
        .unwrap()
        .select_by_value("external_id")
        .await
        .unwrap();
    fill(&reviewer, "input[name=q]", "em_1").await;
    click(&reviewer, "form.filters button").await;
    assert_eq!(text(&reviewer, "table.ops td.key").await, KEY);
    snap(&reviewer, "search").await;

    // A client-role token: it may read an operation, never resolve one.
    let orchestrator = driver.browser().await;
    sign_in(&orchestrator, &console, ORCHESTRATOR).await;
    assert!(
        text(&orchestrator, "#error-message")
            .await
            .contains("ListOperationsForReview")
    );
    let second = format!(
        "{}{}",
        console.url.trim_end_matches('/'),
        operation_path(SECOND_KEY)
    );
    orchestrator.goto(&second).await.unwrap();
    assert!(
        text(&orchestrator, "#resolve-not-allowed")
            .await
            .contains("reviewer or admin")
    );
    assert!(
        orchestrator
            .find_all(Locator::Css("form.resolve"))
            .await
            .unwrap()
            .is_empty()
    );
    snap(&orchestrator, "client-read-only").await;
    // Sending the form anyway, with the session's own CSRF token, is refused by role.
    let forge = r#"
        const form = document.createElement('form');
        form.method = 'post';
        form.action = '/operation/resolve';
        const fields = Object.assign({csrf: document.querySelector('input[name=csrf]').value},
                                     arguments[0]);
        for (const [name, value] of Object.entries(fields)) {
            const input = document.createElement('input');
            input.type = 'hidden'; input.name = name; input.value = value;
            form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
    "#;
    let fields = serde_json::json!({
        "namespace": SHOP, "key": SECOND_KEY, "expected_attempt": "1",
        "decision": "release_for_retry", "reason": "retry it",
    });
    orchestrator.execute(forge, vec![fields]).await.unwrap();
    let refused = text(&orchestrator, "#error-message").await;
    assert!(refused.contains("ResolveOperation"), "{refused}");
    snap(&orchestrator, "client-refused").await;
    assert_eq!(console.row(SECOND_KEY).await, ("unknown".into(), 1, true));

    orchestrator.close().await.unwrap();
    reviewer.close().await.unwrap();
    for name in [
        "sign-in",
        "queue",
        "operation",
        "resolved",
        "changed-meanwhile",
        "search",
        "client-read-only",
        "client-refused",
    ] {
        let written = std::fs::metadata(screenshot_dir().join(format!("{name}.png"))).unwrap();
        assert!(
            written.len() > 10_000,
            "{name}.png is {} bytes",
            written.len()
        );
    }
}
