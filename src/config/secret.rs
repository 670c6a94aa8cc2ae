//! Settings that hold secrets: a database URL with its password, a webhook URL with its
//! token, signing and derivation keys. Held in a `secrecy` box (zeroed on drop); `Debug`
//! and serialization (what `check-config` prints) show `[redacted]`.

use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize, Serializer};

/// A secret setting: its `Debug` and serialized forms are `[redacted]`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(SecretString);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(SecretString::from(value.into()))
    }

    /// The secret's value, for the one place that uses it.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("[redacted]")
    }
}

/// A database URL: the URL is shown (which database, where) but not its password, neither
/// in the user part nor as a `password` parameter.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(Secret);

impl DatabaseUrl {
    /// The URL `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(Secret::new(value))
    }

    /// The whole URL, password included, for connecting.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    /// The URL with any password replaced by `redacted`; `[redacted]` when it does not
    /// parse.
    pub fn redacted(&self) -> String {
        let Ok(mut url) = reqwest::Url::parse(self.expose()) else {
            return "[redacted]".into();
        };
        if url.password().is_some() && url.set_password(Some("redacted")).is_err() {
            return "[redacted]".into();
        }
        if url.query().is_some() {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let hidden = k.to_ascii_lowercase().contains("password");
                    let v = if hidden {
                        "redacted".into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        url.to_string()
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for DatabaseUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_shows_where_but_not_the_password() {
        let url =
            DatabaseUrl::new("postgres://app:hunter2@db.internal:5432/journal?sslmode=require");
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("db.internal:5432/journal"), "{shown}");
        let query = DatabaseUrl::new("postgres://db/j?password=hunter2");
        assert!(!query.redacted().contains("hunter2"));
        assert_eq!(
            DatabaseUrl::new("sqlite://opjournal-data/journal.db").redacted(),
            "sqlite://opjournal-data/journal.db"
        );
        assert_eq!(format!("{:?}", Secret::new("k")), "[redacted]");
    }
}
