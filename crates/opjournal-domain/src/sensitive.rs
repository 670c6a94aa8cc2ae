//! Personal data and secrets in idempotency keys.
//!
//! A key is stored for as long as the record is kept, appears in every listing, is sent to the
//! provider and ends up in operators' terminals. The source article (step 1) says never to put
//! addresses, tokens or message content in it: a key should name the intent
//! (`payment:order-817:intent-01`) or be an opaque derived value, and business links go into
//! `references`. New keys are therefore screened, before anything is written, for four kinds
//! of data. The rules are heuristics, tuned to refuse what looks like the data without refusing
//! ordinary ids such as `order-817`, `intent-01`, dates (`2026-11-30`), epoch timestamps or
//! UUIDs. Each is applied to the key as sent and to its percent-decoded form (`%40` is `@`).
//!
//! - **E-mail address**: `local@domain.tld`: a local part of letters, digits and `._%+-`, then
//!   `@`, then dot-separated labels of letters, digits and `-`, the last one (the top-level
//!   domain) of two or more letters. `user@localhost` is not refused.
//! - **Card number**: 13 to 19 ASCII digits that pass the Luhn check and begin with 2 to 6,
//!   the first digits of the card networks (2 and 5 Mastercard, 3 American Express, Diners and
//!   JCB, 4 Visa, 6 Discover, UnionPay and Maestro), either in one group or in consecutive
//!   groups of 3 to 6 digits separated by a single space or `-` (`4111 1111 1111 1111`,
//!   `3782-822463-10005`). Every run of whole consecutive groups is checked, so a card number
//!   followed by other digit groups is still found; 2-digit groups (dates, phone numbers) are
//!   never combined. Digits touching a letter belong to a word (hex and base32 ids, `a456` in
//!   a UUID) and are not checked; a single group of more than 19 digits is an id. The leading
//!   digit keeps millisecond and nanosecond timestamps and snowflake ids (which begin with 1)
//!   from being refused one time in ten by the Luhn check alone; other 13–19 digit numbers
//!   beginning with 2 to 6 still are, about one in ten (put such ids in `references`).
//! - **Phone number**: a run of ASCII digits with separators (space, `.`, `-`, `(`, `)`;
//!   at most one space, dot or dash, one `(` and one `)` between two digit groups), not glued
//!   to a letter (in `a716-4466` the `716` belongs to the word `a716`), with 9 to 15 digits in
//!   all (E.164 allows 15), that also has one of these shapes:
//!   - it starts with `+` (`+7 916 123-45-67`, `+14155550123`);
//!   - it has a parenthesised group (`(415) 555-0123`, `8 (916) 123-45-67`);
//!   - it has at least three groups, the first of 1–4 digits and every other of 2–4 digits
//!     (`555-123-4567`, `06 12 34 56 78`, `8-916-123-45-67`).
//!
//!   Calendar dates inside the run (`YYYY-MM-DD`, `DD.MM.YYYY`, with `-`, `.` or space) are
//!   taken out first, so `case-442-2026-11-30` is a case number and a date. A bare digit
//!   string without `+` (`79161234567`) is not refused: it cannot be told from an order number
//!   or a timestamp. A dotted IPv4 address with 9 or more digits has the third shape and is
//!   refused too (it is personal data as well).
//! - **Bearer token or secret**: the word `bearer` (any case) followed by whitespace and at
//!   least 6 token characters (`Bearer abc.def.ghi`); a JWT-like triple of base64url segments
//!   (`eyJ…` — the base64 of `{"` — with first and second segments of at least 8 characters,
//!   or three segments of at least 16 characters mixing upper case, lower case and digits);
//!   or a well-known secret prefix followed by the secret's characters: `sk_live_`,
//!   `sk_test_`, `rk_live_`, `rk_test_`, `whsec_` (Stripe), `ghp_`, `gho_`, `ghu_`, `ghs_`,
//!   `ghr_`, `github_pat_` (GitHub), `glpat-` (GitLab), `xoxb-`, `xoxp-`, `xoxa-`, `xoxo-`,
//!   `xoxs-`, `xoxr-`, `xapp-` (Slack), `AKIA`, `ASIA` (AWS), `AIza` (Google), `sk-`,
//!   `sk-proj-` (OpenAI), `npm_`, `pypi-`, `SG.` (SendGrid), `shpat_`, `shpss_` (Shopify).
//!   A dotted name such as `com.example.app` or `v1.2.3` is not a token.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{FieldViolation, JournalError};
use super::model::OperationKey;
use opjournal_reasons::ErrorReason;

