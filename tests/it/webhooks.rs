//! Escalation webhooks end to end: the real reconcile worker binary delivers the journal's
//! escalation outbox to a real HTTP receiver in this test, which verifies every signature
//! (Standard Webhooks: HMAC-SHA256 over "{id}.{timestamp}.{body}") and de-duplicates by event
//! id. Each escalation and each resolution reaches it exactly once after de-duplication,
//! including while it is down for a while and when the worker is killed between the
//! escalation and the delivery.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::*;
use hmac::{KeyInit as _, Mac as _};
use opjournal::domain::model::{Namespace, OperationKey};
use opjournal::store::{DeliveryState, OutboxEntry};
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

const KEY: [u8; 32] = [0x42; 32];
const EMAIL_PAYLOAD: &str = r#"{"case":"442","template":"confirmation-v1"}"#;

fn secret() -> String {
    format!("whsec_{}", BASE64.encode(KEY))
}

/// Whether `signature` (a `webhook-signature` header: space-separated `v1,<base64>`) signs
/// `id`, `timestamp` and `body` with `key`, as a receiver checks it.
fn verifies(key: &[u8], id: &str, timestamp: &str, body: &[u8], signature: &str) -> bool {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = BASE64.encode(mac.finalize().into_bytes());
    signature
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|candidate| candidate == expected)
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// 204 at once.
    Up,
    /// 503 without recording anything.
    Unavailable,
    /// Records the event, then never answers (a receiver that processed it while the
    /// sender died).
    Hang,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    timestamp: String,
    signature: String,
    body: Bytes,
}

#[derive(Default)]
struct Seen {
    /// Every verified arrival (duplicates included).
    arrivals: Vec<Delivery>,
    /// Requests whose signature or timestamp did not verify.
    rejected: usize,
}

/// A webhook receiver on 127.0.0.1 that verifies and de-duplicates by event id; it can be
/// stopped (connections refused) and started again on the same port.
#[derive(Clone)]
struct Receiver {
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Seen>>,
    port: u16,
    stop: Arc<Mutex<Option<CancellationToken>>>,
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mode = *receiver.mode.lock().unwrap();
    if mode == Mode::Unavailable {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let delivery = Delivery {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body,
    };
    let fresh = delivery
        .timestamp
        .parse::<i64>()
        .is_ok_and(|t| (chrono::Utc::now().timestamp() - t).abs() <= 300);
    let valid = verifies(
        &KEY,
        &delivery.id,
        &delivery.timestamp,
        &delivery.body,
        &delivery.signature,
    );
    if !(fresh && valid) {
        receiver.seen.lock().unwrap().rejected += 1;
        return StatusCode::UNAUTHORIZED;
    }
    receiver.seen.lock().unwrap().arrivals.push(delivery);
    if mode == Mode::Hang {
        std::future::pending::<()>().await;
    }
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// A receiver on a free port, not listening yet.
    async fn new() -> Self {
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        Self {
            mode: Arc::new(Mutex::new(Mode::Up)),
            seen: Arc::default(),
            port,
            stop: Arc::default(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/opjournal", self.port)
    }

    async fn start(&self) {
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        let stop = CancellationToken::new();
        *self.stop.lock().unwrap() = Some(stop.clone());
        let app = axum::Router::new()
            .route("/hooks/opjournal", axum::routing::post(receive))
            .with_state(self.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .unwrap();
        });
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn arrivals(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().arrivals.clone()
    }

    fn rejected(&self) -> usize {
        self.seen.lock().unwrap().rejected
    }

    /// The events after de-duplication by id, each with its body; panics if two arrivals of
    /// one id carry different bodies.
    fn events(&self) -> BTreeMap<String, serde_json::Value> {
        let mut events = BTreeMap::new();
        for delivery in self.arrivals() {
            let body: serde_json::Value = serde_json::from_slice(&delivery.body).unwrap();
            assert_eq!(body["data"]["event_id"], delivery.id.as_str());
            if let Some(earlier) = events.insert(delivery.id.clone(), body.clone()) {
                assert_eq!(
                    earlier, body,
                    "every attempt of one event sends the same body"
                );
            }
        }
        events
    }
}

/// Waits until `done` holds, for at most a minute.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut done: impl FnMut() -> F,
) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(60), "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The reconcile worker binary over `app`'s database, delivering to `url` with `secret`.
async fn start_worker(app: &TestApp, policy: &std::path::Path, url: &str, secret: &str) -> Child {
    let args = [
        "--database-url".to_owned(),
        app.db.url(),
        "--policy".to_owned(),
        policy.display().to_string(),
        "--health-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    let mut command = Command::new(env!("CARGO_BIN_EXE_opjournal-reconciler"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env("OPJOURNAL_RECONCILE__POLL_INTERVAL", "0.1")
        .env("OPJOURNAL_WEBHOOK__URL", url)
        .env("OPJOURNAL_WEBHOOK__SECRET", secret)
        .env("OPJOURNAL_WEBHOOK__TIMEOUT", "1")
        .env("OPJOURNAL_WEBHOOK__CLAIM_HOLD", "2")
        .env("OPJOURNAL_WEBHOOK__RETRY_BASE", "0.1")
        .env("OPJOURNAL_WEBHOOK__RETRY_CAP", "0.4")
        .env("OPJOURNAL_WEBHOOK__POLL_INTERVAL", "0.1");
    process::spawn_announcing(&mut command, "opjournal-reconciler health on")
        .await
        .0
}

/// Sends `signal` to the worker and waits for it to stop.
async fn kill(child: Child, signal: &str) {
    process::stop(child, signal).await;
}

fn write_policy(app: &TestApp) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), &app.policy_yaml).unwrap();
    dir
}

