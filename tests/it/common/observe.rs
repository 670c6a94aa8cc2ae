//! Helpers for the telemetry and outage tests: an OTLP trace receiver, a TCP proxy in front
//! of Postgres that a test can cut and restore, a Prometheus text reader, health polling.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// An in-process OTLP/gRPC trace receiver: keeps every span exported to it.
#[derive(Clone, Default)]
pub struct OtlpReceiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for OtlpReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl OtlpReceiver {
    /// Serves on a free loopback port; returns the receiver and its `http://` endpoint.
    pub async fn start() -> (Self, String) {
        let receiver = Self::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (receiver, endpoint)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// A span's attributes as text (numbers and booleans written out).
pub fn attributes(span: &Span) -> BTreeMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// Lowercase hex of an id.
pub fn hex_id(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// A TCP proxy to Postgres on 127.0.0.1:5432 that the test can cut (every open connection is
/// dropped and new ones are refused) and restore: a database outage without stopping the
/// shared server.
pub struct PgProxy {
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<CancellationToken>>,
}

impl PgProxy {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(Mutex::new(CancellationToken::new()));
        let (accept_open, accept_connections) = (open.clone(), connections.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !accept_open.load(Ordering::SeqCst) {
                    drop(client); // refused: the database is "down"
                    continue;
                }
                let cut = accept_connections.lock().unwrap().clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = cut.cancelled() => {}
                    }
                });
            }
        });
        Self {
            addr,
            open,
            connections,
        }
    }

    /// The database goes away: open connections drop, new ones are refused.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        let mut connections = self.connections.lock().unwrap();
        connections.cancel();
        *connections = CancellationToken::new();
    }

    /// The database is back.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// `database_url` with its host and port replaced by the proxy's.
    pub fn url_for(&self, database_url: &str) -> String {
        let (scheme_user, rest) = database_url.split_once('@').unwrap();
        let database = rest.split_once('/').unwrap().1;
        format!("{scheme_user}@{}/{database}", self.addr)
    }
}

/// The status of health entry `service` on `address`.
pub async fn health_status(address: SocketAddr, service: &str) -> i32 {
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// Polls `service` until it reports `status`; fails after a generous bound (not a timing
/// assertion: the bound only keeps a broken build from hanging).
pub async fn wait_health(address: SocketAddr, service: &str, status: i32) {
    let started = Instant::now();
    while health_status(address, service).await != status {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{service} never reached {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of a Prometheus text exposition (format 0.0.4).
pub fn samples(text: &str) -> Vec<Sample> {
    let label = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            Sample {
                name: name.to_owned(),
                labels: label
                    .captures_iter(labels)
                    .map(|c| (c[1].to_owned(), c[2].to_owned()))
                    .collect(),
                value: value.parse().unwrap(),
            }
        })
        .collect()
}

/// The value of the series `name` whose labels, apart from `otel_scope_*`, are exactly
/// `labels`; `None` when there is no such series.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels
                    .iter()
                    .filter(|(k, _)| !k.starts_with("otel_scope_"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>()
                    == want
        })
        .map(|s| s.value)
}

/// The `# TYPE` of metric family `name`.
pub fn metric_type(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("# TYPE {name} ")))
        .map(str::to_owned)
}
