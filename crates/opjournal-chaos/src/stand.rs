//! The stand the suite runs against, all on loopback:
//!
//! ```text
//! agents ─► net proxy A ─► relay A ─► server A ─► net proxy A' ─► Postgres ◄─ worker 1
//!        └► net proxy B ─► relay B ─► server B ─► net proxy B' ─┘          ◄─ worker 2
//! agents, reviewer, workers ─► sandbox provider
//! ```
//!
//! The net proxies carry the network faults (latency, stalls, resets, a partition of one
//! replica); the relays record every status code the servers answer and lose the answers of
//! lossy clients. Everything is brought up piece by piece, so that a run interrupted
//! during set-up still tears down what exists.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use opjournal_client::JournalClient;
use tonic::transport::{Channel, Endpoint};

use crate::netproxy::FaultProxy;
use crate::postgres::{Postgres, free_port};
use crate::process::{Service, sibling};
use crate::relay::{self, LOSSY_AGENT, Wire};

/// The journal calls' deadline: a lost answer costs a client this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client repeats a report whose answer was lost.
pub const REPORT_RETRY: Duration = Duration::from_secs(20);

/// What the stand is built with.
#[derive(Debug, Clone)]
pub struct StandConfig {
    /// The sandbox's `--deliberately-broken` mode, if any.
    pub sandbox_defect: Option<String>,
    /// Probability that a lossy client's call loses its answer.
    pub lose_probability: f64,
    /// Seed of the relays' draws.
    pub seed: u64,
}

/// The running stand.
pub struct Stand {
    /// The work directory: logs, the policy, the Postgres cluster.
    pub dir: PathBuf,
    /// The suite's own Postgres.
    pub postgres: Option<Postgres>,
    /// The sandbox provider.
    pub sandbox: Option<Service>,
    /// Its base URL.
    pub sandbox_url: String,
    /// The server replicas.
    pub servers: Vec<Service>,
    /// The reconcile workers.
    pub workers: Vec<Service>,
    /// Per replica: the proxy between the server and Postgres.
    pub db_proxies: Vec<FaultProxy>,
    /// Per replica: the proxy between the clients and the server (through its relay).
    pub client_proxies: Vec<FaultProxy>,
    /// What the relays saw.
    pub wire: Arc<Wire>,
    /// Per replica: a direct address of the server, for the final read-back.
    pub server_addrs: Vec<SocketAddr>,
}

