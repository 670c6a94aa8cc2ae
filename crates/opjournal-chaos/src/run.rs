//! One run: bring the stand up, drive every intent while the faults are injected, let it
//! settle, read the journal and the provider back, and check.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use opjournal_client::Operation;
use opjournal_client::proto::operation_journal_client::OperationJournalClient;
use opjournal_client::proto::reconciler_client::ReconcilerClient;
use opjournal_client::proto::{GetOperationHistoryRequest, ListOperationsRequest, OperationEvent};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::{Semaphore, watch};
use tonic::transport::{Channel, Endpoint};

use crate::agent::{Agents, Record};
use crate::chaos;
use crate::check::{self, Facts, LedgerKey};
use crate::plan::{self, Fault, Plan};
use crate::report::{Figures, Report};
use crate::reviewer::Reviewer;
use crate::stand::{Stand, StandConfig};

/// A lease (3 s) ending, plus a few worker polls.
const LEASE_SETTLES: Duration = Duration::from_secs(5);

/// The run's settings (the command line's).
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// How many intents.
    pub intents: usize,
    /// Over how long the intents are started while faults are injected.
    pub drive: Duration,
    /// How long agents keep going after the faults stop.
    pub settle: Duration,
    /// Most agents at once.
    pub concurrency: usize,
    /// Seed of every draw.
    pub seed: u64,
    /// Whether process and network faults are injected.
    pub chaos: bool,
    /// The stand's settings.
    pub stand: StandConfig,
}

/// Runs everything on `stand` (already created, maybe partly up after an interruption:
/// the caller tears it down either way).
///
/// Errors: the stand cannot be brought up, or a process does not come back after a fault.
pub async fn run(config: &RunConfig, stand: &mut Stand) -> anyhow::Result<Report> {
    let started = Instant::now();
    stand.bring_up(&config.stand).await?;
    let setup = started.elapsed();
    let plans = plan::plans(config.intents, config.seed);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .context("build the HTTP client")?;
    let agents = Arc::new(Agents {
        clients: stand.clients()?,
        http: http.clone(),
        sandbox_url: stand.sandbox_url.clone(),
        deadline: std::sync::Mutex::new(Instant::now() + Duration::from_secs(24 * 3600)),
        provider_faults: Arc::new(std::array::from_fn(|_| AtomicU32::new(0))),
    });
    let reviewer = Arc::new(Reviewer::new(
        stand.review_channels()?,
        http.clone(),
        stand.sandbox_url.clone(),
    ));
    let (stop_review, stopped) = watch::channel(false);
    let reviewing = tokio::spawn({
        let reviewer = Arc::clone(&reviewer);
        async move { reviewer.run(stopped).await }
    });

    let drive_started = Instant::now();
    let driving = tokio::spawn(drive_all(
        Arc::clone(&agents),
        plans.clone(),
        config.clone(),
    ));
    let chaos_counts = if config.chaos {
        chaos::run(stand, drive_started + config.drive, config.seed).await?
    } else {
        tokio::time::sleep(config.drive).await;
        BTreeMap::new()
    };
    stand.restore().await?;
    let faults_stopped = drive_started.elapsed();
    agents.set_deadline(Instant::now() + config.settle);
    let records = driving.await.context("the agents' task")?;
    let driven = drive_started.elapsed();
    // The reviewer works until every agent is done: nothing it could still resolve is left.
    stop_review.send_replace(true);
    let _ = reviewing.await;
    if records.iter().any(|record| !record.finished) {
        // An agent stopped by the deadline may have left a lease behind: let it end and the
        // workers sweep it before the journal is read.
        tokio::time::sleep(LEASE_SETTLES).await;
    }

    let direct = direct_channel(stand)?;
    let rows = read_rows(direct.clone()).await?;
    let ledger = read_ledger(&http, &stand.sandbox_url).await?;
    let (review_acks, review) = reviewer.results();
    let mut acks: HashMap<String, Vec<crate::agent::Ack>> = HashMap::new();
    let mut agent_errors: HashMap<String, Vec<String>> = HashMap::new();
    for (plan, record) in plans.iter().zip(&records) {
        acks.entry(plan.key.clone())
            .or_default()
            .extend(record.acks.iter().cloned());
        agent_errors
            .entry(plan.key.clone())
            .or_default()
            .extend(record.errors.keys().cloned().chain(record.odd_outcome()));
    }
    for (key, resolved) in review_acks {
        acks.entry(key).or_default().extend(resolved);
    }
    let mut histories = HashMap::new();
    for (key, key_acks) in &acks {
        if key_acks.iter().any(check::needs_history) {
            histories.insert(key.clone(), read_history(direct.clone(), key).await?);
        }
    }
    let wire = stand.wire.snapshot();
    let facts = Facts {
        plans: &plans,
        acks,
        rows,
        histories,
        ledger,
        server_codes: wire.codes.clone(),
        agent_errors,
    };
    let verdict = check::check(&facts);
    let provider_faults: BTreeMap<String, u64> = [
        Fault::CommitThenTimeout,
        Fault::FailBeforeStore,
        Fault::Reject,
        Fault::Slow,
    ]
    .into_iter()
    .map(|fault| {
        let count = agents.provider_faults[fault as usize].load(Ordering::Relaxed);
        (fault.name().to_owned(), u64::from(count))
    })
    .collect();
    Ok(Report::new(Figures {
        config,
        plans: &plans,
        records: &records,
        verdict,
        wire,
        review,
        chaos: chaos_counts,
        provider_faults,
        setup,
        faults_stopped,
        driven,
        total: started.elapsed(),
    }))
}

