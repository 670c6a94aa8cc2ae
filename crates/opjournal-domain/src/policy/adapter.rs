//! Provider adapters: how to ask a provider what happened to an operation, and the checks
//! of their settings (URL templates, timeouts, the statuses that prove nothing).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{AdapterKind, yes};
use crate::result;

/// A provider adapter: how to ask a provider what happened to an operation.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdapterConfig {
    /// A JSON-over-HTTP lookup by the key the provider was called with.
    Http(Box<HttpAdapterConfig>),
    /// A gRPC service implementing `opjournal.v1.ProviderAdapter`, in any language.
    Grpc(GrpcAdapterConfig),
    /// No lookup is possible (e.g. e-mail without search): unknown goes straight to review.
    None,
}

impl AdapterConfig {
    /// The adapter's kind.
    pub fn kind(&self) -> AdapterKind {
        match self {
            Self::Http(_) => AdapterKind::Http,
            Self::Grpc(_) => AdapterKind::Grpc,
            Self::None => AdapterKind::None,
        }
    }

    /// Whether a "not found" from this adapter can prove absence (and so release an
    /// operation for another attempt).
    pub fn can_prove_absence(&self) -> bool {
        match self {
            Self::Http(http) => http.search_complete,
            Self::Grpc(grpc) => grpc.trust_search_complete,
            Self::None => false,
        }
    }
}

/// A provider adapter served over gRPC.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcAdapterConfig {
    /// The adapter's URL, e.g. `http://127.0.0.1:50070`.
    pub endpoint: String,
    /// Lookup timeout, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// Whether the adapter may declare a search complete; `false` makes every "not found"
    /// inconclusive whatever the adapter says.
    #[serde(default = "yes")]
    pub trust_search_complete: bool,
}

/// A JSON-over-HTTP lookup.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpAdapterConfig {
    /// URL template: `{provider_key}`, the idempotency key the provider was called with
    /// (`Operation.provider_key`), percent-encoded, in the path or the query; it is the only
    /// variable, so a lookup never asks about another key. The scheme, host and port are
    /// fixed: the lookup and its headers go to that origin only, and redirects are never
    /// followed.
    pub url: String,
    /// Request headers whose values come from the environment, never from the file.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderFromEnv>,
    /// Lookup timeout, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// Whether the provider guarantees its search is complete and current, so that
    /// "not found" (after the grace window) proves absence.
    #[serde(default)]
    pub search_complete: bool,
    /// HTTP statuses that mean "not found" (4xx only).
    #[serde(default = "default_absent")]
    pub absent_statuses: Vec<u16>,
    /// When set, an absent status counts as "not found" only if the answer's body matches
    /// (e.g. `/error` is `not_found`, and `key_pointer` names the key looked up); any other
    /// answer with that status is a failed lookup, so a wrong URL or a proxy's error page is
    /// never taken for proof of absence. Required, with `key_pointer`, by
    /// `search_complete: true`.
    #[serde(default)]
    pub absent_match: Option<BodyMatch>,
    /// How to read a found object.
    #[serde(default)]
    pub response: ResponseMapping,
}

fn default_timeout() -> f64 {
    5.0
}
fn default_absent() -> Vec<u16> {
    vec![404]
}

/// A condition on a JSON answer: the value at `pointer` is one of `values`, and, with
/// `key_pointer`, the value there is the key looked up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyMatch {
    /// JSON Pointer into the answer.
    pub pointer: String,
    /// Accepted values (strings).
    pub values: Vec<String>,
    /// JSON Pointer to where the answer names the key it is about (e.g. `/idempotency_key`):
    /// the string there must equal the provider key looked up, so that another route's or
    /// another key's "not found" never reads as this key's absence.
    #[serde(default)]
    pub key_pointer: Option<String>,
}

/// A header value taken from an environment variable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderFromEnv {
    /// Name of the environment variable holding the value.
    pub env: String,
    /// Text put before the value, e.g. `"Bearer "`.
    #[serde(default)]
    pub prefix: String,
}

/// JSON Pointers (RFC 6901) into a found object.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseMapping {
    /// Where the object's status is; absent means any found JSON object completed (a
    /// warning: prefer a status and `succeeded_values`).
    #[serde(default)]
    pub status_pointer: Option<String>,
    /// Status values meaning the effect completed.
    #[serde(default)]
    pub succeeded_values: Vec<String>,
    /// Status values meaning the operation failed definitively (no effect).
    #[serde(default)]
    pub failed_values: Vec<String>,
    /// Where the found object names the key it is about (e.g. `/idempotency_key`): the
    /// string there must equal the provider key looked up, or the answer settles nothing (a
    /// failed lookup, `found_another_key`), so that another object's status (a wrong route,
    /// a list that ignores its filter) never reads as this operation's outcome. Not set: a
    /// warning.
    #[serde(default)]
    pub key_pointer: Option<String>,
    /// Where the provider's id of the effect is.
    #[serde(default)]
    pub external_id_pointer: Option<String>,
    /// The older spelling of the action's `result.keep`, for results this adapter finds: it
    /// applies when the action sets no `result.keep`. Empty (and no `result.keep`): no result
    /// is stored from this adapter's answers.
    #[serde(default)]
    pub keep_fields: Vec<String>,
}