/// What kind of sensitive data a key appears to contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SensitiveKind {
    /// An e-mail address.
    EmailAddress,
    /// A payment card number (Luhn-valid).
    CardNumber,
    /// A phone number.
    PhoneNumber,
    /// A bearer token, a JWT or an API secret.
    BearerToken,
}

impl SensitiveKind {
    /// The stable name reported in `ErrorInfo` metadata `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EmailAddress => "email_address",
            Self::CardNumber => "card_number",
            Self::PhoneNumber => "phone_number",
            Self::BearerToken => "bearer_token",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::EmailAddress => "an e-mail address",
            Self::CardNumber => "a payment card number",
            Self::PhoneNumber => "a phone number",
            Self::BearerToken => "a bearer token or secret",
        }
    }
}

/// Refuses a new idempotency key that appears to contain personal data or a secret.
///
/// Errors: `INVALID_ARGUMENT`, reason `KEY_CONTAINS_SENSITIVE_DATA`, a field violation on
/// `operation_key` naming the kind found (never the value), and metadata `kind`.
pub fn check_key(key: &OperationKey) -> Result<(), JournalError> {
    match find_sensitive_data(key.as_str()) {
        None => Ok(()),
        Some(kind) => Err(JournalError::InvalidArgument {
            reason: ErrorReason::KeyContainsSensitiveData,
            violation: FieldViolation::new(
                "operation_key",
                format!(
                    "appears to contain {}; keep personal data and secrets out of keys \
                     (derive an opaque key with DeriveOperationKey and put business links \
                     in references)",
                    kind.description()
                ),
            ),
            metadata: [("kind".to_owned(), kind.as_str().to_owned())].into(),
        }),
    }
}

/// Refuses a new key that begins or ends with whitespace: HTTP header values are trimmed
/// (RFC 9110, section 5.5), so a provider would record the effect under another key than the
/// one a reconcile lookup asks for, and its "not found" would wrongly prove absence.
///
/// Errors: `INVALID_ARGUMENT`, reason `INVALID_OPERATION_KEY`, field `operation_key`.
pub fn check_key_form(key: &OperationKey) -> Result<(), JournalError> {
    let text = key.as_str();
    if text.trim() == text {
        return Ok(());
    }
    Err(JournalError::InvalidArgument {
        reason: ErrorReason::InvalidOperationKey,
        violation: FieldViolation::new(
            "operation_key",
            "must not begin or end with whitespace: providers receive keys in HTTP headers, \
             which are trimmed",
        ),
        metadata: Default::default(),
    })
}

/// The first kind of sensitive data found in `text`, checked in the order e-mail address,
/// card number, phone number, token; the percent-decoded text is checked too.
pub fn find_sensitive_data(text: &str) -> Option<SensitiveKind> {
    let decoded = if text.contains('%') {
        percent_encoding::percent_decode_str(text).decode_utf8_lossy()
    } else {
        Cow::Borrowed(text)
    };
    let mut candidates = vec![text];
    if decoded != text {
        candidates.push(&decoded);
    }
    candidates.into_iter().find_map(classify)
}

