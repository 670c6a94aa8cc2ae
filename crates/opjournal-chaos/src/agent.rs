//! An agent: drives one intent through the Rust client's `execute` until the journal holds
//! its final outcome, calling the sandbox provider whenever the journal grants a lease, and
//! starting over (a new agent, the same key) after every crash, lost answer or outage.
//!
//! It writes down every report the journal acknowledged: those must be in the journal at
//! the end, whatever was killed in between.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use opjournal_client::{
    ClientError, ExecuteOptions, Executed, Intent, JournalClient, ProviderCall, ProviderOutcome,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::plan::{Action, Fault, Plan};
use crate::relay::code_name;

/// A report the journal acknowledged, as the agent (or the reviewer) saw the answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ack {
    /// `CompleteOperation` answered OK: the journal holds `succeeded` with this external id.
    Completed {
        /// The lease's attempt.
        attempt: i32,
        /// The external id in the journal's answer.
        external_id: Option<String>,
    },
    /// `FailOperation` answered OK: the journal holds `failed_final`.
    Failed {
        /// The lease's attempt.
        attempt: i32,
    },
    /// `ReportUnknownOutcome` answered OK.
    Unknown {
        /// The lease's attempt.
        attempt: i32,
    },
    /// `ResolveOperation` answered OK.
    Resolved {
        /// The attempt the reviewer saw.
        attempt: i32,
        /// `succeeded`, `failed_final` or `release_for_retry`.
        resolution: String,
        /// The external id of a `succeeded` resolution.
        external_id: Option<String>,
    },
}

/// What happened to one intent on the agents' side.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Record {
    /// `execute` calls made (one per agent life and retry).
    pub executions: u32,
    /// Provider calls made under a lease.
    pub provider_calls: u32,
    /// Agents that crashed after the provider call, before reporting.
    pub crashes: u32,
    /// The last outcome `execute` returned (`succeeded`, `failed_final`, ...).
    pub last_outcome: Option<String>,
    /// Whether the intent reached a final outcome before the deadline.
    pub finished: bool,
    /// Reports the journal acknowledged.
    pub acks: Vec<Ack>,
    /// Errors `execute` returned, as `CODE/REASON`, counted.
    pub errors: BTreeMap<String, u64>,
}

impl Record {
    /// An outcome that means the journal held the intent back, if `execute` ended with one.
    pub fn odd_outcome(&self) -> Option<String> {
        self.last_outcome
            .clone()
            .filter(|outcome| outcome == "duplicate_intent_suspected")
    }
}

/// What every agent shares.
pub struct Agents {
    /// Per replica: a client, and a client whose answers the relay may lose.
    pub clients: Vec<(JournalClient, JournalClient)>,
    /// The HTTP client for the provider.
    pub http: reqwest::Client,
    /// The sandbox's base URL.
    pub sandbox_url: String,
    /// When agents give up on unfinished intents (moved once the faults stop).
    pub deadline: std::sync::Mutex<Instant>,
    /// Provider calls made with each injected fault.
    pub provider_faults: Arc<[AtomicU32; 6]>,
}

/// How long one `execute` waits for another holder's lease or for a settlement.
const WAIT: Duration = Duration::from_secs(4);

