//! The dashboard and the alerting rules of deploy/monitoring against the real thing: every
//! metric their queries name, every label they match or group by and every label value they
//! select is in a scrape of the built server and worker, after traffic that makes each
//! labelled series appear (a conflict, lookups that succeed and that fail, an escalation to
//! review whose webhook deliveries fail until the event dies, an operation past its deadline,
//! a swept lease, a database outage). The names are
//! read from the files, so a rule or a panel added later is checked too. Their syntax and the
//! alerts' behaviour are promtool's to check (scripts/check-monitoring).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::observe::{PgProxy, Sample, samples};
use common::{PAY_817, PAY_817_OTHER_AMOUNT, TestDb, decision, process};
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal::proto::{BeginOperationRequest, Decision, ReportUnknownOutcomeRequest};
use opjournal_sandbox::SandboxConfig;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, AggregateExpr, Expr, LabelModifier};
use promql_parser::util::{ExprVisitor, walk_expr};
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// Labels Prometheus gives every series of a target (a PodMonitor's, or the usual Kubernetes
/// pod discovery's): never in a scrape, so not looked for there.
const TARGET_LABELS: &[&str] = &[
    "namespace",
    "pod",
    "container",
    "job",
    "instance",
    "endpoint",
    "service",
];

/// One query of the rules or of the dashboard, and where it is.
#[derive(Debug, Clone)]
struct Query {
    place: String,
    expr: String,
}

