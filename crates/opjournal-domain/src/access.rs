//! Access control: which caller may call which RPC, in which namespaces.
//!
//! Namespaces isolate tenants that share one journal: keys are unique per namespace, and a
//! caller whose token does not name a namespace can neither read nor change anything in it.
//! The server knows a bearer token only by its SHA-256, so a leaked configuration grants
//! nothing; a presented token is hashed and compared in constant time with every configured
//! digest. What a caller may do is the union of its roles (see [`Rpc::roles`]).
//!
//! Operations addressed by a lease token are checked against the namespace *inside* the
//! token, which the server itself encoded: a token of tenant B can never complete tenant A's
//! operation, whatever namespace the request claims.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::model::Namespace;

/// What a token may do; a token may hold several roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// An orchestrator: the `OperationJournal` RPCs.
    Client,
    /// A person settling escalations: the review queue, resolutions, history and reads.
    Reviewer,
    /// Everything, including `ReconcileOperation`.
    Admin,
}

impl Role {
    /// The role's name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Reviewer => "reviewer",
            Self::Admin => "admin",
        }
    }
}

/// The RPCs that access control knows about (health and reflection are not among them:
/// they stay open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    /// `OperationJournal/BeginOperation`.
    BeginOperation,
    /// `OperationJournal/CompleteOperation`.
    CompleteOperation,
    /// `OperationJournal/FailOperation`.
    FailOperation,
    /// `OperationJournal/ReportUnknownOutcome`.
    ReportUnknownOutcome,
    /// `OperationJournal/RenewLease`.
    RenewLease,
    /// `OperationJournal/GetOperation`.
    GetOperation,
    /// `OperationJournal/ListOperations`.
    ListOperations,
    /// `OperationJournal/DeriveOperationKey`.
    DeriveOperationKey,
    /// `Reconciler/ReconcileOperation`.
    ReconcileOperation,
    /// `Reconciler/ListOperationsForReview`.
    ListOperationsForReview,
    /// `Reconciler/ResolveOperation`.
    ResolveOperation,
    /// `Reconciler/GetOperationHistory`.
    GetOperationHistory,
}

impl Rpc {
    /// The roles allowed to call this RPC. Exhaustive: a new RPC does not compile until it is
    /// given its roles.
    pub fn roles(self) -> &'static [Role] {
        use Role::{Admin, Client, Reviewer};
        match self {
            Self::BeginOperation
            | Self::CompleteOperation
            | Self::FailOperation
            | Self::ReportUnknownOutcome
            | Self::RenewLease
            | Self::DeriveOperationKey => &[Client, Admin],
            Self::GetOperation | Self::ListOperations => &[Client, Reviewer, Admin],
            Self::ListOperationsForReview | Self::ResolveOperation | Self::GetOperationHistory => {
                &[Reviewer, Admin]
            }
            Self::ReconcileOperation => &[Admin],
        }
    }

    /// The RPC's method name, e.g. `ResolveOperation`.
    pub fn name(self) -> &'static str {
        match self {
            Self::BeginOperation => "BeginOperation",
            Self::CompleteOperation => "CompleteOperation",
            Self::FailOperation => "FailOperation",
            Self::ReportUnknownOutcome => "ReportUnknownOutcome",
            Self::RenewLease => "RenewLease",
            Self::GetOperation => "GetOperation",
            Self::ListOperations => "ListOperations",
            Self::DeriveOperationKey => "DeriveOperationKey",
            Self::ReconcileOperation => "ReconcileOperation",
            Self::ListOperationsForReview => "ListOperationsForReview",
            Self::ResolveOperation => "ResolveOperation",
            Self::GetOperationHistory => "GetOperationHistory",
        }
    }
}

/// Why a call was refused before it touched the journal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No `authorization` header. `UNAUTHENTICATED`, `MISSING_CREDENTIALS`.
    #[error("no bearer token")]
    MissingCredentials,
    /// A malformed header or a token the server does not know. `UNAUTHENTICATED`,
    /// `INVALID_CREDENTIALS`.
    #[error("invalid bearer token")]
    InvalidCredentials,
    /// The token's roles do not include this RPC. `PERMISSION_DENIED`, `ROLE_NOT_ALLOWED`.
    #[error("{} is not allowed for this token's roles", rpc.name())]
    RoleNotAllowed {
        /// The refused RPC.
        rpc: Rpc,
    },
    /// The token does not allow the namespace the request names. `PERMISSION_DENIED`,
    /// `NAMESPACE_NOT_ALLOWED`.
    #[error("namespace {namespace} is not allowed for this token")]
    NamespaceNotAllowed {
        /// The refused namespace.
        namespace: String,
    },
    /// `ResolveOperation` names a reviewer other than the caller. `PERMISSION_DENIED`,
    /// `REVIEWER_MISMATCH`.
    #[error("the reviewer must be the caller")]
    ReviewerMismatch,
}

