//! `opjournal demo`: the source article's seven-step reproducible check, live, against real
//! processes — the server, the sandbox provider and the reconcile worker, each on a free
//! local port — printing each step, what the journal holds and the provider's effect count.
//! With `--against`, it runs against a stand that is already running (`opjournal dev`, or a
//! server, worker and sandbox started by hand) instead. The verdict rests on the provider's
//! count, not on any answer text.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use opjournal::children::Process;
use opjournal::client::proto::{self, OperationStatus};
use opjournal::client::{Begun, ErrorReason, Intent, JournalClient};
use serde_json::json;

/// The article's idempotency key.
const KEY: &str = "payment:order-817:intent-01";

/// Flags of `opjournal demo`.
#[derive(Debug, clap::Args)]
pub struct DemoFlags {
    /// Keep the journal on this database instead of a throwaway embedded file
    /// (`postgres://…` or `sqlite://…`). The demo then works in a namespace of its own.
    #[arg(long, conflicts_with = "against")]
    database_url: Option<String>,
    /// Start nothing: run against the server already listening at this gRPC address
    /// (`host:port` or `http://host:port`, e.g. what `opjournal dev` prints), whose reconcile
    /// worker looks `create_payment` up at the sandbox of `--sandbox-url`. The demo works in a
    /// namespace of its own, so it can run again and again.
    #[arg(long, value_name = "ADDRESS", requires = "sandbox_url")]
    against: Option<String>,
    /// The sandbox provider of the stand given by `--against` (`http://host:port`).
    #[arg(long, value_name = "URL", requires = "against")]
    sandbox_url: Option<String>,
    /// How long the sandbox provider's search lags behind its writes, in seconds. Above
    /// `--reconcile-wait-seconds`, step 5 cannot hold and the demo fails. Not with
    /// `--against` (the running sandbox keeps its own setting).
    #[arg(long, default_value_t = 0.0, conflicts_with = "against")]
    lookup_lag_seconds: f64,
    /// How long step 5 waits for the reconcile worker to settle the operation, in seconds.
    #[arg(long, default_value_t = 20)]
    reconcile_wait_seconds: u64,
    /// Keep the working directory (policy, logs, embedded journal) after the run.
    #[arg(long)]
    keep: bool,
}

