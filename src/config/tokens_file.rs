//! `tokens_file`: the `[[tokens]]` entries kept in a file of their own, for example mounted
//! from a Kubernetes Secret, so that the token digests live with the other secrets rather than
//! in the main configuration. The file is read once, when the configuration is validated at
//! start. Its errors name the setting, the file, and the entry and field at fault; they never
//! quote what the file holds.

use std::path::Path;

use serde::Deserialize;

use super::TokenSettings;

/// The file's whole content: `[[tokens]]` entries and nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenSettings>,
}

/// The entries of the file at `path`.
///
/// Errors (the message starts with the path): the file cannot be read, is not TOML, holds
/// something other than `[[tokens]]` entries, or holds none (a file meant to turn
/// authentication on must not silently leave it off).
pub(super) fn read(path: &Path) -> Result<Vec<TokenSettings>, String> {
    let at = path.display();
    if path.as_os_str().is_empty() {
        return Err("must name a file".into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{at}: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // `message()` is the parser's reason alone; the error's Display would quote the line.
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        match line {
            Some(line) => format!("{at}: line {line}: not valid TOML: {}", e.message()),
            None => format!("{at}: not valid TOML: {}", e.message()),
        }
    })?;
    let file: TokensFile =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let field = e.path().to_string();
            let reason = without_value(e.into_inner().message());
            if field == "." {
                format!("{at}: {reason}")
            } else {
                format!("{at}: {field}: {reason}")
            }
        })?;
    if file.tokens.is_empty() {
        return Err(format!("{at}: holds no [[tokens]] entry"));
    }
    Ok(file.tokens)
}

/// serde names the offending value before `, expected …` (`invalid type: string "x",
/// expected a sequence`, ``unknown variant `x`, expected one of …``): keep the kind of
/// mistake and what was expected, never the value.
fn without_value(message: &str) -> String {
    match message.split_once(", expected ") {
        Some((found, expected)) => {
            let kind = found
                .split([':', '`', '"'])
                .next()
                .unwrap_or_default()
                .trim();
            format!("{kind}, expected {expected}")
        }
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_value;

    #[test]
    fn serde_messages_keep_the_mistake_and_drop_the_value() {
        assert_eq!(
            without_value(r#"invalid type: string "tenant-a", expected a sequence"#),
            "invalid type, expected a sequence"
        );
        assert_eq!(
            without_value("unknown variant `0123abcd`, expected one of `client`, `reviewer`"),
            "unknown variant, expected one of `client`, `reviewer`"
        );
        assert_eq!(
            without_value("missing field `roles`"),
            "missing field `roles`"
        );
    }
}