fn monitoring_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/monitoring")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every rule's expression in deploy/monitoring/rules.yaml.
fn rule_queries() -> Vec<Query> {
    let rules: serde_json::Value = serde_saphyr::from_str(&monitoring_file("rules.yaml")).unwrap();
    let mut queries = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            queries.push(Query {
                place: format!("rules.yaml {name}"),
                expr: rule["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    queries
}

/// Every query of deploy/monitoring/dashboard.json: the panels' (rows' panels included) and
/// the template variables' (`label_values(QUERY, label)` gives QUERY).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<Query> {
    fn panels<'a>(list: &'a [serde_json::Value], out: &mut Vec<&'a serde_json::Value>) {
        for panel in list {
            out.push(panel);
            if let Some(inner) = panel["panels"].as_array() {
                panels(inner, out);
            }
        }
    }
    let mut all = Vec::new();
    panels(dashboard["panels"].as_array().unwrap(), &mut all);
    let mut queries = Vec::new();
    for panel in all {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(Query {
                place: format!(
                    "dashboard.json panel {} \"{}\" {}",
                    panel["id"],
                    panel["title"].as_str().unwrap(),
                    target["refId"].as_str().unwrap()
                ),
                expr: target["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    let label_values =
        regex::Regex::new(r"^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$").unwrap();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .unwrap();
        let inner = label_values
            .captures(query)
            .map_or(query, |c| c.get(1).unwrap().as_str());
        queries.push(Query {
            place: format!("dashboard.json variable {}", variable["name"]),
            expr: inner.to_owned(),
        });
    }
    queries
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&monitoring_file("dashboard.json")).unwrap()
}

/// `expr` with Grafana's variables replaced by sample values: intervals by `5m`, the others by
/// `x` (they only ever stand in label matchers of target labels).
fn grafana_free(expr: &str) -> String {
    let intervals = regex::Regex::new(r"\$\{?(__rate_interval|__interval|__range)\}?").unwrap();
    let variables = regex::Regex::new(r"\$\{[A-Za-z0-9_]+(:[a-z]+)?\}|\$[A-Za-z_]\w*").unwrap();
    variables
        .replace_all(&intervals.replace_all(expr, "5m"), "x")
        .into_owned()
}

/// What one query asks of a scrape: the series it selects, and the labels it groups by (with
/// the metrics under the aggregation or the vector match).
#[derive(Debug, Default)]
struct Needs {
    selectors: Vec<(String, Vec<Matcher>)>,
    grouping: Vec<(BTreeSet<String>, String)>,
}

impl ExprVisitor for Needs {
    type Error = String;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
        let selector = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        if let Some(vs) = selector {
            let name = vs.name.clone().or_else(|| {
                vs.matchers
                    .matchers
                    .iter()
                    .find(|m| m.name == "__name__" && m.op == MatchOp::Equal)
                    .map(|m| m.value.clone())
            });
            let name = name.ok_or_else(|| format!("a selector without a metric name: {vs}"))?;
            let matchers = vs
                .matchers
                .matchers
                .iter()
                .chain(vs.matchers.or_matchers.iter().flatten())
                .filter(|m| m.name != "__name__")
                .cloned()
                .collect();
            self.selectors.push((name, matchers));
        }
        let (labels, under): (Option<&LabelModifier>, Vec<&Expr>) = match expr {
            Expr::Aggregate(AggregateExpr { modifier, expr, .. }) => {
                (modifier.as_ref(), vec![expr.as_ref()])
            }
            Expr::Binary(binary) => (
                binary.modifier.as_ref().and_then(|m| m.matching.as_ref()),
                vec![binary.lhs.as_ref(), binary.rhs.as_ref()],
            ),
            _ => (None, Vec::new()),
        };
        if let Some(labels) = labels {
            let mut inner = Needs::default();
            for e in under {
                walk_expr(&mut inner, e)?;
            }
            let metrics: BTreeSet<String> = inner.selectors.into_iter().map(|(n, _)| n).collect();
            for label in &labels.labels().labels {
                self.grouping.push((metrics.clone(), label.clone()));
            }
        }
        Ok(true)
    }
}

fn needs(query: &Query) -> Needs {
    let expr = parser::parse(&grafana_free(&query.expr))
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", query.place, query.expr));
    let mut needs = Needs::default();
    walk_expr(&mut needs, &expr).unwrap_or_else(|e| panic!("{}: {e}", query.place));
    needs
}

/// Everything `queries` ask for that `scrape` lacks, one line each, naming the query.
fn missing(queries: &[Query], scrape: &[Sample]) -> Vec<String> {
    let mut by_metric: BTreeMap<&str, Vec<&BTreeMap<String, String>>> = BTreeMap::new();
    for sample in scrape {
        by_metric
            .entry(&sample.name)
            .or_default()
            .push(&sample.labels);
    }
    let has_label = |metric: &str, label: &str| {
        TARGET_LABELS.contains(&label)
            || by_metric
                .get(metric)
                .is_some_and(|series| series.iter().any(|s| s.contains_key(label)))
    };
    let mut problems = Vec::new();
    for query in queries {
        let needs = needs(query);
        for (metric, matchers) in &needs.selectors {
            let Some(series) = by_metric.get(metric.as_str()) else {
                problems.push(format!("{}: no metric {metric}", query.place));
                continue;
            };
            for m in matchers {
                if TARGET_LABELS.contains(&m.name.as_str()) {
                    continue;
                }
                if !has_label(metric, &m.name) {
                    problems.push(format!("{}: {metric} has no label {}", query.place, m.name));
                    continue;
                }
                let values = || series.iter().filter_map(|s| s.get(&m.name));
                let found = match &m.op {
                    MatchOp::Equal => values().any(|v| *v == m.value),
                    MatchOp::Re(re) => {
                        let whole = regex::Regex::new(&format!("^(?:{re})$")).unwrap();
                        values().any(|v| whole.is_match(v))
                    }
                    MatchOp::NotEqual | MatchOp::NotRe(_) => true,
                };
                if !found {
                    problems.push(format!(
                        "{}: no {metric} series with {}{}{:?}",
                        query.place, m.name, m.op, m.value
                    ));
                }
            }
        }
        for (metrics, label) in &needs.grouping {
            if !metrics.iter().any(|metric| has_label(metric, label)) {
                problems.push(format!(
                    "{}: groups by {label}, a label of none of {metrics:?}",
                    query.place
                ));
            }
        }
    }
    problems
}

/// The checker itself: a scrape that lacks a metric, a label or a label value is reported,
/// naming the query; target labels are never looked for.
#[test]
fn the_check_names_each_metric_label_and_value_a_scrape_lacks() {
    let scrape = samples(
        "# TYPE opjournal_store_errors_total counter\n\
         opjournal_store_errors_total{operation=\"ping\",error_type=\"other\"} 1\n\
         opjournal_review_queue_size 2\n",
    );
    let query = |expr: &str| Query {
        place: "q".into(),
        expr: expr.into(),
    };
    let found = |expr: &str| missing(&[query(expr)], &scrape);
    assert_eq!(
        found(
            r#"sum by (namespace, operation) (rate(opjournal_store_errors_total{error_type=~"oth.*", pod=~"$pod"}[$__rate_interval]))"#
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        found("max(opjournal_review_oldest_age_seconds) > 1800"),
        ["q: no metric opjournal_review_oldest_age_seconds"]
    );
    assert_eq!(
        found(r#"rate(opjournal_store_errors_total{error_type="unavailable"}[2m])"#),
        ["q: no opjournal_store_errors_total series with error_type=\"unavailable\""]
    );
    assert_eq!(
        found(r#"rate(opjournal_store_errors_total{errortype="other"}[2m])"#),
        ["q: opjournal_store_errors_total has no label errortype"]
    );
    assert_eq!(
        found("sum by (adapter) (rate(opjournal_store_errors_total[2m]))"),
        ["q: groups by adapter, a label of none of {\"opjournal_store_errors_total\"}"]
    );
    assert_eq!(
        found(
            "opjournal_review_queue_size unless on (namespace, operation) opjournal_store_errors_total"
        ),
        Vec::<String>::new()
    );
}

/// The dashboard works in any Grafana: the data source is a variable every panel uses, and
/// every panel can be narrowed to a namespace (and, where a process is measured, to pods).
#[test]
fn the_dashboard_takes_its_data_source_namespace_and_pods_from_variables() {
    let dashboard = dashboard();
    let variables: BTreeMap<&str, &serde_json::Value> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(
        variables.keys().copied().collect::<Vec<_>>(),
        ["datasource", "namespace", "pod"]
    );
    assert_eq!(variables["datasource"]["type"], "datasource");
    assert_eq!(variables["datasource"]["query"], "prometheus");
    assert_eq!(variables["pod"]["multi"], true);
    assert_eq!(variables["pod"]["allValue"], ".*");
    let source = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{}", panel["id"]);
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| grid[k].as_u64().unwrap());
        assert!(
            x + w <= 24,
            "{} is wider than the dashboard",
            panel["title"]
        );
        for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
            assert!(
                cells.insert(cell),
                "{} overlaps another panel",
                panel["title"]
            );
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"], source, "{}", panel["title"]);
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(target["datasource"], source, "{}", panel["title"]);
            let expr = target["expr"].as_str().unwrap();
            assert!(
                expr.contains(r#"namespace=~"$namespace""#),
                "{}: {expr}",
                panel["title"]
            );
        }
    }
    assert!(ids.len() > 10);
}

/// Starts `binary` with `env` and returns it with the addresses it printed after each of
/// `markers`.
async fn start(
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
    markers: &[&str],
) -> (Child, Vec<String>) {
    let (child, mut lines) = process::spawn_piped(
        Command::new(binary)
            .args(args)
            .env("RUST_LOG", "warn")
            .env("OPJOURNAL_RECONCILE__POLL_INTERVAL", "0.1")
            .env("OPJOURNAL_RECONCILE__BACKLOG_SAMPLE_INTERVAL", "0.2")
            .env("OPJOURNAL_SERVER__READINESS_INTERVAL", "0.2")
            .envs(env.iter().copied()),
    );
    let found = process::announced_all(&mut lines, markers, Duration::from_secs(60)).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, found)
}

async fn scrape(url: &str) -> Vec<Sample> {
    samples(&reqwest::get(url).await.unwrap().text().await.unwrap())
}

/// Scrapes `url` until `ready` holds of the samples; fails after a generous bound (not a
/// timing assertion: the bound only keeps a broken build from hanging).
async fn scrape_until(url: &str, what: &str, ready: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let started = Instant::now();
    loop {
        let s = scrape(url).await;
        if ready(&s) {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never scraped {what} from {url}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn has(s: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.iter()
        .find(|x| {
            x.name == name
                && labels
                    .iter()
                    .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|x| x.value)
}

fn policy(sandbox_url: &str, closed_port: u16) -> String {
    format!(
        r#"
actions:
  # Looked up at the sandbox provider.
  create_payment:
    reconcile: {{ adapter: sandbox_payments, first_check_after_seconds: 0, interval_seconds: 1 }}
  # Its lookups fail, and it keeps being looked up past its deadline.
  create_payment_deadline:
    unknown_after_seconds: 1
    on_unresolved: keep_reconciling
    reconcile: {{ adapter: unreachable, first_check_after_seconds: 0, interval_seconds: 1 }}
  # No lookup: escalated to review at once.
  send_email:
    reconcile: {{ adapter: email_no_lookup, first_check_after_seconds: 0 }}
adapters:
  email_no_lookup:
    kind: none
  unreachable:
    kind: http
    url: "http://127.0.0.1:{closed_port}/v1/payments/{{provider_key}}"
    timeout_seconds: 1
    response: {{ status_pointer: /status, succeeded_values: [succeeded] }}
  sandbox_payments:
    kind: http
    url: "{sandbox_url}/v1/payments/by-idempotency-key/{{provider_key}}"
    timeout_seconds: 2
    search_complete: true
    absent_match: {{ pointer: /error, values: [not_found], key_pointer: /idempotency_key }}
    response: {{ status_pointer: /status, succeeded_values: [succeeded], failed_values: [failed], external_id_pointer: /id }}
"#
    )
}

async fn begin(
    client: &mut OperationJournalClient<Channel>,
    key: &str,
    action: &str,
    payload: &str,
    lease_seconds: i32,
) -> Result<opjournal::proto::BeginOperationResponse, tonic::Status> {
    client
        .begin_operation(BeginOperationRequest {
            operation_key: key.into(),
            action_type: action.into(),
            payload_json: payload.into(),
            lease_seconds,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn report_unknown(client: &mut OperationJournalClient<Channel>, token: &str) {
    client
        .report_unknown_outcome(ReportUnknownOutcomeRequest {
            lease_token: token.into(),
            error_code: "timeout".into(),
        })
        .await
        .unwrap();
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn every_metric_the_rules_and_the_dashboard_name_is_in_a_real_scrape(pool: PgPool) {
    opjournal::app::install_crypto_provider();
    let (sandbox_url, _sandbox) = opjournal_sandbox::spawn(SandboxConfig::default())
        .await
        .unwrap();
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, policy(&sandbox_url, closed_port)).unwrap();
    let policy_file = policy_file.display().to_string();
    // Both processes reach the database through a proxy the test can cut.
    let proxy = PgProxy::start().await;
    let database_url = proxy.url_for(&TestDb::Postgres(pool).url());
    let common = [
        "--database-url",
        database_url.as_str(),
        "--policy",
        policy_file.as_str(),
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let (_server, server) = start(
        env!("CARGO_BIN_EXE_opjournal"),
        &[&["serve", "--listen", "127.0.0.1:0"], &common[..]].concat(),
        &[],
        &["opjournal listening on", "opjournal metrics on"],
    )
    .await;
    // Escalation webhooks to a closed port: every attempt fails, and each event dies at its
    // max age of one second.
    let webhook_url = format!("http://127.0.0.1:{closed_port}/hooks");
    let webhook = [
        ("OPJOURNAL_WEBHOOK__URL", webhook_url.as_str()),
        (
            "OPJOURNAL_WEBHOOK__SECRET",
            "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        ),
        ("OPJOURNAL_WEBHOOK__TIMEOUT", "1"),
        ("OPJOURNAL_WEBHOOK__RETRY_BASE", "0.1"),
        ("OPJOURNAL_WEBHOOK__RETRY_CAP", "0.2"),
        ("OPJOURNAL_WEBHOOK__MAX_AGE", "1"),
        ("OPJOURNAL_WEBHOOK__POLL_INTERVAL", "0.1"),
    ];
    let (_worker, worker) = start(
        env!("CARGO_BIN_EXE_opjournal-reconciler"),
        &[&["--health-listen", "127.0.0.1:0"], &common[..]].concat(),
        &webhook,
        &["opjournal-reconciler metrics on"],
    )
    .await;
    let (server_metrics, worker_metrics) = (&server[1], &worker[0]);
    let mut client = OperationJournalClient::connect(format!("http://{}", server[0]))
        .await
        .unwrap();

    // A payment whose answer was lost after the provider took it: the worker finds it.
    let paid = begin(&mut client, "mon-paid", "create_payment", PAY_817, 0)
        .await
        .unwrap();
    assert_eq!(decision(&paid), Decision::Execute);
    let lost = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap()
        .post(format!("{sandbox_url}/v1/payments"))
        .header("Idempotency-Key", "mon-paid")
        .header("X-Sandbox-Fault", "commit-then-timeout")
        .header("Content-Type", "application/json")
        .body(PAY_817)
        .send()
        .await;
    assert!(lost.is_err(), "the sandbox answered {lost:?}");
    report_unknown(&mut client, &paid.lease_token).await;
    // The same key with another request: a conflict.
    let reused = begin(
        &mut client,
        "mon-paid",
        "create_payment",
        PAY_817_OTHER_AMOUNT,
        0,
    )
    .await
    .unwrap_err();
    assert_eq!(reused.code(), tonic::Code::AlreadyExists);
    // An e-mail with no lookup: escalated to review.
    let email = begin(&mut client, "mon-email", "send_email", r#"{"to":"x"}"#, 0)
        .await
        .unwrap();
    report_unknown(&mut client, &email.lease_token).await;
    // A payment whose provider cannot be reached, past its one-second deadline.
    let stuck = begin(
        &mut client,
        "mon-stuck",
        "create_payment_deadline",
        r#"{"amount":3}"#,
        0,
    )
    .await
    .unwrap();
    report_unknown(&mut client, &stuck.lease_token).await;
    // A holder that never reports: its one-second lease is swept.
    begin(
        &mut client,
        "mon-dead",
        "create_payment",
        r#"{"amount":4}"#,
        1,
    )
    .await
    .unwrap();

    scrape_until(worker_metrics, "the reconcile series", |s| {
        has(
            s,
            "opjournal_reconcile_lookup_duration_seconds_count",
            &[
                ("adapter", "sandbox_payments"),
                ("observation", "succeeded"),
            ],
        )
        .is_some()
            && has(
                s,
                "opjournal_reconcile_lookup_duration_seconds_count",
                &[("adapter", "unreachable"), ("observation", "lookup_failed")],
            )
            .is_some()
            && has(
                s,
                "opjournal_reconcile_outcomes_total",
                &[("adapter", "none"), ("outcome", "escalated")],
            )
            .is_some()
            && has(
                s,
                "opjournal_lease_expiries_total",
                &[("detected_by", "sweep")],
            )
            .is_some()
            && has(s, "opjournal_review_queue_size", &[]) == Some(1.0)
            && has(s, "opjournal_unknown_overdue_operations", &[]) >= Some(1.0)
            && has(
                s,
                "opjournal_webhook_deliveries_total",
                &[("outcome", "failed")],
            )
            .is_some()
            && has(
                s,
                "opjournal_webhook_deliveries_total",
                &[("outcome", "dead")],
            )
            .is_some()
            && has(s, "opjournal_webhook_outbox_dead", &[]) == Some(1.0)
    })
    .await;

    // The database goes away for a moment: both processes count it.
    proxy.cut();
    for metrics in [server_metrics, worker_metrics] {
        scrape_until(metrics, "an unavailable store", |s| {
            has(
                s,
                "opjournal_store_errors_total",
                &[("error_type", "unavailable")],
            )
            .is_some()
        })
        .await;
    }
    proxy.restore();
    // The worker reads the backlog again.
    let worker_scrape = scrape_until(worker_metrics, "the backlog gauges", |s| {
        has(s, "opjournal_unknown_overdue_operations", &[]) >= Some(1.0)
            && has(s, "opjournal_webhook_outbox_pending", &[]).is_some()
    })
    .await;
    let server_scrape = scrape(server_metrics).await;

    // The deadline gauges, end to end: the stuck payment is overdue, the e-mail waits.
    assert_eq!(
        has(&worker_scrape, "opjournal_unknown_overdue_operations", &[]),
        Some(1.0)
    );
    assert!(has(&worker_scrape, "opjournal_unknown_overdue_max_seconds", &[]).unwrap() > 0.0);
    assert_eq!(
        has(&worker_scrape, "opjournal_review_queue_size", &[]),
        Some(1.0)
    );
    assert!(has(&worker_scrape, "opjournal_review_oldest_age_seconds", &[]).unwrap() > 0.0);

    let queries: Vec<Query> = rule_queries()
        .into_iter()
        .chain(dashboard_queries(&dashboard()))
        .collect();
    let both: Vec<Sample> = server_scrape.into_iter().chain(worker_scrape).collect();
    let problems = missing(&queries, &both);
    assert!(
        problems.is_empty(),
        "the scrape of the server and the worker lacks what these queries use:\n{}",
        problems.join("\n")
    );
    let metrics: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| needs(q).selectors)
        .map(|(metric, _)| metric)
        .collect();
    eprintln!(
        "{} queries ({} rules), {} metrics, all in the scrape: {}",
        queries.len(),
        rule_queries().len(),
        metrics.len(),
        metrics.into_iter().collect::<Vec<_>>().join(", ")
    );
}