fn classify(text: &str) -> Option<SensitiveKind> {
    // A UUID's all-digit segments are neither a card nor a phone number.
    let digits_text = UUID.replace_all(text, "uuid");
    if EMAIL.is_match(text) {
        Some(SensitiveKind::EmailAddress)
    } else if contains_card_number(&digits_text) {
        Some(SensitiveKind::CardNumber)
    } else if contains_phone_number(&digits_text) {
        Some(SensitiveKind::PhoneNumber)
    } else if contains_token(text) {
        Some(SensitiveKind::BearerToken)
    } else {
        None
    }
}

fn compile(pattern: &str) -> Regex {
    // The patterns are constants covered by the tests below.
    Regex::new(pattern).expect("a valid built-in pattern")
}

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"[\p{L}\p{N}._%+\-]+@[\p{L}\p{N}](?:[\p{L}\p{N}\-]*[\p{L}\p{N}])?(?:\.[\p{L}\p{N}](?:[\p{L}\p{N}\-]*[\p{L}\p{N}])?)*\.\p{L}{2,}",
    )
});

static UUID: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"));

static BEARER: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{6,}"));

static JWT_HEADER: LazyLock<Regex> =
    LazyLock::new(|| compile(r"eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"));

static OPAQUE_TRIPLE: LazyLock<Regex> =
    LazyLock::new(|| compile(r"[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"));

static SECRET_PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    compile(concat!(
        r"(?:^|[^A-Za-z0-9])(?:",
        r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}",
        r"|whsec_[A-Za-z0-9]{8,}",
        r"|gh[pousr]_[A-Za-z0-9]{20,}",
        r"|github_pat_[A-Za-z0-9_]{20,}",
        r"|glpat-[A-Za-z0-9_\-]{20,}",
        r"|xox[abposr]-[A-Za-z0-9\-]{10,}",
        r"|xapp-[A-Za-z0-9\-]{10,}",
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}",
        r"|AIza[0-9A-Za-z_\-]{35}",
        r"|sk-(?:proj-)?[A-Za-z0-9_\-]{20,}",
        r"|npm_[A-Za-z0-9]{36}",
        r"|pypi-[A-Za-z0-9_\-]{16,}",
        r"|SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
        r"|shp(?:at|ss|ca|pa)_[A-Fa-f0-9]{32}",
        r")",
    ))
});

fn contains_token(text: &str) -> bool {
    BEARER.is_match(text)
        || JWT_HEADER.is_match(text)
        || SECRET_PREFIX.is_match(text)
        || OPAQUE_TRIPLE.find_iter(text).any(|m| {
            let s = m.as_str();
            s.chars().any(|c| c.is_ascii_uppercase())
                && s.chars().any(|c| c.is_ascii_lowercase())
                && s.chars().any(|c| c.is_ascii_digit())
        })
}

/// The Luhn (mod 10) check of a string of ASCII digits.
pub fn luhn_valid(digits: &str) -> bool {
    let mut sum = 0u32;
    for (i, b) in digits.bytes().rev().enumerate() {
        if !b.is_ascii_digit() {
            return false;
        }
        let mut d = u32::from(b - b'0');
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// A group of ASCII digits, and whether a letter touches it on either side.
#[derive(Debug, Clone, Copy)]
struct DigitGroup<'a> {
    digits: &'a str,
    glued_left: bool,
    glued_right: bool,
}

/// Runs of digit groups separated by exactly one of `separators`.
fn digit_runs<'a>(text: &'a str, separators: &[u8]) -> Vec<Vec<DigitGroup<'a>>> {
    let bytes = text.as_bytes();
    let mut runs = Vec::new();
    let mut current = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        current.push(DigitGroup {
            digits: &text[start..i],
            glued_left: text[..start]
                .chars()
                .next_back()
                .is_some_and(char::is_alphabetic),
            glued_right: text[i..].chars().next().is_some_and(char::is_alphabetic),
        });
        let joined =
            i + 1 < bytes.len() && separators.contains(&bytes[i]) && bytes[i + 1].is_ascii_digit();
        if joined {
            i += 1;
        } else {
            runs.push(std::mem::take(&mut current));
        }
    }
    runs
}