/// The namespaces a token may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceScope {
    /// Every namespace (`["*"]` in the configuration).
    Any,
    /// Only these.
    Only(BTreeSet<String>),
}

impl NamespaceScope {
    /// Whether `namespace` is in scope.
    pub fn allows(&self, namespace: &Namespace) -> bool {
        match self {
            Self::Any => true,
            Self::Only(names) => names.contains(namespace.as_str()),
        }
    }
}

/// An authenticated caller: a configured token's name, namespaces and roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name, recorded as the reviewer in the history (1-200 characters).
    pub name: String,
    /// Namespaces it may touch.
    pub namespaces: NamespaceScope,
    /// Its roles (at least one).
    pub roles: BTreeSet<Role>,
}

impl Principal {
    /// Whether one of the principal's roles allows `rpc`.
    pub fn may_call(&self, rpc: Rpc) -> bool {
        rpc.roles().iter().any(|role| self.roles.contains(role))
    }
}

/// Who is calling, as the transport established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off (no tokens configured): everything is allowed.
    Anyone,
    /// A caller that presented a configured token.
    Principal(Arc<Principal>),
}

impl Caller {
    /// Checks that the caller may call `rpc` at all.
    ///
    /// Errors: [`AccessError::RoleNotAllowed`].
    pub fn authorize(&self, rpc: Rpc) -> Result<(), AccessError> {
        match self {
            Self::Anyone => Ok(()),
            Self::Principal(p) if p.may_call(rpc) => Ok(()),
            Self::Principal(_) => Err(AccessError::RoleNotAllowed { rpc }),
        }
    }

    /// Checks that the caller may touch `namespace`.
    ///
    /// Errors: [`AccessError::NamespaceNotAllowed`].
    pub fn authorize_namespace(&self, namespace: &Namespace) -> Result<(), AccessError> {
        match self {
            Self::Anyone => Ok(()),
            Self::Principal(p) if p.namespaces.allows(namespace) => Ok(()),
            Self::Principal(_) => Err(AccessError::NamespaceNotAllowed {
                namespace: namespace.to_string(),
            }),
        }
    }

    /// The reviewer to record for a resolution: with authentication on, the principal's name
    /// (an empty `requested` takes it; any other name is refused); otherwise `requested`.
    ///
    /// Errors: [`AccessError::ReviewerMismatch`].
    pub fn reviewer(&self, requested: &str) -> Result<String, AccessError> {
        match self {
            Self::Anyone => Ok(requested.to_owned()),
            Self::Principal(p) if requested.is_empty() || requested == p.name => Ok(p.name.clone()),
            Self::Principal(_) => Err(AccessError::ReviewerMismatch),
        }
    }

    /// Whether the caller may touch every namespace (authentication off, or a token with
    /// `["*"]`): only such callers see figures that span namespaces.
    pub fn covers_every_namespace(&self) -> bool {
        match self {
            Self::Anyone => true,
            Self::Principal(p) => p.namespaces == NamespaceScope::Any,
        }
    }

    /// The principal's name; `None` when authentication is off.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Anyone => None,
            Self::Principal(p) => Some(&p.name),
        }
    }
}

/// The SHA-256 of a bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// The digest of a presented token.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Parses 64 hexadecimal characters (either case).
    ///
    /// Errors: anything else, described without quoting the value.
    pub fn parse_hex(text: &str) -> Result<Self, TokenDigestError> {
        let mut bytes = [0_u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| TokenDigestError)?;
        Ok(Self(bytes))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// A token's `sha256` that is not 64 hexadecimal characters. The message never quotes the
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be 64 hexadecimal characters (a SHA-256)")]
pub struct TokenDigestError;

/// Why a set of tokens cannot form a registry. The messages name the tokens, never their
/// digests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRegistryError {
    /// Two tokens have one `sha256`, so one presented token would stand for both names.
    #[error("tokens {first} and {second} have the same sha256")]
    SameSha256 {
        /// The name of the token configured first.
        first: String,
        /// The name of the token configured later.
        second: String,
    },
    /// Two tokens have one `name`, which the history could not tell apart.
    #[error("two tokens are named {name}")]
    SameName {
        /// The name both tokens have.
        name: String,
    },
}

/// The configured tokens, by digest.
#[derive(Debug, Clone, Default)]
pub struct TokenRegistry {
    entries: Vec<(TokenDigest, Arc<Principal>)>,
}

impl TokenRegistry {
    /// A registry of `entries`.
    ///
    /// Errors: two entries with one digest or one name (the message names the token).
    pub fn new(
        entries: impl IntoIterator<Item = (TokenDigest, Principal)>,
    ) -> Result<Self, TokenRegistryError> {
        let mut registry = Self::default();
        for (digest, principal) in entries {
            for (known, other) in &registry.entries {
                if *known == digest {
                    return Err(TokenRegistryError::SameSha256 {
                        first: other.name.clone(),
                        second: principal.name,
                    });
                }
                if other.name == principal.name {
                    return Err(TokenRegistryError::SameName {
                        name: principal.name,
                    });
                }
            }
            registry.entries.push((digest, Arc::new(principal)));
        }
        Ok(registry)
    }

