//! The review console in tests: the real server (gRPC on port 0) with its console served the
//! way `opjournal serve` serves it (`app::serve_console`, port 0), the tokens of one shop,
//! an operation escalated through the real API, and a cookie-keeping HTTP visitor.

use std::collections::BTreeMap;
use std::sync::Mutex;

use opjournal::api::Authenticator;
use opjournal::api::console::{ConsoleAccess, ConsoleLimits, ConsoleOptions};
use opjournal::config::Config;
use opjournal::proto::{BeginOperationRequest, Decision, ReportUnknownOutcomeRequest};
use sha2::Digest as _;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{SpawnOptions, TestApp, decision};

/// The tenant namespace of the console tests.
pub const SHOP: &str = "shop";
/// A reviewer of the shop.
pub const ALICE: &str = "tok-alice.5a7e2b9c14d06f83";
/// An orchestrator of the shop (role `client`).
pub const ORCHESTRATOR: &str = "tok-orch.0f3c9d2e71b84a6f";
/// A reviewer of another tenant.
pub const BOB: &str = "tok-bob.c3f81e6a2d9b4075";
/// What every escalated test e-mail's payload carries; no page may ever show it.
pub const PAYLOAD_MARKER: &str = "PAYLOAD-ONLY-7731";

fn sha256(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The configuration an operator writes: digests only, one entry per person or system.
pub fn tokens_config() -> Config {
    let entry = |name: &str, token: &str, namespace: &str, role: &str| {
        format!(
            "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nnamespaces = [\"{namespace}\"]\n\
             roles = [\"{role}\"]\n",
            sha256(token)
        )
    };
    let toml = [
        entry("alice", ALICE, SHOP, "reviewer"),
        entry("orchestrator", ORCHESTRATOR, SHOP, "client"),
        entry("bob", BOB, "other-shop", "reviewer"),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opjournal.toml");
    std::fs::write(&path, toml).unwrap();
    Config::load(Some(&path), serde_json::json!({})).unwrap()
}

/// The app and its console.
pub struct ConsoleApp {
    pub app: TestApp,
    /// The console's base URL, ending in `/`.
    pub url: String,
    shutdown: CancellationToken,
}

impl Drop for ConsoleApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl ConsoleApp {
    /// The app with the shop's tokens and its console.
    pub async fn spawn(pool: PgPool) -> Self {
        let config = tokens_config();
        let registry = config.token_registry().unwrap();
        let options = SpawnOptions {
            auth: Authenticator::new(registry.clone()),
            ..SpawnOptions::default()
        };
        let app = TestApp::spawn_with_options(pool, options).await;
        Self::with_console(app, ConsoleAccess::from_registry(registry)).await
    }

    /// The app without tokens, and its console (open, sign-in by name).
    pub async fn spawn_open(pool: PgPool) -> Self {
        let app = TestApp::spawn(pool).await;
        Self::with_console(app, ConsoleAccess::Open).await
    }

    /// The app with the shop's tokens and its console over HTTPS with `tls`.
    pub async fn spawn_https(pool: PgPool, tls: opjournal::api::tls::ServerTls) -> Self {
        Self::spawn_https_limited(pool, tls, ConsoleLimits::default()).await
    }

    /// The same, within `limits`.
    pub async fn spawn_https_limited(
        pool: PgPool,
        tls: opjournal::api::tls::ServerTls,
        limits: ConsoleLimits,
    ) -> Self {
        let registry = tokens_config().token_registry().unwrap();
        let options = SpawnOptions {
            auth: Authenticator::new(registry.clone()),
            ..SpawnOptions::default()
        };
        let app = TestApp::spawn_with_options(pool, options).await;
        let access = ConsoleAccess::from_registry(registry);
        let mut options = ConsoleOptions::new(access, Some(tls), 64 * 1024);
        options.limits = limits;
        Self::serve(app, options)
    }

    /// The app with the shop's tokens and its console within `limits`.
    pub async fn spawn_limited(pool: PgPool, limits: ConsoleLimits) -> Self {
        let registry = tokens_config().token_registry().unwrap();
        let options = SpawnOptions {
            auth: Authenticator::new(registry.clone()),
            ..SpawnOptions::default()
        };
        let app = TestApp::spawn_with_options(pool, options).await;
        let mut options =
            ConsoleOptions::new(ConsoleAccess::from_registry(registry), None, 64 * 1024);
        options.limits = limits;
        Self::serve(app, options)
    }

    /// The console's address.
    pub fn address(&self) -> std::net::SocketAddr {
        let rest = self.url.split_once("://").unwrap().1;
        rest.trim_end_matches('/').parse().unwrap()
    }

    async fn with_console(app: TestApp, access: ConsoleAccess) -> Self {
        Self::serve(app, ConsoleOptions::new(access, None, 64 * 1024))
    }

    fn serve(app: TestApp, options: ConsoleOptions) -> Self {
        let shutdown = CancellationToken::new();
        let address = "127.0.0.1:0".parse().unwrap();
        let (url, _task) =
            opjournal::app::serve_console(&app.parts, address, options, shutdown.clone()).unwrap();
        Self { app, url, shutdown }
    }

    /// Begins an e-mail in the shop (as the orchestrator, through gRPC), lets the provider
    /// send it while the answer is lost, reports the outcome unknown, and lets the reconcile
    /// worker escalate it (e-mails have no lookup). Returns the lease token of attempt 1.
    pub async fn escalated_email(&self, key: &str, token: Option<&str>) -> String {
        let begin = self.begin_email(key, token).await.unwrap();
        assert_eq!(decision(&begin), Decision::Execute);
        let sent = self
            .app
            .send_email(&provider_key(key), Some("commit-then-timeout"))
            .await;
        assert_eq!(sent, None, "the provider's answer is lost");
        let report = ReportUnknownOutcomeRequest {
            lease_token: begin.lease_token.clone(),
            error_code: "timeout".into(),
        };
        match token {
            Some(token) => {
                self.app
                    .journal_as(token)
                    .report_unknown_outcome(report)
                    .await
            }
            None => {
                self.app
                    .journal
                    .clone()
                    .report_unknown_outcome(report)
                    .await
            }
        }
        .unwrap();
        let stats = self.app.worker("worker-a").tick().await.unwrap();
        assert_eq!(stats.escalated, 1);
        begin.lease_token
    }

    /// BeginOperation of the test e-mail `key` in the shop.
    pub async fn begin_email(
        &self,
        key: &str,
        token: Option<&str>,
    ) -> Result<opjournal::proto::BeginOperationResponse, tonic::Status> {
        // `email:order-817:...` is about order 817.
        let order = key
            .split(':')
            .nth(1)
            .unwrap_or(key)
            .trim_start_matches("order-");
        let request = BeginOperationRequest {
            namespace: SHOP.into(),
            operation_key: key.into(),
            action_type: "send_email".into(),
            payload_json: format!(
                r#"{{"template":"order-shipped","order":"{order}","note":"{PAYLOAD_MARKER}"}}"#
            ),
            references: [
                ("order_id".to_owned(), order.to_owned()),
                ("case.id".to_owned(), format!("C-{order}")),
            ]
            .into(),
            ..Default::default()
        };
        match token {
            Some(token) => self.app.journal_as(token).begin_operation(request).await,
            None => self.app.journal.clone().begin_operation(request).await,
        }
        .map(tonic::Response::into_inner)
    }

    /// The operation's row: (status, attempt_count, review_required_at set).
    pub async fn row(&self, key: &str) -> (String, i32, bool) {
        sqlx::query_as::<_, (String, i32, bool)>(
            "SELECT status, attempt_count, review_required_at IS NOT NULL FROM agent_operations \
             WHERE namespace = $1 AND operation_key = $2",
        )
        .bind(SHOP)
        .bind(key)
        .fetch_one(self.app.pool())
        .await
        .unwrap()
    }

    /// The operation's history: (to_status, actor_kind, actor, reason), oldest first.
    pub async fn events(&self, key: &str) -> Vec<(String, String, String, Option<String>)> {
        sqlx::query_as(
            "SELECT to_status, actor_kind, actor, reason FROM operation_events \
             WHERE namespace = $1 AND operation_key = $2 ORDER BY event_id",
        )
        .bind(SHOP)
        .bind(key)
        .fetch_all(self.app.pool())
        .await
        .unwrap()
    }

    /// Effects of the e-mail `key` at the sandbox provider.
    pub fn emails_sent(&self, key: &str) -> u64 {
        self.app.counts(&provider_key(key)).effects
    }
}

/// The key the provider sees for the shop's `key`.
pub fn provider_key(key: &str) -> String {
    format!("{SHOP}/{key}")
}

/// A browser without JavaScript: keeps cookies, follows no redirect.
pub struct Visitor {
    pub base: String,
    client: reqwest::Client,
    cookies: Mutex<BTreeMap<String, String>>,
    /// Set-Cookie headers received, as sent.
    pub set_cookies: Mutex<Vec<String>>,
}

/// An answer: status, `Location`, body.
pub struct Answer {
    pub status: u16,
    pub location: String,
    pub body: String,
}

impl Visitor {
    pub fn new(base: &str) -> Self {
        Self::with_client(base, reqwest::Client::builder())
    }

    /// A visitor whose HTTP client is built from `builder` (e.g. trusting a test CA).
    pub fn with_client(base: &str, builder: reqwest::ClientBuilder) -> Self {
        opjournal::app::install_crypto_provider();
        Self {
            base: base.trim_end_matches('/').to_owned(),
            client: builder
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookies: Mutex::default(),
            set_cookies: Mutex::default(),
        }
    }

    /// The `Cookie` header this visitor sends.
    pub fn cookie_header(&self) -> String {
        let cookies = self.cookies.lock().unwrap();
        cookies
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let response = request
            .header("cookie", self.cookie_header())
            .send()
            .await
            .unwrap();
        for value in response.headers().get_all("set-cookie") {
            let text = value.to_str().unwrap().to_owned();
            let pair = text.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            let mut cookies = self.cookies.lock().unwrap();
            if value.is_empty() {
                cookies.remove(name);
            } else {
                cookies.insert(name.to_owned(), value.to_owned());
            }
            self.set_cookies.lock().unwrap().push(text);
        }
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        Answer {
            status,
            location,
            body: response.text().await.unwrap(),
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.post_with(path, form, &[]).await
    }

    /// Like [`Visitor::post`], with extra headers.
    pub async fn post_with(
        &self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(form));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    /// Signs in with `token` (or, on an open console, a name): the sign-in answer.
    pub async fn sign_in(&self, field: &str, value: &str) -> Answer {
        let page = self.get("/sign-in").await;
        assert_eq!(page.status, 200);
        let csrf = csrf_of(&page.body);
        self.post("/sign-in", &[("csrf", &csrf), (field, value)])
            .await
    }

    /// The CSRF token of the session, read from a page's forms.
    pub async fn csrf(&self) -> String {
        csrf_of(&self.get("/search").await.body)
    }
}

/// `form` as `application/x-www-form-urlencoded`.
pub fn form_body(form: &[(&str, &str)]) -> String {
    let encode = |text: &str| {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    form.iter()
        .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The first `csrf` hidden field of `html`.
pub fn csrf_of(html: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf" value="([^"]+)""#).unwrap();
    re.captures(html)
        .map(|c| c[1].to_owned())
        .expect("a form with a csrf field")
}

/// `/operation?...` of the shop's `key`.
pub fn operation_path(key: &str) -> String {
    opjournal::api::console::operation_href(SHOP, key)
}

/// A raw TCP connection to the console at `address` from the loopback address `from`
/// (`127.x.y.z`: each is another peer to the console).
pub async fn connect_from(address: std::net::SocketAddr, from: [u8; 4]) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    socket.connect(address).await.unwrap()
}

/// What the server sends on `stream` until it closes it, if it does within `limit`;
/// `None` while it stays open.
pub async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: std::time::Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut received = Vec::new();
    let read = async {
        let mut chunk = [0_u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read).await.ok()?;
    Some(String::from_utf8_lossy(&received).into_owned())
}

/// One HTTP/1.1 exchange with the console from `from`: `request` (a whole request, with
/// `Connection: close`) and everything the server answered; empty when it closed the
/// connection without answering.
pub async fn exchange_from(address: std::net::SocketAddr, from: [u8; 4], request: &str) -> String {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = connect_from(address, from).await;
    let _ = stream.write_all(request.as_bytes()).await;
    read_until_closed(&mut stream, std::time::Duration::from_secs(10))
        .await
        .expect("the console answers and closes")
}

/// `GET path` as a browser without cookies sends it, closing the connection after.
pub fn get_request(address: std::net::SocketAddr, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
}
