//! What a storage failure is, for every store and the outbox alike.

/// A storage failure, split by what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached now; the request changed nothing and may be retried.
    #[error("database unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Anything else: a bug, a broken constraint, corrupt data.
    #[error("database error")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}