    /// Whether no token is configured (authentication is off).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The principal of a presented token. Every configured digest is compared, each in
    /// constant time, so the time taken does not tell how close a guess came.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        let presented = TokenDigest::of(token);
        let mut found = None;
        for (digest, principal) in &self.entries {
            let equal: bool = digest.0.ct_eq(&presented.0).into();
            if equal && found.is_none() {
                found = Some(principal.clone());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn principal(name: &str, namespaces: &[&str], roles: &[Role]) -> Principal {
        Principal {
            name: name.to_owned(),
            namespaces: NamespaceScope::Only(namespaces.iter().map(|s| (*s).to_owned()).collect()),
            roles: roles.iter().copied().collect(),
        }
    }

    fn ns(name: &str) -> Namespace {
        Namespace::parse(name).unwrap()
    }

    #[test]
    fn each_role_reaches_exactly_its_rpcs() {
        let client = Caller::Principal(Arc::new(principal("c", &["a"], &[Role::Client])));
        let reviewer = Caller::Principal(Arc::new(principal("r", &["a"], &[Role::Reviewer])));
        let admin = Caller::Principal(Arc::new(principal("x", &["a"], &[Role::Admin])));
        assert!(client.authorize(Rpc::CompleteOperation).is_ok());
        assert!(client.authorize(Rpc::GetOperation).is_ok());
        assert_eq!(
            client.authorize(Rpc::ResolveOperation),
            Err(AccessError::RoleNotAllowed {
                rpc: Rpc::ResolveOperation
            })
        );
        assert!(client.authorize(Rpc::GetOperationHistory).is_err());
        assert!(reviewer.authorize(Rpc::ResolveOperation).is_ok());
        assert!(reviewer.authorize(Rpc::ListOperations).is_ok());
        assert!(reviewer.authorize(Rpc::BeginOperation).is_err());
        assert!(reviewer.authorize(Rpc::ReconcileOperation).is_err());
        assert!(admin.authorize(Rpc::ReconcileOperation).is_ok());
        assert!(admin.authorize(Rpc::BeginOperation).is_ok());
        assert!(Caller::Anyone.authorize(Rpc::ReconcileOperation).is_ok());
    }

    #[test]
    fn a_token_reaches_only_its_namespaces_unless_it_has_the_wildcard() {
        let a = Caller::Principal(Arc::new(principal("a", &["tenant-a"], &[Role::Client])));
        assert!(a.authorize_namespace(&ns("tenant-a")).is_ok());
        assert!(a.authorize_namespace(&ns("tenant-b")).is_err());
        assert!(
            a.authorize_namespace(&ns("")).is_err(),
            "empty is `default`"
        );
        let mut any = principal("any", &[], &[Role::Client]);
        any.namespaces = NamespaceScope::Any;
        assert!(
            Caller::Principal(Arc::new(any))
                .authorize_namespace(&ns("x"))
                .is_ok()
        );
    }

    #[test]
    fn the_reviewer_is_the_principal_when_authentication_is_on() {
        let r = Caller::Principal(Arc::new(principal("alice", &["a"], &[Role::Reviewer])));
        assert_eq!(r.reviewer("").unwrap(), "alice");
        assert_eq!(r.reviewer("alice").unwrap(), "alice");
        assert_eq!(r.reviewer("bob"), Err(AccessError::ReviewerMismatch));
        assert_eq!(Caller::Anyone.reviewer("bob").unwrap(), "bob");
    }

    #[test]
    fn tokens_are_known_by_their_digest_only() {
        let digest = TokenDigest::parse_hex(&hex::encode(Sha256::digest(b"s3cret"))).unwrap();
        let registry =
            TokenRegistry::new([(digest, principal("orchestrator-a", &["a"], &[Role::Client]))])
                .unwrap();
        assert_eq!(
            registry.authenticate("s3cret").unwrap().name,
            "orchestrator-a"
        );
        assert!(registry.authenticate("s3cret ").is_none());
        assert!(registry.authenticate("").is_none());
        assert!(TokenDigest::parse_hex("abc").is_err());
        assert!(TokenDigest::parse_hex(&"g".repeat(64)).is_err());
    }

    #[test]
    fn duplicate_digests_or_names_are_refused() {
        let d = || TokenDigest::of("t");
        assert!(
            TokenRegistry::new([
                (d(), principal("a", &["x"], &[Role::Client])),
                (d(), principal("b", &["x"], &[Role::Client])),
            ])
            .is_err()
        );
        assert!(
            TokenRegistry::new([
                (
                    TokenDigest::of("1"),
                    principal("a", &["x"], &[Role::Client])
                ),
                (
                    TokenDigest::of("2"),
                    principal("a", &["x"], &[Role::Client])
                ),
            ])
            .is_err()
        );
    }
}
