//! Telemetry options, and reading them from the standard `OTEL_*` variables
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/>).

use std::time::Duration;

use super::TelemetryError;

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