impl Stand {
    /// An empty stand in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            postgres: None,
            sandbox: None,
            sandbox_url: String::new(),
            servers: Vec::new(),
            workers: Vec::new(),
            db_proxies: Vec::new(),
            client_proxies: Vec::new(),
            wire: Arc::new(Wire::default()),
            server_addrs: Vec::new(),
        }
    }

    /// Brings everything up: Postgres, the schema, the sandbox, two server replicas behind
    /// their relays and proxies, two reconcile workers.
    ///
    /// Errors: any piece failing to start (the message names it and its log).
    pub async fn bring_up(&mut self, config: &StandConfig) -> anyhow::Result<()> {
        let postgres = Postgres::create(&self.dir).await?;
        postgres.start().await.context("start Postgres")?;
        let direct_url = postgres.url("postgres");
        let pg_addr: SocketAddr = ([127, 0, 0, 1], postgres.port()).into();
        self.postgres = Some(postgres);
        migrate(&direct_url).await?;

        let mut sandbox_args = args(&[
            "--listen",
            "127.0.0.1:0",
            "--hang-seconds",
            "3",
            "--slow-seconds",
            "4",
        ]);
        if let Some(defect) = &config.sandbox_defect {
            sandbox_args.extend(args(&["--deliberately-broken", defect]));
        }
        let mut sandbox = Service::new(
            "sandbox",
            "opjournal-sandbox",
            &sandbox_args,
            &[],
            "listening on ",
            &self.dir,
        )?;
        self.sandbox_url = sandbox.start().await?;
        self.sandbox = Some(sandbox);
        let policy = self.dir.join("policy.yaml");
        std::fs::write(&policy, policy_yaml(&self.sandbox_url)).context("write the policy")?;
        let policy = policy.display().to_string();

        for (index, replica) in ["a", "b"].into_iter().enumerate() {
            let db_proxy = FaultProxy::start(&format!("db-{replica}"), pg_addr).await?;
            let port = free_port()?;
            let listen = format!("127.0.0.1:{port}");
            let url = format!("postgres://postgres@{}/postgres", db_proxy.addr());
            let mut server = Service::new(
                &format!("server-{replica}"),
                "opjournal",
                &args(&[
                    "serve",
                    "--listen",
                    &listen,
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--database-url",
                    &url,
                    "--policy",
                    &policy,
                ]),
                &[("OPJOURNAL_DATABASE__MAX_CONNECTIONS", "16")],
                "listening on ",
                &self.dir,
            )?;
            server.start().await?;
            let server_addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let seed = config.seed.wrapping_add(index as u64);
            let relay = relay::start(
                server_addr,
                config.lose_probability,
                seed,
                Arc::clone(&self.wire),
            )
            .await?;
            let client_proxy = FaultProxy::start(&format!("clients-{replica}"), relay).await?;
            self.servers.push(server);
            self.server_addrs.push(server_addr);
            self.db_proxies.push(db_proxy);
            self.client_proxies.push(client_proxy);
        }

        for name in ["worker-1", "worker-2"] {
            let mut worker = Service::new(
                name,
                "opjournal-reconciler",
                &args(&[
                    "--health-listen",
                    "127.0.0.1:0",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--database-url",
                    &direct_url,
                    "--policy",
                    &policy,
                ]),
                &[
                    ("OPJOURNAL_RECONCILE__POLL_INTERVAL", "0.3"),
                    ("OPJOURNAL_RECONCILE__CLAIM_HOLD", "5"),
                    ("OPJOURNAL_RECONCILE__BATCH_SIZE", "100"),
                    ("OPJOURNAL_RECONCILE__CONCURRENCY", "16"),
                ],
                "health on ",
                &self.dir,
            )?;
            worker.start().await?;
            self.workers.push(worker);
        }
        Ok(())
    }

    /// Per replica: a client through the faults, and a lossy one.
    ///
    /// Errors: an invalid address (never, for loopback addresses).
    pub fn clients(&self) -> anyhow::Result<Vec<(JournalClient, JournalClient)>> {
        self.client_proxies
            .iter()
            .map(|proxy| {
                let url = format!("http://{}", proxy.addr());
                let plain = client(channel(&url, "opjournal-chaos")?);
                let lossy = client(channel(&url, LOSSY_AGENT)?);
                Ok((plain, lossy))
            })
            .collect()
    }

    /// Per replica: a channel through the network faults (not lossy), for the reviewer.
    ///
    /// Errors: an invalid address (never, for loopback addresses).
    pub fn review_channels(&self) -> anyhow::Result<Vec<Channel>> {
        self.client_proxies
            .iter()
            .map(|proxy| {
                channel(
                    &format!("http://{}", proxy.addr()),
                    "opjournal-chaos-reviewer",
                )
            })
            .collect()
    }

    /// Lifts every network fault and starts whatever is down: the state the run settles in.
    ///
    /// Errors: a process that does not start again.
    pub async fn restore(&mut self) -> anyhow::Result<()> {
        for proxy in self.db_proxies.iter().chain(&self.client_proxies) {
            proxy.heal();
        }
        if let Some(postgres) = self.postgres.as_ref().filter(|pg| !pg.is_running()) {
            postgres.start().await?;
        }
        for service in self.servers.iter_mut().chain(self.workers.iter_mut()) {
            if !service.is_running() {
                restart(service).await?;
            }
        }
        Ok(())
    }

    /// Stops every process, then the cluster. The work directory is left to its owner.
    pub async fn tear_down(&mut self) {
        for service in self
            .workers
            .iter_mut()
            .chain(self.servers.iter_mut())
            .chain(self.sandbox.iter_mut())
        {
            service.terminate().await;
        }
        if let Some(postgres) = &self.postgres {
            postgres.destroy().await;
        }
    }
}

/// Starts `service` again, trying a few times (a port may linger for a moment).
///
/// Errors: it did not start in five tries.
pub async fn restart(service: &mut Service) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match service.start().await {
            Ok(_) => return Ok(()),
            Err(err) => {
                tracing::warn!(process = service.name(), error = %err, "restart failed; again");
                last = Some(err);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("{} did not restart", service.name())))
}

fn client(channel: Channel) -> JournalClient {
    JournalClient::new(channel)
        .with_call_timeout(CALL_TIMEOUT)
        .with_report_retry(REPORT_RETRY)
}

fn channel(url: &str, agent: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(url.to_owned())?
        .user_agent(agent)?
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

fn args(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

/// `opjournal migrate` on the cluster, before any server starts.
async fn migrate(url: &str) -> anyhow::Result<()> {
    let output = tokio::process::Command::new(sibling("opjournal")?)
        .args(["migrate", "--database-url", url])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .context("run opjournal migrate")?;
    if !output.status.success() {
        bail!(
            "opjournal migrate failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The policy of the run: short leases and fast reconciliation, so that every fault settles
/// within seconds; payments looked up at the sandbox, e-mails with no lookup (review).
fn policy_yaml(sandbox_url: &str) -> String {
    format!(
        r#"# Written by opjournal-chaos.
defaults:
  lease_seconds: 3
actions:
  create_payment:
    lease_seconds: 3
    retry:
      on_timeout: reconcile_before_retry
    unknown_after_seconds: 3600
    reconcile:
      adapter: sandbox_payments
      first_check_after_seconds: 0
      interval_seconds: 1
      backoff_multiplier: 1.0
      max_interval_seconds: 1
      jitter: 0.2
      absence_grace_seconds: 3
    result:
      keep: [/id, /status, /amount_minor, /currency]
  send_email:
    lease_seconds: 3
    retry:
      on_timeout: reconcile_before_retry
    reconcile:
      adapter: email_no_lookup
    result:
      keep: [/id, /status]
adapters:
  email_no_lookup:
    kind: none
  sandbox_payments:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    absent_statuses: [404]
    response: {{ status_pointer: /status, succeeded_values: [succeeded], key_pointer: /idempotency_key, external_id_pointer: /id }}
"#
    )
}