/// 4xx statuses that say the request was not served, so never "not found", whatever the
/// body: 401, 403 and 407 (credentials refused, by the provider or a proxy; a store that
/// hides what the caller may not list answers 403 for a missing and an existing object
/// alike), 405 (a wrong method or route), 408 (a timeout), 413, 414 and 431 (a request,
/// URL or headers too large: an over-long key), 421 (misdirected), 425 and 429 (too early,
/// too many), 426 (upgrade required), 451 (withheld).
pub const NOT_SERVED_STATUSES: &[u16] = &[
    401, 403, 405, 407, 408, 413, 414, 421, 425, 426, 429, 431, 451,
];

/// The variables an http adapter's `url` may contain: the provider key only.
pub const URL_VARIABLES: &[&str] = &["provider_key"];

/// Checks an http adapter's settings; the error names the setting and what is wrong.
pub fn validate_http(http: &HttpAdapterConfig) -> Result<(), (&'static str, String)> {
    validate_url_template(&http.url).map_err(|e| ("url", e.to_string()))?;
    if !(http.timeout_seconds > 0.0 && http.timeout_seconds <= 300.0) {
        return Err((
            "timeout_seconds",
            "must be greater than 0 and at most 300".into(),
        ));
    }
    validate_absence(http)?;
    if http.response.status_pointer.is_some() && http.response.succeeded_values.is_empty() {
        return Err((
            "response",
            "succeeded_values must name at least one status when status_pointer is set".into(),
        ));
    }
    let pointers = http
        .response
        .status_pointer
        .iter()
        .chain(http.absent_match.iter().map(|m| &m.pointer))
        .chain(
            http.absent_match
                .iter()
                .filter_map(|m| m.key_pointer.as_ref()),
        )
        .chain(http.response.key_pointer.iter())
        .chain(http.response.external_id_pointer.iter());
    for pointer in pointers {
        if !pointer.starts_with('/') {
            return Err((
                "response",
                format!("'{pointer}' is not a JSON Pointer (must start with '/')"),
            ));
        }
    }
    result::validate_keep(&http.response.keep_fields)
        .map_err(|m| ("response", format!("keep_fields: {m}")))?;
    for (header, source) in &http.headers {
        if source.env.is_empty() {
            return Err((
                "headers",
                format!("{header}.env must name an environment variable"),
            ));
        }
    }
    Ok(())
}

/// Checks what proves an object absent: which statuses may say "not found", and the
/// provider's own "no such object" answer that `search_complete` requires.
fn validate_absence(http: &HttpAdapterConfig) -> Result<(), (&'static str, String)> {
    if let Some(status) = http
        .absent_statuses
        .iter()
        .find(|s| !(400..=499).contains(*s))
    {
        return Err((
            "absent_statuses",
            format!(
                "{status} cannot mean \"not found\": only 4xx answers may (a redirect, a \
                 success or a server error never proves absence)"
            ),
        ));
    }
    if let Some(status) = http
        .absent_statuses
        .iter()
        .find(|s| NOT_SERVED_STATUSES.contains(*s))
    {
        return Err((
            "absent_statuses",
            format!(
                "{status} cannot mean \"not found\": it says the request was not served (refused \
                 credentials, a proxy's or a gateway's refusal, a rate limit, a timeout, a wrong \
                 method or an over-long key), whether the object exists or not"
            ),
        ));
    }
    if http.search_complete {
        let Some(absent) = &http.absent_match else {
            return Err((
                "absent_match",
                "is required with search_complete: true, so that only the provider's own \
                 \"no such object\" answer (not a wrong URL or a proxy's 404) proves absence"
                    .into(),
            ));
        };
        if absent.key_pointer.is_none() {
            return Err((
                "absent_match",
                "key_pointer is required with search_complete: true: the \"not found\" answer \
                 must name the key it is about (the value at key_pointer equal to the provider \
                 key), so that another route's or another key's \"not found\" (a lookup by id, \
                 a moved endpoint) never proves absence; set search_complete: false if the \
                 provider's answer does not name the key (unknown outcomes then go to review)"
                    .into(),
            ));
        }
    }
    if let Some(absent) = &http.absent_match
        && absent.values.is_empty()
    {
        return Err(("absent_match", "values must name at least one value".into()));
    }
    Ok(())
}

