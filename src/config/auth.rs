//! `[auth]`: who may call. Bearer tokens known by their SHA-256, in this file or a file of
//! their own, and the switch that lets an unauthenticated server listen where other hosts
//! can reach it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, tokens_file};
use crate::domain::access::{
    NamespaceScope, Principal, Role, TokenDigest, TokenDigestError, TokenRegistry,
};
use crate::domain::model::Namespace;

/// `[auth]` settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthSettings {
    /// Without authentication (no tokens, no client certificates), let the server listen
    /// where other hosts can reach it anyway: the gRPC `[server] listen` address and the
    /// review console's `[console] listen` (`--insecure-allow-unauthenticated`). Everyone
    /// who reaches it can then read and change every namespace: only for a server behind
    /// something that authenticates for it (a mesh's authorization policy).
    pub insecure_allow_unauthenticated: bool,
    /// A TOML file holding more `[[tokens]]` entries, e.g. mounted from a Kubernetes
    /// Secret; read at start, added to `tokens`, and never logged.
    pub tokens_file: Option<PathBuf>,
    /// Bearer tokens (`[[auth.tokens]]`), known by their SHA-256 only; none (here and in
    /// `tokens_file`) means authentication is off.
    pub tokens: Vec<TokenSettings>,
}

impl AuthSettings {
    /// The configured tokens, `tokens` then those of `tokens_file`; empty when
    /// authentication is off.
    ///
    /// Errors: an unreadable or invalid `tokens_file`, or one without entries; an invalid
    /// entry (named by its position and field, and its file); two entries with one digest
    /// or name. No message quotes a digest or the file's content.
    pub fn token_registry(&self) -> Result<TokenRegistry, ConfigError> {
        let mut entries = principals(&self.tokens, |e| format!("auth.tokens{e}"))?;
        if let Some(path) = &self.tokens_file {
            let tokens = tokens_file::read(path)
                .map_err(|e| ConfigError(format!("auth.tokens_file: {e}")))?;
            let at = path.display();
            entries.extend(principals(&tokens, |e| {
                format!("auth.tokens_file: {at}: tokens{e}")
            })?);
        }
        let settings = match self.tokens_file {
            Some(_) => "auth.tokens and auth.tokens_file",
            None => "auth.tokens",
        };
        TokenRegistry::new(entries).map_err(|e| ConfigError(format!("{settings}: {e}")))
    }
}

/// One bearer token: `[[tokens]]` in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// Who holds it (1-200 characters); a reviewer's name in the history.
    pub name: String,
    /// SHA-256 of the token, 64 hexadecimal characters; the token itself is never configured.
    pub sha256: String,
    /// Namespaces it may touch, or `["*"]` for all.
    pub namespaces: Vec<String>,
    /// Its roles: `client`, `reviewer`, `admin`; never `client` and `reviewer` together (the
    /// configuration is refused, naming the token).
    pub roles: Vec<Role>,
}

/// Why one `[[tokens]]` entry is invalid: the field at fault (its name first in the message)
/// and what is wrong with it. No message quotes the digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TokenSettingsError {
    /// `name` is empty, longer than 200 characters or holds a control character.
    #[error("name: must be 1 to 200 characters without control characters")]
    Name,
    /// `sha256` is not 64 hexadecimal characters.
    #[error("sha256: {0}")]
    Sha256(#[from] TokenDigestError),
    /// `namespaces` is empty.
    #[error("namespaces: must name at least one namespace, or \"*\"")]
    NoNamespaces,
    /// An entry of `namespaces` is not a namespace name, or `"*"` is given with others.
    #[error("namespaces: each must be a namespace name, or \"*\" alone")]
    Namespace,
    /// `roles` is empty.
    #[error("roles: must name at least one of client, reviewer, admin")]
    NoRoles,
    /// `roles` holds both `client` and `reviewer`: the agent could approve its own unknown
    /// operations.
    #[error(
        "roles: the token named {name:?} holds both client and reviewer; one token may not do \
         both (an agent could approve its own unknown operations): give the reviewer a token \
         of its own"
    )]
    ClientAndReviewer {
        /// The token's `name` (the holder's, never a secret).
        name: String,
    },
}

impl TokenSettings {
    /// The digest and principal this entry describes.
    ///
    /// Errors: an invalid field, described without quoting the digest.
    fn principal(&self) -> Result<(TokenDigest, Principal), TokenSettingsError> {
        let chars = self.name.chars().count();
        if chars == 0 || chars > 200 || self.name.chars().any(char::is_control) {
            return Err(TokenSettingsError::Name);
        }
        let digest = TokenDigest::parse_hex(&self.sha256)?;
        let namespaces = match self.namespaces.as_slice() {
            [] => return Err(TokenSettingsError::NoNamespaces),
            [all] if all == "*" => NamespaceScope::Any,
            names => {
                let mut scope = std::collections::BTreeSet::new();
                for name in names {
                    if name.is_empty() || name == "*" || Namespace::parse(name).is_err() {
                        return Err(TokenSettingsError::Namespace);
                    }
                    scope.insert(name.clone());
                }
                NamespaceScope::Only(scope)
            }
        };
        if self.roles.is_empty() {
            return Err(TokenSettingsError::NoRoles);
        }
        if self.roles.contains(&Role::Client) && self.roles.contains(&Role::Reviewer) {
            // The name is the holder's, never a secret; the digest is not quoted.
            return Err(TokenSettingsError::ClientAndReviewer {
                name: self.name.clone(),
            });
        }
        Ok((
            digest,
            Principal {
                name: self.name.clone(),
                namespaces,
                roles: self.roles.iter().copied().collect(),
            },
        ))
    }
}

/// The principals of `tokens`; an invalid entry's error is `[i].field: reason`, put in
/// context by `describe`.
fn principals(
    tokens: &[TokenSettings],
    describe: impl Fn(String) -> String,
) -> Result<Vec<(TokenDigest, Principal)>, ConfigError> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, token)| {
            token
                .principal()
                .map_err(|e| ConfigError(describe(format!("[{i}].{e}"))))
        })
        .collect()
}
