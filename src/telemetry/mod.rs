//! Traces, metrics and logs (docs/observability.md).
//!
//! [`Telemetry::new`] builds the OpenTelemetry tracer and meter providers from explicit
//! [`TelemetryOptions`]; the binaries read those from the standard `OTEL_*` variables with
//! [`TelemetryOptions::from_env`], tests give them directly (a test cannot rely on
//! process-wide variables while others run beside it). [`Telemetry::subscriber`] makes the
//! `tracing` subscriber (filter, text or JSON log lines with `trace_id` and `span_id`, and the
//! OpenTelemetry layer); [`Telemetry::install`] makes it and the providers the process's
//! own. [`Telemetry::shutdown`] flushes and stops the exporters.
//!
//! Parts: [`propagation`] (W3C trace context in and out), [`grpc`] (one server span and the
//! duration histogram per RPC), [`metrics`] (the instruments), [`admin`] (the Prometheus
//! scrape endpoint).

pub mod admin;
pub mod grpc;
pub mod metrics;
mod options;
pub mod propagation;

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

pub use metrics::Metrics;
pub use options::{OtlpExport, TelemetryOptions};

/// A telemetry setting that cannot be used; the message names the variable or option.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// How log lines are written.
pub struct LogOptions {
    /// Text or JSON lines.
    pub format: LogFormat,
    /// An `EnvFilter` directive, e.g. `info` or `info,opjournal=debug` (`RUST_LOG`).
    pub filter: String,
    /// Where lines go (standard error in the binaries).
    pub writer: BoxMakeWriter,
}

impl LogOptions {
    /// `format` to standard error, filtered by `RUST_LOG` (default `info`).
    pub fn from_env(format: LogFormat) -> Self {
        Self {
            format,
            filter: std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "info".to_owned()),
            writer: BoxMakeWriter::new(std::io::stderr),
        }
    }
}

/// The process's telemetry: providers, instruments and the Prometheus registry.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    registry: Option<prometheus::Registry>,
    metrics: Metrics,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("tracing", &self.tracer_provider.is_some())
            .field("metrics", &self.meter_provider.is_some())
            .field("prometheus", &self.registry.is_some())
            .finish()
    }
}

impl Telemetry {
    /// Nothing made, nothing exported; logs only.
    pub fn disabled() -> Self {
        Self {
            tracer_provider: None,
            meter_provider: None,
            registry: None,
            metrics: Metrics::disabled(),
        }
    }

