//! The bearer token sent with every call when the server requires tokens.

use std::fmt;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Adds `authorization: Bearer <token>` to every call (or nothing). The token never shows
/// in `Debug` output and is kept out of HTTP/2 header compression.
#[derive(Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

/// A token that cannot be sent in a header.
#[derive(Debug, thiserror::Error)]
#[error("the token must be non-empty printable ASCII")]
pub struct InvalidToken;

impl BearerToken {
    /// Sends `token`.
    ///
    /// Errors: [`InvalidToken`] for an empty token or one with characters a header cannot
    /// carry.
    pub fn new(token: &str) -> Result<Self, InvalidToken> {
        if token.is_empty() {
            return Err(InvalidToken);
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| InvalidToken)?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }

    /// Sends no token.
    pub fn none() -> Self {
        Self(None)
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "BearerToken(..)"
        } else {
            "BearerToken(none)"
        })
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_token_goes_into_the_authorization_header_and_never_into_debug_output() {
        let mut token = BearerToken::new("s3cret").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
        let request = token.call(Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer s3cret"
        );
        let request = BearerToken::none().call(Request::new(())).unwrap();
        assert!(request.metadata().get("authorization").is_none());
    }

    #[test]
    fn an_empty_token_or_one_a_header_cannot_carry_is_refused() {
        assert!(BearerToken::new("").is_err());
        assert!(BearerToken::new("line\nbreak").is_err());
    }
}
