//! The W3C `traceparent` rules (Trace Context level 1), shared by the opjournal server and
//! its sandbox provider, so that both read a header value the same way.

/// Reads a `traceparent` header value by the W3C rules (Trace Context level 1, 3.2):
/// lowercase hex, version `ff` invalid, version `00` exactly 55 characters, a later version
/// read by its version-00 prefix. Answers its version-00 form,
/// `00-<32 lowercase hex trace id>-<16 lowercase hex parent id>-<2 hex flags>`; `None` for
/// anything invalid, including all-zero ids.
pub fn normalize(value: &str) -> Option<String> {
    let value = value.trim_matches(|c| c == ' ' || c == '\t');
    let bytes = value.as_bytes();
    let hex = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .is_some_and(|part| part.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    };
    let dashes = [2, 35, 52].iter().all(|&i| bytes.get(i) == Some(&b'-'));
    let version_ok = hex(0..2) && !value.starts_with("ff");
    let length_ok = if value.starts_with("00") {
        bytes.len() == 55
    } else {
        bytes.len() == 55 || bytes.get(55) == Some(&b'-')
    };
    if !(version_ok && length_ok && dashes && hex(3..35) && hex(36..52) && hex(53..55)) {
        return None;
    }
    let trace_id = &value[3..35];
    let span_id = &value[36..52];
    if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
        return None;
    }
    Some(format!("00-{trace_id}-{span_id}-{}", &value[53..55]))
}
