//! The shipped binaries as processes: health endpoints, working against the journal, and a
//! clean stop on SIGTERM.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::terminate;
use common::*;
use opjournal::proto::OperationStatus;
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tonic_health::pb::health_check_response::ServingStatus;

/// Starts `binary` with `args` and returns it with the address it printed after `marker`.
async fn start(binary: &str, args: &[String], marker: &str) -> (Child, String) {
    start_with_env(binary, args, &[], marker).await
}

/// [`start`] with extra environment variables (`RUST_LOG` is `warn` unless given).
async fn start_with_env(
    binary: &str,
    args: &[String],
    env: &[(&str, &str)],
    marker: &str,
) -> (Child, String) {
    start_logging(binary, args, env, Stdio::inherit(), marker).await
}

/// [`start_with_env`] with the process's standard error going to `stderr`.
async fn start_logging(
    binary: &str,
    args: &[String],
    env: &[(&str, &str)],
    stderr: Stdio,
    marker: &str,
) -> (Child, String) {
    let mut command = Command::new(binary);
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stderr(stderr);
    process::spawn_announcing(&mut command, marker).await
}

async fn wait_serving(address: &str, service: &str) {
    let started = Instant::now();
    while common::observe::health_status(address.parse().unwrap(), service).await
        != ServingStatus::Serving as i32
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{service} never SERVING"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_reconcile_worker_serves_health_settles_work_and_stops_on_sigterm(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &app.policy_yaml).unwrap();
    let args = [
        "--database-url".to_owned(),
        app.database_url(),
        "--policy".to_owned(),
        policy.display().to_string(),
        "--health-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    let (child, address) = start(
        env!("CARGO_BIN_EXE_opjournal-reconciler"),
        &args,
        "opjournal-reconciler health on",
    )
    .await;
    assert_eq!(
        common::observe::health_status(address.parse().unwrap(), "liveness").await,
        ServingStatus::Serving as i32
    );
    wait_serving(&address, "readiness").await;

    // The running worker settles an unknown payment on its own.
    let begin = app
        .begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    assert!(
        app.pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&begin.lease_token).await;
    let started = Instant::now();
    while op_status(&app.get(PAYMENT_KEY).await) != OperationStatus::Succeeded {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the worker never settled it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.counts(PAYMENT_KEY).effects, 1);
    terminate(child).await;
}

