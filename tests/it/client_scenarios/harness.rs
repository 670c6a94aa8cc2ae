//! The harness behind `clients/scenarios.yaml`: a journal server that can be stopped and
//! started again on the same address, behind a relay that can lose a Begin's answer
//! (`common::relay`), a control endpoint the runners call to make the scenarios' faults
//! happen (another holder, a takeover, a reconcile, a restart, a lost Begin answer), and the
//! check of every scenario's `final` against the journal rows, the sandbox's own counts and
//! the answers the relay lost.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use opjournal::api::{self, ServeOptions};
use opjournal::journal::Journal;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::reconciler_client::ReconcilerClient;
use opjournal::proto::{self, Decision};
use opjournal::reconcile::Reconciler;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::common::TestApp;
use crate::common::client_suites::{Row, row};
use crate::common::relay::Relay;

/// A journal server over the app's journal that the harness can stop and start again on the
/// same address, as a restarted pod comes back behind the same Service.
pub struct RestartableServer {
    pub addr: SocketAddr,
    journal: Journal,
    reconciler: Reconciler,
    running: Mutex<Option<(CancellationToken, JoinHandle<()>)>>,
}

impl RestartableServer {
    /// Serves the app's journal on a new port.
    pub async fn start(app: &TestApp) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            journal: app.parts.journal.clone(),
            reconciler: app.parts.reconciler.clone(),
            running: Mutex::new(None),
        });
        server.serve(listener).await;
        server
    }

    async fn serve(&self, listener: tokio::net::TcpListener) {
        let shutdown = CancellationToken::new();
        let options = ServeOptions {
            readiness_interval: Duration::from_millis(200),
            drain_delay: Duration::ZERO,
            ..ServeOptions::default()
        };
        let task = tokio::spawn({
            let (journal, reconciler, shutdown) = (
                self.journal.clone(),
                self.reconciler.clone(),
                shutdown.clone(),
            );
            async move {
                api::serve(journal, reconciler, listener, options, shutdown)
                    .await
                    .unwrap();
            }
        });
        *self.running.lock().await = Some((shutdown, task));
    }

    /// Stops serving: in-flight calls drain, connections close, new ones are refused.
    pub async fn stop(&self) {
        if let Some((shutdown, task)) = self.running.lock().await.take() {
            shutdown.cancel();
            let drained = tokio::time::timeout(Duration::from_secs(10), task).await;
            assert!(drained.is_ok(), "the journal server did not stop in 10 s");
        }
    }

    /// Serves again on the same address.
    pub async fn start_again(&self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener).await;
    }
}

/// What the control endpoint acts on.
#[derive(Clone)]
struct Control {
    server: Arc<RestartableServer>,
    relay: Arc<Relay>,
    app_pool: Option<sqlx::PgPool>,
    sandbox_url: String,
    journal: OperationJournalClient<Channel>,
    reconciler: ReconcilerClient<Channel>,
}

#[derive(Deserialize)]
struct Restart {
    down_ms: u64,
}

#[derive(Deserialize)]
struct Target {
    operation_key: String,
    #[serde(default)]
    action_type: String,
    #[serde(default)]
    payload: Value,
    complete_after_ms: Option<u64>,
    after_ms: Option<u64>,
    delay_ms: Option<u64>,
}

type Answer = Result<Json<Value>, (StatusCode, String)>;

fn failed(what: &str, error: impl std::fmt::Display) -> (StatusCode, String) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what}: {error}"),
    )
}

/// Starts the control endpoint for `server` and the runners' `relay` in front of it; returns
/// its base URL.
pub async fn spawn_control(
    app: &TestApp,
    server: Arc<RestartableServer>,
    relay: Arc<Relay>,
) -> String {
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_lazy();
    let control = Control {
        server,
        relay,
        app_pool: match &app.db {
            crate::common::TestDb::Postgres(pool) => Some(pool.clone()),
            crate::common::TestDb::Sqlite { .. } => None,
        },
        sandbox_url: app.sandbox_url.clone(),
        journal: OperationJournalClient::new(channel.clone()),
        reconciler: ReconcilerClient::new(channel),
    };
    let router = Router::new()
        .route("/journal/restart", post(restart))
        .route("/lease/hold", post(hold))
        .route("/lease/takeover", post(takeover))
        .route("/reconcile", post(reconcile))
        .route("/begin/lose-answer", post(lose_begin_answer))
        .route("/begin/delay-answer", post(delay_begin_answer))
        .with_state(control);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

/// Stops the journal server, answers once it has stopped, and starts it again after
/// `down_ms`.
async fn restart(State(control): State<Control>, Json(body): Json<Restart>) -> Answer {
    control.server.stop().await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(body.down_ms)).await;
        control.server.start_again().await;
    });
    Ok(Json(json!({"stopped": true})))
}

