//! Provider adapters: how to ask a provider what really happened to an operation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::domain::canonical;
use crate::domain::policy::{AdapterConfig, HttpAdapterConfig, Policy};

/// What the reconcile path asks a provider about.
#[derive(Debug, Clone)]
pub struct LookupRequest {
    /// Tenant namespace.
    pub namespace: String,
    /// The operation's idempotency key in the journal.
    pub operation_key: String,
    /// The idempotency key the provider was called with (`Operation.provider_key`).
    pub provider_key: String,
    /// The action type.
    pub action_type: String,
    /// The provider's id, when one was recorded.
    pub external_id: Option<String>,
    /// The operation's business links.
    pub references: BTreeMap<String, String>,
}

pub use crate::domain::transition::Observation;

/// A way to look operations up at one provider. The reconciler calls it inside the lookup's
/// client span: an adapter passes that span's W3C trace context on to the provider
/// ([`crate::telemetry::propagation::inject_current`]).
#[async_trait]
pub trait ProviderAdapter: Send + Sync {
    /// Looks the operation up. Never fails: a failed lookup is an observation.
    async fn lookup(&self, request: &LookupRequest) -> Observation;
}

/// One named adapter of a set: one that looks operations up, or a `kind: none` adapter.
#[derive(Clone)]
pub enum AdapterEntry {
    /// An adapter that looks operations up.
    Lookup(Arc<dyn ProviderAdapter>),
    /// `kind: none`: operations under it are never looked up; they go to review.
    NoLookup,
}

/// The adapters of a policy, built once at start, `kind: none` ones included.
#[derive(Clone, Default)]
pub struct AdapterSet {
    adapters: BTreeMap<String, AdapterEntry>,
}

/// A reconcile component (adapter, webhook client, worker) refused at start: the message names
/// the refused setting and why. No caller tells the cases apart: they are reported and the
/// process does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

impl SetupError {
    /// `setting` refused because of `why`.
    pub fn setting(setting: impl std::fmt::Display, why: impl std::fmt::Display) -> Self {
        Self(format!("{setting}: {why}"))
    }
}

/// An adapter that cannot be built (e.g. a header's environment variable is not set).
#[derive(Debug, thiserror::Error)]
#[error("adapters.{adapter}: {message}")]
pub struct AdapterError {
    /// The adapter's name.
    pub adapter: String,
    /// What is wrong.
    pub message: String,
}

impl AdapterSet {
    /// Builds every adapter of `policy`. Header values are read from the environment now.
    ///
    /// Errors: a missing environment variable or an unusable HTTP client.
    pub fn from_policy(policy: &Policy) -> Result<Self, AdapterError> {
        let mut adapters = BTreeMap::new();
        for (name, config) in &policy.adapters {
            let error = |e: SetupError| AdapterError {
                adapter: name.clone(),
                message: e.0,
            };
            let adapter = match config {
                AdapterConfig::Http(http) => AdapterEntry::Lookup(Arc::new(
                    HttpAdapter::new((**http).clone()).map_err(error)?,
                )),
                AdapterConfig::Grpc(grpc) => AdapterEntry::Lookup(Arc::new(
                    super::grpc::GrpcAdapter::new(grpc).map_err(error)?,
                )),
                AdapterConfig::None => AdapterEntry::NoLookup,
            };
            adapters.insert(name.clone(), adapter);
        }
        Ok(Self { adapters })
    }

    /// Adds or replaces an adapter (for adapters not described by the policy file).
    pub fn insert(&mut self, name: impl Into<String>, adapter: Arc<dyn ProviderAdapter>) {
        self.adapters
            .insert(name.into(), AdapterEntry::Lookup(adapter));
    }

    /// The adapter named `name`, if it can look anything up.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn ProviderAdapter>> {
        match self.adapters.get(name) {
            Some(AdapterEntry::Lookup(adapter)) => Some(adapter),
            Some(AdapterEntry::NoLookup) | None => None,
        }
    }

    /// The adapter named `name`, `kind: none` included; `None` when there is none by that
    /// name.
    pub fn entry(&self, name: &str) -> Option<&AdapterEntry> {
        self.adapters.get(name)
    }

    /// The adapter named `name` with the set's own copy of the name.
    pub fn entry_named(&self, name: &str) -> Option<(&str, &AdapterEntry)> {
        self.adapters
            .get_key_value(name)
            .map(|(name, entry)| (name.as_str(), entry))
    }
}

