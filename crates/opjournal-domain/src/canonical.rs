//! Strict JSON parsing and the request hash that binds an idempotency key to a request.
//!
//! A retried call is only safe if the journal can tell "the same request again" from "a different
//! request under the same key". Two different requests must therefore never share a hash, while
//! member order and insignificant whitespace must never change it. We get the second property
//! from RFC 8785 (JCS), but JCS libraries quietly break the first one: `serde_json` (and so
//! `serde_json_canonicalizer`) keeps the last of duplicate members, rounds integers beyond 2^53 to
//! the nearest double, and a canonicalizer cannot see what was lost. `{"amount":1,"amount":9}` and
//! `{"amount":9}`, or two account numbers that differ past the 16th digit, would hash alike.
//!
//! So we refuse every input that is not I-JSON (RFC 7493) *before* hashing, with our own small
//! parser, and say where (an RFC 6901 JSON Pointer) without echoing the value, which may be
//! personal data. Once the input is I-JSON, the JCS text is a faithful image of it.

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// Default nesting limit: at most this many nested arrays/objects, so a hostile payload cannot
/// exhaust the stack of the recursive parser.
pub const MAX_DEPTH: usize = 64;
/// Default size limit for one JSON text: 1 MiB.
pub const MAX_BYTES: usize = 1_048_576;
/// Largest integer magnitude an IEEE-754 double holds exactly, 2^53 - 1 (RFC 7493 section 2.2).
const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// Resource limits for [`parse_strict`]. Defaults: [`MAX_BYTES`] and [`MAX_DEPTH`].
///
/// `max_depth` bounds recursion; raising it far above the default can overflow the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted text, in bytes of UTF-8.
    pub max_bytes: usize,
    /// Most nested arrays/objects; a top-level object alone is depth 1.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: MAX_BYTES,
            max_depth: MAX_DEPTH,
        }
    }
}

/// Why a JSON text was refused, and where.
///
/// `pointer` is the RFC 6901 JSON Pointer of the member or element whose value (or, for
/// `DuplicateMember`, whose repeated name) broke the rule. Problems between members or elements
/// (a missing `,`, a trailing comma, a bad member name) point at the enclosing container; `""` is
/// the root. `offset` is the byte offset in the text. The `Display` text names the rule and the
/// place, never the offending value, which may be personal data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at JSON pointer \"{pointer}\" (byte {offset})")]
pub struct JsonError {
    /// RFC 6901 pointer (`~` written `~0`, `/` written `~1`); `""` is the whole document.
    pub pointer: String,
    /// Which rule was broken.
    pub kind: JsonErrorKind,
    /// Byte offset in the input where the problem was detected.
    pub offset: usize,
}

/// The rule a refused JSON text broke. See [`JsonErrorKind::rule`] for stable names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonErrorKind {
    /// Not RFC 8259 JSON; the text says what was expected, never what was found.
    #[error("syntax error: {0} (RFC 8259)")]
    Syntax(String),
    /// The same member name twice in one object, compared after unescaping (RFC 7493 section 2.3).
    #[error("duplicate member name (RFC 7493 section 2.3)")]
    DuplicateMember,
    /// Integer literal beyond +/-(2^53-1) (RFC 7493 section 2.2).
    #[error("integer magnitude exceeds 2^53-1; send it as a string (RFC 7493 section 2.2)")]
    IntegerOutOfRange,
    /// Number whose decimal value is not the shortest round-trip form of the IEEE-754 double it
    /// parses to, i.e. not what RFC 8785 section 3.2.2.3 would write back (RFC 7493 section 2.2).
    #[error(
        "number does not survive a round trip through an IEEE-754 double; send it as a string (RFC 7493 section 2.2)"
    )]
    NumberNotRepresentable,
    /// Number beyond the range of a double; JCS has no text for infinity (RFC 8785 section
    /// 3.2.2.3, RFC 7493 section 2.2).
    #[error("number overflows an IEEE-754 double (RFC 8785 section 3.2.2.3)")]
    NonFiniteNumber,
    /// `\u` escape of an unpaired UTF-16 surrogate (RFC 7493 section 2.1, RFC 8259 section 8.2).
    #[error("string contains an unpaired surrogate escape (RFC 7493 section 2.1)")]
    LoneSurrogate,
    /// Nesting deeper than [`Limits::max_depth`] (RFC 8259 section 9 allows the limit).
    #[error("nesting deeper than the configured limit (RFC 8259 section 9)")]
    TooDeep,
    /// Text longer than [`Limits::max_bytes`] (RFC 8259 section 9 allows the limit).
    #[error("text larger than the configured limit (RFC 8259 section 9)")]
    TooLarge,
    /// The top-level value is not an object.
    #[error("payload must be a JSON object")]
    NotAnObject,
}

