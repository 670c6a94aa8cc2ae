//! The flat keys of the first configuration format (`max_in_flight_requests = 128` at the
//! top of the file, `OPJOURNAL_MAX_IN_FLIGHT_REQUESTS`), still read: each is moved to its
//! place in the sectioned form before the configuration is extracted, and reported once as
//! deprecated, naming the new key. Command-line flags use the same table, silently.

use std::sync::LazyLock;

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::ConfigError;

/// One flat key and where it lives now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// The old, flat key (`reconcile_poll_seconds`).
    pub old: &'static str,
    /// The section it moved to (`reconcile`).
    pub section: &'static str,
    /// Its name in the section (`poll_interval`).
    pub key: &'static str,
}

impl Moved {
    /// The notice for the key found in a file.
    pub fn in_file(&self) -> String {
        format!(
            "{} is deprecated: use [{}] {}",
            self.old, self.section, self.key
        )
    }

    /// The notice for the key found in the environment.
    pub fn in_environment(&self) -> String {
        format!(
            "{} is deprecated: use {}",
            legacy_variable(self.old),
            variable(self.section, self.key)
        )
    }
}

/// `OPJOURNAL_<SECTION>__<KEY>`, the environment variable of a sectioned key.
pub fn variable(section: &str, key: &str) -> String {
    format!(
        "OPJOURNAL_{}__{}",
        section.to_ascii_uppercase(),
        key.to_ascii_uppercase()
    )
}

/// `OPJOURNAL_<KEY>`, the environment variable of a flat key.
pub fn legacy_variable(old: &str) -> String {
    format!("OPJOURNAL_{}", old.to_ascii_uppercase())
}

/// Every flat key, in the order of the old documentation (`moved_keys.txt`: one
/// `<flat key> <section>.<key>` a line).
pub static MOVED: LazyLock<Vec<Moved>> = LazyLock::new(|| {
    include_str!("moved_keys.txt")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (old, place) = line
                .split_once(char::is_whitespace)
                .expect("moved_keys.txt: a line is `<flat key> <section>.<key>`");
            let (section, key) = place
                .trim()
                .split_once('.')
                .expect("moved_keys.txt: the new place is `<section>.<key>`");
            Moved { old, section, key }
        })
        .collect()
});

/// The flat key `old`, if it is one.
pub fn find(old: &str) -> Option<&'static Moved> {
    MOVED.iter().find(|m| m.old.eq_ignore_ascii_case(old))
}

/// A provider's data with its flat keys moved into their sections; its metadata (which
/// names the file or the environment in errors) is the provider's own.
pub struct Nested {
    metadata: Metadata,
    data: Map<Profile, Dict>,
}

impl Nested {
    /// `provider`'s data with the flat keys moved, and the keys that were moved, each once.
    ///
    /// Errors: the provider's own (a file that is not TOML).
    pub fn new(provider: &impl Provider) -> Result<(Self, Vec<&'static Moved>), ConfigError> {
        let mut data = provider.data().map_err(|e| ConfigError(e.to_string()))?;
        let mut found = Vec::new();
        for dict in data.values_mut() {
            for moved in nest(dict) {
                if !found.contains(&moved) {
                    found.push(moved);
                }
            }
        }
        let metadata = provider.metadata();
        Ok((Self { metadata, data }, found))
    }
}

impl Provider for Nested {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(self.data.clone())
    }
}

/// Moves every flat key of `dict` into its section; a key set both ways keeps the new
/// one's value.
fn nest(dict: &mut Dict) -> Vec<&'static Moved> {
    let mut found = Vec::new();
    for moved in MOVED.iter() {
        let Some(value) = dict.remove(moved.old) else {
            continue;
        };
        found.push(moved);
        let section = dict
            .entry(moved.section.to_owned())
            .or_insert_with(|| Value::from(Dict::new()));
        if let Value::Dict(_, section) = section {
            section.entry(moved.key.to_owned()).or_insert(value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flat_key_moves_to_a_distinct_place() {
        let mut seen = std::collections::BTreeSet::new();
        for moved in MOVED.iter() {
            assert!(
                seen.insert((moved.section, moved.key)),
                "{} and another key move to one place",
                moved.old
            );
            assert_eq!(find(moved.old), Some(moved));
        }
        assert_eq!(
            find("max_in_flight_requests")
                .map(Moved::in_file)
                .as_deref(),
            Some("max_in_flight_requests is deprecated: use [limits] max_in_flight_requests")
        );
        assert_eq!(
            find("database_url").map(Moved::in_environment).as_deref(),
            Some("OPJOURNAL_DATABASE_URL is deprecated: use OPJOURNAL_DATABASE__URL")
        );
    }
}
