//! The journal calls each scenario makes, through the real gRPC API, checking every answer
//! is the one the journal promises (an EXECUTE for a new key, a REPLAY for a succeeded one,
//! `IDEMPOTENCY_KEY_REUSED` for another payload): a fast wrong answer is an error, not a
//! result.

use std::time::{Duration, Instant};

use opjournal::client::{ClientError, ErrorReason};
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{
    BeginOperationRequest, BeginOperationResponse, CompleteOperationRequest, Decision,
    ReportUnknownOutcomeRequest,
};
use tonic::transport::Channel;

use crate::load::{CallFailure, CallOutcome, Recorder};

/// The action type every scenario uses (the benchmark's policy reconciles it through the
/// sandbox provider's search by key).
pub const ACTION: &str = "create_payment";

/// The idempotency key of operation `sequence` of `client` in run `run`. Letters glue the
/// numbers to words, so the journal's personal-data screening never takes them for a phone
/// or card number.
pub fn key(run: &str, scenario: &str, client: usize, sequence: u64) -> String {
    format!("bench:{run}:{scenario}:c{client}n{sequence}")
}

/// The request parameters of operation `sequence`; `variant` changes the payload (a
/// conflict is the same key with another variant).
pub fn payload(sequence: u64, variant: u32) -> String {
    format!(
        r#"{{"amount_minor":{},"currency":"EUR","variant":{variant}}}"#,
        1000 + sequence % 9000
    )
}

fn begin_request(namespace: &str, key: String, payload: String) -> BeginOperationRequest {
    BeginOperationRequest {
        namespace: namespace.to_owned(),
        operation_key: key,
        action_type: ACTION.to_owned(),
        payload_json: payload,
        ..BeginOperationRequest::default()
    }
}

async fn begin(
    client: &mut OperationJournalClient<Channel>,
    request: BeginOperationRequest,
) -> Result<BeginOperationResponse, ClientError> {
    client
        .begin_operation(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(ClientError::from)
}

fn expect_decision(response: &BeginOperationResponse, expected: Decision) -> CallOutcome {
    let decision = Decision::try_from(response.decision).unwrap_or(Decision::Unspecified);
    if decision == expected {
        Ok(())
    } else {
        Err(CallFailure::new(format!(
            "expected {}, got {}",
            expected.as_str_name(),
            decision.as_str_name()
        )))
    }
}

/// Begin of a new key, then Complete with the provider's id: the full lifecycle of a new
/// operation (the article's steps 1, 3 and 6). Stages: `begin` and `complete` from when
/// each call was sent, `lifecycle` from `started` (the intended send time in an open loop).
pub async fn lifecycle(
    channel: Channel,
    namespace: &str,
    key: String,
    payload: String,
    started: Instant,
    mut recorder: Recorder,
) -> (CallOutcome, Recorder) {
    let mut client = OperationJournalClient::new(channel);
    let begun = begin(&mut client, begin_request(namespace, key, payload)).await;
    recorder.record("begin", started.elapsed());
    let response = match begun {
        Ok(response) => response,
        Err(error) => return (Err(CallFailure::new(format!("Begin: {error}"))), recorder),
    };
    if let Err(error) = expect_decision(&response, Decision::Execute) {
        return (Err(CallFailure::new(format!("Begin: {error}"))), recorder);
    }
    let sent_complete = Instant::now();
    let completed = client
        .complete_operation(CompleteOperationRequest {
            lease_token: response.lease_token,
            external_id: "ext-bench".to_owned(),
            result_json: r#"{"id":"ext"}"#.to_owned(),
        })
        .await;
    recorder.record("complete", sent_complete.elapsed());
    recorder.record("lifecycle", started.elapsed());
    match completed {
        Ok(_) => (Ok(()), recorder),
        Err(status) => (
            Err(CallFailure::new(format!(
                "Complete: {}",
                ClientError::from(status)
            ))),
            recorder,
        ),
    }
}

/// Begin of a succeeded key with its own payload: must be answered REPLAY.
pub async fn replay(
    channel: Channel,
    namespace: &str,
    key: String,
    payload: String,
    recorder: Recorder,
) -> (CallOutcome, Recorder) {
    let (answer, recorder) = timed_begin(channel, namespace, key, payload, recorder).await;
    let outcome = match answer {
        Ok(response) => expect_decision(&response, Decision::Replay),
        Err(error) => Err(CallFailure::new(format!("Begin: {error}"))),
    };
    (outcome, recorder)
}

/// Begin of a succeeded key with another payload: must be refused `ALREADY_EXISTS` /
/// `IDEMPOTENCY_KEY_REUSED`, and the provider never called.
pub async fn conflict(
    channel: Channel,
    namespace: &str,
    key: String,
    payload: String,
    recorder: Recorder,
) -> (CallOutcome, Recorder) {
    let (answer, recorder) = timed_begin(channel, namespace, key, payload, recorder).await;
    let outcome = match answer {
        Err(error) if error.reason == ErrorReason::IdempotencyKeyReused => Ok(()),
        Err(error) => Err(CallFailure::new(format!(
            "expected IDEMPOTENCY_KEY_REUSED, got {error}"
        ))),
        Ok(response) => Err(CallFailure::new(format!(
            "expected IDEMPOTENCY_KEY_REUSED, got {}",
            Decision::try_from(response.decision)
                .unwrap_or(Decision::Unspecified)
                .as_str_name()
        ))),
    };
    (outcome, recorder)
}

/// One Begin, its latency recorded as the `call` stage.
async fn timed_begin(
    channel: Channel,
    namespace: &str,
    key: String,
    payload: String,
    mut recorder: Recorder,
) -> (Result<BeginOperationResponse, ClientError>, Recorder) {
    let mut client = OperationJournalClient::new(channel);
    let sent = Instant::now();
    let answer = begin(&mut client, begin_request(namespace, key, payload)).await;
    recorder.record("call", sent.elapsed());
    (answer, recorder)
}

/// Makes one operation whose outcome is unknown to the journal: Begin, the effect at the
/// sandbox provider (a payment under the operation's provider key), then a report of a
/// timeout, as a caller whose answer was lost would (the article's step 4).
pub async fn unknown_after_effect(
    channel: Channel,
    http: &reqwest::Client,
    sandbox_url: &str,
    namespace: &str,
    key: String,
    payload: String,
) -> anyhow::Result<()> {
    let mut client = OperationJournalClient::new(channel);
    let response = begin(&mut client, begin_request(namespace, key, payload.clone())).await?;
    expect_decision(&response, Decision::Execute).map_err(anyhow::Error::msg)?;
    let provider_key = response
        .operation
        .as_ref()
        .map(|op| op.provider_key.clone())
        .unwrap_or_default();
    let created = http
        .post(format!("{sandbox_url}/v1/payments"))
        .header("Idempotency-Key", provider_key)
        .header("Content-Type", "application/json")
        .body(payload)
        .timeout(Duration::from_secs(10))
        .send()
        .await?;
    anyhow::ensure!(
        created.status().is_success(),
        "the sandbox refused a payment: {}",
        created.status()
    );
    client
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: response.lease_token,
            error_code: "TIMEOUT".to_owned(),
        })
        .await
        .map_err(ClientError::from)?;
    Ok(())
}
