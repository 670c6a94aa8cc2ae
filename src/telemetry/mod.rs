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
pub mod propagation;

use std::time::Duration;

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

use crate::config::LogFormat;
pub use metrics::Metrics;

/// A telemetry setting that cannot be used; the message names the variable or option.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// Where and how to export.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryOptions {
    /// `service.name` of the resource (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`); `service.version` is always
    /// the crate's version.
    pub resource_attributes: Vec<(String, String)>,
    /// Whether spans are made at all (`false` with `OTEL_SDK_DISABLED=true`): without them
    /// logs carry no trace ids and operations keep only the caller's trace context.
    pub tracing: bool,
    /// Span export over OTLP/gRPC; `None` exports no span.
    pub traces: Option<OtlpExport>,
    /// Metric export over OTLP/gRPC; `None` pushes no metric.
    pub otlp_metrics: Option<OtlpExport>,
    /// Interval between metric pushes over OTLP (`OTEL_METRIC_EXPORT_INTERVAL`, default 60 s).
    pub metric_export_interval: Option<Duration>,
    /// Whether the Prometheus scrape endpoint is served.
    pub prometheus: bool,
}

/// One OTLP/gRPC export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtlpExport {
    /// The collector, e.g. `http://otel-collector:4317`; `None` reads
    /// `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`, then `OTEL_EXPORTER_OTLP_ENDPOINT`, then uses
    /// `http://localhost:4317`. Headers, timeout and compression come from the standard
    /// `OTEL_EXPORTER_OTLP_*` variables.
    pub endpoint: Option<String>,
}

impl TelemetryOptions {
    /// Spans made but not exported, Prometheus only, as `service_name`.
    pub fn local(service_name: &str) -> Self {
        Self {
            service_name: service_name.to_owned(),
            resource_attributes: Vec::new(),
            tracing: true,
            traces: None,
            otlp_metrics: None,
            metric_export_interval: None,
            prometheus: true,
        }
    }

