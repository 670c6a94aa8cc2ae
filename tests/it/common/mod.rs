//! Test harness: the real gRPC server on port 0 over a fresh Postgres database (or a fresh
//! embedded SQLite journal file), and the real HTTP sandbox provider on port 0.

pub mod client_suites;
pub mod console;
pub mod observe;
pub mod process;
pub mod relay;
pub mod seven_steps;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opjournal::api::auth::BearerToken;
use opjournal::api::tls::ServerTls;
use opjournal::api::{self, Authenticator, ServeOptions};
use opjournal::app::Database;
use opjournal::app::{self, Components};
use opjournal::domain::policy::Policy;
use opjournal::journal::RequestLimits;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::reconciler_client::ReconcilerClient;
use opjournal::proto::{self, BeginOperationRequest, BeginOperationResponse, Decision};
use opjournal::reconcile::AdapterSet;
use opjournal::store::{PgStore, SqliteStore};
use opjournal::telemetry::Metrics;
use opjournal_sandbox::{self as sandbox, KeyCounts, Sandbox, SandboxConfig};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic_types::StatusExt as _;

pub const PAYMENT_KEY: &str = "payment:order-817:intent-01";

/// The database under a test app: a fresh Postgres database, or a fresh SQLite journal file
/// in a temporary directory (removed when the last clone goes).
#[derive(Clone)]
pub enum TestDb {
    Postgres(PgPool),
    Sqlite {
        store: SqliteStore,
        url: String,
        /// Holds the directory: removed when the last clone goes.
        _dir: Arc<tempfile::TempDir>,
    },
}

impl TestDb {
    /// A new journal file, prepared the way `opjournal serve` prepares it.
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("data/journal.db").display());
        let store = opjournal::app::database::sqlite(&url, 10).unwrap();
        store.prepare().await.unwrap();
        Self::Sqlite {
            store,
            url,
            _dir: Arc::new(dir),
        }
    }

    /// The database as the server builds it.
    pub fn database(&self) -> Database {
        match self {
            Self::Postgres(pool) => PgStore::new(pool.clone()).into(),
            Self::Sqlite { store, .. } => store.clone().into(),
        }
    }

    /// A connection URL for this database, for child processes.
    pub fn url(&self) -> String {
        match self {
            Self::Postgres(pool) => {
                let options = pool.connect_options();
                format!(
                    "postgres://{}@{}:{}/{}",
                    options.get_username(),
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap()
                )
            }
            Self::Sqlite { url, .. } => url.clone(),
        }
    }
}

/// Runs `$body` with `$pool` bound to the pool of a [`TestDb`], whichever the backend: for
/// SQL both dialects accept (`$1` parameters, no backend functions).
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            $crate::common::TestDb::Postgres($pool) => $body,
            $crate::common::TestDb::Sqlite { store, .. } => {
                let $pool = store.pool();
                $body
            }
        }
    };
}
pub(crate) use on_pool;

/// Writes a test policy for the sandbox's URL.
pub type PolicyWriter = dyn Fn(&str) -> String + Send + Sync;

/// How a test server is secured and limited, and how the harness's own clients reach it.
#[derive(Clone)]
pub struct SpawnOptions {
    /// Bearer tokens; disabled by default.
    pub auth: Authenticator,
    /// The server's TLS; plaintext when `None`.
    pub tls: Option<ServerTls>,
    /// The TLS of `TestApp::journal` and `TestApp::reconciler`; `https://` when set.
    pub client_tls: Option<ClientTlsConfig>,
    /// Payload, result, depth and page limits.
    pub limits: RequestLimits,
    /// Largest request message the server decodes.
    pub max_message_bytes: usize,
    /// Streams per connection, header size, in-flight calls, connections, keepalive and age.
    pub transport: api::TransportLimits,
    /// Writes the policy for the sandbox's URL; `policy_yaml` when `None`.
    pub policy: Option<Arc<PolicyWriter>>,
    /// The secret of DeriveOperationKey; derivation is off when `None`.
    pub key_secret: Option<String>,
    /// Where the server, the journal and the reconciler record metrics.
    pub metrics: Metrics,
    /// The store the server uses; the test database's pool when `None`. `TestApp::pool`
    /// always reaches the database directly.
    pub store: Option<PgStore>,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        Self {
            auth: Authenticator::disabled(),
            tls: None,
            client_tls: None,
            limits: RequestLimits::default(),
            max_message_bytes: ServeOptions::default().max_message_bytes,
            transport: api::TransportLimits::default(),
            policy: None,
            key_secret: None,
            metrics: Metrics::disabled(),
            store: None,
        }
    }
}