impl JsonErrorKind {
    /// Stable snake_case rule name for error metadata: `syntax`, `duplicate_member`,
    /// `integer_out_of_range`, `number_not_representable`, `non_finite_number`,
    /// `lone_surrogate`, `too_deep`, `too_large`, `not_an_object`.
    pub fn rule(&self) -> &'static str {
        match self {
            Self::Syntax(_) => "syntax",
            Self::DuplicateMember => "duplicate_member",
            Self::IntegerOutOfRange => "integer_out_of_range",
            Self::NumberNotRepresentable => "number_not_representable",
            Self::NonFiniteNumber => "non_finite_number",
            Self::LoneSurrogate => "lone_surrogate",
            Self::TooDeep => "too_deep",
            Self::TooLarge => "too_large",
            Self::NotAnObject => "not_an_object",
        }
    }
}

/// Parses I-JSON text strictly; any JSON value is allowed at top level.
///
/// Grammar is RFC 8259 exactly (no comments, trailing commas, leading zeros, `NaN`/`Infinity`,
/// BOM, or whitespace other than space, tab, LF, CR). On top of it the I-JSON rules of RFC 7493
/// section 2 are enforced as described on [`JsonErrorKind`]. Numbers are stored as integers when
/// their value is an integer of magnitude at most 2^53-1 (so `1.0` and `1` parse equal), otherwise
/// as `f64`.
///
/// # Errors
/// Any [`JsonErrorKind`] except `NotAnObject`.
pub fn parse_strict(text: &str, limits: &Limits) -> Result<Value, JsonError> {
    if text.len() > limits.max_bytes {
        return Err(JsonError {
            pointer: String::new(),
            kind: JsonErrorKind::TooLarge,
            offset: limits.max_bytes,
        });
    }
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        max_depth: limits.max_depth,
        path: Vec::new(),
    };
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(p.syntax("end of input after the top-level value"));
    }
    Ok(value)
}

/// Parses like [`parse_strict`] and requires the top-level value to be an object.
///
/// # Errors
/// Those of [`parse_strict`], or `NotAnObject` (pointer `""`) for any other top-level value.
pub fn parse_object(text: &str, limits: &Limits) -> Result<Map<String, Value>, JsonError> {
    match parse_strict(text, limits)? {
        Value::Object(map) => Ok(map),
        _ => {
            let offset = text.len() - text.trim_start_matches([' ', '\t', '\n', '\r']).len();
            Err(JsonError {
                pointer: String::new(),
                kind: JsonErrorKind::NotAnObject,
                offset,
            })
        }
    }
}

/// RFC 8785 canonical text of a value produced by [`parse_strict`], via `serde_json_canonicalizer`
/// (members sorted by UTF-16 code units, section 3.2.3; ECMAScript number form, section 3.2.2.3).
///
/// Values not from [`parse_strict`] may hold integers beyond 2^53, which JCS silently rounds.
///
/// # Panics
/// Never in practice: a `serde_json::Value` cannot hold NaN/infinity (the canonicalizer's only
/// failure for a `Value`) and writing to a `Vec` cannot fail.
pub fn canonicalize(value: &Value) -> String {
    serde_json_canonicalizer::to_string(value).expect("a serde_json::Value always has a JCS form")
}