/// Why an http adapter's `url` template is refused; the message names the problem without
/// the setting's name, which the caller adds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlTemplateError {
    /// The scheme is neither `http` nor `https`.
    #[error("must start with http:// or https://")]
    UnsupportedScheme,
    /// A `{` opens a variable that no `}` closes.
    #[error("has a '{{' without a closing '}}'")]
    UnclosedVariable,
    /// `{operation_key}`: the journal's key, which differs from the provider key in any
    /// namespace but `default` and for keys with `/`.
    #[error(
        "{{operation_key}} names the journal's key, which is not the key the provider was \
         called with in any namespace but default nor for keys with '/' (t1/key, \
         default/a/b); the provider's \"not found\" for it would release an operation that \
         took effect: use {{provider_key}}, the only variable"
    )]
    OperationKeyVariable,
    /// `{external_id}`: the provider's id, not the key the provider was called with.
    #[error(
        "{{external_id}} asks about the provider's id, not the key the provider was called \
         with; a \"not found\" for it says nothing about that key: use {{provider_key}}, the \
         only variable"
    )]
    ExternalIdVariable,
    /// `{namespace}`: a part of the provider key, where a lookup must ask about all of it.
    #[error(
        "{{namespace}} is part of the provider key already; a lookup must ask about the whole \
         provider key: use {{provider_key}}, the only variable"
    )]
    NamespaceVariable,
    /// A variable of any other name.
    #[error("{{{name}}} is not a lookup variable: use {{provider_key}}, the only variable")]
    UnknownVariable {
        /// The variable's name, without its braces.
        name: String,
    },
    /// No `{provider_key}` anywhere.
    #[error("must contain {{provider_key}}, the key the provider was called with")]
    MissingProviderKey,
    /// `{provider_key}` in the scheme, host or port, or a template whose origin moves with
    /// the key.
    #[error(
        "{{provider_key}} must be in the path or the query: the scheme, host and port are \
         fixed, so lookups and their headers go to one origin"
    )]
    ProviderKeyInOrigin,
    /// A fragment (`#`), which is never sent to the provider.
    #[error(
        "must not have a fragment ('#'): it is never sent to the provider, so a key there is \
         not asked about"
    )]
    Fragment,
    /// The template, with a key in place of `{provider_key}`, does not parse as a URL with
    /// a host.
    #[error("is not a valid URL")]
    InvalidUrl,
    /// User information (`user:password@`) before the host.
    #[error("must not carry credentials; give them in headers read from the environment")]
    Credentials,
}

/// Checks an http adapter's `url` template: `http://` or `https://`, `{provider_key}` in the
/// path or the query (never in the scheme, host or port, which are fixed), and no other
/// variable: `{operation_key}` differs from the provider key in any namespace but `default`
/// and for keys with `/`, and `{namespace}`, `{external_id}` or any other name ask about
/// something the provider was not called with, whose "not found" would read as absence.
///
/// Errors: why the template is refused.
pub fn validate_url_template(url: &str) -> Result<(), UrlTemplateError> {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return Err(UrlTemplateError::UnsupportedScheme);
    };
    let mut tail = url;
    while let Some(open) = tail.find('{') {
        let after = &tail[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(UrlTemplateError::UnclosedVariable);
        };
        let name = &after[..close];
        if !URL_VARIABLES.contains(&name) {
            return Err(match name {
                "operation_key" => UrlTemplateError::OperationKeyVariable,
                "external_id" => UrlTemplateError::ExternalIdVariable,
                "namespace" => UrlTemplateError::NamespaceVariable,
                _ => UrlTemplateError::UnknownVariable {
                    name: name.to_owned(),
                },
            });
        }
        tail = &after[close + 1..];
    }
    if !url.contains("{provider_key}") {
        return Err(UrlTemplateError::MissingProviderKey);
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..authority_end].contains('{') {
        return Err(UrlTemplateError::ProviderKeyInOrigin);
    }
    if url.contains('#') {
        return Err(UrlTemplateError::Fragment);
    }
    // Parsed the way lookups parse it, with two different keys: the origin must not move
    // (`http:///{provider_key}` is parsed with the key as the host).
    let origins: Vec<_> = ["key", "other"]
        .into_iter()
        .map(|key| url::Url::parse(&url.replace("{provider_key}", key)))
        .collect();
    match origins.as_slice() {
        [Ok(one), Ok(other)] if one.host().is_some() && one.origin() == other.origin() => {}
        [Ok(one), Ok(_)] if one.host().is_some() => {
            return Err(UrlTemplateError::ProviderKeyInOrigin);
        }
        _ => return Err(UrlTemplateError::InvalidUrl),
    }
    if rest[..authority_end].contains('@') {
        return Err(UrlTemplateError::Credentials);
    }
    Ok(())
}

pub(super) fn validate_grpc(grpc: &GrpcAdapterConfig) -> Result<(), (&'static str, String)> {
    if !(grpc.endpoint.starts_with("http://") || grpc.endpoint.starts_with("https://")) {
        return Err(("endpoint", "must start with http:// or https://".into()));
    }
    if !(grpc.timeout_seconds > 0.0 && grpc.timeout_seconds <= 300.0) {
        return Err((
            "timeout_seconds",
            "must be greater than 0 and at most 300".into(),
        ));
    }
    Ok(())
}