/// A client that sends a bearer token.
pub type Authorized = InterceptedService<Channel, BearerToken>;

pub struct TestApp {
    pub addr: SocketAddr,
    /// The harness's channel (TLS when the app was spawned with `client_tls`), no token.
    pub channel: Channel,
    pub journal: OperationJournalClient<Channel>,
    pub reconciler: ReconcilerClient<Channel>,
    pub parts: Components,
    pub db: TestDb,
    pub sandbox_url: String,
    pub sandbox: Sandbox,
    pub policy_yaml: String,
    /// The instruments the server records into (disabled unless the test gave some).
    pub metrics: Metrics,
    /// The statements' clock, shared by the server and the workers of this app: tests move it
    /// forward to end leases and pass grace windows instead of sleeping.
    pub clock: opjournal::store::Clock,
    shutdown: CancellationToken,
}

/// The policy used by tests: payments reconciled through the sandbox's lookup by key.
pub fn policy_yaml(sandbox_url: &str, grace_seconds: u32) -> String {
    format!(
        r#"
defaults:
  lease_seconds: 30
actions:
  create_payment:
    retry:
      on_timeout: reconcile_before_retry
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
      interval_seconds: 1
      absence_grace_seconds: {grace_seconds}
  create_payment_dedup:
    retry:
      on_timeout: retry_with_same_key
    reconcile:
      adapter: sandbox_payments
  create_payment_deadline:
    unknown_after_seconds: 1
    on_unresolved: require_human_review
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
      interval_seconds: 1
      absence_grace_seconds: 60
  create_payment_bulk:
    reconcile: {{ adapter: sandbox_payments, first_check_after_seconds: 0, interval_seconds: 600, absence_grace_seconds: 3600 }}
  create_payment_deadline_slow:
    unknown_after_seconds: 1
    reconcile: {{ adapter: sandbox_payments, first_check_after_seconds: 0, interval_seconds: 30, jitter: 0.0, absence_grace_seconds: 60 }}
  create_payment_incomplete:
    reconcile: {{ adapter: sandbox_payments_incomplete, first_check_after_seconds: 0, absence_grace_seconds: 0 }}
  create_payment_hold:
    duplicate_intent: {{ mode: hold, window_seconds: 600 }}
  create_payment_warn:
    duplicate_intent: {{ mode: warn, window_seconds: 600 }}
  send_email:
    reconcile:
      adapter: email_no_lookup
      first_check_after_seconds: 0
adapters:
  email_no_lookup:
    kind: none
  sandbox_payments_incomplete:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    search_complete: false
    response: {{ status_pointer: /status, succeeded_values: [succeeded], key_pointer: /idempotency_key, external_id_pointer: /id }}
  sandbox_payments:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    response:
      status_pointer: /status
      succeeded_values: [succeeded]
      failed_values: [failed]
      key_pointer: /idempotency_key
      external_id_pointer: /id
      keep_fields: [/id, /status, /amount_minor, /currency]
"#
    )
}