    /// Builds the providers and instruments for `options`. OTLP exporters connect lazily (a
    /// collector that is down loses data, never stops the service); they must be built inside
    /// a Tokio runtime.
    ///
    /// Errors: an exporter cannot be built (e.g. an invalid endpoint), naming the setting.
    pub fn new(options: &TelemetryOptions) -> Result<Self, TelemetryError> {
        let mut attributes = vec![
            KeyValue::new("service.name", options.service_name.clone()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ];
        attributes.extend(
            options
                .resource_attributes
                .iter()
                .filter(|(k, _)| k != "service.name" && k != "service.version")
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
        let resource = Resource::builder_empty()
            .with_attributes(attributes)
            .build();

        let tracer_provider = if options.tracing {
            let mut builder = SdkTracerProvider::builder().with_resource(resource.clone());
            if let Some(export) = &options.traces {
                let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(endpoint) = &export.endpoint {
                    exporter = exporter.with_endpoint(endpoint.clone());
                }
                let exporter = exporter
                    .build()
                    .map_err(|e| TelemetryError(format!("OTLP span exporter: {e}")))?;
                builder = builder.with_batch_exporter(exporter);
            }
            Some(builder.build())
        } else {
            None
        };

        let registry = options.prometheus.then(prometheus::Registry::new);
        let meter_provider = if registry.is_some() || options.otlp_metrics.is_some() {
            let mut builder = SdkMeterProvider::builder().with_resource(resource);
            if let Some(registry) = &registry {
                let exporter = opentelemetry_prometheus::exporter()
                    .with_registry(registry.clone())
                    .build()
                    .map_err(|e| TelemetryError(format!("Prometheus exporter: {e}")))?;
                builder = builder.with_reader(exporter);
            }
            if let Some(export) = &options.otlp_metrics {
                let mut exporter = opentelemetry_otlp::MetricExporter::builder().with_tonic();
                if let Some(endpoint) = &export.endpoint {
                    exporter = exporter.with_endpoint(endpoint.clone());
                }
                let exporter = exporter
                    .build()
                    .map_err(|e| TelemetryError(format!("OTLP metric exporter: {e}")))?;
                let mut reader = PeriodicReader::builder(exporter);
                if let Some(interval) = options.metric_export_interval {
                    reader = reader.with_interval(interval);
                }
                builder = builder.with_reader(reader.build());
            }
            Some(builder.build())
        } else {
            None
        };
        let metrics = match &meter_provider {
            Some(provider) => Metrics::new(&provider.meter(metrics::SCOPE)),
            None => Metrics::disabled(),
        };
        Ok(Self {
            tracer_provider,
            meter_provider,
            registry,
            metrics,
        })
    }

    /// The instruments, to hand to the journal, the reconciler and the server.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The registry the scrape endpoint serves, when Prometheus is on.
    pub fn prometheus_registry(&self) -> Option<&prometheus::Registry> {
        self.registry.as_ref()
    }

    /// A `tracing` subscriber: the filter, log lines as `logs` says (JSON lines carry
    /// `trace_id` and `span_id` of the current span), and, with tracing on, the OpenTelemetry
    /// layer for this crate's spans (`opjournal` targets only: libraries' spans, the
    /// exporters' own among them, never become trace spans).
    pub fn subscriber(&self, logs: LogOptions) -> impl tracing::Subscriber + Send + Sync + 'static {
        // The filter chooses log lines only: spans are made whatever `RUST_LOG` says.
        let filter = tracing_subscriber::EnvFilter::try_new(&logs.filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // A `Targets` filter, not a closure: its interest is decided once per callsite. A
        // closure's "sometimes" interest beside the lines' per-layer `EnvFilter` lost events
        // emitted on other threads (tests/it/binaries.rs checks the log lines of every task).
        let otel = self.tracer_provider.as_ref().map(|provider| {
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(metrics::SCOPE))
                .with_threads(false)
                .with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target("opjournal", tracing::Level::INFO),
                )
        });
        let lines = match logs.format {
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(logs.writer)
                .with_ansi(false)
                .with_filter(filter)
                .boxed(),
            LogFormat::Json => {
                let mut layer = json_subscriber::JsonLayer::new(logs.writer);
                layer
                    .with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime)
                    .with_level("level")
                    .with_flattened_event()
                    .with_target("target")
                    .with_current_span("span");
                layer.add_dynamic_field("trace_id", |_, _| {
                    current_ids().map(|(trace_id, _)| trace_id)
                });
                layer
                    .add_dynamic_field("span_id", |_, _| current_ids().map(|(_, span_id)| span_id));
                layer.with_filter(filter).boxed()
            }
        };
        tracing_subscriber::registry().with(otel).with(lines)
    }

    /// Makes the subscriber (see [`Telemetry::subscriber`]), the W3C trace-context
    /// propagator and the providers the process's global ones, for libraries that use them.
    ///
    /// Errors: a global subscriber is already set.
    pub fn install(&self, logs: LogOptions) -> Result<(), TelemetryError> {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        if let Some(provider) = &self.tracer_provider {
            opentelemetry::global::set_tracer_provider(provider.clone());
        }
        if let Some(provider) = &self.meter_provider {
            opentelemetry::global::set_meter_provider(provider.clone());
        }
        self.subscriber(logs)
            .try_init()
            .map_err(|e| TelemetryError(format!("cannot install the subscriber: {e}")))
    }

    /// Exports every finished span and, for OTLP, every metric now.
    pub async fn flush(&self) {
        let tracer = self.tracer_provider.clone();
        let meter = self.meter_provider.clone();
        // The SDK blocks while its exporter (which runs on this runtime) works.
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(provider) = tracer {
                let _ = provider.force_flush();
            }
            if let Some(provider) = meter {
                let _ = provider.force_flush();
            }
        })
        .await;
    }

    /// Flushes and stops the exporters (at exit); telemetry recorded afterwards is dropped.
    pub async fn shutdown(self) {
        let tracer = self.tracer_provider;
        let meter = self.meter_provider;
        let result = tokio::task::spawn_blocking(move || {
            let traces = tracer.map(|p| p.shutdown());
            let metrics = meter.map(|p| p.shutdown());
            (traces, metrics)
        })
        .await;
        if let Ok((traces, metrics)) = result {
            for (what, outcome) in [("traces", traces), ("metrics", metrics)] {
                if let Some(Err(error)) = outcome {
                    tracing::warn!(error = %error, "telemetry shutdown: {what} not flushed");
                }
            }
        }
    }
}

/// The trace and span id of the OpenTelemetry context active on this thread (the entered
/// span's), as lowercase hex.
fn current_ids() -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt as _;
    let context = opentelemetry::Context::current();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

/// Log output format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}