    /// Reads the standard variables (see docs/observability.md): `OTEL_SDK_DISABLED`,
    /// `OTEL_SERVICE_NAME` (default `default_service_name`), `OTEL_RESOURCE_ATTRIBUTES`,
    /// `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER` (`otlp`, `prometheus` for metrics,
    /// `none`; unset, OTLP is on when an OTLP endpoint variable is set, and Prometheus always),
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` (only `grpc`), `OTEL_METRIC_EXPORT_INTERVAL`.
    ///
    /// Errors: an unsupported exporter or protocol, naming the variable.
    pub fn from_env(default_service_name: &str) -> Result<Self, TelemetryError> {
        Self::from_lookup(default_service_name, |name| std::env::var(name).ok())
    }

    /// [`TelemetryOptions::from_env`] over any source of variables.
    ///
    /// Errors: as [`TelemetryOptions::from_env`].
    pub fn from_lookup(
        default_service_name: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let var = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let service_name = var("OTEL_SERVICE_NAME").unwrap_or_else(|| default_service_name.into());
        let resource_attributes = var("OTEL_RESOURCE_ATTRIBUTES")
            .map(|v| parse_resource_attributes(&v))
            .unwrap_or_default();
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(Self {
                service_name,
                resource_attributes,
                tracing: false,
                traces: None,
                otlp_metrics: None,
                metric_export_interval: None,
                prometheus: false,
            });
        }
        let any_endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let traces_default = any_endpoint || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
        let metrics_default = any_endpoint || var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some();

        let traces = exporters(
            "OTEL_TRACES_EXPORTER",
            var("OTEL_TRACES_EXPORTER"),
            &["otlp", "none"],
        )?;
        let traces = traces.map_or(traces_default, |list| list.contains(&"otlp"));
        let metrics = exporters(
            "OTEL_METRICS_EXPORTER",
            var("OTEL_METRICS_EXPORTER"),
            &["otlp", "prometheus", "none"],
        )?;
        let (otlp_metrics, prometheus) = match metrics {
            None => (metrics_default, true),
            Some(list) => (list.contains(&"otlp"), list.contains(&"prometheus")),
        };
        for (signal, used) in [
            ("TRACES_", traces),
            ("METRICS_", otlp_metrics),
            ("", traces || otlp_metrics),
        ] {
            let name = format!("OTEL_EXPORTER_OTLP_{signal}PROTOCOL");
            if used
                && let Some(protocol) = var(&name)
                && protocol != "grpc"
            {
                return Err(TelemetryError(format!(
                    "{name}: `{protocol}` is not supported; this build exports OTLP over gRPC \
                     (grpc)"
                )));
            }
        }
        let metric_export_interval = match var("OTEL_METRIC_EXPORT_INTERVAL") {
            None => None,
            Some(v) => Some(Duration::from_millis(v.parse().map_err(|_| {
                TelemetryError("OTEL_METRIC_EXPORT_INTERVAL: must be milliseconds".into())
            })?)),
        };
        Ok(Self {
            service_name,
            resource_attributes,
            tracing: true,
            traces: traces.then(OtlpExport::default),
            otlp_metrics: otlp_metrics.then(OtlpExport::default),
            metric_export_interval,
            prometheus,
        })
    }
}

/// A comma-separated exporter list; `None` when unset. `none` may only stand alone.
fn exporters<'a>(
    name: &str,
    value: Option<String>,
    known: &[&'a str],
) -> Result<Option<Vec<&'a str>>, TelemetryError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let mut list = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(known) = known.iter().find(|k| k.eq_ignore_ascii_case(item)) else {
            return Err(TelemetryError(format!(
                "{name}: `{item}` is not supported (use {})",
                known.join(", ")
            )));
        };
        list.push(*known);
    }
    if list.contains(&"none") && list.len() > 1 {
        return Err(TelemetryError(format!("{name}: `none` must stand alone")));
    }
    Ok(Some(list))
}

/// `key1=value1,key2=value2`, values percent-decoded (W3C Baggage octets, as the
/// specification of `OTEL_RESOURCE_ATTRIBUTES` says); malformed members are skipped.
fn parse_resource_attributes(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter_map(|member| {
            let (key, value) = member.split_once('=')?;
            let key = key.trim();
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .ok()?;
            (!key.is_empty()).then(|| (key.to_owned(), value.into_owned()))
        })
        .collect()
}

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
        // emitted on other threads (tests/binaries.rs checks the log lines of every task).
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn options(vars: &[(&str, &str)]) -> Result<TelemetryOptions, TelemetryError> {
        let vars: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TelemetryOptions::from_lookup("opjournal-server", |name| vars.get(name).cloned())
    }

    #[test]
    fn without_variables_spans_are_made_and_prometheus_is_served_but_nothing_is_pushed() {
        let o = options(&[]).unwrap();
        assert_eq!(o, TelemetryOptions::local("opjournal-server"));
    }

    #[test]
    fn an_endpoint_turns_otlp_on_for_both_signals() {
        let o = options(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_SERVICE_NAME", "journal-eu"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=prod,team=pay%20ments",
            ),
        ])
        .unwrap();
        assert_eq!(o.service_name, "journal-eu");
        assert_eq!(o.traces, Some(OtlpExport::default()));
        assert_eq!(o.otlp_metrics, Some(OtlpExport::default()));
        assert!(o.prometheus);
        assert_eq!(
            o.resource_attributes,
            vec![
                ("deployment.environment.name".into(), "prod".into()),
                ("team".into(), "pay ments".into())
            ]
        );
    }

    #[test]
    fn exporters_can_be_chosen_and_turned_off() {
        let o = options(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ])
        .unwrap();
        assert_eq!(
            (o.traces, o.otlp_metrics, o.prometheus),
            (None, None, false)
        );
        let o = options(&[
            ("OTEL_METRICS_EXPORTER", "otlp"),
            ("OTEL_TRACES_EXPORTER", "otlp"),
        ])
        .unwrap();
        assert!(o.traces.is_some() && o.otlp_metrics.is_some() && !o.prometheus);
        let o = options(&[("OTEL_SDK_DISABLED", "TRUE")]).unwrap();
        assert!(!o.tracing && o.traces.is_none() && !o.prometheus);
    }

    #[test]
    fn unsupported_values_are_refused_by_name() {
        for (vars, named) in [
            (
                vec![("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![("OTEL_METRICS_EXPORTER", "none,otlp")],
                "OTEL_METRICS_EXPORTER",
            ),
            (
                vec![
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![("OTEL_METRIC_EXPORT_INTERVAL", "soon")],
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
        ] {
            let err = options(&vars).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
        // A protocol for a signal that is not exported is not read.
        assert!(options(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
    }
}