impl TestApp {
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, SandboxConfig::default(), 0).await
    }

    /// The app over a fresh embedded SQLite journal file.
    pub async fn spawn_sqlite() -> Self {
        Self::spawn_on(
            TestDb::sqlite().await,
            SandboxConfig::default(),
            0,
            SpawnOptions::default(),
        )
        .await
    }

    pub async fn spawn_with(pool: PgPool, sandbox_config: SandboxConfig, grace: u32) -> Self {
        Self::spawn_full(pool, sandbox_config, grace, SpawnOptions::default()).await
    }

    /// The app with bearer tokens, TLS or other request limits.
    pub async fn spawn_with_options(pool: PgPool, options: SpawnOptions) -> Self {
        Self::spawn_full(pool, SandboxConfig::default(), 0, options).await
    }

    /// The app under the policy `make_policy` writes for the sandbox's URL, deriving keys
    /// with `key_secret` when one is given.
    pub async fn spawn_with_policy(
        pool: PgPool,
        sandbox_config: SandboxConfig,
        make_policy: impl Fn(&str) -> String + Send + Sync + 'static,
        key_secret: Option<&str>,
    ) -> Self {
        let options = SpawnOptions {
            policy: Some(Arc::new(make_policy)),
            key_secret: key_secret.map(str::to_owned),
            ..SpawnOptions::default()
        };
        Self::spawn_full(pool, sandbox_config, 0, options).await
    }

    pub async fn spawn_full(
        pool: PgPool,
        sandbox_config: SandboxConfig,
        grace: u32,
        options: SpawnOptions,
    ) -> Self {
        Self::spawn_on(TestDb::Postgres(pool), sandbox_config, grace, options).await
    }

    /// The app over `db`, whichever the backend.
    pub async fn spawn_on(
        db: TestDb,
        sandbox_config: SandboxConfig,
        grace: u32,
        options: SpawnOptions,
    ) -> Self {
        app::install_crypto_provider();
        let (sandbox_url, sandbox) = sandbox::spawn(sandbox_config).await.unwrap();
        let policy_yaml = match &options.policy {
            Some(make_policy) => make_policy(&sandbox_url),
            None => policy_yaml(&sandbox_url, grace),
        };
        let policy = Arc::new(Policy::parse(&policy_yaml, "test-policy.yaml").unwrap());
        let adapters = AdapterSet::from_policy(&policy).unwrap();
        let clock = opjournal::store::Clock::default();
        let database: Database = match options.store.clone() {
            Some(store) => store.into(),
            None => db.database(),
        };
        let database = database.with_clock(clock.clone());
        let mut parts = Components::new(
            database,
            policy,
            adapters,
            options.limits.clone(),
            options.metrics.clone(),
        );
        if let Some(secret) = &options.key_secret {
            let deriver = opjournal::domain::derived_key::KeyDeriver::new(secret.as_bytes());
            parts.journal = parts.journal.with_key_deriver(deriver.unwrap());
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(api::serve(
            parts.journal.clone(),
            parts.reconciler.clone(),
            listener,
            ServeOptions {
                readiness_interval: Duration::from_millis(200),
                drain_delay: Duration::ZERO,
                auth: options.auth,
                tls: options.tls,
                max_message_bytes: options.max_message_bytes,
                limits: options.transport,
                metrics: options.metrics.clone(),
            },
            shutdown.clone(),
        ));
        let channel = match options.client_tls {
            None => Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap(),
            Some(tls) => Channel::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .unwrap(),
        };
        Self {
            addr,
            channel: channel.clone(),
            journal: OperationJournalClient::new(channel.clone()),
            reconciler: ReconcilerClient::new(channel),
            parts,
            db,
            sandbox_url,
            sandbox,
            policy_yaml,
            metrics: options.metrics,
            clock,
            shutdown,
        }
    }

    /// A journal client on the harness's channel that sends `token`.
    pub fn journal_as(&self, token: &str) -> OperationJournalClient<Authorized> {
        OperationJournalClient::with_interceptor(
            self.channel.clone(),
            BearerToken::new(token).unwrap(),
        )
    }

    /// A reconciler client on the harness's channel that sends `token`.
    pub fn reconciler_as(&self, token: &str) -> ReconcilerClient<Authorized> {
        ReconcilerClient::with_interceptor(self.channel.clone(), BearerToken::new(token).unwrap())
    }

    /// A connection URL for this test's database, for child processes.
    pub fn database_url(&self) -> String {
        self.db.url()
    }

    /// The Postgres pool of this test's database, for SQL only Postgres speaks.
    pub fn pool(&self) -> &PgPool {
        match &self.db {
            TestDb::Postgres(pool) => pool,
            TestDb::Sqlite { .. } => panic!("this test reads Postgres directly"),
        }
    }

    pub async fn begin(
        &self,
        key: &str,
        action: &str,
        payload: &str,
    ) -> Result<BeginOperationResponse, tonic::Status> {
        self.begin_in("", key, action, payload, 0).await
    }

    pub async fn begin_in(
        &self,
        namespace: &str,
        key: &str,
        action: &str,
        payload: &str,
        lease_seconds: i32,
    ) -> Result<BeginOperationResponse, tonic::Status> {
        self.journal
            .clone()
            .begin_operation(BeginOperationRequest {
                namespace: namespace.into(),
                operation_key: key.into(),
                action_type: action.into(),
                payload_json: payload.into(),
                lease_seconds,
                references: [("order_id".to_owned(), "817".to_owned())].into(),
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Calls the sandbox provider the way an orchestrator would, with the operation key as
    /// the Idempotency-Key; `fault` is an X-Sandbox-Fault value. Returns the HTTP status, or
    /// None when the call timed out.
    pub async fn pay(
        &self,
        key: &str,
        payload: &str,
        fault: Option<&str>,
    ) -> Option<(u16, serde_json::Value)> {
        opjournal::app::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(400))
            .build()
            .unwrap();
        let mut request = client
            .post(format!("{}/v1/payments", self.sandbox_url))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(payload.to_owned());
        if let Some(fault) = fault {
            request = request.header("X-Sandbox-Fault", fault);
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.json().await.unwrap_or_default()))
    }

    /// Sends an e-mail through the sandbox (no idempotency); `reference` is the external
    /// reference the provider can be searched by. Returns None when the call timed out.
    pub async fn send_email(&self, reference: &str, fault: Option<&str>) -> Option<u16> {
        opjournal::app::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(400))
            .build()
            .unwrap();
        let mut request =
            client
                .post(format!("{}/v1/emails", self.sandbox_url))
                .json(&serde_json::json!({
                    "to": "customer@example.com",
                    "subject": "Your order",
                    "external_reference": reference,
                }));
        if let Some(fault) = fault {
            request = request.header("X-Sandbox-Fault", fault);
        }
        let response = request.send().await.ok()?;
        Some(response.status().as_u16())
    }

    /// A reconcile worker over this app's database and adapters, as a replica named `name`.
    pub fn worker(&self, name: &str) -> opjournal::reconcile::worker::Worker {
        let policy = Arc::new(Policy::parse(&self.policy_yaml, "test-policy.yaml").unwrap());
        let adapters = AdapterSet::from_policy(&policy).unwrap();
        let store = self
            .db
            .database()
            .with_clock(self.clock.clone())
            .with_metrics(self.metrics.clone())
            .store();
        let reconciler = opjournal::reconcile::Reconciler::new(store, policy, adapters, name)
            .with_metrics(self.metrics.clone());
        opjournal::reconcile::worker::Worker::new(
            reconciler,
            opjournal::reconcile::worker::WorkerConfig {
                poll_interval: Duration::from_millis(100),
                batch_size: 50,
                concurrency: 8,
                claim_hold: Duration::from_secs(60),
                ..Default::default()
            },
        )
    }

    pub async fn get(&self, key: &str) -> proto::Operation {
        self.journal
            .clone()
            .get_operation(proto::GetOperationRequest {
                namespace: String::new(),
                operation_key: key.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .operation
            .unwrap()
    }

    /// ReconcileOperation on `key` in `namespace` (empty = default).
    pub async fn reconcile(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<proto::ReconcileOperationResponse, tonic::Status> {
        self.reconciler
            .clone()
            .reconcile_operation(proto::ReconcileOperationRequest {
                namespace: namespace.into(),
                operation_key: key.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Alice resolves the unknown operation `key` (its first attempt) as sent: external id
    /// `em_1`, result `{"status":"sent"}`. Returns the settled record.
    pub async fn resolve_as_sent(&self, key: &str) -> proto::Operation {
        use proto::resolve_operation_request::Resolution;
        self.reconciler
            .clone()
            .resolve_operation(proto::ResolveOperationRequest {
                operation_key: key.into(),
                expected_attempt_count: 1,
                reviewer: "alice".into(),
                reason: "seen in the provider's log".into(),
                resolution: Some(Resolution::Succeeded(proto::ResolveSucceeded {
                    external_id: "em_1".into(),
                    result_json: r#"{"status":"sent"}"#.into(),
                })),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .operation
            .unwrap()
    }

    pub async fn report_unknown(&self, token: &str) -> proto::Operation {
        self.journal
            .clone()
            .report_unknown_outcome(proto::ReportUnknownOutcomeRequest {
                lease_token: token.into(),
                error_code: "timeout".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .operation
            .unwrap()
    }

    /// The decision of a Begin of `key` that is expected to be answered.
    pub async fn begin_decision(&self, key: &str, action: &str, payload: &str) -> Decision {
        decision(&self.begin(key, action, payload).await.unwrap())
    }

    /// The `ErrorInfo` reason of a Begin of `key` that is expected to be refused.
    pub async fn begin_refusal(&self, key: &str, action: &str, payload: &str) -> String {
        reason(&self.begin(key, action, payload).await.unwrap_err())
    }

    /// FailOperation under `token` with error code `card_declined`.
    pub async fn fail_declined(&self, token: &str) {
        self.journal
            .clone()
            .fail_operation(proto::FailOperationRequest {
                lease_token: token.into(),
                error_code: "card_declined".into(),
            })
            .await
            .unwrap();
    }

    pub fn counts(&self, key: &str) -> KeyCounts {
        self.sandbox.counts(key)
    }

    /// Rows per key, the article's audit query.
    pub async fn rows_for(&self, key: &str) -> i64 {
        on_pool!(&self.db, |pool| {
            sqlx::query_scalar("SELECT COUNT(*) FROM agent_operations WHERE operation_key = $1")
                .bind(key)
                .fetch_one(pool)
                .await
                .unwrap()
        })
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn decision(response: &BeginOperationResponse) -> Decision {
    Decision::try_from(response.decision).unwrap()
}

pub fn op_status(operation: &proto::Operation) -> proto::OperationStatus {
    proto::OperationStatus::try_from(operation.status).unwrap()
}

/// The ErrorInfo reason of a status; every error must carry exactly one.
pub fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo on {status:?}"))
        .reason
}

/// The JSON Pointer named in an INVALID_ARGUMENT for a payload.
pub fn json_pointer(status: &tonic::Status) -> String {
    let info = status.get_details_error_info().unwrap();
    info.metadata
        .get("json_pointer")
        .cloned()
        .unwrap_or_default()
}

/// The field of the (single) field violation.
pub fn violated_field(status: &tonic::Status) -> String {
    let bad = status.get_details_bad_request().expect("BadRequest detail");
    bad.field_violations[0].field.clone()
}

pub const PAY_817: &str = r#"{"order_id":"817","amount_minor":490000,"currency":"RUB"}"#;
pub const PAY_817_OTHER_AMOUNT: &str =
    r#"{"order_id":"817","amount_minor":590000,"currency":"RUB"}"#;

/// Returns once a statement on this test's database waits for a lock that another
/// transaction holds (Postgres reports it in `pg_stat_activity`).
pub async fn a_statement_waits_for_a_lock(pool: &PgPool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    {
        assert!(std::time::Instant::now() < deadline, "no statement waits");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Everything the journal's tables hold (operations and events), as text.
pub async fn stored_text(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT string_agg(o::text, ' ') FROM agent_operations o), '') || ' ' || \
         coalesce((SELECT string_agg(e::text, ' ') FROM operation_events e), '')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
