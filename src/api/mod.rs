//! The gRPC transport: services, health, reflection, authentication, TLS, and ordered
//! shutdown.
//!
//! Health entries: `""` (the whole server) and `liveness` never depend on the database;
//! `readiness` and one entry per service follow a cached database check. On shutdown every
//! entry goes NOT_SERVING first, then, after `drain_delay` (time for load balancers to
//! notice), the listener closes and in-flight calls finish. The same entries may also be
//! served on a second, plaintext listener of their own, for probes that cannot speak TLS.

pub mod auth;
pub mod console;
pub mod convert;
pub mod journal_service;
pub mod limits;
pub mod reconciler_service;
pub mod reflection;
pub mod status;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::journal::Journal;
use crate::proto::operation_journal_server::OperationJournalServer;
use crate::proto::reconciler_server::ReconcilerServer;
use crate::reconcile::Reconciler;
use crate::store::JournalStore;
use crate::telemetry::Metrics;
use crate::telemetry::grpc::RpcTelemetryLayer;
pub use auth::Authenticator;
pub use journal_service::JournalService;
pub use limits::TransportLimits;
pub use reconciler_service::ReconcilerService;

/// Health service names besides the gRPC services themselves.
pub const LIVENESS: &str = "liveness";
/// Health entry that follows the database check.
pub const READINESS: &str = "readiness";
pub use crate::proto::SERVICES;

/// Longest wait for the health-only listener's open calls once the journal's listener has
/// drained.
const HEALTH_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest request message of health and reflection, in bytes: a service or symbol name,
/// not tonic's default of 4 MiB per held call.
const SMALL_REQUEST_BYTES: usize = 16 * 1024;

/// Largest request message the server decodes by default, in bytes (1 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Server settings: lifecycle, authentication, TLS, the message size limit and the
/// transport's resource limits.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How often readiness checks the database.
    pub readiness_interval: Duration,
    /// Time between NOT_SERVING and closing the listener on shutdown.
    pub drain_delay: Duration,
    /// Bearer-token authentication of the journal and reconciler services (health and
    /// reflection stay open); disabled by default.
    pub auth: Authenticator,
    /// TLS (and, with a client CA, mutual TLS) for the whole port, its files read again
    /// while serving; plaintext when `None`.
    pub tls: Option<tls::ServerTls>,
    /// Largest request message decoded, in bytes; a larger one is refused by the transport
    /// with `OUT_OF_RANGE` before any handler runs.
    pub max_message_bytes: usize,
    /// Streams per connection, header size, in-flight calls, connections, keepalive and
    /// connection age.
    pub limits: TransportLimits,
    /// Where `rpc.server.call.duration` is recorded (one server span per journal RPC is
    /// made whenever tracing is on; see [`crate::telemetry::grpc`]).
    pub metrics: Metrics,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            readiness_interval: Duration::from_secs(2),
            drain_delay: Duration::from_secs(0),
            auth: Authenticator::disabled(),
            tls: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            limits: TransportLimits::default(),
            metrics: Metrics::disabled(),
        }
    }
}

/// A server failure.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection descriptors are broken.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// An embedded descriptor set does not decode.
    #[error("descriptors: {0}")]
    Descriptors(#[from] prost::DecodeError),
}

/// Serves the journal on `listener` until `shutdown` is cancelled, then drains.
///
/// Errors: the transport fails to serve.
pub async fn serve(
    journal: Journal,
    reconciler: Reconciler,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_with_health(journal, reconciler, listener, None, options, shutdown).await
}

/// Serves the journal on `listener` and, with `health_listener`, gRPC health alone in
/// plaintext on that one too (the same entries; it closes once the journal's listener has
/// drained), until `shutdown` is cancelled.
///
/// Errors: the transport fails to serve.
pub async fn serve_with_health(
    journal: Journal,
    reconciler: Reconciler,
    listener: TcpListener,
    health_listener: Option<TcpListener>,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Outermost first: shed calls are measured too.
    let mut builder = options
        .limits
        .apply(tonic::transport::Server::builder())
        .layer(RpcTelemetryLayer::new(options.metrics.clone()))
        .layer(limits::AdmissionLayer::new(
            &options.limits,
            options.auth.clone(),
            options.metrics.clone(),
        ));
    let (reporter, health) = tonic_health::server::health_reporter();
    let health = health.max_decoding_message_size(SMALL_REQUEST_BYTES);
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    // Not ready until the first database check passes.
    set_all(&reporter, ServingStatus::NotServing).await;
    let readiness = tokio::spawn(watch_readiness(
        journal.store().clone(),
        reporter.clone(),
        options.readiness_interval,
        shutdown.clone(),
    ));

    let descriptors = reflection::served_descriptors()?;
    let reflection_v1 = reflection::builder(&descriptors)
        .build_v1()?
        .max_decoding_message_size(SMALL_REQUEST_BYTES);
    let reflection_v1alpha = reflection::builder(&descriptors)
        .build_v1alpha()?
        .max_decoding_message_size(SMALL_REQUEST_BYTES);

    let reload_stop = shutdown.clone();
    let stopped = drained(shutdown, reporter.clone(), options.drain_delay);

    let journal = OperationJournalServer::new(JournalService(journal))
        .max_decoding_message_size(options.max_message_bytes);
    let reconciler = ReconcilerServer::new(ReconcilerService(reconciler))
        .max_decoding_message_size(options.max_message_bytes);
    let health_only = health_listener
        .map(|listener| HealthOnly::spawn(listener, &options.limits, health.clone()));
    let router = builder
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(InterceptedService::new(journal, options.auth.clone()))
        .add_service(InterceptedService::new(reconciler, options.auth));
    let accepted = limits::incoming(listener, &options.limits);
    let result = match options.tls {
        Some(tls) => {
            let reload = tokio::spawn(tls.clone().watch(reload_stop));
            let result = router
                .serve_with_incoming_shutdown(tls::incoming_from(accepted, tls), stopped)
                .await;
            reload.abort();
            result
        }
        None => router.serve_with_incoming_shutdown(accepted, stopped).await,
    };
    readiness.abort();
    if let Some(health_only) = health_only {
        health_only.stop().await;
    }
    result?;
    Ok(())
}