/// An e-mail whose outcome is unknown: its action has no lookup, so the next reconcile poll
/// sends it to review at once.
async fn unknown_email(app: &TestApp, key: &str) {
    let begin = app.begin(key, "send_email", EMAIL_PAYLOAD).await.unwrap();
    assert_eq!(app.send_email(key, Some("commit-then-timeout")).await, None);
    app.report_unknown(&begin.lease_token).await;
}

async fn outbox(app: &TestApp, key: &str) -> Vec<OutboxEntry> {
    let store = app.db.database().store();
    let (ns, key) = (
        Namespace::parse("").unwrap(),
        OperationKey::parse(key).unwrap(),
    );
    store.deliveries(&ns, &key).await.unwrap()
}

async fn all_delivered(app: &TestApp, keys: &[&str]) -> bool {
    for key in keys {
        let entries = outbox(app, key).await;
        if entries.is_empty() || entries.iter().any(|e| e.state != DeliveryState::Delivered) {
            return false;
        }
    }
    true
}

/// Escalation then resolution, each seen once by the receiver with the journal's facts.
async fn escalation_and_resolution_reach_the_receiver_once(app: &TestApp) {
    let receiver = Receiver::new().await;
    receiver.start().await;
    let dir = write_policy(app);
    let worker = start_worker(
        app,
        &dir.path().join("policy.yaml"),
        &receiver.url(),
        &secret(),
    )
    .await;
    let key = "email:case-442:confirmation-v1";
    unknown_email(app, key).await;
    eventually("the escalation is delivered", || async {
        receiver.events().len() == 1
    })
    .await;
    app.resolve_as_sent(key).await;
    eventually("the resolution is delivered", || async {
        receiver.events().len() == 2 && all_delivered(app, &[key]).await
    })
    .await;
    kill(worker, "-TERM").await;

    let events = receiver.events();
    let mut bodies: Vec<_> = events.values().cloned().collect();
    bodies.sort_by_key(|b| b["data"]["occurred_at"].as_str().unwrap().to_owned());
    let [required, resolved] = bodies.as_slice() else {
        panic!("{bodies:#?}")
    };
    assert_eq!(required["type"], "operation.review_required");
    assert_eq!(required["data"]["operation_key"], key);
    assert_eq!(required["data"]["action_type"], "send_email");
    assert_eq!(required["data"]["status"], "unknown");
    assert_eq!(required["data"]["attempt"], 1);
    assert_eq!(required["data"]["reason"], "no_provider_lookup");
    assert_eq!(required["data"]["business_references"]["order_id"], "817");
    assert!(required["data"]["resolution"].is_null());
    assert_eq!(resolved["type"], "operation.review_resolved");
    assert_eq!(resolved["data"]["status"], "succeeded");
    assert_eq!(resolved["data"]["resolution"], "succeeded");
    assert_eq!(resolved["data"]["resolved_by"], "reviewer");
    assert_eq!(resolved["data"]["reviewer"], "alice");
    assert_eq!(resolved["data"]["reason"], "seen in the provider's log");
    let text = serde_json::to_string(&bodies).unwrap();
    assert!(
        !text.contains("em_1") && !text.contains("sent\\\""),
        "no result in events"
    );
    assert_eq!(receiver.rejected(), 0, "every signature verified");

    // The signature binds the secret, the id, the timestamp and the body.
    let delivery = &receiver.arrivals()[0];
    let (id, at, signature) = (&delivery.id, &delivery.timestamp, &delivery.signature);
    assert!(verifies(&KEY, id, at, &delivery.body, signature));
    assert!(
        !verifies(&[0x43; 32], id, at, &delivery.body, signature),
        "wrong secret"
    );
    assert!(!verifies(&KEY, id, at, b"{}", signature), "other body");
    assert!(
        !verifies(&KEY, "other-id", at, &delivery.body, signature),
        "other id"
    );
    let entries = outbox(app, key).await;
    assert!(entries.iter().all(|e| e.last_status_code == Some(204)));
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn each_escalation_and_resolution_reaches_a_deduplicating_receiver_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    escalation_and_resolution_reach_the_receiver_once(&app).await;
}