/// Whether whole consecutive groups of one run form a card number. Groups are combined only
/// when each has 3 to 6 digits, as printed card numbers are grouped (`4111 1111 1111 1111`,
/// `3782 822463 10005`), so dates and phone numbers are not combined. Digits touching a letter
/// belong to a word (a hex or base32 id such as `5f0e…7a`, or `a456` in a UUID) and are never
/// taken for a card number.
fn contains_card_number(text: &str) -> bool {
    digit_runs(text, b" -").iter().any(|groups| {
        (0..groups.len()).any(|first| {
            let mut digits = String::new();
            for (last, group) in groups.iter().enumerate().skip(first) {
                digits.push_str(group.digits);
                if digits.len() > 19 {
                    break;
                }
                let combinable = !(groups[first].glued_left || group.glued_right)
                    && (first == last
                        || groups[first..=last]
                            .iter()
                            .all(|g| (3..=6).contains(&g.digits.len())));
                if digits.len() >= 13
                    && combinable
                    && matches!(digits.as_bytes()[0], b'2'..=b'6')
                    && luhn_valid(&digits)
                {
                    return true;
                }
            }
            false
        })
    })
}

/// One digit group of a phone candidate and the separator text before it.
#[derive(Debug, Clone, Copy)]
struct Group<'a> {
    before: &'a str,
    digits: &'a str,
    after: &'a str,
}

const PHONE_CHARS: &[u8] = b"0123456789+(). -";

fn contains_phone_number(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !PHONE_CHARS.contains(&bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && PHONE_CHARS.contains(&bytes[i]) {
            i += 1;
        }
        let glued_left = text[..start]
            .chars()
            .next_back()
            .is_some_and(char::is_alphanumeric);
        let glued_right = text[i..].chars().next().is_some_and(char::is_alphanumeric);
        if span_has_phone(&text[start..i], glued_left, glued_right) {
            return true;
        }
    }
    false
}

/// Splits a span of phone characters into digit groups with the text around each.
fn groups_of(span: &str) -> Vec<Group<'_>> {
    let bytes = span.as_bytes();
    let mut bounds = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            bounds.push((start, i));
        } else {
            i += 1;
        }
    }
    bounds
        .iter()
        .enumerate()
        .map(|(n, &(start, end))| {
            let before_start = if n == 0 { 0 } else { bounds[n - 1].1 };
            let after_end = bounds.get(n + 1).map_or(span.len(), |b| b.0);
            Group {
                before: &span[before_start..start],
                digits: &span[start..end],
                after: &span[end..after_end],
            }
        })
        .collect()
}

/// Whether the text between two digit groups can separate parts of one phone number.
fn joins(separator: &str) -> bool {
    let plain = separator.bytes().filter(|b| b" .-".contains(b)).count();
    let open = separator.bytes().filter(|&b| b == b'(').count();
    let close = separator.bytes().filter(|&b| b == b')').count();
    !separator.contains('+') && plain <= 1 && open <= 1 && close <= 1
}

fn span_has_phone(span: &str, glued_left: bool, glued_right: bool) -> bool {
    let mut groups = groups_of(span);
    // Digits glued to a letter belong to a word (`a716`, `v1`), not to a number.
    if glued_right && span.as_bytes().last().is_some_and(u8::is_ascii_digit) {
        groups.pop();
    }
    if glued_left && span.as_bytes().first().is_some_and(u8::is_ascii_digit) && !groups.is_empty() {
        groups.remove(0);
    }
    let mut pieces: Vec<Vec<Group<'_>>> = vec![Vec::new()];
    for group in groups {
        let piece = pieces.last_mut();
        match piece {
            Some(piece) if piece.is_empty() || joins(group.before) => piece.push(group),
            _ => pieces.push(vec![group]),
        }
    }
    pieces
        .into_iter()
        .flat_map(without_dates)
        .any(|piece| piece_is_phone(&piece))
}

