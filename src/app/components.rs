//! The journal's parts built from a [`Config`]: the database and its store, the policy, the
//! journal use cases, the reconcile path and its worker.

use std::sync::Arc;

use super::StartError;
use super::database::Database;
use crate::config::Config;
use crate::domain::derived_key::KeyDeriver;
use crate::domain::policy::{Policy, PolicyError};
use crate::journal::{Journal, RequestLimits};
use crate::reconcile::worker::{Worker, WorkerConfig};
use crate::reconcile::{AdapterSet, Reconciler};
use crate::store::{GroupCommit, JournalStore};
use crate::telemetry::Metrics;

/// The journal's parts, built from a configuration.
#[derive(Clone)]
pub struct Components {
    /// The database (Postgres or the embedded SQLite file): migrations and closing.
    pub database: Database,
    /// The store the journal and the reconcile path share.
    pub store: Arc<dyn JournalStore>,
    /// The journal use cases.
    pub journal: Journal,
    /// The reconcile path.
    pub reconciler: Reconciler,
}

impl Components {
    /// Builds the components `config` describes, recording into `metrics`; connects lazily,
    /// so the database may still be down (and, on SQLite, the file may not exist yet: see
    /// [`Database::prepare`]). Logs the policy's warnings.
    ///
    /// Errors: invalid policy, adapter, database URL or key derivation secret.
    pub fn build(config: &Config, metrics: &Metrics) -> Result<Self, StartError> {
        let policy = Arc::new(load_policy(config)?);
        for warning in policy_warnings(config)? {
            tracing::warn!(warning = %warning, "the policy weakens a lookup's proof");
        }
        let adapters = AdapterSet::from_policy(&policy)?;
        let database = Database::connect_lazy(
            config.database.url.expose(),
            config.database.max_connections,
        )?
        .with_group_commit(group_commit(config));
        let mut parts = Self::new(
            database,
            policy,
            adapters,
            config.request_limits(),
            metrics.clone(),
        );
        if let Some(secret) = &config.server.key_derivation_secret {
            let deriver = KeyDeriver::new(secret.expose().as_bytes())?;
            parts.journal = parts.journal.with_key_deriver(deriver);
        }
        Ok(parts)
    }

    /// Assembles the components over an existing database (a
    /// [`PgStore`](crate::store::PgStore), a [`SqliteStore`](crate::store::SqliteStore) or a
    /// [`Database`]) with `limits`, recording into `metrics` (the store traces its statements
    /// and counts their failures; [`Metrics::disabled`] records nothing).
    pub fn new(
        database: impl Into<Database>,
        policy: Arc<Policy>,
        adapters: AdapterSet,
        limits: RequestLimits,
        metrics: Metrics,
    ) -> Self {
        let database = database.into().with_metrics(metrics.clone());
        let store: Arc<dyn JournalStore> = database.store();
        Self {
            journal: Journal::new(store.clone(), policy.clone(), limits.clone())
                .with_metrics(metrics.clone()),
            reconciler: Reconciler::new(store.clone(), policy, adapters, default_actor())
                .with_limits(limits)
                .with_metrics(metrics),
            store,
            database,
        }
    }

    /// The reconcile worker over these components, with the `reconcile_*` and `purge_*`
    /// settings of `config` (the `opjournal-reconciler` binary and `opjournal dev` run it).
    ///
    /// Errors: the policy file is unusable, or `reconcile_claim_hold_seconds` is shorter
    /// than twice the policy's longest lookup timeout (`StartError::Config`).
    pub fn worker(&self, config: &Config) -> Result<Worker, StartError> {
        let worker = Worker::new(
            self.reconciler.clone(),
            WorkerConfig {
                poll_interval: config.reconcile.poll_interval,
                batch_size: config.reconcile.batch_size,
                concurrency: config.reconcile.concurrency,
                claim_hold: config.reconcile.claim_hold,
                purge_interval: config.reconcile.purge_interval,
                purge_batch_size: config.reconcile.purge_batch_size,
            },
        );
        worker
            .check_claim_hold(&load_policy(config)?)
            .map_err(StartError::Worker)?;
        Ok(worker)
    }
}

/// Loads the policy named by the configuration, or the built-in one.
///
/// Errors: the file is unreadable or invalid (the message names the file and setting).
pub fn load_policy(config: &Config) -> Result<Policy, PolicyError> {
    match &config.server.policy_file {
        Some(path) => Policy::load(path),
        None => Ok(Policy::builtin()),
    }
}

/// The warnings of the policy file named by the configuration, one line each
/// (`FILE:LINE: SETTING: why`); none for the built-in policy. `check-config` prints them and
/// [`Components::build`] logs them.
///
/// Errors: the file is unreadable or invalid (the message names the file and setting).
pub fn policy_warnings(config: &Config) -> Result<Vec<String>, PolicyError> {
    let Some(path) = &config.server.policy_file else {
        return Ok(Vec::new());
    };
    let (_, warnings) = Policy::load_with_warnings(path)?;
    Ok(warnings
        .problems
        .into_iter()
        .map(|problem| {
            PolicyError {
                file: warnings.file.clone(),
                problems: vec![problem],
            }
            .to_string()
        })
        .collect())
}

/// The group commit `config` asks for: `group_commit_lanes` per kind of write, at most
/// `(max_connections - 1) / 2` (at least one); `None` when it is `0`.
fn group_commit(config: &Config) -> Option<GroupCommit> {
    let spare = (config.database.max_connections.saturating_sub(1) / 2).max(1) as usize;
    (config.database.group_commit_lanes > 0).then(|| GroupCommit {
        lanes: config.database.group_commit_lanes.min(spare),
        ..GroupCommit::default()
    })
}

/// The escalation webhook's delivery settings, when `webhook_url` is configured (the
/// configuration checked the URL and the secret).
///
/// Errors: the URL or the secret does not parse.
pub fn webhook_config(
    config: &Config,
) -> Result<Option<crate::reconcile::webhook::WebhookConfig>, WebhookConfigError> {
    use crate::domain::escalation::{RetrySchedule, WebhookSecret};
    let (Some(url), Some(secret)) = (&config.webhook.url, &config.webhook.secret) else {
        return Ok(None);
    };
    Ok(Some(crate::reconcile::webhook::WebhookConfig {
        url: reqwest::Url::parse(url.expose()).map_err(|_| WebhookConfigError::Url)?,
        secret: WebhookSecret::parse(secret.expose())?,
        timeout: config.webhook.timeout,
        claim_lease: config.webhook.claim_hold,
        schedule: RetrySchedule {
            base: config.webhook.retry_base,
            cap: config.webhook.retry_cap,
            max_age: config.webhook.max_age,
        },
        poll_interval: config.webhook.poll_interval,
        batch_size: config.webhook.batch_size,
        sample_interval: config.reconcile.backlog_sample_interval,
    }))
}

/// Why the webhook settings cannot be used (the configuration's check refuses both first).
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    /// `webhook.url` does not parse as a URL (the message never repeats it: it may hold a
    /// token).
    #[error("webhook.url: not a URL")]
    Url,
    /// `webhook.secret` is not a `whsec_` secret.
    #[error(transparent)]
    Secret(#[from] crate::domain::escalation::WebhookSecretError),
}

/// This process's name in the history: `HOSTNAME` (the pod name on Kubernetes) and pid.
pub fn default_actor() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}