/// SHA-256 of the RFC 8785 canonical form of `{"action_type": …, "payload": …}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    /// Hashes the JCS (RFC 8785) text of `{"action_type": action_type, "payload": payload}`.
    /// `payload` should come from [`parse_object`] so that it is I-JSON (RFC 7493).
    pub fn compute(action_type: &str, payload: &Map<String, Value>) -> Self {
        let mut envelope = Map::new();
        envelope.insert(
            "action_type".to_owned(),
            Value::String(action_type.to_owned()),
        );
        envelope.insert("payload".to_owned(), Value::Object(payload.clone()));
        Self(Sha256::digest(canonicalize(&Value::Object(envelope)).as_bytes()).into())
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits (either case); `None` for any other length or character.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s, &mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// The raw 32-byte digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Display for RequestHash {
    /// Writes the lowercase 64-character hex digest.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Convenience: [`parse_object`] then [`RequestHash::compute`].
///
/// # Errors
/// Those of [`parse_object`]; nothing is hashed unless the payload is an I-JSON object.
pub fn request_hash(
    action_type: &str,
    payload_json: &str,
    limits: &Limits,
) -> Result<RequestHash, JsonError> {
    Ok(RequestHash::compute(
        action_type,
        &parse_object(payload_json, limits)?,
    ))
}

/// One step of the path to the value being parsed.
enum Segment {
    Key(String),
    Index(usize),
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
    path: Vec<Segment>,
}

impl Parser<'_> {
    fn pointer(&self) -> String {
        let mut out = String::new();
        for seg in &self.path {
            out.push('/');
            match seg {
                Segment::Key(k) => out.push_str(&k.replace('~', "~0").replace('/', "~1")),
                Segment::Index(i) => out.push_str(&i.to_string()),
            }
        }
        out
    }

    fn fail(&self, kind: JsonErrorKind, offset: usize) -> JsonError {
        JsonError {
            pointer: self.pointer(),
            kind,
            offset,
        }
    }

    fn syntax(&self, expected: &str) -> JsonError {
        self.fail(
            JsonErrorKind::Syntax(format!("expected {expected}")),
            self.pos,
        )
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8, expected: &str) -> Result<(), JsonError> {
        self.skip_ws();
        if self.peek() != Some(byte) {
            return Err(self.syntax(expected));
        }
        self.pos += 1;
        Ok(())
    }

    /// `depth` is the number of containers around the value.
    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.skip_ws();
        match self.peek() {
            Some(b'{' | b'[') if depth >= self.max_depth => {
                Err(self.fail(JsonErrorKind::TooDeep, self.pos))
            }
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => {
                for (word, value) in [
                    ("true", Value::Bool(true)),
                    ("false", Value::Bool(false)),
                    ("null", Value::Null),
                ] {
                    if self.bytes[self.pos..].starts_with(word.as_bytes()) {
                        self.pos += word.len();
                        return Ok(value);
                    }
                }
                Err(self.syntax("a JSON value"))
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1; // '{'
        let mut map = Map::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("a string member name"));
            }
            let key_start = self.pos;
            let key = self.string()?;
            let duplicate = map.contains_key(&key);
            self.path.push(Segment::Key(key));
            if duplicate {
                return Err(self.fail(JsonErrorKind::DuplicateMember, key_start));
            }
            self.expect(b':', "':' after a member name")?;
            let value = self.value(depth)?;
            if let Some(Segment::Key(key)) = self.path.pop() {
                map.insert(key, value);
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.syntax("',' or '}' after an object member")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.path.push(Segment::Index(items.len()));
            let value = self.value(depth)?;
            self.path.pop();
            items.push(value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.syntax("',' or ']' after an array element")),
            }
        }
    }

    /// Parses a string starting at `"`; RFC 8259 section 7 escapes only.
    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // '"'
        let mut out = String::new();
        loop {
            let start = self.pos;
            while matches!(self.peek(), Some(b) if b >= 0x20 && b != b'"' && b != b'\\') {
                self.pos += 1;
            }
            // The run ends at an ASCII byte or the end, so both ends are char boundaries.
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let escape_start = self.pos;
                    self.pos += 1;
                    let c = match self.peek() {
                        Some(b'u') => {
                            self.pos += 1;
                            self.unicode_escape(escape_start)?
                        }
                        Some(b) => {
                            let c = match b {
                                b'"' => '"',
                                b'\\' => '\\',
                                b'/' => '/',
                                b'b' => '\u{8}',
                                b'f' => '\u{c}',
                                b'n' => '\n',
                                b'r' => '\r',
                                b't' => '\t',
                                _ => return Err(self.syntax("a valid escape character after '\\'")),
                            };
                            self.pos += 1;
                            c
                        }
                        None => return Err(self.syntax("an escape character after '\\'")),
                    };
                    out.push(c);
                }
                Some(_) => return Err(self.syntax("control characters in strings to be escaped")),
                None => return Err(self.syntax("'\"' to close the string")),
            }
        }
    }

    /// RFC 8259 section 6 number grammar, then the I-JSON number rules (RFC 7493 section 2.2).
    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(self.fail(
                        JsonErrorKind::Syntax(
                            "no leading zeros in numbers (RFC 8259 section 6)".into(),
                        ),
                        start,
                    ));
                }
            }
            Some(b'1'..=b'9') => self.digits("a digit")?,
            _ => return Err(self.syntax("a digit")),
        }
        let integer_end = self.pos;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.digits("a digit after the decimal point")?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.digits("a digit in the exponent")?;
        }
        let literal = &self.text[start..self.pos];
        number_value(literal, integer_end == self.pos).map_err(|kind| self.fail(kind, start))
    }

    /// One or more ASCII digits.
    fn digits(&mut self, expected: &str) -> Result<(), JsonError> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.syntax(expected));
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        Ok(())
    }

    /// After `\u`: four hex digits, combining a surrogate pair (RFC 8259 section 7).
    fn unicode_escape(&mut self, escape_start: usize) -> Result<char, JsonError> {
        let hi = self.hex4()?;
        let cp = match hi {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(self.fail(JsonErrorKind::LoneSurrogate, escape_start));
                }
                self.pos += 2;
                let lo = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(self.fail(JsonErrorKind::LoneSurrogate, escape_start));
                }
                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
            }
            _ => hi,
        };
        char::from_u32(cp).ok_or_else(|| self.fail(JsonErrorKind::LoneSurrogate, escape_start))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let cp = digits
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.syntax("four hex digits after '\\u'"))?;
        self.pos += 4;
        Ok(cp)
    }
}

