//! The human reviewer, automated: reads the review queue through the Reconciler API, looks
//! each operation up at the provider (the sandbox holds the truth a person would check), and
//! resolves it: `succeeded` with the provider's id when the effect exists; otherwise, in turn,
//! `failed_final` or `release_for_retry` (the agent then executes it again, same key).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use opjournal_client::ClientError;
use opjournal_client::proto::reconciler_client::ReconcilerClient;
use opjournal_client::proto::{
    ListOperationsForReviewRequest, Operation, ResolveFailedFinal, ResolveOperationRequest,
    ResolveReleaseForRetry, ResolveSucceeded, resolve_operation_request::Resolution,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::agent::{Ack, error_name};
use crate::stand::CALL_TIMEOUT;

/// What the reviewer did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReviewCounts {
    /// Resolutions acknowledged, by kind (`succeeded`, `failed_final`, `release_for_retry`).
    pub resolved: BTreeMap<String, u64>,
    /// Errors of the review calls, as `CODE/REASON`.
    pub errors: BTreeMap<String, u64>,
    /// Provider lookups that failed (the operation was left for the next pass).
    pub lookup_failures: u64,
}

/// The reviewer's state: what it resolved, per key.
pub struct Reviewer {
    channels: Vec<Channel>,
    http: reqwest::Client,
    sandbox_url: String,
    acks: Mutex<HashMap<String, Vec<Ack>>>,
    counts: Mutex<ReviewCounts>,
}

/// What the provider holds for an operation.
enum Truth {
    Found(String),
    Absent,
}

impl Reviewer {
    /// A reviewer over one channel per replica.
    pub fn new(channels: Vec<Channel>, http: reqwest::Client, sandbox_url: String) -> Self {
        Self {
            channels,
            http,
            sandbox_url,
            acks: Mutex::new(HashMap::new()),
            counts: Mutex::new(ReviewCounts::default()),
        }
    }

    /// Works the queue every 300 ms, on the replicas in turn, until `stop` turns true.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let mut pass = 0_usize;
        while !*stop.borrow() {
            let channel = self.channels[pass % self.channels.len()].clone();
            pass += 1;
            if let Err(error) = self.pass(ReconcilerClient::new(channel)).await {
                self.error(&error);
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(300)) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// The acknowledged resolutions per key, and the counts.
    pub fn results(&self) -> (HashMap<String, Vec<Ack>>, ReviewCounts) {
        let acks = self
            .acks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (acks, counts)
    }

    async fn pass(&self, mut client: ReconcilerClient<Channel>) -> Result<(), ClientError> {
        let mut page_token = String::new();
        loop {
            let mut request = tonic::Request::new(ListOperationsForReviewRequest {
                namespace: String::new(),
                page_size: 500,
                page_token: page_token.clone(),
            });
            request.set_timeout(CALL_TIMEOUT);
            let page = client
                .list_operations_for_review(request)
                .await?
                .into_inner();
            for operation in page.operations {
                self.review(&mut client, operation).await;
            }
            if page.next_page_token.is_empty() {
                return Ok(());
            }
            page_token = page.next_page_token;
        }
    }

    async fn review(&self, client: &mut ReconcilerClient<Channel>, operation: Operation) {
        let truth = match self.truth(&operation).await {
            Some(truth) => truth,
            None => {
                self.counts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .lookup_failures += 1;
                return;
            }
        };
        let (name, resolution, external_id) = match truth {
            Truth::Found(id) => (
                "succeeded",
                Resolution::Succeeded(ResolveSucceeded {
                    external_id: id.clone(),
                    result_json: json!({"id": id, "status": "found_by_reviewer"}).to_string(),
                }),
                Some(id),
            ),
            Truth::Absent if release(&operation.operation_key) => (
                "release_for_retry",
                Resolution::ReleaseForRetry(ResolveReleaseForRetry {}),
                None,
            ),
            Truth::Absent => (
                "failed_final",
                Resolution::FailedFinal(ResolveFailedFinal {
                    error_code: "not_at_provider".into(),
                }),
                None,
            ),
        };
        let mut request = tonic::Request::new(ResolveOperationRequest {
            namespace: operation.namespace.clone(),
            operation_key: operation.operation_key.clone(),
            expected_attempt_count: operation.attempt_count,
            reviewer: "chaos-reviewer".into(),
            reason: "checked the provider".into(),
            resolution: Some(resolution),
        });
        request.set_timeout(CALL_TIMEOUT);
        match client.resolve_operation(request).await {
            Ok(_) => {
                let ack = Ack::Resolved {
                    attempt: operation.attempt_count,
                    resolution: name.to_owned(),
                    external_id,
                };
                self.acks
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(operation.operation_key)
                    .or_default()
                    .push(ack);
                let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
                *counts.resolved.entry(name.to_owned()).or_default() += 1;
            }
            Err(status) => self.error(&ClientError::from(status)),
        }
    }

    /// Looks the operation up at the sandbox: a payment by its idempotency key, an e-mail by
    /// its external reference. `None` when the lookup itself failed.
    async fn truth(&self, operation: &Operation) -> Option<Truth> {
        let path = match operation.action_type.as_str() {
            "send_email" => "emails/by-reference",
            _ => "payments/by-idempotency-key",
        };
        let url = format!("{}/v1/{path}/{}", self.sandbox_url, operation.provider_key);
        let response = self
            .http
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.ok()?;
        match (status, body["id"].as_str(), body["error"].as_str()) {
            (200, Some(id), _) => Some(Truth::Found(id.to_owned())),
            (404, _, Some("not_found")) => Some(Truth::Absent),
            _ => None,
        }
    }

    fn error(&self, error: &ClientError) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.errors.entry(error_name(error)).or_default() += 1;
    }
}

/// Half of the operations found absent are released for retry, the other half failed for
/// good, by the parity of the key's last digit.
fn release(key: &str) -> bool {
    key.bytes()
        .last()
        .is_some_and(|digit| digit.is_ascii_digit() && (digit - b'0') % 2 == 1)
}