impl Control {
    /// Begins `target` as another holder; the lease token when the journal said EXECUTE.
    async fn begin_elsewhere(&self, target: &Target) -> Result<String, (StatusCode, String)> {
        let begun = self
            .journal
            .clone()
            .begin_operation(proto::BeginOperationRequest {
                operation_key: target.operation_key.clone(),
                action_type: target.action_type.clone(),
                payload_json: target.payload.to_string(),
                lease_seconds: 120,
                ..Default::default()
            })
            .await
            .map_err(|status| failed("begin", status))?
            .into_inner();
        if begun.decision != Decision::Execute as i32 {
            return Err(failed("begin", format!("decision {}", begun.decision)));
        }
        Ok(begun.lease_token)
    }

    /// Pays at the sandbox under the operation's provider key and completes with its answer.
    async fn pay_and_complete(&self, target: &Target, token: String) -> Answer {
        opjournal::app::install_crypto_provider();
        let payment: Value = reqwest::Client::new()
            .post(format!("{}/v1/payments", self.sandbox_url))
            .header("Idempotency-Key", &target.operation_key)
            .json(&target.payload)
            .send()
            .await
            .map_err(|error| failed("pay", error))?
            .json()
            .await
            .map_err(|error| failed("pay", error))?;
        let completed = self
            .journal
            .clone()
            .complete_operation(proto::CompleteOperationRequest {
                lease_token: token,
                external_id: payment["id"].as_str().unwrap_or_default().to_owned(),
                result_json: payment.to_string(),
            })
            .await
            .map_err(|status| failed("complete", status))?;
        let status = completed.into_inner().operation.map(|op| op.status);
        Ok(Json(json!({"completed": true, "status": status})))
    }
}

/// Another holder begins the operation and keeps its lease; with `complete_after_ms` it pays
/// and completes in the background after that long.
async fn hold(State(control): State<Control>, Json(target): Json<Target>) -> Answer {
    let token = control.begin_elsewhere(&target).await?;
    if let Some(delay) = target.complete_after_ms {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            if let Err((_, message)) = control.pay_and_complete(&target, token).await {
                panic!("the holder could not complete: {message}");
            }
        });
    }
    Ok(Json(json!({"held": true})))
}

/// Ends the current lease in the database, then begins, pays and completes as another holder.
async fn takeover(State(control): State<Control>, Json(target): Json<Target>) -> Answer {
    let pool = control.app_pool.as_ref().ok_or_else(|| {
        failed(
            "takeover",
            "the scenario harness ends leases on Postgres only",
        )
    })?;
    let ended = sqlx::query(
        "UPDATE agent_operations SET lease_until = now() - interval '1 second'
         WHERE namespace = 'default' AND operation_key = $1 AND status = 'in_progress'",
    )
    .bind(&target.operation_key)
    .execute(pool)
    .await
    .map_err(|error| failed("end the lease", error))?;
    if ended.rows_affected() != 1 {
        return Err(failed("end the lease", "no live lease on that key"));
    }
    let token = control.begin_elsewhere(&target).await?;
    control.pay_and_complete(&target, token).await
}

/// Makes the relay lose the answer of the next Begin of the key, after the journal processed
/// it: the caller gets `UNAVAILABLE` instead.
async fn lose_begin_answer(State(control): State<Control>, Json(target): Json<Target>) -> Answer {
    control
        .relay
        .lose_next_begin_answer(&target.operation_key)
        .await;
    Ok(Json(json!({"armed": true})))
}

/// Makes the relay hold the answer of the next Begin of the key back for `delay_ms` after
/// the journal processed it, then pass it on.
async fn delay_begin_answer(State(control): State<Control>, Json(target): Json<Target>) -> Answer {
    let delay = Duration::from_millis(target.delay_ms.unwrap_or(0));
    control
        .relay
        .delay_next_begin_answer(&target.operation_key, delay)
        .await;
    Ok(Json(json!({"armed": true})))
}