/// Value of a grammatically valid number literal, or the I-JSON rule it breaks (RFC 7493 2.2).
fn number_value(literal: &str, integer_literal: bool) -> Result<Value, JsonErrorKind> {
    if integer_literal {
        return match literal.trim_start_matches('-').parse::<u64>() {
            Ok(m) if m <= MAX_SAFE_INTEGER && literal.starts_with('-') => {
                Ok(Value::from(-(m as i64)))
            }
            Ok(m) if m <= MAX_SAFE_INTEGER => Ok(Value::from(m)),
            _ => Err(JsonErrorKind::IntegerOutOfRange),
        };
    }
    let f: f64 = literal
        .parse()
        .map_err(|_| JsonErrorKind::Syntax("expected a number".into()))?;
    if !f.is_finite() {
        return Err(JsonErrorKind::NonFiniteNumber);
    }
    // The literal must mean exactly the digits JCS will write for this double (the shortest
    // round-trip form, RFC 8785 section 3.2.2.3), so no two accepted literals share a double.
    // We ask the canonicalizer rather than `{:e}`: on a tie between two 17-digit spellings
    // (e.g. 1424953923781206.2 vs .3) Rust and ECMAScript pick differently.
    let double = Value::Number(Number::from_f64(f).ok_or(JsonErrorKind::NonFiniteNumber)?);
    if decimal_parts(literal) != decimal_parts(&canonicalize(&double)) {
        return Err(JsonErrorKind::NumberNotRepresentable);
    }
    if f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64 {
        return Ok(Value::from(f as i64)); // 1.0 -> 1, -0.0 -> 0: same JCS text, now equal Values too
    }
    Ok(double)
}