/// Characters left as they are in a URL path segment: RFC 3986 unreserved.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Largest provider answer read, in bytes.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// A JSON-over-HTTP lookup by the key the provider was called with.
///
/// It asks the configured origin only, directly: redirects are never followed (a 3xx answer
/// is a failed lookup, `redirect_<status>`), no `Referer` is sent, proxies named by the
/// environment (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`) are not used, and a URL whose
/// origin differs from the template's is never requested, so the headers (credentials)
/// reach that origin only.
pub struct HttpAdapter {
    config: HttpAdapterConfig,
    client: reqwest::Client,
    headers: reqwest::header::HeaderMap,
    origin: reqwest::Url,
    /// The parsed template up to the key: every lookup URL starts with it, then the key.
    prefix: String,
}

/// A stand-in for the key when the template is parsed at start: unreserved characters only,
/// so the parser leaves it as it is.
const KEY_MARKER: &str = "opjournal-provider-key";

impl HttpAdapter {
    /// Builds the adapter; header values are read from the environment now.
    ///
    /// Errors: a message naming the refused setting (the same checks as the policy file's,
    /// see [`crate::domain::policy::validate_http`]), the missing variable or the bad header.
    pub fn new(config: HttpAdapterConfig) -> Result<Self, SetupError> {
        install_crypto_provider();
        crate::domain::policy::validate_http(&config)
            .map_err(|(setting, message)| SetupError::setting(setting, message))?;
        let origin = reqwest::Url::parse(&config.url.replace("{provider_key}", KEY_MARKER))
            .map_err(|_| SetupError::setting("url", "is not a valid URL"))?;
        // What every lookup URL starts with: the template up to the key, as parsed.
        let prefix = origin
            .as_str()
            .find(KEY_MARKER)
            .map(|at| origin.as_str()[..at].to_owned())
            .ok_or_else(|| SetupError::setting("url", "{provider_key} does not reach the URL"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, source) in &config.headers {
            let value = std::env::var(&source.env).map_err(|_| {
                SetupError::setting(
                    format_args!("headers.{name}"),
                    format_args!("environment variable {} is not set", source.env),
                )
            })?;
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                SetupError::setting(format_args!("headers.{name}"), "not a valid header name")
            })?;
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("{}{value}", source.prefix))
                    .map_err(|_| {
                        SetupError::setting(
                            format_args!("headers.{name}"),
                            "the value is not a valid header value",
                        )
                    })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(config.timeout_seconds))
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            // HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are not obeyed: a proxy would get the
            // headers (over http://, the credentials in clear) and could answer for the
            // provider.
            .no_proxy()
            .build()
            .map_err(|e| SetupError(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            config,
            client,
            headers,
            origin,
            prefix,
        })
    }

    /// The lookup's URL: the template with the provider key, percent-encoded; `None` when it
    /// would not address that key at the configured origin and path (the parsed URL must be
    /// the parsed template's text up to the key, then the encoded key: a key that would
    /// complete a dot segment or a percent sequence of the template is not looked up).
    fn url(&self, request: &LookupRequest) -> Option<reqwest::Url> {
        // "." and ".." would be removed from the path as dot segments and address another
        // resource, whose 404 would then read as "absent".
        if matches!(request.provider_key.as_str(), "" | "." | "..") {
            return None;
        }
        let key = utf8_percent_encode(&request.provider_key, SEGMENT).to_string();
        let url = reqwest::Url::parse(&self.config.url.replace("{provider_key}", &key)).ok()?;
        let addressed = url.origin() == self.origin.origin()
            && url
                .as_str()
                .strip_prefix(self.prefix.as_str())
                .is_some_and(|rest| rest.starts_with(&key));
        addressed.then_some(url)
    }

    fn read_found(&self, body: &Value, provider_key: &str) -> Observation {
        // `null`, a bare string or a list is no object the provider found.
        if !body.is_object() {
            return Observation::LookupFailed {
                code: "response_not_object".into(),
            };
        }
        let mapping = &self.config.response;
        // Another object's status is not this operation's outcome.
        let about_key = mapping.key_pointer.as_ref().is_none_or(|pointer| {
            body.pointer(pointer)
                .and_then(Value::as_str)
                .is_some_and(|named| named == provider_key)
        });
        if !about_key {
            return Observation::LookupFailed {
                code: "found_another_key".into(),
            };
        }
        let text_at = |pointer: &Option<String>| {
            pointer
                .as_deref()
                .and_then(|p| body.pointer(p))
                .and_then(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
        };
        let status = text_at(&mapping.status_pointer);
        if let Some(status) = &status {
            if mapping.failed_values.contains(status) {
                return Observation::Failed {
                    code: format!("provider_{}", sanitize_code(status)),
                };
            }
            if !mapping.succeeded_values.contains(status) {
                return Observation::Pending;
            }
        } else if mapping.status_pointer.is_some() {
            return Observation::LookupFailed {
                code: "status_missing".into(),
            };
        }
        Observation::Succeeded {
            external_id: text_at(&mapping.external_id_pointer),
            result_json: Some(canonical::canonicalize(body)),
        }
    }
}