#[tokio::test]
async fn the_embedded_journal_delivers_escalations_too() {
    let app = TestApp::spawn_sqlite().await;
    escalation_and_resolution_reach_the_receiver_once(&app).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_receiver_down_for_a_while_gets_every_event_once_after_backoff(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let receiver = Receiver::new().await; // not listening: connections are refused
    let dir = write_policy(&app);
    let worker = start_worker(
        &app,
        &dir.path().join("policy.yaml"),
        &receiver.url(),
        &secret(),
    )
    .await;
    let keys = ["email:a", "email:b", "email:c"];
    for key in keys {
        unknown_email(&app, key).await;
    }
    eventually("every event was refused more than once", || async {
        for key in keys {
            let entries = outbox(&app, key).await;
            if !entries
                .iter()
                .any(|e| e.attempts >= 2 && e.last_error.as_deref() == Some("connect"))
            {
                return false;
            }
        }
        true
    })
    .await;
    // Back, but failing.
    receiver.set(Mode::Unavailable);
    receiver.start().await;
    eventually("an attempt got a 503", || async {
        outbox(&app, keys[0]).await[0].last_status_code == Some(503)
    })
    .await;
    assert!(receiver.events().is_empty());
    receiver.set(Mode::Up);
    eventually("every event is delivered", || async {
        all_delivered(&app, &keys).await
    })
    .await;
    kill(worker, "-TERM").await;

    let events = receiver.events();
    assert_eq!(events.len(), 3, "nothing lost, nothing doubled");
    let mut delivered_keys: Vec<_> = events
        .values()
        .map(|b| b["data"]["operation_key"].as_str().unwrap().to_owned())
        .collect();
    delivered_keys.sort();
    assert_eq!(delivered_keys, keys);
    assert!(
        events
            .values()
            .all(|b| b["type"] == "operation.review_required")
    );
    for key in keys {
        let entry = &outbox(&app, key).await[0];
        assert!(entry.attempts >= 3, "{key}: {entry:?}");
        assert_eq!(entry.last_status_code, Some(204));
    }
    assert_eq!(receiver.rejected(), 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_worker_killed_between_the_escalation_and_the_delivery_delivers_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let receiver = Receiver::new().await;
    receiver.set(Mode::Hang);
    receiver.start().await;
    let dir = write_policy(&app);
    let policy = dir.path().join("policy.yaml");

    // Escalated while no delivering worker runs: the event waits in the outbox.
    let key = "email:case-443:confirmation-v1";
    unknown_email(&app, key).await;
    assert_eq!(app.worker("in-process").tick().await.unwrap().escalated, 1);
    let waiting = outbox(&app, key).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].state, waiting[0].attempts),
        (DeliveryState::Pending, 0)
    );

    // The worker posts it; the receiver takes it in and the worker dies before the answer.
    let worker = start_worker(&app, &policy, &receiver.url(), &secret()).await;
    eventually("the receiver has the event", || async {
        !receiver.arrivals().is_empty()
    })
    .await;
    kill(worker, "-KILL").await;
    let claimed = outbox(&app, key).await;
    assert_eq!(
        (claimed[0].state, claimed[0].attempts),
        (DeliveryState::Pending, 1)
    );

    // Restarted, a worker sends it again once the dead one's claim has ended.
    receiver.set(Mode::Up);
    let worker = start_worker(&app, &policy, &receiver.url(), &secret()).await;
    eventually("the event is delivered", || async {
        all_delivered(&app, &[key]).await
    })
    .await;
    kill(worker, "-TERM").await;
    let arrivals = receiver.arrivals();
    assert!(
        arrivals.len() >= 2,
        "sent again after the crash: {arrivals:?}"
    );
    assert!(
        arrivals.iter().all(|a| a.id == arrivals[0].id),
        "one event id"
    );
    let events = receiver.events();
    assert_eq!(events.len(), 1, "exactly once after de-duplication");
    assert_eq!(
        events.values().next().unwrap()["type"],
        "operation.review_required"
    );
    assert_eq!(receiver.rejected(), 0);
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_receiver_with_another_secret_refuses_every_delivery(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let receiver = Receiver::new().await;
    receiver.start().await;
    let dir = write_policy(&app);
    let other = format!("whsec_{}", BASE64.encode([0x43; 32]));
    let worker = start_worker(
        &app,
        &dir.path().join("policy.yaml"),
        &receiver.url(),
        &other,
    )
    .await;
    let key = "email:case-444:confirmation-v1";
    unknown_email(&app, key).await;
    eventually("the receiver refused two attempts", || async {
        receiver.rejected() >= 2
    })
    .await;
    kill(worker, "-TERM").await;
    assert!(receiver.events().is_empty(), "nothing accepted");
    let entry = &outbox(&app, key).await[0];
    assert_eq!(entry.state, DeliveryState::Pending, "kept for a retry");
    assert_eq!(entry.last_status_code, Some(401));
}