/// Exact decimal value of a number literal as `(negative, digits, exponent)` meaning
/// `digits × 10^exponent`, with no leading or trailing zeros in `digits`; zero is `(false, "", 0)`.
fn decimal_parts(s: &str) -> (bool, String, i64) {
    let (negative, s) = s.strip_prefix('-').map_or((false, s), |rest| (true, rest));
    let (mantissa, exp) = s.split_once(['e', 'E']).unwrap_or((s, "0"));
    // Saturate: a literal of at most `max_bytes` digits cannot make up a 2^60 exponent.
    let magnitude = exp
        .trim_start_matches(['+', '-'])
        .bytes()
        .fold(0i64, |acc, b| {
            acc.saturating_mul(10)
                .saturating_add(i64::from(b - b'0'))
                .min(1 << 60)
        });
    let exponent = if exp.starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = [int, frac].concat();
    let trimmed = all.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        return (false, String::new(), 0);
    }
    let shift = (trimmed.len() - significant.len()) as i64 - frac.len() as i64;
    (negative, significant.to_owned(), exponent + shift)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hash(payload: &str) -> RequestHash {
        request_hash("payments.charge", payload, &Limits::default()).unwrap()
    }

    /// Parses with default limits and returns `(pointer, rule)` of the refusal.
    fn refusal(text: &str) -> (String, &'static str) {
        let err = parse_strict(text, &Limits::default()).unwrap_err();
        (err.pointer, err.kind.rule())
    }

    /// Each non-blank line: `input pointer rule`, separated by whitespace.
    fn refused(table: &str) {
        for line in table.lines().filter(|l| !l.trim().is_empty()) {
            let [text, pointer, rule] = line.split_whitespace().collect::<Vec<_>>()[..] else {
                panic!("bad table line {line}");
            };
            assert_eq!(refusal(text), (pointer.to_owned(), rule), "input: {text}");
        }
    }

    #[test]
    fn member_order_whitespace_and_integral_floats_do_not_change_the_hash() {
        let h = hash(r#"{"a":1,"to":{"x":1,"y":2}}"#);
        assert_eq!(h, hash(r#"{"to":{"y":2,"x":1},"a":1.0}"#));
        let spaced = " {\n\t\"to\" : { \"x\" : 1e0 ,\r\n \"y\":2 } , \"a\" : 10E-1 }\n";
        assert_eq!(h, hash(spaced));
    }

    #[test]
    fn array_order_action_type_and_value_types_change_the_hash() {
        assert_ne!(hash(r#"{"p":[1,2]}"#), hash(r#"{"p":[2,1]}"#));
        let payload = parse_object(r#"{"a":1}"#, &Limits::default()).unwrap();
        let (b, c) = (
            RequestHash::compute("a.b", &payload),
            RequestHash::compute("a.c", &payload),
        );
        assert_ne!(b, c);
        assert_ne!(hash(r#"{"a":"1"}"#), hash(r#"{"a":1}"#));
        assert_ne!(hash(r#"{"a":[]}"#), hash(r#"{"a":{}}"#));
        assert_ne!(hash(r#"{"a":null}"#), hash(r#"{}"#));
    }

    #[test]
    fn integers_beyond_two_to_the_53_minus_one_are_refused() {
        refused(
            r#"
            {"ref":9007199254740993}                  /ref  integer_out_of_range
            {"ref":-9007199254740992}                 /ref  integer_out_of_range
            {"ref":123456789012345678901234567890}    /ref  integer_out_of_range
            "#,
        );
        let v = parse_strict(
            r#"{"ref":9007199254740991,"neg":-9007199254740991}"#,
            &Limits::default(),
        );
        assert_eq!(
            canonicalize(&v.unwrap()),
            r#"{"neg":-9007199254740991,"ref":9007199254740991}"#
        );
    }

    #[test]
    fn duplicate_members_are_refused_even_when_spelled_differently() {
        refused(
            r#"
            {"a":1,"a":2}          /a    duplicate_member
            {"x":{"k":1,"k":2}}    /x/k  duplicate_member
            {"a":1,"\u0061":2}     /a    duplicate_member
            "#,
        );
        let err = parse_strict(r#"{"a":1,"a":2}"#, &Limits::default()).unwrap_err();
        assert_eq!(err.offset, 7);
    }

    #[test]
    fn lone_surrogates_are_refused_and_valid_pairs_accepted() {
        refused(
            r#"
            {"s":"\ud800"}                  /s        lone_surrogate
            {"s":"\ud800\u0041"}            /s        lone_surrogate
            {"s":"\udc00"}                  /s        lone_surrogate
            {"list":["a","b","x\udc00"]}    /list/2   lone_surrogate
            "#,
        );
        let v = parse_strict(r#"{"s":"\ud83d\ude00"}"#, &Limits::default()).unwrap();
        assert_eq!(v["s"], "\u{1F600}");
    }

    #[test]
    fn numbers_a_double_cannot_hold_exactly_are_refused() {
        // 1424953923781206.2 and .3 both spell the double 0x43143ff3c1cb0959 in 17 digits; only
        // the one JCS writes (.2) is accepted, so two accepted literals never share a double.
        refused(
            r#"
            {"n":1e400}                       /n  non_finite_number
            {"n":-1e400}                      /n  non_finite_number
            {"n":1.00000000000000000001}      /n  number_not_representable
            {"n":1e-400}                      /n  number_not_representable
            {"n":333333333.33333329}          /n  number_not_representable
            {"n":1424953923781206.3}          /n  number_not_representable
            "#,
        );
        for ok in [
            "0.1",
            "-0",
            "-0.0",
            "0e99999999999999999999",
            "1.5e300",
            "100e-2",
        ] {
            assert!(parse_strict(ok, &Limits::default()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn anything_outside_the_rfc_8259_grammar_is_a_syntax_error() {
        for bad in [
            "{\"n\":NaN}",
            "{\"n\":Infinity}",
            "{\"n\":-Infinity}",
            "{\"a\":1,}",
            "[1,]",
            "{,}",
            "{\"a\":1 // c\n}",
            "{\"a\":/*c*/1}",
            "{\"n\":01}",
            "{\"n\":-01}",
            "{\"n\":1.}",
            "{\"n\":.5}",
            "{\"n\":1e}",
            "{\"n\":+1}",
            "{'a':1}",
            "{\"a\" 1}",
            "{\"a\":tru}",
            "{\"s\":\"\\x\"}",
            "{\"s\":\"\\u12G4\"}",
            "{\"s\":\"a\tb\"}",
            "{\"s\":\"open}",
            "\u{feff}{}",
            "{}\u{a0}",
            "{\u{b}}",
            "{} {}",
            "",
            "{\"a\":1",
        ] {
            let err = parse_strict(bad, &Limits::default()).unwrap_err();
            assert_eq!(err.kind.rule(), "syntax", "input: {bad:?}");
        }
        let err = parse_strict(r#"{"a":[1,2,]}"#, &Limits::default()).unwrap_err();
        assert_eq!((err.pointer.as_str(), err.offset), ("/a/2", 10));
    }

    #[test]
    fn error_messages_describe_the_rule_without_quoting_the_value() {
        let err = parse_strict(r#"{"card":"4111\ud800","x":1}"#, &Limits::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"string contains an unpaired surrogate escape (RFC 7493 section 2.1) at JSON pointer "/card" (byte 13)"#
        );
        let err = parse_strict(r#"{"pin":12345678901234567890}"#, &Limits::default()).unwrap_err();
        assert!(!err.to_string().contains("1234"));
    }

    #[test]
    fn pointers_escape_tilde_and_slash_in_member_names() {
        refused(
            r#"
            {"a/b":{"m~n":[0,{"k":1,"k":2}]}}   /a~1b/m~0n/1/k  duplicate_member
            {"~1":1,"~1":2}                     /~01            duplicate_member
            "#,
        );
    }

    #[test]
    fn nesting_and_size_are_limited() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse_strict(&nested(MAX_DEPTH), &Limits::default()).is_ok());
        assert_eq!(refusal(&nested(MAX_DEPTH + 1)).1, "too_deep");
        assert_eq!(refusal(&nested(100_000)).1, "too_deep");
        let tight = Limits {
            max_bytes: 16,
            max_depth: 2,
        };
        let err = parse_strict(r#"{"a":{"b":{}}}"#, &tight).unwrap_err();
        assert_eq!(
            (err.pointer.as_str(), err.kind.rule()),
            ("/a/b", "too_deep")
        );
        assert!(parse_strict(r#"{"a":"0123456"}"#, &tight).is_ok());
        assert_eq!(
            parse_strict(r#"{"a":"012345678"}"#, &tight)
                .unwrap_err()
                .kind,
            JsonErrorKind::TooLarge
        );
    }

    #[test]
    fn a_top_level_value_other_than_an_object_is_not_a_payload() {
        for text in ["[1]", "\"s\"", " 1", "null"] {
            let err = request_hash("x", text, &Limits::default()).unwrap_err();
            assert_eq!(
                (err.pointer.as_str(), err.kind.rule()),
                ("", "not_an_object")
            );
            assert!(parse_strict(text, &Limits::default()).is_ok());
        }
    }

    #[test]
    fn numbers_serialise_as_the_rfc_8785_appendix_b_vectors() {
        // input literal (spelled to pass the round-trip rule) | RFC 8785 output | IEEE-754 bits
        let vectors = "
            0                         0                          0000000000000000
            -0                        0                          8000000000000000
            5e-324                    5e-324                     0000000000000001
            -1.7976931348623157e308   -1.7976931348623157e+308   ffefffffffffffff
            9.007199254740992e15      9007199254740992           4340000000000000
            2.9514790517935283e20     295147905179352830000      4430000000000000
            9.999999999999997e22      9.999999999999997e+22      44b52d02c7e14af5
            1E23                      1e+23                      44b52d02c7e14af6
            9.999999999999997e20      999999999999999700000      444b1ae4d6e2ef4e
            1e21                      1e+21                      444b1ae4d6e2ef50
            9.999999999999997e-7      9.999999999999997e-7       3eb0c6f7a0b5ed8c
            0.000001                  0.000001                   3eb0c6f7a0b5ed8d
            333333333.33333325        333333333.33333325         41b3de4355555554
            333333333.3333333         333333333.3333333          41b3de4355555555
            -0.0000033333333333333333 -0.0000033333333333333333  becbf647612f3696
            1424953923781206.2        1424953923781206.2         43143ff3c1cb0959
            9007199254740991          9007199254740991           433fffffffffffff
            1e-7                      1e-7                       3e7ad7f29abcaf48
            1E30                      1e+30                      46293e5939a08cea
            4.50                      4.5                        4012000000000000
            2e-3                      0.002                      3f60624dd2f1a9fc
        ";
        for line in vectors.lines().filter(|l| !l.trim().is_empty()) {
            let [literal, jcs, bits] = line.split_whitespace().collect::<Vec<_>>()[..] else {
                panic!("bad vector {line}");
            };
            let v = parse_strict(literal, &Limits::default()).unwrap();
            let expected = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
            assert_eq!(v.as_f64().unwrap(), expected, "{literal}"); // -0.0 == 0.0
            assert_eq!(canonicalize(&v), jcs, "{literal}");
        }
    }

    #[test]
    fn members_sort_by_utf16_code_units_as_in_rfc_8785_section_3_2_3() {
        let input = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(
            canonicalize(&parse_strict(input, &Limits::default()).unwrap()),
            expected
        );
    }

    #[test]
    fn the_hash_of_a_fixed_payload_matches_an_independent_sha256() {
        // printf '%s' '{"action_type":"payments.charge","payload":{"amount":12.5,"currency":"EUR","memo":"café","to":{"iban":"DE89370400440532013000"}}}' | sha256sum
        let expected = "edf9e554e6f7b86b9ab02e31588473ca4f6ce372556e3e51abcda0863c01160b";
        let h = hash(
            r#"{"to": {"iban": "DE89370400440532013000"}, "memo": "caf\u00e9", "currency": "EUR", "amount": 1.25e1}"#,
        );
        assert_eq!(
            (h.to_hex(), h.to_string()),
            (expected.to_owned(), expected.to_owned())
        );
        assert_eq!(RequestHash::from_hex(expected), Some(h));
        assert_eq!(
            RequestHash::from_hex(&expected.to_uppercase())
                .unwrap()
                .as_bytes(),
            h.as_bytes()
        );
        assert_eq!(RequestHash::from_hex(&expected[1..]), None);
        assert_eq!(
            RequestHash::from_hex(&format!("{}zz", &expected[2..])),
            None
        );
    }

    /// Writes `v` with members in rotated order and `ws` around every token; leaves via serde_json.
    fn reserialise(v: &Value, rotate: usize, ws: &str) -> String {
        match v {
            Value::Object(m) if !m.is_empty() => {
                let mut members: Vec<_> = m.iter().collect();
                let by = rotate % members.len();
                members.rotate_left(by);
                let parts: Vec<_> = members
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{}{ws}:{ws}{}",
                            serde_json::to_string(k).unwrap(),
                            reserialise(v, rotate + 1, ws)
                        )
                    })
                    .collect();
                format!("{{{ws}{}{ws}}}", parts.join(&format!("{ws},{ws}")))
            }
            Value::Array(a) => {
                let parts: Vec<_> = a.iter().map(|v| reserialise(v, rotate + 1, ws)).collect();
                format!("[{ws}{}{ws}]", parts.join(&format!(",{ws}")))
            }
            leaf => serde_json::to_string(leaf).unwrap(),
        }
    }

    #[test]
    fn reserialising_in_any_member_order_and_whitespace_keeps_the_hash() {
        let samples = [
            r#"{"amount":{"value":"12.30","currency":"EUR"},"to":["a","b",{"z":null,"y":true}],"n":-0.5}"#,
            r#"{"\u00e9":1,"e":2,"\ud83d\ude00":[[],{}],"tab\t":"x\"y\\z","big":1e300,"tiny":5e-324}"#,
            r#"{"nested":{"c":{"b":{"a":[3,2,1]}},"b":false},"a":"","z":0.1,"m":-9007199254740991}"#,
        ];
        for sample in samples {
            let value = parse_strict(sample, &Limits::default()).unwrap();
            let reference = hash(sample);
            for (seed, ws) in ["", " ", "\n\t", "\r\n  "].iter().enumerate() {
                for pretty in [false, true] {
                    let text = if pretty {
                        serde_json::to_string_pretty(&value).unwrap()
                    } else {
                        reserialise(&value, seed, ws)
                    };
                    assert_eq!(hash(&text), reference, "{text}");
                }
            }
        }
    }
}
