//! Traces over OTLP to an in-process receiver: an orchestrator's trace continues through the
//! journal (one server span per RPC, store spans under it), the operation remembers it, and a
//! reconcile attempt long after links to it and carries its own trace on to the provider, over
//! HTTP and over gRPC. JSON log lines carry the trace and span ids.

use crate::common;

use std::sync::{Arc, Mutex};

use common::observe::{OtlpReceiver, attributes, hex_id};
use common::*;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opjournal::config::LogFormat;
use opjournal::proto::provider_adapter_server::{ProviderAdapter, ProviderAdapterServer};
use opjournal::proto::{
    BeginOperationRequest, Decision, LookupOperationRequest, LookupOperationResponse,
    LookupOutcome, OperationStatus,
};
use opjournal::telemetry::{LogOptions, OtlpExport, Telemetry, TelemetryOptions};
use opjournal_sandbox::SandboxConfig;
use sqlx::PgPool;
use tokio_stream::wrappers::TcpListenerStream;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// The orchestrator's trace and span, as it would send them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

/// Log lines written by the subscriber under test.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn json(&self) -> Vec<serde_json::Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// Telemetry exporting spans to a fresh in-process receiver, installed as this test's
/// subscriber (the test runtime runs every task on this thread).
struct Traced {
    receiver: OtlpReceiver,
    telemetry: Telemetry,
    lines: Lines,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Traced {
    async fn start() -> Self {
        let (receiver, endpoint) = OtlpReceiver::start().await;
        let options = TelemetryOptions {
            traces: Some(OtlpExport {
                endpoint: Some(endpoint),
            }),
            prometheus: false,
            ..TelemetryOptions::local("opjournal-test")
        };
        let telemetry = Telemetry::new(&options).unwrap();
        let lines = Lines::default();
        let writer = lines.clone();
        let guard = tracing::subscriber::set_default(telemetry.subscriber(LogOptions {
            format: LogFormat::Json,
            filter: "info".into(),
            writer: BoxMakeWriter::new(move || writer.clone()),
        }));
        Self {
            receiver,
            telemetry,
            lines,
            _guard: guard,
        }
    }

    async fn spans(&self) -> Vec<Span> {
        self.telemetry.flush().await;
        self.receiver.spans()
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn only<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "{name}: {found:#?}");
    found[0]
}

async fn begin_traced(
    app: &TestApp,
    key: &str,
    action: &str,
) -> opjournal::proto::BeginOperationResponse {
    let mut request = tonic::Request::new(BeginOperationRequest {
        operation_key: key.into(),
        action_type: action.into(),
        payload_json: PAY_817.into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01")
            .parse()
            .unwrap(),
    );
    app.journal
        .clone()
        .begin_operation(request)
        .await
        .unwrap()
        .into_inner()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_begin_continues_the_callers_trace_and_a_reconcile_links_to_it(pool: PgPool) {
    let traced = Traced::start().await;
    let app = TestApp::spawn_with(pool, SandboxConfig::default(), 0).await;

    // The orchestrator's call, carrying its trace context; the provider's answer is lost.
    let begin = begin_traced(&app, PAYMENT_KEY, "create_payment").await;
    assert_eq!(decision(&begin), Decision::Execute);
    assert!(
        app.pay(PAYMENT_KEY, PAY_817, Some("commit-then-timeout"))
            .await
            .is_none()
    );
    app.report_unknown(&begin.lease_token).await;

    // The server span is in the caller's trace, a child of the caller's span.
    let spans = traced.spans().await;
    let server = only(&spans, "opjournal.v1.OperationJournal/BeginOperation");
    assert_eq!(hex_id(&server.trace_id), TRACE_ID);
    assert_eq!(hex_id(&server.parent_span_id), CALLER_SPAN_ID);
    assert_eq!(server.kind, SpanKind::Server as i32);
    let attrs = attributes(server);
    assert_eq!(attrs["rpc.system.name"], "grpc");
    assert_eq!(
        attrs["rpc.method"],
        "opjournal.v1.OperationJournal/BeginOperation"
    );
    assert_eq!(attrs["rpc.response.status_code"], "OK");
    assert_eq!(attrs["opjournal.begin.decision"], "execute");
    let server_span_id = hex_id(&server.span_id);

    // The registration is a client span under it.
    let insert = only(&spans, "INSERT agent_operations");
    assert_eq!(hex_id(&insert.trace_id), TRACE_ID);
    assert_eq!(hex_id(&insert.parent_span_id), server_span_id);
    assert_eq!(insert.kind, SpanKind::Client as i32);
    assert_eq!(attributes(insert)["db.system.name"], "postgresql");
    assert_eq!(attributes(insert)["opjournal.store.method"], "register");

    // The report is its own RPC span in the same trace.
    let report = only(&spans, "opjournal.v1.OperationJournal/ReportUnknownOutcome");
    assert_eq!(attributes(report)["rpc.response.status_code"], "OK");

    // The operation remembers the registering span.
    let stored: Option<String> =
        sqlx::query_scalar("SELECT trace_context FROM agent_operations WHERE operation_key = $1")
            .bind(PAYMENT_KEY)
            .fetch_one(app.pool())
            .await
            .unwrap();
    assert_eq!(
        stored.as_deref(),
        Some(format!("00-{TRACE_ID}-{server_span_id}-01").as_str())
    );

    // Later the worker reconciles it: its attempt links to the registering span, and the
    // lookup continues the attempt's trace at the provider.
    let stats = app.worker("w1").tick().await.unwrap();
    assert_eq!((stats.looked_up, stats.settled), (1, 1));
    assert_eq!(
        op_status(&app.get(PAYMENT_KEY).await),
        OperationStatus::Succeeded
    );
    let spans = traced.spans().await;
    let attempt = only(&spans, "reconcile");
    assert_eq!(attempt.links.len(), 1, "{attempt:#?}");
    assert_eq!(hex_id(&attempt.links[0].trace_id), TRACE_ID);
    assert_eq!(hex_id(&attempt.links[0].span_id), server_span_id);
    let attempt_attrs = attributes(attempt);
    assert_eq!(
        attempt_attrs["opjournal.reconcile.outcome"],
        "marked_succeeded"
    );
    assert_eq!(attempt_attrs["opjournal.reconcile.trigger"], "worker");
    let lookup = only(&spans, "lookup sandbox_payments");
    assert_eq!(lookup.trace_id, attempt.trace_id);
    assert_eq!(lookup.parent_span_id, attempt.span_id);
    assert_eq!(lookup.kind, SpanKind::Client as i32);
    assert_eq!(
        attributes(lookup)["opjournal.lookup.observation"],
        "succeeded"
    );
    assert_eq!(
        app.sandbox.lookup_traceparents(PAYMENT_KEY),
        vec![format!(
            "00-{}-{}-01",
            hex_id(&lookup.trace_id),
            hex_id(&lookup.span_id)
        )]
    );
    // The attempt's store calls are under it too.
    let resolve = spans
        .iter()
        .find(|s| {
            attributes(s)
                .get("opjournal.store.method")
                .map(String::as_str)
                == Some("resolve")
        })
        .expect("a store span for the resolution");
    assert_eq!(resolve.parent_span_id, attempt.span_id);

    // No span names the key or carries the payload.
    for span in &spans {
        for value in attributes(span).values() {
            assert!(!value.contains(PAYMENT_KEY), "{}: {value}", span.name);
            assert!(!value.contains("490000"), "{}: {value}", span.name);
        }
    }
    traced.telemetry.shutdown().await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn json_log_lines_inside_a_call_carry_its_trace_and_span_ids(pool: PgPool) {
    let traced = Traced::start().await;
    let app = TestApp::spawn(pool).await;
    // A new key for a request already registered logs a warning inside the Begin.
    begin_traced(&app, "order-1:first", "create_payment_warn").await;
    let second = begin_traced(&app, "order-1:second", "create_payment_warn").await;
    assert_eq!(decision(&second), Decision::Execute);

    let spans = traced.spans().await;
    let begins = named(&spans, "opjournal.v1.OperationJournal/BeginOperation");
    assert_eq!(begins.len(), 2);
    let lines = traced.lines.json();
    let warning = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("duplicate intent suspected"))
        })
        .unwrap_or_else(|| panic!("no duplicate intent warning in {lines:#?}"));
    assert_eq!(warning["level"], "WARN");
    assert_eq!(warning["trace_id"], TRACE_ID);
    let span_id = warning["span_id"].as_str().unwrap();
    assert!(
        begins.iter().any(|b| hex_id(&b.span_id) == span_id),
        "{span_id} is not a Begin span"
    );
    // Log lines never carry the key or the payload.
    for line in &lines {
        let text = line.to_string();
        assert!(!text.contains("order-1:"), "{text}");
        assert!(!text.contains("490000"), "{text}");
    }
    traced.telemetry.shutdown().await;
}

/// A gRPC provider adapter that answers "succeeded" and keeps the `traceparent` it was sent.
#[derive(Clone, Default)]
struct RecordingAdapter {
    traceparents: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl ProviderAdapter for RecordingAdapter {
    async fn lookup_operation(
        &self,
        request: tonic::Request<LookupOperationRequest>,
    ) -> Result<tonic::Response<LookupOperationResponse>, tonic::Status> {
        if let Some(value) = request.metadata().get("traceparent") {
            self.traceparents
                .lock()
                .unwrap()
                .push(value.to_str().unwrap().to_owned());
        }
        Ok(tonic::Response::new(LookupOperationResponse {
            outcome: LookupOutcome::Succeeded.into(),
            external_id: "pay_grpc_1".into(),
            ..Default::default()
        }))
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_reconcile_through_a_grpc_adapter_passes_its_trace_on(pool: PgPool) {
    let traced = Traced::start().await;
    let adapter = RecordingAdapter::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProviderAdapterServer::new(adapter.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let policy = move |_: &str| {
        format!(
            "actions:\n  create_payment:\n    reconcile: {{ adapter: grpc_payments, first_check_after_seconds: 0 }}\n\
             adapters:\n  grpc_payments:\n    kind: grpc\n    endpoint: \"{endpoint}\"\n    timeout_seconds: 5\n"
        )
    };
    let app = TestApp::spawn_with_policy(pool, SandboxConfig::default(), policy, None).await;
    let begin = begin_traced(&app, PAYMENT_KEY, "create_payment").await;
    app.report_unknown(&begin.lease_token).await;

    // An operator reconciles it now: the attempt runs inside that RPC's span.
    let reconciled = app.reconcile("", PAYMENT_KEY).await.unwrap();
    assert_eq!(
        op_status(reconciled.operation.as_ref().unwrap()),
        OperationStatus::Succeeded
    );
    let spans = traced.spans().await;
    let server = only(&spans, "opjournal.v1.OperationJournal/BeginOperation");
    let rpc = only(&spans, "opjournal.v1.Reconciler/ReconcileOperation");
    let attempt = only(&spans, "reconcile");
    assert_eq!(attempt.parent_span_id, rpc.span_id);
    assert_eq!(
        attributes(attempt)["opjournal.reconcile.trigger"],
        "request"
    );
    assert_eq!(attempt.links[0].span_id, server.span_id);
    let lookup = only(&spans, "lookup grpc_payments");
    assert_eq!(lookup.parent_span_id, attempt.span_id);
    assert_eq!(
        *adapter.traceparents.lock().unwrap(),
        vec![format!(
            "00-{}-{}-01",
            hex_id(&lookup.trace_id),
            hex_id(&lookup.span_id)
        )]
    );
    traced.telemetry.shutdown().await;
}
