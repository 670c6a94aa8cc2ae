//! What a provider call says happened, and the safe default for everything it cannot say.
//!
//! Only the provider can prove that nothing happened. A timeout, a reset connection, a 5xx
//! or an error nobody expected may hide an effect, so by default every error is an
//! *uncertain* outcome: the journal records `unknown` and reconciliation asks the provider,
//! instead of a retry that could pay twice.

use std::error::Error as StdError;
use std::fmt;
use std::io;

/// What the provider call knows happened: the article's classification.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// The provider confirmed the effect.
    Succeeded {
        /// The provider's id of the effect (payment id, message id).
        external_id: Option<String>,
        /// The result to keep for replays; sanitized by the action's result policy.
        result: Option<serde_json::Value>,
    },
    /// The provider confirmed that nothing happened (a decline, a validation error).
    Rejected {
        /// A short machine code such as `card_declined`.
        error_code: String,
    },
    /// Anything else: timeout, connection reset, 5xx, an unreadable answer.
    Uncertain {
        /// A short machine code such as `timeout`, if known.
        error_code: Option<String>,
    },
}

/// A confirmed effect, as a fallible provider function returns it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProviderSuccess {
    /// The provider's id of the effect (payment id, message id).
    pub external_id: Option<String>,
    /// The result to keep for replays; sanitized by the action's result policy.
    pub result: Option<serde_json::Value>,
}

impl ProviderSuccess {
    /// A success with the provider's id of the effect.
    pub fn new(external_id: impl Into<String>) -> Self {
        Self {
            external_id: Some(external_id.into()),
            result: None,
        }
    }

    /// The same success keeping `result` for replays.
    #[must_use]
    pub fn with_result(mut self, result: serde_json::Value) -> Self {
        self.result = Some(result);
        self
    }
}

impl From<ProviderSuccess> for ProviderOutcome {
    fn from(success: ProviderSuccess) -> Self {
        Self::Succeeded {
            external_id: success.external_id,
            result: success.result,
        }
    }
}

/// Why a fallible provider function did not return a success.
///
/// Any error converts into it with `?` (as [`ProviderError::Error`]); the other variants say
/// what the function knows. [`ProviderError::outcome`] is the default classification: only
/// [`ProviderError::Rejected`] is a rejection. The message of a wrapped error is never sent
/// to the journal (it may quote payloads); only a short code is.
pub enum ProviderError {
    /// The provider confirmed that nothing happened: recorded `failed_final` with this code
    /// (1–100 characters of `[A-Za-z0-9._:-]`, e.g. `card_declined`).
    Rejected {
        /// The code to record.
        error_code: String,
    },
    /// The function knows the outcome is unknown and names it (e.g. `unreadable_response`).
    Uncertain {
        /// The code to record.
        error_code: String,
    },
    /// The provider answered with a non-success HTTP status. Uncertain by default
    /// (`http_<status>`): a 5xx may follow a commit, and only the provider's documentation
    /// can say which 4xx prove that nothing happened (a classifier hook may).
    Status(http::StatusCode),
    /// Any other error (transport, decoding, a bug). Uncertain, with the code
    /// [`default_error_code`] finds in its source chain.
    Error(Box<dyn StdError + Send + Sync>),
}

impl ProviderError {
    /// A confirmed rejection with `error_code`.
    pub fn rejected(error_code: impl Into<String>) -> Self {
        Self::Rejected {
            error_code: error_code.into(),
        }
    }

    /// An uncertain outcome with `error_code`.
    pub fn uncertain(error_code: impl Into<String>) -> Self {
        Self::Uncertain {
            error_code: error_code.into(),
        }
    }

