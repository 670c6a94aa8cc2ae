//! The `grpc` provider adapter: a small gRPC service, in any language, implementing
//! `opjournal.v1.ProviderAdapter/LookupOperation`.

use std::time::Duration;

use async_trait::async_trait;
use tonic::transport::{Channel, Endpoint};

use super::adapter::{LookupRequest, Observation, ProviderAdapter, SetupError};
use crate::domain::canonical::{self, Limits};
use crate::domain::policy::GrpcAdapterConfig;
use crate::proto::provider_adapter_client::ProviderAdapterClient;
use crate::proto::{LookupOperationRequest, LookupOutcome};

/// Largest result an adapter may return, in bytes.
const MAX_RESULT_BYTES: usize = 64 * 1024;

/// A provider adapter reached over gRPC.
pub struct GrpcAdapter {
    client: ProviderAdapterClient<Channel>,
    trust_search_complete: bool,
}

impl GrpcAdapter {
    /// Builds the adapter; connects lazily, so the adapter may start after the worker.
    ///
    /// Errors: the endpoint is not a valid URI.
    pub fn new(config: &GrpcAdapterConfig) -> Result<Self, SetupError> {
        let timeout = Duration::from_secs_f64(config.timeout_seconds);
        let channel = Endpoint::from_shared(config.endpoint.clone())
            .map_err(|e| SetupError::setting("endpoint", e))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_lazy();
        Ok(Self {
            client: ProviderAdapterClient::new(channel),
            trust_search_complete: config.trust_search_complete,
        })
    }
}

#[async_trait]
impl ProviderAdapter for GrpcAdapter {
    async fn lookup(&self, request: &LookupRequest) -> Observation {
        let call = LookupOperationRequest {
            namespace: request.namespace.clone(),
            operation_key: request.operation_key.clone(),
            provider_key: request.provider_key.clone(),
            action_type: request.action_type.clone(),
            external_id: request.external_id.clone().unwrap_or_default(),
            references: request.references.clone().into_iter().collect(),
        };
        let mut call = tonic::Request::new(call);
        crate::telemetry::propagation::inject_current(call.metadata_mut().as_mut());
        let response = match self.client.clone().lookup_operation(call).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                return Observation::LookupFailed {
                    code: format!("grpc_{:?}", status.code()).to_lowercase(),
                };
            }
        };
        let external_id = (!response.external_id.is_empty()).then_some(response.external_id);
        match LookupOutcome::try_from(response.outcome) {
            Ok(LookupOutcome::Succeeded) => {
                let result_json = if response.result_json.is_empty() {
                    None
                } else {
                    let limits = Limits {
                        max_bytes: MAX_RESULT_BYTES,
                        ..Limits::default()
                    };
                    match canonical::parse_strict(&response.result_json, &limits) {
                        Ok(value) => Some(canonical::canonicalize(&value)),
                        Err(_) => {
                            return Observation::LookupFailed {
                                code: "invalid_result_json".into(),
                            };
                        }
                    }
                };
                Observation::Succeeded {
                    external_id,
                    result_json,
                }
            }
            Ok(LookupOutcome::Failed) => Observation::Failed {
                code: sanitize(&response.error_code),
            },
            Ok(LookupOutcome::Pending) => Observation::Pending,
            Ok(LookupOutcome::NotFound) => Observation::NotFound {
                search_complete: self.trust_search_complete && response.search_complete,
            },
            Ok(LookupOutcome::Unspecified) | Err(_) => Observation::LookupFailed {
                code: "invalid_outcome".into(),
            },
        }
    }
}

fn sanitize(code: &str) -> String {
    let code: String = code
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        .take(90)
        .collect();
    if code.is_empty() {
        "provider_failed".into()
    } else {
        format!("provider_{code}")
    }
}