/// Runs the demo; exit code 0 only when every step held.
pub async fn run(flags: DemoFlags) -> anyhow::Result<ExitCode> {
    opjournal::app::install_crypto_provider();
    let workdir = tempfile::Builder::new()
        .prefix("opjournal-demo-")
        .tempdir()
        .context("cannot create a working directory")?;
    let dir = workdir.path().to_owned();
    let outcome = Demo::start(&flags, &dir).await;
    let result = match outcome {
        Ok(mut demo) => {
            let verdict = demo.seven_steps().await;
            demo.stop().await;
            verdict
        }
        Err(err) => Err(err),
    };
    let code = match result {
        Ok(()) => {
            println!("\nVerdict: exactly one effect. All seven steps hold.");
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("\nVerdict: FAILED — {err:#}");
            if flags.against.is_none() {
                println!("Logs of the processes: {}", dir.display());
                // Keep what explains the failure.
                let _ = workdir.keep();
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    if flags.keep {
        println!("Working directory kept: {}", workdir.keep().display());
    }
    Ok(code)
}

/// The running processes and the clients of them.
struct Demo {
    processes: Vec<Process>,
    client: JournalClient,
    sandbox_url: String,
    http: reqwest::Client,
    namespace: String,
    reconcile_wait: Duration,
    step: u8,
}

/// Starts the server and the reconcile worker on `database_url` with the policy file
/// `policy`, on free local ports, into `processes`; returns the server's gRPC address and the
/// worker's health address.
async fn start_journal(
    processes: &mut Vec<Process>,
    dir: &Path,
    database_url: &str,
    policy: &str,
) -> anyhow::Result<(String, String)> {
    let (server, server_addr) = Process::start(
        "opjournal",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
            "--policy",
            policy,
            "--migrate",
        ],
        &[],
        "listening on ",
        dir,
    )
    .await?;
    processes.push(server);

    let (reconciler, health_addr) = Process::start(
        "opjournal-reconciler",
        &[
            "--health-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
            "--policy",
            policy,
        ],
        &[("OPJOURNAL_RECONCILE__POLL_INTERVAL", "0.5")],
        "health on ",
        dir,
    )
    .await?;
    processes.push(reconciler);

    Ok((server_addr, health_addr))
}

/// A namespace of the demo's own, so that its key is new in a journal that outlives it.
fn own_namespace() -> String {
    format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

impl Demo {
    async fn start(flags: &DemoFlags, dir: &Path) -> anyhow::Result<Self> {
        if let (Some(address), Some(sandbox_url)) = (&flags.against, &flags.sandbox_url) {
            return Self::against(flags, address, sandbox_url).await;
        }
        let (database_url, journal, namespace) = match &flags.database_url {
            Some(url) => (
                url.clone(),
                "the database you gave".to_owned(),
                own_namespace(),
            ),
            None => {
                let file = dir.join("journal.db");
                (
                    format!("sqlite://{}", file.display()),
                    format!("embedded SQLite at {}", file.display()),
                    String::new(),
                )
            }
        };
        println!("opjournal demo: the seven-step check of the source article, live.\n");

        let mut processes = Vec::new();
        let (sandbox, sandbox_addr) = Process::start(
            "opjournal-sandbox",
            &[
                "--listen",
                "127.0.0.1:0",
                "--lookup-lag-seconds",
                &flags.lookup_lag_seconds.to_string(),
                "--hang-seconds",
                "5",
            ],
            &[],
            "listening on http://",
            dir,
        )
        .await?;
        processes.push(sandbox);
        let sandbox_url = format!("http://{sandbox_addr}");

        let policy = dir.join("policy.yaml");
        std::fs::write(
            &policy,
            opjournal::children::payments_policy_yaml(&sandbox_url, "`opjournal demo`"),
        )
        .context("cannot write the policy")?;
        let policy = policy.display().to_string();

        let (server_addr, health_addr) =
            start_journal(&mut processes, dir, &database_url, &policy).await?;

        println!("  server      {server_addr}  (journal: {journal})");
        println!("  provider    {sandbox_url}  (sandbox: stores payments, can lose answers)");
        println!("  reconciler  polling every 0.5 s  (health on {health_addr})");
        if !namespace.is_empty() {
            println!("  namespace   {namespace}");
        }
        println!();

        let client = JournalClient::connect(&format!("http://{server_addr}")).await?;
        Ok(Self {
            processes,
            client,
            sandbox_url,
            http: reqwest::Client::new(),
            namespace,
            reconcile_wait: Duration::from_secs(flags.reconcile_wait_seconds),
            step: 0,
        })
    }

    /// Connects to a running stand; starts nothing.
    async fn against(flags: &DemoFlags, address: &str, sandbox_url: &str) -> anyhow::Result<Self> {
        let endpoint = if address.contains("://") {
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let sandbox_url = sandbox_url.trim_end_matches('/').to_owned();
        let namespace = own_namespace();
        println!("opjournal demo: the seven-step check of the source article, live.\n");
        println!("  server      {endpoint}  (already running)");
        println!("  provider    {sandbox_url}  (already running)");
        println!("  namespace   {namespace}");
        println!();
        let client = JournalClient::connect(&endpoint)
            .await
            .with_context(|| format!("cannot connect to {endpoint}"))?;
        Ok(Self {
            processes: Vec::new(),
            client,
            sandbox_url,
            http: reqwest::Client::new(),
            namespace,
            reconcile_wait: Duration::from_secs(flags.reconcile_wait_seconds),
            step: 0,
        })
    }

    async fn stop(&mut self) {
        for process in self.processes.iter_mut().rev() {
            process.stop().await;
        }
    }

    fn intent(&self, amount_minor: u64) -> Intent {
        Intent::new(
            KEY,
            "create_payment",
            json!({"amount_minor": amount_minor, "currency": "EUR", "order_id": "817"}),
        )
        .in_namespace(self.namespace.clone())
        .with_reference("order_id", "817")
    }

    fn step(&mut self, title: &str) {
        self.step += 1;
        println!("{}. {title}", self.step);
    }

    async fn seven_steps(&mut self) -> anyhow::Result<()> {
        self.step("Create the operation with the key payment:order-817:intent-01 (1000 EUR).");
        let Begun::Execute { operation, lease } = self.client.begin(&self.intent(1000)).await?
        else {
            bail!("step 1: a new key must be granted a lease (DECISION_EXECUTE)");
        };
        holds(&format!(
            "DECISION_EXECUTE: lease granted, attempt {}",
            operation.attempt_count
        ));
        self.show_journal().await?;

        self.step("Set the provider to store the payment, then lose the answer.");
        holds("the next call carries X-Sandbox-Fault: commit-then-timeout");

        self.step("Call the provider; on the timeout, report the outcome unknown.");
        let answered = self
            .http
            .post(format!("{}/v1/payments", self.sandbox_url))
            .timeout(Duration::from_secs(1))
            .header("Idempotency-Key", &lease.provider_key)
            .header("X-Sandbox-Fault", "commit-then-timeout")
            .json(&json!({"amount_minor": 1000, "currency": "EUR", "order_id": "817"}))
            .send()
            .await;
        if answered.is_ok() {
            bail!("step 3: the provider was to lose its answer, but it answered");
        }
        println!("   no answer within 1 s: the effect may or may not exist");
        let reported = self.client.report_unknown(&lease, Some("timeout")).await?;
        expect_status(&reported, OperationStatus::Unknown, 3)?;
        holds("the journal says unknown, not failed");
        self.show_journal().await?;

        self.step("Repeat the request with the same key and the same parameters.");
        match self.client.begin(&self.intent(1000)).await? {
            Begun::VerificationRequired(_) => {}
            other => bail!("step 4: expected DECISION_VERIFICATION_REQUIRED, got {other:?}"),
        }
        let counts = self.effects(&lease.provider_key).await?;
        if counts.requests != 1 {
            bail!(
                "step 4: the provider got {} requests, expected 1",
                counts.requests
            );
        }
        holds("DECISION_VERIFICATION_REQUIRED: not sent again (provider requests: 1)");
        self.steps_five_to_seven(&lease.provider_key).await
    }

    /// Steps 5 to 7, after the repeat was held back: the worker settles the operation, the
    /// provider counts one effect, and a conflicting repeat is refused.
    async fn steps_five_to_seven(&mut self, provider_key: &str) -> anyhow::Result<()> {
        self.step("Let the reconcile worker ask the provider; the record becomes succeeded.");
        let started = Instant::now();
        let settled = loop {
            let operation = self.client.get(&self.namespace, KEY).await?;
            if operation.status == OperationStatus::Succeeded as i32 {
                break operation;
            }
            if started.elapsed() > self.reconcile_wait {
                bail!(
                    "step 5: still {} after {} s; the provider's search never showed the payment",
                    status_name(&operation),
                    self.reconcile_wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        holds(&format!(
            "succeeded after {:.1} s, external_id {}",
            started.elapsed().as_secs_f64(),
            settled.external_id.as_deref().unwrap_or("-")
        ));
        match self.client.begin(&self.intent(1000)).await? {
            Begun::Replay(_) => holds("a repeat now gets DECISION_REPLAY with the stored outcome"),
            other => bail!("step 5: expected DECISION_REPLAY, got {other:?}"),
        }
        self.show_journal().await?;

        self.step("Count the effects at the provider.");
        let counts = self.effects(provider_key).await?;
        if counts.effects != 1 {
            bail!(
                "step 6: {} effects at the provider, expected 1",
                counts.effects
            );
        }
        holds(&format!(
            "effects: {}, requests: {}, lookups by the reconciler: {}",
            counts.effects, counts.requests, counts.lookups
        ));

        self.step("Repeat with the same key but another amount (9999 EUR).");
        match self.client.begin(&self.intent(9999)).await {
            Err(err)
                if err.code == tonic::Code::AlreadyExists
                    && err.reason == ErrorReason::IdempotencyKeyReused =>
            {
                holds("ALREADY_EXISTS, reason IDEMPOTENCY_KEY_REUSED: a conflict, not a replay");
            }
            other => bail!("step 7: expected ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED, got {other:?}"),
        }
        let after = self.effects(provider_key).await?;
        if after.requests != counts.requests || after.effects != 1 {
            bail!("step 7: the conflict reached the provider");
        }
        holds(&format!(
            "no call to the provider (requests still {})",
            after.requests
        ));
        Ok(())
    }

    async fn show_journal(&self) -> anyhow::Result<()> {
        let operation = self.client.get(&self.namespace, KEY).await?;
        println!(
            "   journal: status={} attempt_count={} external_id={} error_code={}",
            status_name(&operation),
            operation.attempt_count,
            operation.external_id.as_deref().unwrap_or("-"),
            operation.error_code.as_deref().unwrap_or("-"),
        );
        Ok(())
    }

    async fn effects(&self, provider_key: &str) -> anyhow::Result<Counts> {
        let url = format!(
            "{}/v1/effects/{}",
            self.sandbox_url,
            percent_encoding::utf8_percent_encode(provider_key, percent_encoding::NON_ALPHANUMERIC)
        );
        let body: serde_json::Value = self
            .http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let count = |name: &str| body[name].as_u64().unwrap_or(0);
        Ok(Counts {
            requests: count("requests"),
            effects: count("effects"),
            lookups: count("lookups"),
        })
    }
}

/// The provider's counters for one key.
struct Counts {
    requests: u64,
    effects: u64,
    lookups: u64,
}

fn holds(what: &str) {
    println!("   ✓ {what}");
}

fn status_name(operation: &proto::Operation) -> String {
    OperationStatus::try_from(operation.status)
        .map(|status| {
            status
                .as_str_name()
                .trim_start_matches("OPERATION_STATUS_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| operation.status.to_string())
}

fn expect_status(
    operation: &proto::Operation,
    status: OperationStatus,
    step: u8,
) -> anyhow::Result<()> {
    if operation.status != status as i32 {
        bail!(
            "step {step}: the journal says {}, expected {}",
            status_name(operation),
            status.as_str_name()
        );
    }
    Ok(())
}