/// The JSON lines of the log at `path` so far.
fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_reconcile_workers_log_names_a_database_errors_message_and_sqlstate(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    // An operation whose key must never reach the log.
    let secret_key = "payment:kept-out-of-logs-4417";
    app.begin(secret_key, "create_payment", PAY_817)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, &app.policy_yaml).unwrap();
    let args = [
        "--database-url".to_owned(),
        app.database_url(),
        "--policy".to_owned(),
        policy.display().to_string(),
        "--health-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    let log = tempfile::NamedTempFile::new().unwrap();
    let (child, address) = start_logging(
        env!("CARGO_BIN_EXE_opjournal-reconciler"),
        &args,
        &[("OPJOURNAL_TELEMETRY__LOG_FORMAT", "json")],
        Stdio::from(log.reopen().unwrap()),
        "opjournal-reconciler health on",
    )
    .await;
    wait_serving(&address, "readiness").await;

    // The journal's table goes away under the running worker (as a botched migration or a
    // misrouted database would make it): every round fails in Postgres.
    sqlx::query("ALTER TABLE agent_operations RENAME TO agent_operations_away")
        .execute(&pool)
        .await
        .unwrap();
    let started = Instant::now();
    let line = loop {
        let found = json_lines(log.path()).into_iter().find(|line| {
            line["fields"]["message"] == "database error in reconcile; retrying"
                || line["message"] == "database error in reconcile; retrying"
        });
        if let Some(line) = found {
            break line;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no database error logged:\n{}",
            std::fs::read_to_string(log.path()).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    sqlx::query("ALTER TABLE agent_operations_away RENAME TO agent_operations")
        .execute(&pool)
        .await
        .unwrap();
    terminate(child).await;

    assert_eq!(line["level"], "ERROR", "{line}");
    let error = line["error"]
        .as_str()
        .or_else(|| line["fields"]["error"].as_str())
        .unwrap_or_else(|| panic!("no error field in {line}"));
    assert!(
        error.contains(r#"relation "agent_operations" does not exist"#)
            && error.contains("SQLSTATE 42P01"),
        "{error}"
    );
    let whole = std::fs::read_to_string(log.path()).unwrap();
    assert!(!whole.contains(secret_key), "a key in the log:\n{whole}");
    // Nothing was lost: the operation is still there, as it was.
    assert_eq!(
        op_status(&app.get(secret_key).await),
        OperationStatus::InProgress
    );
}

/// `serve` on ephemeral gRPC and metrics ports against the test app's database.
fn serve_against(app: &TestApp) -> [String; 7] {
    [
        "serve".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--database-url".to_owned(),
        app.database_url(),
    ]
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_server_binary_serves_and_stops_on_sigterm(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let args = serve_against(&app);
    let log = tempfile::NamedTempFile::new().unwrap();
    let (child, address) = start_logging(
        env!("CARGO_BIN_EXE_opjournal"),
        &args,
        &[
            ("RUST_LOG", "info"),
            ("OPJOURNAL_TELEMETRY__LOG_FORMAT", "json"),
        ],
        Stdio::from(log.reopen().unwrap()),
        "opjournal listening on",
    )
    .await;
    wait_serving(&address, "readiness").await;
    let mut client = opjournal::proto::operation_journal_client::OperationJournalClient::connect(
        format!("http://{address}"),
    )
    .await
    .unwrap();
    let begin = client
        .begin_operation(opjournal::proto::BeginOperationRequest {
            operation_key: "k".into(),
            action_type: "anything".into(),
            payload_json: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&begin), opjournal::proto::Decision::Execute);
    terminate(child).await;

    // Every line is JSON, and the lines of the main task and of the background tasks (the
    // readiness check, the signal handler) are all there.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .filter_map(|line| line["message"].as_str())
        .collect();
    for expected in [
        "telemetry ready",
        "opjournal serving gRPC",
        "database reachable: ready",
        "SIGTERM received",
        "stopped",
    ] {
        assert!(
            messages.contains(&expected),
            "{expected:?} not in {messages:#?}"
        );
    }
    for line in &lines {
        assert!(
            line["timestamp"].is_string() && line["level"].is_string(),
            "{line}"
        );
    }
}

/// What one client task saw of one operation.
#[derive(Debug)]
struct BurstCall {
    key: String,
    begin: Result<(), tonic::Status>,
    complete: Option<Result<(), tonic::Status>>,
}

/// An error as the Rust client sees a server going away: UNAVAILABLE (a stream refused by
/// the server's GOAWAY included), or a transport error (connection refused or reset) that
/// tonic reports while a connection closes.
fn unavailable_as_seen(status: &tonic::Status) -> bool {
    let error = opjournal_client::ClientError::from(status.clone());
    error.code == tonic::Code::Unavailable
        || (error.code == tonic::Code::Unknown
            && error.reason == opjournal_client::ErrorReason::Transport)
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn sigterm_during_a_burst_leaves_no_call_half_done(pool: PgPool) {
    use opjournal::proto::operation_journal_client::OperationJournalClient;
    use opjournal::proto::{BeginOperationRequest, CompleteOperationRequest};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let app = TestApp::spawn(pool).await;
    let args = serve_against(&app);
    let (child, address) = start_with_env(
        env!("CARGO_BIN_EXE_opjournal"),
        &args,
        &[("OPJOURNAL_SERVER__DRAIN_DELAY", "0.2")],
        "opjournal listening on",
    )
    .await;
    wait_serving(&address, "readiness").await;

    // Many clients, each on its own connection, Begin and Complete as fast as they can
    // until the server goes away.
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|task| {
            let acknowledged = acknowledged.clone();
            let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
                .unwrap()
                .connect_lazy();
            tokio::spawn(async move {
                let mut client = OperationJournalClient::new(channel);
                let mut calls = Vec::new();
                for i in 0..2000 {
                    let key = format!("burst-{task}-{i}");
                    let begin = client
                        .begin_operation(BeginOperationRequest {
                            operation_key: key.clone(),
                            action_type: "burst".into(),
                            payload_json: format!(r#"{{"task":{task},"n":{i}}}"#),
                            ..Default::default()
                        })
                        .await;
                    let token = match begin {
                        Ok(response) => response.into_inner().lease_token,
                        Err(status) => {
                            calls.push(BurstCall {
                                key,
                                begin: Err(status),
                                complete: None,
                            });
                            break;
                        }
                    };
                    acknowledged.fetch_add(1, Ordering::SeqCst);
                    let complete = client
                        .complete_operation(CompleteOperationRequest {
                            lease_token: token,
                            external_id: format!("ext-{task}-{i}"),
                            result_json: String::new(),
                        })
                        .await
                        .map(|_| ());
                    let failed = complete.is_err();
                    if !failed {
                        acknowledged.fetch_add(1, Ordering::SeqCst);
                    }
                    calls.push(BurstCall {
                        key,
                        begin: Ok(()),
                        complete: Some(complete),
                    });
                    if failed {
                        break;
                    }
                }
                calls
            })
        })
        .collect();

    // SIGTERM mid-burst.
    let started = Instant::now();
    while acknowledged.load(Ordering::SeqCst) < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the burst never got going"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    terminate(child).await;
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.unwrap());
    }

    // Every call was answered OK or, as the client saw it, UNAVAILABLE.
    let mut refused = 0;
    for call in &calls {
        for status in [Some(&call.begin), call.complete.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Err(status) = status {
                assert!(unavailable_as_seen(status), "{}: {status:?}", call.key);
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 12, "every client stopped on one refused call");

    // The journal holds exactly what the callers were told: an acknowledged Begin is there,
    // an acknowledged Complete settled it, a refused call changed nothing.
    let rows: std::collections::BTreeMap<String, String> = sqlx::query_as::<_, (String, String)>(
        "SELECT operation_key, status FROM agent_operations WHERE operation_key LIKE 'burst-%'",
    )
    .fetch_all(app.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let mut expected = std::collections::BTreeMap::new();
    for call in &calls {
        let status = match (&call.begin, &call.complete) {
            (Err(_), _) => continue,
            (Ok(()), Some(Ok(()))) => "succeeded",
            (Ok(()), _) => "in_progress",
        };
        expected.insert(call.key.clone(), status.to_owned());
    }
    assert!(expected.len() >= 50, "{} operations", expected.len());
    assert_eq!(rows, expected);
}

/// `opjournal serve` on `listen` over a new embedded journal, with `extra` flags.
fn serve_args(dir: &std::path::Path, listen: &str, extra: &[&str]) -> Vec<String> {
    let url = format!("sqlite://{}", dir.join("journal.db").display());
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        listen,
        "--metrics-listen",
        "127.0.0.1:0",
        "--database-url",
        &url,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

#[tokio::test]
async fn serve_refuses_a_reachable_address_without_authentication_unless_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_opjournal");
    // Every address of the host, no tokens, no client certificates: refused, saying why.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new(binary)
            .args(serve_args(dir.path(), "0.0.0.0:0", &[]))
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve exits")
    .unwrap();
    assert!(!refused.status.success());
    assert!(refused.stdout.is_empty(), "it never listened");
    let said = String::from_utf8_lossy(&refused.stderr);
    for named in [
        "without authentication",
        "tokens",
        "insecure_allow_unauthenticated",
    ] {
        assert!(said.contains(named), "{named}: {said}");
    }

    // Told so explicitly (the flag, or the variable): it serves.
    let serves = |extra: &'static [&'static str], env: Vec<(&'static str, String)>| {
        let args = serve_args(dir.path(), "0.0.0.0:0", extra);
        async move {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (child, address) =
                start_with_env(binary, &args, &env, "opjournal listening on").await;
            let port = address.rsplit(':').next().unwrap();
            wait_serving(&format!("127.0.0.1:{port}"), "").await;
            terminate(child).await;
        }
    };
    serves(&["--insecure-allow-unauthenticated"], vec![]).await;
    serves(
        &[],
        vec![(
            "OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED",
            "true".to_owned(),
        )],
    )
    .await;
    // With a token it needs no such setting.
    let token = format!(
        "[{{name=\"orchestrator\", sha256=\"{}\", namespaces=[\"*\"], roles=[\"client\"]}}]",
        "ab".repeat(32)
    );
    serves(&[], vec![("OPJOURNAL_AUTH__TOKENS", token)]).await;
}

#[tokio::test]
async fn serve_and_check_config_refuse_a_token_holding_client_and_reviewer() {
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_opjournal");
    let digest = "cd".repeat(32);
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nname = \"orchestrator\"\nsha256 = \"{}\"\nnamespaces = [\"*\"]\nroles = [\"client\"]\n\n\
             [[tokens]]\nname = \"agent-with-approval\"\nsha256 = \"{digest}\"\nnamespaces = [\"shop\"]\nroles = [\"client\", \"reviewer\"]\n",
            "ab".repeat(32)
        ),
    )
    .unwrap();
    let tokens_file = tokens.display().to_string();
    let serve = serve_args(dir.path(), "127.0.0.1:0", &[]);
    let check = vec!["check-config".to_owned()];
    for args in [serve, check] {
        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            Command::new(binary)
                .args(&args)
                .env("OPJOURNAL_AUTH__TOKENS_FILE", &tokens_file)
                .env("RUST_LOG", "warn")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("exits")
        .unwrap();
        assert!(!refused.status.success(), "{args:?}");
        assert!(refused.stdout.is_empty(), "{args:?}: it never listened");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            said.contains(&format!(
                "tokens_file: {tokens_file}: tokens[1].roles: the token named \"agent-with-approval\" holds both client and reviewer"
            )),
            "{args:?}: {said}"
        );
        assert!(
            !said.contains(&digest),
            "the digest is never quoted: {said}"
        );
    }
}

/// A configuration file of the first, flat format, and its old variables.
fn flat_config(dir: &std::path::Path) -> (std::path::PathBuf, Vec<(&'static str, String)>) {
    let file = dir.join("opjournal.toml");
    let url = format!("sqlite://{}", dir.join("journal.db").display());
    std::fs::write(
        &file,
        format!(
            "database_url = \"{url}\"\nmax_in_flight_requests = 9\n\
             drain_delay_seconds = 0.5\nmetrics_listen = \"127.0.0.1:0\"\n"
        ),
    )
    .unwrap();
    let env = vec![
        ("OPJOURNAL_MAX_CONNECTIONS", "4".to_owned()),
        ("OPJOURNAL_READINESS_INTERVAL_SECONDS", "1.5".to_owned()),
        (
            "OPJOURNAL_KEY_DERIVATION_SECRET",
            "a-secret-of-at-least-thirty-two-bytes".to_owned(),
        ),
        ("OPJOURNAL_LIMITS__MAX_PAGE_SIZE", "50".to_owned()),
    ];
    (file, env)
}

/// The deprecation notices a flat file and old variables of [`flat_config`] bring, one each.
const FLAT_NOTICES: [&str; 7] = [
    "database_url is deprecated: use [database] url",
    "max_in_flight_requests is deprecated: use [limits] max_in_flight_requests",
    "drain_delay_seconds is deprecated: use [server] drain_delay",
    "metrics_listen is deprecated: use [server] metrics_listen",
    "OPJOURNAL_MAX_CONNECTIONS is deprecated: use OPJOURNAL_DATABASE__MAX_CONNECTIONS",
    "OPJOURNAL_READINESS_INTERVAL_SECONDS is deprecated: use OPJOURNAL_SERVER__READINESS_INTERVAL",
    "OPJOURNAL_KEY_DERIVATION_SECRET is deprecated: use OPJOURNAL_SERVER__KEY_DERIVATION_SECRET",
];

#[tokio::test]
async fn check_config_reads_a_flat_file_warns_once_per_old_key_and_prints_sections() {
    let dir = tempfile::tempdir().unwrap();
    let (file, env) = flat_config(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(["check-config", "--config"])
        .arg(&file)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for notice in FLAT_NOTICES {
        assert_eq!(stderr.matches(notice).count(), 1, "{notice}\n{stderr}");
    }
    assert_eq!(
        stderr.matches("deprecated").count(),
        FLAT_NOTICES.len(),
        "{stderr}"
    );
    for line in [
        "[server]",
        "drain_delay = \"500ms\"",
        "readiness_interval = \"1s 500ms\"",
        "key_derivation_secret = \"[redacted]\"",
        "[database]",
        "max_connections = 4",
        "[limits]",
        "max_in_flight_requests = 9",
        "max_page_size = 50",
        "[telemetry]",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line}\n{stdout}");
    }
    assert!(!stdout.contains("thirty-two"), "{stdout}");
    assert!(stdout.contains("configuration and policy are valid"));
}

#[tokio::test]
async fn serve_starts_on_a_flat_file_and_old_variables_with_one_warning_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let (file, env) = flat_config(dir.path());
    let file = file.display().to_string();
    let args: Vec<String> = ["serve", "--listen", "127.0.0.1:0", "--config", &file]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (mut child, address) = start_logging(
        env!("CARGO_BIN_EXE_opjournal"),
        &args,
        &env,
        Stdio::piped(),
        "opjournal listening on",
    )
    .await;
    wait_serving(&address, "readiness").await;
    let mut stderr = child.stderr.take().unwrap();
    terminate(child).await;
    let mut log = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut log)
        .await
        .unwrap();
    for notice in FLAT_NOTICES {
        assert_eq!(log.matches(notice).count(), 1, "{notice}\n{log}");
    }
    assert!(!log.contains("thirty-two"), "{log}");
}
