//! The Rust runner of `clients/scenarios.yaml`: every scenario through `opjournal-client`'s
//! `execute_with`, as the file's header says, against the journal, the sandbox provider and
//! the harness's control endpoint. Each step's answer is held against its `expect`, and
//! afterwards each key's `final` against `GetOperation` and the sandbox's effect counts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opjournal_client::proto::OperationStatus;
use opjournal_client::{
    ClientError, ErrorReason, ExecuteOptions, Executed, Intent, JournalClient, ProviderCall,
    ProviderError, ProviderSuccess,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The HTTP timeout of every provider call.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    version: u32,
    defaults: Defaults,
    scenarios: Vec<Scenario>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    action_type: String,
    payload: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    about: String,
    steps: Vec<Step>,
    #[serde(rename = "final")]
    finals: BTreeMap<String, Final>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    execute: Option<Execute>,
    expect: Option<Expect>,
    control: Option<Control>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Execute {
    key: Option<String>,
    action_type: Option<String>,
    payload: Option<Map<String, Value>>,
    payload_patch: Option<Map<String, Value>>,
    provider: String,
    #[serde(default)]
    in_progress_wait_ms: u64,
    #[serde(default)]
    settle_wait_ms: u64,
    #[serde(default)]
    lease_seconds: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    outcome: String,
    replayed: Option<bool>,
    reported: Option<bool>,
    error_code: Option<String>,
    external_id_from_provider: Option<bool>,
    duplicate_of: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    path: String,
    #[serde(default)]
    body: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Final {
    status: Option<String>,
    attempt_count: Option<i32>,
    error_code: Option<String>,
    row: Option<String>,
    requests: Option<u64>,
    effects: Option<u64>,
    /// Checked by the harness (the relay's count), not by a runner.
    #[allow(dead_code)]
    begin_answers_lost: Option<u64>,
    /// Checked by the harness (the relay's count), not by a runner.
    #[allow(dead_code)]
    begin_answers_delayed: Option<u64>,
}

/// What the runner shares with every step: the journal client, HTTP, the URLs, and the
/// payment id the provider last returned per key.
struct Runner {
    client: JournalClient,
    http: reqwest::Client,
    sandbox_url: String,
    control_url: String,
    prefix: String,
    paid: Arc<Mutex<BTreeMap<String, String>>>,
}

/// Runs every scenario of `clients/scenarios.yaml` against the journal at `server_addr`
/// (`host:port`, plaintext), the sandbox at `sandbox_url` and the control endpoint at
/// `control_url`, with keys `{prefix}:{scenario}:{step key}`.
///
/// Errors: every failed step and every `final` mismatch, one line each, naming the scenario,
/// the step index (from 0) and what was expected against what came.
pub async fn run_all(
    server_addr: &str,
    sandbox_url: &str,
    control_url: &str,
    prefix: &str,
) -> Result<(), String> {
    run_matching(server_addr, sandbox_url, control_url, prefix, |_| true).await
}

/// [`run_all`] for the scenarios whose name `wanted` accepts.
pub async fn run_matching(
    server_addr: &str,
    sandbox_url: &str,
    control_url: &str,
    prefix: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<(), String> {
    opjournal::app::install_crypto_provider();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/scenarios.yaml");
    let text = std::fs::read_to_string(path).map_err(|err| format!("{path}: {err}"))?;
    let file: ScenarioFile =
        serde_saphyr::from_str(&text).map_err(|err| format!("{path}: {err}"))?;
    if file.version != 1 {
        return Err(format!("{path}: version {}, expected 1", file.version));
    }
    let client = JournalClient::connect(&format!("http://{server_addr}"))
        .await
        .map_err(|err| format!("connect to the journal: {err}"))?;
    let runner = Runner {
        client,
        http: reqwest::Client::new(),
        sandbox_url: sandbox_url.trim_end_matches('/').to_owned(),
        control_url: control_url.trim_end_matches('/').to_owned(),
        prefix: prefix.to_owned(),
        paid: Arc::default(),
    };
    let mut failures = Vec::new();
    for scenario in file.scenarios.iter().filter(|s| wanted(&s.name)) {
        failures.extend(runner.run(&file.defaults, scenario).await);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

impl Runner {
    fn key(&self, scenario: &Scenario, step_key: &str) -> String {
        format!("{}:{}:{step_key}", self.prefix, scenario.name)
    }

    /// Runs one scenario; its failures, one line each.
    async fn run(&self, defaults: &Defaults, scenario: &Scenario) -> Vec<String> {
        let mut payload = defaults.payload.clone();
        payload.insert(
            "run".into(),
            format!("{}:{}", self.prefix, scenario.name).into(),
        );
        let mut failures = Vec::new();
        for (index, step) in scenario.steps.iter().enumerate() {
            let at = format!("{} step {index}", scenario.name);
            let result = match (&step.execute, &step.expect, &step.control) {
                (Some(execute), Some(expect), None) => {
                    self.execute(scenario, defaults, &payload, execute, expect)
                        .await
                }
                (None, None, Some(control)) => {
                    self.control(scenario, defaults, &payload, control).await
                }
                _ => Err(vec![
                    "a step is `execute` with `expect`, or `control`".into(),
                ]),
            };
            if let Err(problems) = result {
                failures.extend(problems.into_iter().map(|p| format!("{at}: {p}")));
            }
        }
        for (step_key, expected) in &scenario.finals {
            let key = self.key(scenario, step_key);
            for problem in self.check_final(&key, expected).await {
                failures.push(format!("{} final {step_key}: {problem}", scenario.name));
            }
        }
        failures
    }

    /// A control step: POST `{control}/{path}` with the body completed as the header says.
    async fn control(
        &self,
        scenario: &Scenario,
        defaults: &Defaults,
        payload: &Map<String, Value>,
        control: &Control,
    ) -> Result<(), Vec<String>> {
        let mut body = control.body.clone();
        if let Some(step_key) = body.remove("key") {
            let step_key = step_key.as_str().unwrap_or("main").to_owned();
            body.insert("operation_key".into(), self.key(scenario, &step_key).into());
        }
        body.entry("action_type")
            .or_insert_with(|| defaults.action_type.clone().into());
        body.entry("payload")
            .or_insert_with(|| Value::Object(payload.clone()));
        post_control(
            &self.http,
            &self.control_url,
            &control.path,
            &Value::Object(body),
        )
        .await
        .map_err(|problem| vec![problem])
    }

    /// An execute step, checked against `expect`.
    async fn execute(
        &self,
        scenario: &Scenario,
        defaults: &Defaults,
        base_payload: &Map<String, Value>,
        step: &Execute,
        expect: &Expect,
    ) -> Result<(), Vec<String>> {
        let step_key = step.key.as_deref().unwrap_or("main");
        let key = self.key(scenario, step_key);
        let action_type = step
            .action_type
            .clone()
            .unwrap_or_else(|| defaults.action_type.clone());
        let mut payload = match &step.payload {
            Some(payload) => {
                let mut payload = payload.clone();
                payload.insert("run".into(), base_payload["run"].clone());
                payload
            }
            None => base_payload.clone(),
        };
        for (name, value) in step.payload_patch.iter().flatten() {
            payload.insert(name.clone(), value.clone());
        }
        let mut intent = Intent::new(
            key.clone(),
            action_type.clone(),
            Value::Object(payload.clone()),
        );
        if step.lease_seconds > 0 {
            intent = intent.with_lease(Duration::from_secs(step.lease_seconds));
        }
        let options = ExecuteOptions::new()
            .wait_in_progress(Duration::from_millis(step.in_progress_wait_ms))
            .wait_settled(Duration::from_millis(step.settle_wait_ms));
        let provider = Provider {
            behaviour: step.provider.clone(),
            http: self.http.clone(),
            sandbox_url: self.sandbox_url.clone(),
            control_url: self.control_url.clone(),
            action_type,
            payload: Value::Object(payload),
            calls: Arc::new(AtomicUsize::new(0)),
            paid: Arc::clone(&self.paid),
        };
        let calls = Arc::clone(&provider.calls);
        let answer = self
            .client
            .execute_with(intent, &options, move |call| async move {
                provider.call(call).await.into()
            })
            .await;
        let called = calls.load(Ordering::SeqCst) > 0;
        let mut problems = Vec::new();
        if step.provider == "none" && called {
            problems.push("the provider function was called; it must not be".into());
        }
        if step.provider != "none" && !called && expect.outcome != "conflict" {
            problems.push(format!(
                "the provider function ({}) was never called",
                step.provider
            ));
        }
        let paid = self.paid.lock().unwrap().get(&key).cloned();
        check_expect(
            &answer,
            expect,
            called,
            paid.as_deref(),
            &|step_key| self.key(scenario, step_key),
            &mut problems,
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Holds `key`'s journal row and provider counts against `expected`.
    async fn check_final(&self, key: &str, expected: &Final) -> Vec<String> {
        let mut problems = Vec::new();
        match (self.client.get("", key).await, expected.row.as_deref()) {
            (Err(err), Some("none")) if err.reason == ErrorReason::OperationNotFound => {}
            (Ok(_), Some("none")) => problems.push("expected no journal row, found one".into()),
            (Err(err), _) => problems.push(format!("GetOperation: {}", describe_error(&err))),
            (Ok(row), _) => {
                let status = status_name(row.status);
                if let Some(want) = &expected.status
                    && *want != status
                {
                    problems.push(format!("status: expected {want}, got {status}"));
                }
                if let Some(want) = expected.attempt_count
                    && want != row.attempt_count
                {
                    problems.push(format!(
                        "attempt_count: expected {want}, got {}",
                        row.attempt_count
                    ));
                }
                if expected.error_code.is_some() && expected.error_code != row.error_code {
                    problems.push(format!(
                        "error_code: expected {:?}, got {:?}",
                        expected.error_code, row.error_code
                    ));
                }
            }
        }
        match self.effects(key).await {
            Ok((requests, effects)) => {
                if let Some(want) = expected.requests
                    && want != requests
                {
                    problems.push(format!(
                        "provider requests: expected {want}, got {requests}"
                    ));
                }
                if let Some(want) = expected.effects
                    && want != effects
                {
                    problems.push(format!("provider effects: expected {want}, got {effects}"));
                }
            }
            Err(problem) => problems.push(problem),
        }
        problems
    }

    /// `(requests, effects)` of the provider key `key` at the sandbox.
    async fn effects(&self, key: &str) -> Result<(u64, u64), String> {
        let encoded =
            percent_encoding::utf8_percent_encode(key, percent_encoding::NON_ALPHANUMERIC);
        let url = format!("{}/v1/effects/{encoded}", self.sandbox_url);
        let counts: Value = async {
            self.http
                .get(&url)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await
        }
        .await
        .map_err(|err: reqwest::Error| format!("GET /v1/effects: {err}"))?;
        let count = |name: &str| {
            counts[name]
                .as_u64()
                .ok_or(format!("no `{name}` in {counts}"))
        };
        Ok((count("requests")?, count("effects")?))
    }
}

/// Holds an execute's answer against `expect`, adding what disagrees to `problems`.
fn check_expect(
    answer: &Result<Executed, ClientError>,
    expect: &Expect,
    called: bool,
    paid: Option<&str>,
    full_key: &dyn Fn(&str) -> String,
    problems: &mut Vec<String>,
) {
    let outcome = match answer {
        Ok(executed) => executed.outcome().to_owned(),
        Err(err) if err.reason == ErrorReason::IdempotencyKeyReused => "conflict".into(),
        Err(err) if err.reason == ErrorReason::LeaseLost => "lease_lost".into(),
        Err(err) if err.reason == ErrorReason::LeaseExpiredBeforeCall => "lease_expired".into(),
        Err(err) => format!("error {}", describe_error(err)),
    };
    if outcome != expect.outcome {
        problems.push(format!(
            "outcome: expected {}, got {outcome}",
            expect.outcome
        ));
        return;
    }
    let Ok(executed) = answer else { return };
    if let Some(want) = expect.replayed {
        match executed {
            Executed::Succeeded { replayed, .. } | Executed::FailedFinal { replayed, .. } => {
                if *replayed != want {
                    problems.push(format!("replayed: expected {want}, got {replayed}"));
                }
            }
            _ => problems.push("`replayed` given for an outcome without it".into()),
        }
    }
    if let Some(want) = expect.reported
        && want != called
    {
        problems.push(format!("reported: expected {want}, got {called}"));
    }
    let operation = executed.operation();
    if let Some(want) = &expect.error_code {
        let got = operation.and_then(|op| op.error_code.as_deref());
        if got != Some(want.as_str()) {
            problems.push(format!("error_code: expected {want}, got {got:?}"));
        }
    }
    if expect.external_id_from_provider == Some(true) {
        let got = operation.and_then(|op| op.external_id.as_deref());
        if paid.is_none() || got != paid {
            problems.push(format!(
                "external_id: expected the provider's payment id {paid:?}, got {got:?}"
            ));
        }
    }
    if let Some(step_key) = &expect.duplicate_of {
        let want = full_key(step_key);
        match executed {
            Executed::DuplicateIntentSuspected {
                duplicate_of_operation_key,
            } if *duplicate_of_operation_key == want => {}
            Executed::DuplicateIntentSuspected { .. } => {
                problems.push(format!(
                    "duplicate_of: expected the key of `{step_key}`, got another"
                ));
            }
            _ => problems.push("`duplicate_of` given for another outcome".into()),
        }
    }
}

/// The provider function of one execute step.
struct Provider {
    behaviour: String,
    http: reqwest::Client,
    sandbox_url: String,
    control_url: String,
    action_type: String,
    payload: Value,
    calls: Arc<AtomicUsize>,
    paid: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Provider {
    /// Does what the scenario's `provider` says; errors are left to the client's default
    /// classification.
    async fn call(self, call: ProviderCall) -> Result<ProviderSuccess, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.behaviour.as_str() {
            "ok" => self.pay(&call, None).await,
            fault @ ("commit-then-timeout" | "fail-before-store" | "reject") => {
                self.pay(&call, Some(fault)).await
            }
            "raise" => Err(std::io::Error::other("the provider function failed").into()),
            "restart_journal" => {
                let paid = self.pay(&call, None).await?;
                self.control("journal/restart", json!({"down_ms": 1500}))
                    .await?;
                Ok(paid)
            }
            "takeover" => {
                let paid = self.pay(&call, None).await?;
                let body = json!({
                    "operation_key": call.operation_key,
                    "action_type": self.action_type,
                    "payload": self.payload,
                });
                self.control("lease/takeover", body).await?;
                Ok(paid)
            }
            // `none` and anything unknown: the step fails on the call itself.
            _ => Err(ProviderError::uncertain("runner_unexpected_call")),
        }
    }

    /// POST /v1/payments under the provider key, with a 1-second HTTP timeout.
    async fn pay(
        &self,
        call: &ProviderCall,
        fault: Option<&str>,
    ) -> Result<ProviderSuccess, ProviderError> {
        let mut request = self
            .http
            .post(format!("{}/v1/payments", self.sandbox_url))
            .header("Idempotency-Key", &call.provider_key)
            .json(&self.payload);
        if let Some(fault) = fault {
            request = request.header("X-Sandbox-Fault", fault);
        }
        let (status, body) = tokio::time::timeout(PROVIDER_TIMEOUT, async {
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.json::<Value>().await.ok()))
        })
        .await??;
        if status.is_success() {
            let body = body.ok_or(ProviderError::uncertain("unreadable_response"))?;
            let id = body["id"].as_str().unwrap_or_default().to_owned();
            self.paid
                .lock()
                .unwrap()
                .insert(call.operation_key.clone(), id.clone());
            return Ok(ProviderSuccess::new(id).with_result(body));
        }
        if status == reqwest::StatusCode::PAYMENT_REQUIRED {
            let code = body.as_ref().and_then(|b| b["error"].as_str());
            return Err(ProviderError::rejected(code.unwrap_or("card_declined")));
        }
        Err(ProviderError::Status(status))
    }

    async fn control(&self, path: &str, body: Value) -> Result<(), ProviderError> {
        post_control(&self.http, &self.control_url, path, &body)
            .await
            .map_err(|_| ProviderError::uncertain("runner_control_failed"))
    }
}

/// POST `{control_url}/{path}` with `body`; a problem unless 200.
async fn post_control(
    http: &reqwest::Client,
    control_url: &str,
    path: &str,
    body: &Value,
) -> Result<(), String> {
    let response = http
        .post(format!("{control_url}/{path}"))
        .json(body)
        .send()
        .await
        .map_err(|err| format!("control {path}: {err}"))?;
    let status = response.status();
    if status == reqwest::StatusCode::OK {
        Ok(())
    } else {
        let text = response.text().await.unwrap_or_default();
        Err(format!("control {path}: HTTP {status}: {text}"))
    }
}

/// `succeeded`, `in_progress`, ...: the status as the scenario file names it.
fn status_name(status: i32) -> String {
    OperationStatus::try_from(status).map_or_else(
        |_| status.to_string(),
        |status| {
            status
                .as_str_name()
                .trim_start_matches("OPERATION_STATUS_")
                .to_lowercase()
        },
    )
}

fn describe_error(err: &ClientError) -> String {
    format!("{:?} {}", err.code, err.reason)
}