/// Starts the intents evenly over the drive time, at most `concurrency` at once; returns
/// each intent's record, in plan order.
async fn drive_all(agents: Arc<Agents>, plans: Vec<Plan>, config: RunConfig) -> Vec<Record> {
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let spacing = config.drive / u32::try_from(plans.len().max(1)).unwrap_or(u32::MAX);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, plan) in plans.into_iter().enumerate() {
        let at = started + spacing * u32::try_from(index).unwrap_or(u32::MAX);
        tokio::time::sleep_until(at.into()).await;
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let agents = Arc::clone(&agents);
        let seed = config.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let record = agents.drive(&plan, || rng.random_range(0..2)).await;
            drop(permit);
            (index, record)
        });
    }
    let mut records = vec![Record::default(); tasks.len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, record)) => records[index] = record,
            Err(err) => tracing::error!(error = %err, "an agent task failed"),
        }
    }
    records
}

fn direct_channel(stand: &Stand) -> anyhow::Result<Channel> {
    let addr = stand.server_addrs.first().context("no server")?;
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Every row of the journal (the run has the database to itself), by key. A read that fails
/// is tried again for up to a minute: the stand has just been restored.
async fn read_rows(channel: Channel) -> anyhow::Result<HashMap<String, Operation>> {
    let client = OperationJournalClient::new(channel);
    let mut rows = HashMap::new();
    let mut page_token = String::new();
    loop {
        let request = ListOperationsRequest {
            page_size: 500,
            page_token: page_token.clone(),
            ..ListOperationsRequest::default()
        };
        let page = retry(|| {
            let mut client = client.clone();
            let request = request.clone();
            async move { client.list_operations(request).await }
        })
        .await
        .context("read the journal back")?;
        for operation in page.operations {
            rows.insert(operation.operation_key.clone(), operation);
        }
        if page.next_page_token.is_empty() {
            return Ok(rows);
        }
        page_token = page.next_page_token;
    }
}

/// The whole history of `key`, oldest first.
async fn read_history(channel: Channel, key: &str) -> anyhow::Result<Vec<OperationEvent>> {
    let client = ReconcilerClient::new(channel);
    let mut events = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = GetOperationHistoryRequest {
            operation_key: key.to_owned(),
            page_size: 1000,
            page_token: page_token.clone(),
            ..GetOperationHistoryRequest::default()
        };
        let page = retry(|| {
            let mut client = client.clone();
            let request = request.clone();
            async move { client.get_operation_history(request).await }
        })
        .await
        .with_context(|| format!("read the history of {key}"))?;
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            return Ok(events);
        }
        page_token = page.next_page_token;
    }
}

/// The sandbox's ledger, by key.
async fn read_ledger(
    http: &reqwest::Client,
    sandbox_url: &str,
) -> anyhow::Result<HashMap<String, LedgerKey>> {
    #[derive(serde::Deserialize)]
    struct Ledger {
        keys: Vec<LedgerKey>,
    }
    let ledger: Ledger = http
        .get(format!("{sandbox_url}/v1/admin/ledger"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .context("read the sandbox's ledger")?
        .json()
        .await
        .context("decode the sandbox's ledger")?;
    Ok(ledger
        .keys
        .into_iter()
        .map(|entry| (entry.key.clone(), entry))
        .collect())
}

/// Calls `call` until it answers, for up to a minute.
async fn retry<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let started = Instant::now();
    loop {
        match call().await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) if started.elapsed() < Duration::from_secs(60) => {
                tracing::warn!(code = ?status.code(), "read-back call failed; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => return Err(status),
        }
    }
}