/// Reads a JSON answer of at most [`MAX_RESPONSE_BYTES`], chunk by chunk, stopping as soon
/// as it is longer (an answer without `Content-Length` can be endless). The error is the
/// failed lookup's code: `response_too_large`, `timeout` (the body did not arrive within
/// `timeout_seconds`), `response_read_failed` or `response_not_json`.
async fn read_json(mut response: reqwest::Response) -> Result<Value, &'static str> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
    {
        return Err("response_too_large");
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err("response_too_large");
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(error) if error.is_timeout() => return Err("timeout"),
            Err(_) => return Err("response_read_failed"),
        }
    }
    serde_json::from_slice(&body).map_err(|_| "response_not_json")
}

fn sanitize_code(value: &str) -> String {
    value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(60)
        .collect()
}

#[async_trait]
impl ProviderAdapter for HttpAdapter {
    async fn lookup(&self, request: &LookupRequest) -> Observation {
        let Some(url) = self.url(request) else {
            return Observation::LookupFailed {
                code: "not_addressable".into(),
            };
        };
        let mut headers = self.headers.clone();
        crate::telemetry::propagation::inject_current(&mut headers);
        let response = match self
            .client
            .get(url)
            .headers(headers)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                let code = if error.is_timeout() {
                    "timeout"
                } else if error.is_connect() {
                    "connect_failed"
                } else {
                    "request_failed"
                };
                return Observation::LookupFailed { code: code.into() };
            }
        };
        let status = response.status().as_u16();
        // A redirect is never followed and never read: the answer of another origin (a
        // gateway, a moved endpoint, a login page) proves nothing about this key.
        if response.status().is_redirection() {
            return Observation::LookupFailed {
                code: format!("redirect_{status}"),
            };
        }
        if self.config.absent_statuses.contains(&status) {
            if let Some(expected) = &self.config.absent_match {
                let body = match read_json(response).await {
                    Ok(body) => Some(body),
                    // An answer cut off or too large is no answer: never a "not found".
                    Err(code @ ("timeout" | "response_too_large" | "response_read_failed")) => {
                        return Observation::LookupFailed { code: code.into() };
                    }
                    Err(_) => None,
                };
                let matched = body
                    .as_ref()
                    .and_then(|b| b.pointer(&expected.pointer))
                    .and_then(Value::as_str)
                    .is_some_and(|v| expected.values.iter().any(|e| e == v));
                if !matched {
                    return Observation::LookupFailed {
                        code: format!("unexpected_{status}"),
                    };
                }
                // The answer must be about the key asked for: another route's (by id) or
                // another key's "not found" is no proof of this key's absence.
                let names_key = expected.key_pointer.as_ref().is_none_or(|pointer| {
                    body.as_ref()
                        .and_then(|b| b.pointer(pointer))
                        .and_then(Value::as_str)
                        .is_some_and(|named| named == request.provider_key)
                });
                if !names_key {
                    return Observation::LookupFailed {
                        code: format!("absent_{status}_for_another_key"),
                    };
                }
            }
            return Observation::NotFound {
                search_complete: self.config.search_complete,
            };
        }
        if !response.status().is_success() {
            return Observation::LookupFailed {
                code: format!("http_{status}"),
            };
        }
        match read_json(response).await {
            Ok(body) => self.read_found(&body, &request.provider_key),
            Err(code) => Observation::LookupFailed { code: code.into() },
        }
    }
}

/// Installs ring as the process's rustls crypto provider (HTTPS to providers), once; a
/// provider installed earlier by the embedding program is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