/// ReconcileOperation now, or after `after_ms` in the background.
async fn reconcile(State(control): State<Control>, Json(target): Json<Target>) -> Answer {
    let request = proto::ReconcileOperationRequest {
        namespace: String::new(),
        operation_key: target.operation_key.clone(),
    };
    let Some(delay) = target.after_ms else {
        let response = control
            .reconciler
            .clone()
            .reconcile_operation(request)
            .await
            .map_err(|status| failed("reconcile", status))?;
        return Ok(Json(json!({"action": response.into_inner().action})));
    };
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(delay)).await;
        control
            .reconciler
            .clone()
            .reconcile_operation(request)
            .await
            .expect("the delayed reconcile failed");
    });
    Ok(Json(json!({"scheduled": true})))
}

/// The parts of `clients/scenarios.yaml` the harness checks.
#[derive(Deserialize)]
pub struct ScenarioFile {
    pub scenarios: Vec<Scenario>,
}

#[derive(Deserialize)]
pub struct Scenario {
    pub name: String,
    #[serde(rename = "final")]
    pub expected: BTreeMap<String, Final>,
}

/// What one key must look like once its scenario has run.
#[derive(Deserialize)]
pub struct Final {
    pub status: Option<String>,
    pub attempt_count: Option<i32>,
    pub error_code: Option<String>,
    pub row: Option<String>,
    pub requests: u64,
    pub effects: u64,
    /// Begin answers of the key the relay lost (checked only when given).
    pub begin_answers_lost: Option<usize>,
    /// Begin answers of the key the relay delayed (checked only when given).
    pub begin_answers_delayed: Option<usize>,
}

/// The scenario file every client runs.
pub fn scenario_file() -> ScenarioFile {
    let path = crate::common::client_suites::repo().join("clients/scenarios.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Holds every scenario's `final` against the journal rows, the sandbox's counts and the
/// answers `relay` lost for the keys a runner with `prefix` used. Returns every mismatch, one
/// line each.
pub async fn check_finals(app: &TestApp, relay: &Relay, prefix: &str) -> Vec<String> {
    let mut mismatches = Vec::new();
    for scenario in scenario_file().scenarios {
        for (step_key, expected) in &scenario.expected {
            let key = format!("{prefix}:{}:{step_key}", scenario.name);
            let found = row(app, &key).await;
            let counts = app.counts(&key);
            let mut say = |what: String| mismatches.push(format!("{key}: {what}"));
            match (&found, expected.row.as_deref()) {
                (Some(found), Some("none")) => say(format!("expected no row, found {found:?}")),
                (None, None) => say("no journal row".into()),
                (
                    Some(Row {
                        status,
                        attempt_count,
                        error_code,
                        ..
                    }),
                    None,
                ) => {
                    if expected.status.as_ref().is_some_and(|want| want != status) {
                        say(format!("status {status}, expected {:?}", expected.status));
                    }
                    if expected
                        .attempt_count
                        .is_some_and(|want| want != *attempt_count)
                    {
                        say(format!(
                            "attempt_count {attempt_count}, expected {:?}",
                            expected.attempt_count
                        ));
                    }
                    if expected.error_code.is_some() && expected.error_code != *error_code {
                        say(format!(
                            "error_code {error_code:?}, expected {:?}",
                            expected.error_code
                        ));
                    }
                }
                _ => {}
            }
            if let Some(want) = expected.begin_answers_lost {
                let lost = relay.answers_lost_for(&key);
                if lost != want {
                    say(format!("{lost} Begin answers lost, expected {want}"));
                }
            }
            if let Some(want) = expected.begin_answers_delayed {
                let delayed = relay.answers_delayed_for(&key);
                if delayed != want {
                    say(format!("{delayed} Begin answers delayed, expected {want}"));
                }
            }
            if (counts.requests, counts.effects) != (expected.requests, expected.effects) {
                say(format!(
                    "provider requests/effects {}/{}, expected {}/{}",
                    counts.requests, counts.effects, expected.requests, expected.effects
                ));
            }
        }
    }
    mismatches
}
