//! Bearer-token authentication for the gRPC services.
//!
//! [`Authenticator`] is a tonic interceptor in front of `OperationJournal` and `Reconciler`
//! (health and reflection stay open): it turns the `authorization: Bearer <token>` header
//! into a [`Caller`] in the request's extensions, or refuses the call with
//! `UNAUTHENTICATED`. Each handler then checks its RPC with [`caller`], and the namespace its
//! request touches, once converted, with [`check_namespace`]. With no tokens configured
//! every call passes as [`Caller::Anyone`]. Tokens are never logged.

use std::fmt;
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::status::{access_status, journal_status};
use crate::domain::access::{AccessError, Caller, Rpc, TokenRegistry};
use crate::domain::error::JournalError;
use crate::domain::model::Namespace;

const AUTHORIZATION: &str = "authorization";

/// The server side: authenticates each call against the configured tokens.
#[derive(Clone, Default)]
pub struct Authenticator {
    registry: Option<Arc<TokenRegistry>>,
}

impl Authenticator {
    /// Authentication off: every call is [`Caller::Anyone`].
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Authentication against `registry`; an empty registry means authentication off.
    pub fn new(registry: TokenRegistry) -> Self {
        if registry.is_empty() {
            Self::disabled()
        } else {
            Self {
                registry: Some(Arc::new(registry)),
            }
        }
    }

    /// Whether calls must present a token.
    pub fn is_enabled(&self) -> bool {
        self.registry.is_some()
    }

    /// How many tokens are accepted (0 when authentication is off).
    pub fn tokens(&self) -> usize {
        self.registry.as_ref().map_or(0, |registry| registry.len())
    }

    /// The caller behind `metadata`.
    ///
    /// Errors: [`AccessError::MissingCredentials`] without an `authorization` header;
    /// [`AccessError::InvalidCredentials`] for more than one, a scheme other than `Bearer`,
    /// a token outside RFC 6750's `b64token` characters, or a token not configured.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, AccessError> {
        self.authenticate_headers(metadata.as_ref())
    }

    /// The caller behind a request's HTTP `headers`, as [`Authenticator::authenticate`]
    /// (the server's admission layer counts calls per principal with it, before the call
    /// reaches a service).
    ///
    /// Errors: as [`Authenticator::authenticate`].
    pub fn authenticate_headers(&self, headers: &http::HeaderMap) -> Result<Caller, AccessError> {
        let Some(registry) = &self.registry else {
            return Ok(Caller::Anyone);
        };
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let value = values.next().ok_or(AccessError::MissingCredentials)?;
        if values.next().is_some() {
            return Err(AccessError::InvalidCredentials);
        }
        let token = bearer_token(
            value
                .to_str()
                .map_err(|_| AccessError::InvalidCredentials)?,
        )
        .ok_or(AccessError::InvalidCredentials)?;
        registry
            .authenticate(token)
            .map(Caller::Principal)
            .ok_or(AccessError::InvalidCredentials)
    }
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("tokens", &self.registry.as_ref().map_or(0, |r| r.len()))
            .finish()
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        // Already authenticated by the server's admission layer (which only ever inserts a
        // principal its own authenticator, this one, accepted).
        if matches!(
            request.extensions().get::<Caller>(),
            Some(Caller::Principal(_))
        ) {
            return Ok(request);
        }
        match self.authenticate(request.metadata()) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                Ok(request)
            }
            Err(error) => {
                tracing::debug!(%error, "call refused: not authenticated");
                Err(access_status(error))
            }
        }
    }
}

/// The token of an `authorization` value `Bearer <token>` (scheme in any case).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    let b64token =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/');
    let body = token.trim_end_matches('=');
    (scheme.eq_ignore_ascii_case("bearer") && !body.is_empty() && body.chars().all(b64token))
        .then_some(token)
}

/// The authenticated caller of `request`, checked for `rpc`.
///
/// Errors: `PERMISSION_DENIED`/`ROLE_NOT_ALLOWED`; `INTERNAL` when the request did not pass
/// through an [`Authenticator`] (a wiring bug: the call is refused, never let through).
pub fn caller<T>(request: &Request<T>, rpc: Rpc) -> Result<Caller, Status> {
    let caller = request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| JournalError::internal("a call reached a handler without authentication"))
        .map_err(journal_status)?;
    caller
        .authorize(rpc)
        .map_err(|error| refused(&caller, error))?;
    Ok(caller)
}

/// The command of an authorized call: checks the caller's role for `rpc` ([`caller`]),
/// converts the request into its command (`api::convert`), and checks the caller may touch
/// the command's namespace, as `namespace` finds it ([`check_namespace`]).
///
/// Errors: those of [`caller`] and [`check_namespace`]; `INVALID_ARGUMENT` (with its reason)
/// for a request that does not convert.
pub fn command<R, C>(
    request: Request<R>,
    rpc: Rpc,
    namespace: impl FnOnce(&C) -> &Namespace,
) -> Result<C, Status>
where
    C: TryFrom<R, Error = JournalError>,
{
    let caller = caller(&request, rpc)?;
    let command = C::try_from(request.into_inner()).map_err(journal_status)?;
    check_namespace(&caller, namespace(&command))?;
    Ok(command)
}

/// Checks that `caller` may touch `namespace`: the request's, or for a lease holder's call,
/// the one inside its lease token (never any the request claims besides).
///
/// Errors: `PERMISSION_DENIED`/`NAMESPACE_NOT_ALLOWED`.
pub fn check_namespace(caller: &Caller, namespace: &Namespace) -> Result<(), Status> {
    caller
        .authorize_namespace(namespace)
        .map_err(|error| refused(caller, error))
}

/// Logs a refusal (the principal's name, never its token) and turns it into a status.
pub fn refused(caller: &Caller, error: AccessError) -> Status {
    tracing::info!(principal = caller.name().unwrap_or(""), %error, "call refused");
    access_status(error)
}

/// The client side: adds `authorization: Bearer <token>` to every call (or nothing); the
/// client crate's interceptor, used by the operator console and the tests.
pub use opjournal_client::{BearerToken, InvalidToken};

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn only_the_bearer_scheme_with_a_b64token_is_accepted() {
        assert_eq!(
            bearer_token("Bearer abc.DEF-12_~+/=="),
            Some("abc.DEF-12_~+/==")
        );
        assert_eq!(bearer_token("bearer  abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer a b"), None);
        assert_eq!(bearer_token("Bearer =="), None);
    }
}