/// The piece split around calendar dates (`YYYY-MM-DD`, `DD.MM.YYYY`; `-`, `.` or space).
fn without_dates(piece: Vec<Group<'_>>) -> Vec<Vec<Group<'_>>> {
    let mut out = vec![Vec::new()];
    let mut i = 0;
    while i < piece.len() {
        if i + 2 < piece.len() && is_date(&piece[i..i + 3]) {
            out.push(Vec::new());
            i += 3;
            continue;
        }
        if let Some(last) = out.last_mut() {
            last.push(piece[i]);
        }
        i += 1;
    }
    out.retain(|p| !p.is_empty());
    out
}

fn is_date(groups: &[Group<'_>]) -> bool {
    let separator = groups[0].after;
    if !matches!(separator, "-" | "." | " ") || groups[1].after != separator {
        return false;
    }
    let number = |g: &Group<'_>| g.digits.parse::<u32>().unwrap_or(0);
    let lengths = (
        groups[0].digits.len(),
        groups[1].digits.len(),
        groups[2].digits.len(),
    );
    let (year, month, day) = match lengths {
        (4, 2, 2) => (number(&groups[0]), number(&groups[1]), number(&groups[2])),
        (2, 2, 4) => (number(&groups[2]), number(&groups[1]), number(&groups[0])),
        _ => return false,
    };
    (1900..=2199).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day)
}

fn piece_is_phone(piece: &[Group<'_>]) -> bool {
    let Some(first) = piece.first() else {
        return false;
    };
    let digits: usize = piece.iter().map(|g| g.digits.len()).sum();
    if !(9..=15).contains(&digits) {
        return false;
    }
    let plus = first.before.trim_end_matches(['(', ' ']).ends_with('+');
    let parenthesised = piece
        .iter()
        .any(|g| g.before.ends_with('(') && g.after.starts_with(')') && g.digits.len() <= 5);
    let grouped = piece.len() >= 3
        && (1..=4).contains(&first.digits.len())
        && piece[1..].iter().all(|g| (2..=4).contains(&g.digits.len()));
    plus || parenthesised || grouped
}

/// A per-action pattern that every new key of the action must match as a whole (the pattern
/// is anchored at both ends), written in the syntax of the `regex` crate. It serializes as
/// the pattern text, and two patterns are equal when their texts are.
#[derive(Debug, Clone)]
pub struct KeyPattern {
    source: String,
    regex: Regex,
}

/// Why a `key_pattern` is refused: it is not a valid regular expression, or compiles to more
/// than the size limit. The message quotes the `regex` crate's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid regular expression: {reason}")]
pub struct KeyPatternError {
    /// What the `regex` crate found wrong, as it words it.
    pub reason: String,
}

impl KeyPattern {
    /// Compiles `pattern`, anchored at both ends.
    ///
    /// Errors: the pattern is not a valid regular expression, or is too large.
    pub fn new(pattern: &str) -> Result<Self, KeyPatternError> {
        let regex = regex::RegexBuilder::new(&format!(r"\A(?:{pattern})\z"))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| KeyPatternError {
                reason: e.to_string(),
            })?;
        Ok(Self {
            source: pattern.to_owned(),
            regex,
        })
    }

    /// Whether the whole key matches.
    pub fn matches(&self, key: &OperationKey) -> bool {
        self.regex.is_match(key.as_str())
    }

    /// The pattern as written in the policy file.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl PartialEq for KeyPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Serialize for KeyPattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

impl<'de> Deserialize<'de> for KeyPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = String::deserialize(deserializer)?;
        Self::new(&source).map_err(serde::de::Error::custom)
    }
}