    /// The default classification: [`ProviderOutcome::Rejected`] for
    /// [`ProviderError::Rejected`] only, [`ProviderOutcome::Uncertain`] for everything else.
    pub fn outcome(&self) -> ProviderOutcome {
        let uncertain = |code: String| ProviderOutcome::Uncertain {
            error_code: Some(code),
        };
        match self {
            Self::Rejected { error_code } => ProviderOutcome::Rejected {
                error_code: error_code.clone(),
            },
            Self::Uncertain { error_code } => uncertain(error_code.clone()),
            Self::Status(status) => uncertain(format!("http_{}", status.as_u16())),
            Self::Error(error) => uncertain(default_error_code(error.as_ref()).to_owned()),
        }
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for ProviderError {
    fn from(error: E) -> Self {
        Self::Error(Box::new(error))
    }
}

impl fmt::Debug for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected { error_code } => write!(f, "Rejected({error_code})"),
            Self::Uncertain { error_code } => write!(f, "Uncertain({error_code})"),
            Self::Status(status) => write!(f, "Status({status})"),
            Self::Error(error) => write!(f, "Error({})", default_error_code(error.as_ref())),
        }
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.outcome() {
            ProviderOutcome::Rejected { error_code } => {
                write!(f, "the provider rejected the request ({error_code})")
            }
            ProviderOutcome::Uncertain { error_code } => write!(
                f,
                "the provider's outcome is unknown ({})",
                error_code.unwrap_or_default()
            ),
            ProviderOutcome::Succeeded { .. } => f.write_str("the provider succeeded"),
        }
    }
}

impl From<Result<ProviderSuccess, ProviderError>> for ProviderOutcome {
    /// Classifies with the default: [`ProviderError::outcome`].
    fn from(result: Result<ProviderSuccess, ProviderError>) -> Self {
        match result {
            Ok(success) => success.into(),
            Err(error) => error.outcome(),
        }
    }
}

/// The code of an uncertain outcome for `error`, from the first source in its chain that
/// says more: `timeout` for [`tokio::time::error::Elapsed`] or an I/O `TimedOut`,
/// `connection_reset` for an I/O `ConnectionReset`, `connection_error` for other
/// connection failures, and `unexpected_error` for anything else.
pub fn default_error_code(error: &(dyn StdError + 'static)) -> &'static str {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<tokio::time::error::Elapsed>() {
            return "timeout";
        }
        if let Some(io) = error.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::TimedOut => return "timeout",
                io::ErrorKind::ConnectionReset => return "connection_reset",
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::NotConnected
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => return "connection_error",
                _ => {}
            }
        }
        next = error.source();
    }
    "unexpected_error"
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("request failed")]
    struct Wrapped(#[source] io::Error);

    fn code_of(error: ProviderError) -> Option<String> {
        match error.outcome() {
            ProviderOutcome::Uncertain { error_code } => error_code,
            other => panic!("expected uncertain, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_timeout_anywhere_in_the_chain_is_an_uncertain_timeout() {
        let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(code_of(elapsed.into()).as_deref(), Some("timeout"));
        let wrapped = Wrapped(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(code_of(wrapped.into()).as_deref(), Some("timeout"));
        let reset = Wrapped(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(code_of(reset.into()).as_deref(), Some("connection_reset"));
    }

    #[test]
    fn only_a_confirmed_rejection_is_a_rejection() {
        assert_eq!(
            ProviderError::rejected("card_declined").outcome(),
            ProviderOutcome::Rejected {
                error_code: "card_declined".into()
            }
        );
        assert_eq!(
            code_of(ProviderError::Status(http::StatusCode::SERVICE_UNAVAILABLE)).as_deref(),
            Some("http_503")
        );
        assert_eq!(
            code_of(ProviderError::Status(http::StatusCode::BAD_REQUEST)).as_deref(),
            Some("http_400")
        );
        assert_eq!(
            code_of(io::Error::other("the SDK blew up").into()).as_deref(),
            Some("unexpected_error")
        );
    }

    #[test]
    fn the_error_message_never_reaches_debug_output_or_the_code() {
        let error = ProviderError::from(io::Error::other("card 4111 1111 1111 1111"));
        assert!(!format!("{error:?} {error}").contains("4111"));
    }
}