impl Agents {
    /// Drives `plan` to its end (or the deadline); `pick` chooses the replica of each try.
    pub async fn drive(&self, plan: &Plan, mut pick: impl FnMut() -> usize) -> Record {
        let mut record = Record::default();
        let intent = intent(plan);
        let options = ExecuteOptions::new()
            .wait_in_progress(WAIT)
            .wait_settled(WAIT);
        let calls = Arc::new(AtomicU32::new(0));
        while Instant::now() < self.deadline() {
            let (plain, lossy) = &self.clients[pick() % self.clients.len()];
            let client = if plan.lost_answers { lossy } else { plain };
            let first_call = calls.load(Ordering::SeqCst) == 0;
            let fault = if first_call { plan.fault } else { Fault::None };
            let (crash, crashed) = oneshot::channel::<()>();
            let counter = Arc::clone(&calls);
            let call = |call: ProviderCall| async move {
                counter.fetch_add(1, Ordering::SeqCst);
                self.count_fault(fault);
                let outcome = self.call_provider(plan, &call, fault).await;
                if fault == Fault::CrashAfterCall {
                    let _ = crash.send(());
                    std::future::pending::<()>().await;
                }
                outcome
            };
            record.executions += 1;
            let calls_before = calls.load(Ordering::SeqCst);
            let executed = tokio::select! {
                executed = client.execute_with(intent.clone(), &options, call) => Some(executed),
                Ok(()) = crashed => None,
            };
            record.provider_calls = calls.load(Ordering::SeqCst);
            let Some(executed) = executed else {
                // The agent died with the effect done and unreported; a new one starts.
                record.crashes += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            match executed {
                Ok(executed) => {
                    record.last_outcome = Some(executed.outcome().to_owned());
                    let called = calls.load(Ordering::SeqCst) > calls_before;
                    if let Some(ack) = acknowledged(&executed, called) {
                        record.acks.push(ack);
                    }
                    match executed {
                        Executed::Succeeded { .. } | Executed::FailedFinal { .. } => {
                            record.finished = true;
                            break;
                        }
                        Executed::DuplicateIntentSuspected { .. } => {
                            record.last_outcome = Some("duplicate_intent_suspected".into());
                            break;
                        }
                        Executed::VerificationRequired { .. } | Executed::InProgress { .. } => {}
                    }
                }
                Err(error) => {
                    *record.errors.entry(error_name(&error)).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        record
    }

    /// Sets when agents give up.
    pub fn set_deadline(&self, deadline: Instant) {
        *self
            .deadline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = deadline;
    }

    fn deadline(&self) -> Instant {
        *self
            .deadline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn count_fault(&self, fault: Fault) {
        let index = fault as usize;
        self.provider_faults[index].fetch_add(1, Ordering::Relaxed);
    }

    /// One call to the sandbox under the lease, classified honestly: only a decline is a
    /// rejection; a timeout, a 5xx or an unreadable answer is uncertain.
    async fn call_provider(
        &self,
        plan: &Plan,
        call: &ProviderCall,
        fault: Fault,
    ) -> ProviderOutcome {
        let (path, body) = provider_request(plan, &call.provider_key);
        let mut request = self
            .http
            .post(format!("{}{path}", self.sandbox_url))
            .json(&body)
            .timeout(match fault {
                Fault::CommitThenTimeout => Duration::from_secs(1),
                Fault::Slow => Duration::from_secs(15),
                _ => Duration::from_secs(5),
            });
        if plan.action == Action::Payment {
            request = request.header("Idempotency-Key", &call.provider_key);
        }
        if let Some(header) = fault.header() {
            request = request.header("X-Sandbox-Fault", header);
        }
        let uncertain = |code: &str| ProviderOutcome::Uncertain {
            error_code: Some(code.to_owned()),
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) if err.is_timeout() => return uncertain("timeout"),
            Err(_) => return uncertain("connection_error"),
        };
        let status = response.status();
        let Ok(answer) = response.json::<Value>().await else {
            return uncertain("unreadable_response");
        };
        if status.is_success() {
            let id = answer["id"].as_str().map(str::to_owned);
            return ProviderOutcome::Succeeded {
                external_id: id,
                result: Some(answer),
            };
        }
        match (status.as_u16(), answer["error"].as_str()) {
            (402, Some(code @ "card_declined")) | (422, Some(code @ "recipient_rejected")) => {
                ProviderOutcome::Rejected {
                    error_code: code.to_owned(),
                }
            }
            (status, _) => uncertain(&format!("http_{status}")),
        }
    }
}

/// The intent of `plan`: the same payload on every try, so the request hash never changes.
pub fn intent(plan: &Plan) -> Intent {
    let payload = match plan.action {
        Action::Payment => json!({
            "amount_minor": 100 + plan.index,
            "currency": "EUR",
            "order_id": format!("order-{}", plan.index),
        }),
        Action::Email => {
            json!({"template": "receipt", "order_id": format!("order-{}", plan.index)})
        }
    };
    Intent::new(plan.key.clone(), plan.action.action_type(), payload)
        .with_reference("order_id", format!("order-{}", plan.index))
}

fn provider_request(plan: &Plan, provider_key: &str) -> (&'static str, Value) {
    match plan.action {
        Action::Payment => ("/v1/payments", intent(plan).payload),
        Action::Email => (
            "/v1/emails",
            json!({
                "to": format!("recipient-{}", plan.index),
                "subject": "receipt",
                "external_reference": provider_key,
            }),
        ),
    }
}

/// The report an outcome of `execute` proves the journal acknowledged, if any; `called`
/// says whether this `execute` called the provider (then a verification-required outcome
/// is the acknowledged report of an unknown outcome).
fn acknowledged(executed: &Executed, called: bool) -> Option<Ack> {
    match executed {
        Executed::VerificationRequired { operation } if called => Some(Ack::Unknown {
            attempt: operation.attempt_count,
        }),
        Executed::Succeeded {
            operation,
            replayed: false,
        } => Some(Ack::Completed {
            attempt: operation.attempt_count,
            external_id: operation.external_id.clone(),
        }),
        Executed::FailedFinal {
            operation,
            replayed: false,
        } => Some(Ack::Failed {
            attempt: operation.attempt_count,
        }),
        _ => None,
    }
}

/// `CODE/REASON` of a client error.
pub fn error_name(error: &ClientError) -> String {
    format!("{}/{}", code_name(error.code as i32), error.reason)
}
