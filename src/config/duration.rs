//! Durations in the configuration: human form (`"10s"`, `"5m"`, `"1h 30m"`, `"250ms"`,
//! parsed by `humantime`), or a plain number of seconds (`2.5`), which is what the old
//! `*_seconds` keys hold. Printed in human form.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// Serializes `value` in human form (`"1m 30s"`; `"0s"` for zero).
pub(super) fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*value).to_string())
}

/// Reads a human duration or a non-negative number of seconds.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    deserializer.deserialize_any(HumanOrSeconds)
}

struct HumanOrSeconds;

impl Visitor<'_> for HumanOrSeconds {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"10s\", \"5m\" or \"250ms\", or a number of seconds")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        u64::try_from(v)
            .map(Duration::from_secs)
            .map_err(|_| E::custom("a duration must be 0 or more"))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Duration::try_from_secs_f64(v)
            .map_err(|_| E::custom("a duration must be a finite number of seconds, 0 or more"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        let v = v.trim();
        if let Ok(seconds) = v.parse::<f64>() {
            return self.visit_f64(seconds);
        }
        humantime::parse_duration(v).map_err(|e| E::custom(format!("not a duration: {e}")))
    }
}

/// `zero` as none: a duration of 0 turns the setting off.
pub(super) fn zero_is_none(value: Duration) -> Option<Duration> {
    (!value.is_zero()).then_some(value)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(with = "super")]
        d: Duration,
    }

    fn read(toml: &str) -> Result<Duration, String> {
        toml::from_str::<Holder>(toml)
            .map(|h| h.d)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn human_durations_and_plain_seconds_are_read() {
        assert_eq!(read("d = \"10s\""), Ok(Duration::from_secs(10)));
        assert_eq!(read("d = \"5m\""), Ok(Duration::from_secs(300)));
        assert_eq!(read("d = \"1h 30m\""), Ok(Duration::from_secs(5400)));
        assert_eq!(read("d = \"250ms\""), Ok(Duration::from_millis(250)));
        assert_eq!(read("d = 2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(read("d = 60"), Ok(Duration::from_secs(60)));
        assert_eq!(read("d = \"0\""), Ok(Duration::ZERO));
        assert!(read("d = -1").is_err());
        assert!(read("d = \"soon\"").is_err());
    }
}