/// Resolves once `shutdown` is cancelled, every health entry is `NOT_SERVING` and
/// `drain_delay` has passed (so that balancers see it before the listener closes).
async fn drained(shutdown: CancellationToken, reporter: HealthReporter, drain_delay: Duration) {
    shutdown.cancelled().await;
    set_all(&reporter, ServingStatus::NotServing).await;
    reporter
        .set_service_status(LIVENESS, ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    tracing::info!(
        drain_delay_ms = drain_delay.as_millis() as u64,
        "shutting down: draining"
    );
    tokio::time::sleep(drain_delay).await;
}

/// The health-only listener: gRPC health in plaintext, served until [`HealthOnly::stop`].
struct HealthOnly {
    stop: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Serves only `health` on `listener` under `transport` (a listener's health-only limits:
/// the same transport limits with budgets of their own), without authentication, until
/// `stop`.
async fn serve_health_only<H: tonic_health::pb::health_server::Health>(
    listener: TcpListener,
    transport: TransportLimits,
    health: tonic_health::pb::health_server::HealthServer<H>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    transport
        .apply(tonic::transport::Server::builder())
        .layer(limits::AdmissionLayer::new(
            &transport,
            Authenticator::disabled(),
            Metrics::disabled(),
        ))
        .add_service(health)
        .serve_with_incoming_shutdown(limits::incoming(listener, &transport), stop)
        .await
}

impl HealthOnly {
    /// Serves `health` on `listener` under the health-only form of `journal_limits`.
    fn spawn<H: tonic_health::pb::health_server::Health>(
        listener: TcpListener,
        journal_limits: &TransportLimits,
        health: tonic_health::pb::health_server::HealthServer<H>,
    ) -> Self {
        let stop = CancellationToken::new();
        // The same transport limits, with budgets of its own: a flood on the journal's port
        // never takes the probes' places here.
        let server = serve_health_only(
            listener,
            journal_limits.health_only(),
            health,
            stop.clone().cancelled_owned(),
        );
        Self {
            stop,
            server: tokio::spawn(server),
        }
    }

    /// Stops the listener, waiting at most [`HEALTH_STOP_TIMEOUT`].
    async fn stop(mut self) {
        self.stop.cancel();
        // A client watching health would hold a graceful stop open for ever.
        match tokio::time::timeout(HEALTH_STOP_TIMEOUT, &mut self.server).await {
            Ok(Ok(Err(error))) => tracing::warn!(%error, "the health listener failed"),
            Ok(Err(error)) => tracing::warn!(%error, "the health listener failed"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => self.server.abort(),
        }
    }
}

async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status(READINESS, status).await;
    for service in SERVICES {
        reporter.set_service_status(*service, status).await;
    }
}

/// Serves only gRPC health (for the reconcile worker): `""` and `liveness` SERVING,
/// `readiness` following the database check, all NOT_SERVING once `shutdown` is cancelled;
/// within `transport`'s [`TransportLimits::health_only`] (connections, per peer, timeouts, the health budget) like the server's
/// ports.
///
/// Errors: the transport fails to serve.
pub async fn serve_health(
    store: Arc<dyn JournalStore>,
    listener: TcpListener,
    readiness_interval: Duration,
    transport: TransportLimits,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let health = health.max_decoding_message_size(SMALL_REQUEST_BYTES);
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(READINESS, ServingStatus::NotServing)
        .await;
    let readiness = tokio::spawn(watch_readiness(
        store,
        reporter.clone(),
        readiness_interval,
        shutdown.clone(),
    ));
    let stopped = async move {
        shutdown.cancelled().await;
        for service in ["", LIVENESS, READINESS] {
            reporter
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
    };
    let result = serve_health_only(listener, transport.health_only(), health, stopped).await;
    readiness.abort();
    result?;
    Ok(())
}

/// Follows the database check into readiness until shutdown.
async fn watch_readiness(
    store: Arc<dyn JournalStore>,
    reporter: HealthReporter,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut last = None;
    loop {
        let ready = tokio::select! {
            () = shutdown.cancelled() => return,
            result = tokio::time::timeout(interval.max(Duration::from_millis(500)), store.ping()) => {
                matches!(result, Ok(Ok(())))
            }
        };
        if last != Some(ready) && !shutdown.is_cancelled() {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_all(&reporter, status).await;
            if ready {
                tracing::info!("database reachable: ready");
            } else {
                tracing::warn!("database unreachable: not ready");
            }
            last = Some(ready);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