/// The docs' chat bridge (examples/webhooks/chat_bridge.py) between the worker and a chat
/// channel's incoming webhook: one chat message per event.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_chat_bridge_example_posts_one_message_per_event(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The chat channel's incoming webhook.
    let messages: Arc<Mutex<Vec<String>>> = Arc::default();
    let chat = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let chat_url = format!("http://{}/hooks/channel", chat.local_addr().unwrap());
    let posted = messages.clone();
    let router = axum::Router::new().route(
        "/hooks/channel",
        axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let posted = posted.clone();
            async move {
                posted
                    .lock()
                    .unwrap()
                    .push(body["text"].as_str().unwrap().to_owned());
                StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(chat, router).await.unwrap() });
    let python = std::env::var("OPJOURNAL_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/webhooks/chat_bridge.py"
    );
    let (_bridge, mut lines) = process::spawn_piped(
        Command::new(python)
            .args([script, "--listen", "127.0.0.1:0"])
            .env("OPJOURNAL_WEBHOOK__SECRET", secret())
            .env("CHAT_WEBHOOK_URL", &chat_url),
    );
    let address = process::announced(&mut lines, "chat bridge listening on ").await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let dir = write_policy(&app);
    let worker = start_worker(
        &app,
        &dir.path().join("policy.yaml"),
        &format!("http://{address}/"),
        &secret(),
    )
    .await;
    let key = "email:case-445:confirmation-v1";
    unknown_email(&app, key).await;
    eventually("the escalation is in the channel", || async {
        messages.lock().unwrap().len() == 1
    })
    .await;
    app.resolve_as_sent(key).await;
    eventually("the resolution is in the channel", || async {
        all_delivered(&app, &[key]).await
    })
    .await;
    kill(worker, "-TERM").await;
    let messages = messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    assert!(messages[0].contains("review required"), "{}", messages[0]);
    assert!(messages[0].contains(key) && messages[0].contains("no_provider_lookup"));
    assert!(messages[0].contains("order_id=817"));
    assert!(messages[1].contains("review resolved"), "{}", messages[1]);
    assert!(
        messages[1].contains("succeeded by alice"),
        "{}",
        messages[1]
    );
    // A request the bridge cannot verify is refused.
    let forged = reqwest::Client::new()
        .post(format!("http://{address}/"))
        .header("webhook-id", "forged")
        .header(
            "webhook-timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
}