/// Refuses a key that does not match its action's `key_pattern`.
///
/// Errors: `INVALID_ARGUMENT`, reason `KEY_PATTERN_MISMATCH`, a field violation on
/// `operation_key` (the key is not quoted).
pub fn check_pattern(key: &OperationKey, pattern: &KeyPattern) -> Result<(), JournalError> {
    if pattern.matches(key) {
        return Ok(());
    }
    Err(JournalError::invalid(
        ErrorReason::KeyPatternMismatch,
        FieldViolation::new(
            "operation_key",
            "does not match the key_pattern of its action type in the policy file",
        ),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn kind(key: &str) -> Option<SensitiveKind> {
        find_sensitive_data(key)
    }

    #[test]
    fn keys_with_surrounding_whitespace_are_refused() {
        for bad in ["payment:1 ", " payment:1", "payment:1\u{a0}", "\u{2003}x"] {
            let key = OperationKey::parse(bad).unwrap();
            let Err(JournalError::InvalidArgument { reason, .. }) = check_key_form(&key) else {
                panic!("{bad:?} was accepted");
            };
            assert_eq!(reason, "INVALID_OPERATION_KEY");
        }
        assert!(check_key_form(&OperationKey::parse("payment:order 817").unwrap()).is_ok());
    }

    #[test]
    fn the_articles_example_keys_pass() {
        for key in [
            "payment:order-817:intent-01",
            "email:case-442:confirmation-v1",
            "application:user-93:program-2026",
        ] {
            assert_eq!(kind(key), None, "{key}");
        }
    }

    #[test]
    fn the_must_show_keys_are_refused_with_their_kind() {
        assert_eq!(
            kind("pay:alice@example.com:1"),
            Some(SensitiveKind::EmailAddress)
        );
        assert_eq!(
            kind("card:4111111111111111"),
            Some(SensitiveKind::CardNumber)
        );
        assert_eq!(
            kind("tok:Bearer abc.def.ghi"),
            Some(SensitiveKind::BearerToken)
        );
    }

    #[test]
    fn ordinary_ids_dates_timestamps_and_uuids_pass() {
        for key in [
            "order-817",
            "intent-01",
            "2026-11-30",
            "report:2026-11-30:batch-0001",
            "case-442-2026-11-30",
            "case-442-30.11.2026",
            "run-2026-11-30-1200",
            "550e8400-e29b-41d4-a716-446655440000",
            "123e4567-e89b-12d3-a456-426614174000",
            "00000000-0000-0000-0000-000000000000",
            "f47ac10b-58cc-4372-a567-0e02b2c3d479",
            "job:1735689600123",
            "event:1735689600123456789",
            "invoice-000123456",
            "v1.2.3",
            "release-1.22.3",
            "com.example.app",
            "order-817-item-3",
            "host-10.0.0.1",
            "user@localhost",
            "task-12345",
            "desk-sk-1",
            "sku:AB-1234-XY",
            "ok_mzxw6ytboi",
            "pay:order-817:amount-490000",
            "2026.11.30",
            "bearer-bonds:order-1",
        ] {
            assert_eq!(kind(key), None, "{key}");
        }
    }

    #[test]
    fn random_uuids_never_look_sensitive() {
        for _ in 0..2000 {
            let id = uuid::Uuid::new_v4();
            assert_eq!(kind(&format!("op:{id}")), None, "{id}");
            assert_eq!(kind(&format!("op-{}", id.simple())), None, "{id}");
        }
    }

    #[test]
    fn derived_keys_never_look_sensitive() {
        use crate::derived_key::KeyDeriver;
        use crate::model::{ActionType, Namespace};
        let deriver = KeyDeriver::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let namespace = Namespace::parse("").unwrap();
        let action = ActionType::parse("create_payment").unwrap();
        for n in 0..5000 {
            let key = deriver
                .derive(&namespace, &action, &format!("intent-{n}"))
                .unwrap();
            assert_eq!(kind(key.as_str()), None, "{key}");
        }
    }

    #[test]
    fn email_addresses_are_found_also_percent_encoded() {
        for key in [
            "alice@example.com",
            "notify:Bob.Smith+tag@mail.example.co.uk",
            "x:alice%40example.com",
            "алиса@пример.рф",
        ] {
            assert_eq!(kind(key), Some(SensitiveKind::EmailAddress), "{key}");
        }
    }

    #[test]
    fn card_numbers_are_found_in_groups_and_next_to_other_digits() {
        for key in [
            "4111 1111 1111 1111",
            "card:4111-1111-1111-1111",
            "5500005555555559",
            "amex:378282246310005",
            "pay:4111-1111-1111-1111-2026",
            "card:6011111111111117",
        ] {
            assert_eq!(kind(key), Some(SensitiveKind::CardNumber), "{key}");
        }
        // Luhn fails, or the first digit is not a card network's.
        assert_eq!(kind("card:4111111111111112"), None);
        assert_eq!(kind("ts:1234567890128"), None);
        // Digits inside a word: hex and base32 ids.
        assert_eq!(kind("id-244772419519657a"), None);
        assert_eq!(kind("x4111111111111111y"), None);
        assert_eq!(kind("01J2A052123B31C1893A42476638312654"), None);
    }

    #[test]
    fn the_luhn_check_matches_known_numbers() {
        assert!(luhn_valid("4111111111111111"));
        assert!(luhn_valid("79927398713"));
        assert!(!luhn_valid("79927398710"));
        assert!(!luhn_valid(""));
        assert!(!luhn_valid("4111a"));
    }

    #[test]
    fn phone_numbers_are_found_in_common_layouts() {
        for key in [
            "+7 916 123-45-67",
            "sms:+14155550123",
            "call:(415) 555-0123",
            "notify:8 (916) 123-45-67",
            "notify:8-916-123-45-67",
            "sms:555.123.4567",
            "fr:06 12 34 56 78",
            "uk:+44 20 7946 0958",
            "sms:1-800-555-0199",
            "sms:+7(916)1234567",
            "x:%2B79161234567",
        ] {
            assert_eq!(kind(key), Some(SensitiveKind::PhoneNumber), "{key}");
        }
    }

    #[test]
    fn tokens_and_secrets_are_found() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        for key in [
            "tok:Bearer abc.def.ghi",
            "auth:bearer   abcdefgh",
            "tok:BEARER%20abcdef123",
            jwt,
            &format!("session:{jwt}"),
            "key:sk_live_51HxYz0123456789",
            "gh:ghp_0123456789abcdefghijABCDEFGHIJ",
            "slack:xoxb-1234567890-abcdefghij",
            "aws:AKIAIOSFODNN7EXAMPLE",
            "x:Q2xpZW50U2VjcmV0MTIz.U2lnbmF0dXJlUGFydDQ1Ng.QW5vdGhlclBhcnQ3ODkw",
        ] {
            assert_eq!(kind(key), Some(SensitiveKind::BearerToken), "{key}");
        }
    }

    #[test]
    fn a_refusal_names_the_kind_and_never_the_value() {
        let key = OperationKey::parse("pay:alice@example.com:1").unwrap();
        let JournalError::InvalidArgument {
            reason,
            violation,
            metadata,
        } = check_key(&key).unwrap_err()
        else {
            panic!("not an invalid argument");
        };
        assert_eq!(reason, "KEY_CONTAINS_SENSITIVE_DATA");
        assert_eq!(violation.field, "operation_key");
        assert!(violation.description.contains("e-mail address"));
        assert!(!violation.description.contains("alice"));
        assert_eq!(metadata.get("kind").unwrap(), "email_address");
    }

    #[test]
    fn a_key_pattern_must_match_the_whole_key() {
        let pattern = KeyPattern::new("payment:order-[0-9]+:intent-[0-9]{2}").unwrap();
        let good = OperationKey::parse("payment:order-817:intent-01").unwrap();
        let longer = OperationKey::parse("payment:order-817:intent-01:x").unwrap();
        assert!(check_pattern(&good, &pattern).is_ok());
        assert!(check_pattern(&longer, &pattern).is_err());
        assert!(KeyPattern::new("(unclosed").is_err());
        assert_eq!(pattern.as_str(), "payment:order-[0-9]+:intent-[0-9]{2}");
    }
}
