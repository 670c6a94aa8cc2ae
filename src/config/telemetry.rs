//! `[telemetry]`: the log format. Traces and metrics are set with the standard `OTEL_*`
//! variables (docs/observability.md).

use serde::{Deserialize, Serialize};

pub use crate::telemetry::LogFormat;

/// `[telemetry]` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TelemetrySettings {
    /// Log format: `text` or `json` (`--log-format`).
    pub log_format: LogFormat,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
        }
    }
}
