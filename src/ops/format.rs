//! Text output for people: aligned tables and `key: value` blocks, `-` for empty fields.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::rows::{EventRow, OperationDetail, OperationRow, ReconcileRow, format_time};

/// What an empty field is shown as.
pub const EMPTY: &str = "-";

/// A column of an operations table: its heading and how a row fills it.
type Column = (&'static str, fn(&OperationRow) -> String);

/// The `list` table's columns.
const LIST_COLUMNS: [Column; 7] = [
    ("KEY", |r| cell(&r.operation_key)),
    ("STATUS", |r| r.status.to_owned()),
    ("ATTEMPT", |r| r.attempt_count.to_string()),
    ("ACTION", |r| cell(&r.action_type)),
    ("EXTERNAL_ID", |r| opt(r.external_id.as_deref())),
    ("ERROR_CODE", |r| opt(r.error_code.as_deref())),
    ("UPDATED", |r| time(r.updated_at.as_ref())),
];

/// The `review` table's columns.
const REVIEW_COLUMNS: [Column; 7] = [
    ("KEY", |r| cell(&r.operation_key)),
    ("ATTEMPT", |r| r.attempt_count.to_string()),
    ("ACTION", |r| cell(&r.action_type)),
    ("REVIEW_SINCE", |r| time(r.review_required_at.as_ref())),
    ("REVIEW_REASON", |r| opt(r.review_reason.as_deref())),
    ("ERROR_CODE", |r| opt(r.error_code.as_deref())),
    ("LOOKUPS", |r| r.reconcile_attempts.to_string()),
];

/// The `list` table: one operation per line, newest first.
pub fn operations_table(rows: &[OperationRow]) -> String {
    operation_table(rows, &LIST_COLUMNS, "no operations\n")
}

/// The `review` table: one operation per line, oldest escalation first.
pub fn review_table(rows: &[OperationRow]) -> String {
    operation_table(rows, &REVIEW_COLUMNS, "no operations waiting for review\n")
}

/// A table of `rows` in `columns`, or `empty` when there are none.
fn operation_table(rows: &[OperationRow], columns: &[Column], empty: &str) -> String {
    if rows.is_empty() {
        return empty.to_owned();
    }
    let headings: Vec<&str> = columns.iter().map(|(heading, _)| *heading).collect();
    table(
        &headings,
        rows.iter()
            .map(|r| columns.iter().map(|(_, value)| value(r)).collect()),
    )
}

/// The `show` output: the record, its result, then its history.
pub fn show(detail: &OperationDetail, history: &[EventRow]) -> String {
    let mut fields = operation_fields(&detail.row);
    let after_codes = fields
        .iter()
        .position(|(name, _)| *name == "error_code")
        .map_or(fields.len(), |i| i + 1);
    fields.insert(
        after_codes,
        ("result_json", opt(detail.result_json.as_deref())),
    );
    let mut out = block(&fields);
    out.push_str("\nhistory:\n");
    if history.is_empty() {
        out.push_str("no events\n");
    } else {
        out.push_str(&history_table(history));
    }
    out
}

/// The history table: time, from -> to, attempt, actor kind/actor, reason, and `review`
/// when the event left the operation waiting for review.
pub fn history_table(events: &[EventRow]) -> String {
    table(
        &["TIME", "TRANSITION", "ATTEMPT", "ACTOR", "REASON", "REVIEW"],
        events.iter().map(|e| {
            let actor = match &e.actor {
                Some(actor) => format!("{}/{}", e.actor_kind, cell(actor)),
                None => e.actor_kind.to_owned(),
            };
            vec![
                time(e.occurred_at.as_ref()),
                format!("{} -> {}", e.from_status.unwrap_or(EMPTY), e.to_status),
                e.attempt_count.to_string(),
                actor,
                opt(e.reason.as_deref()),
                if e.review_required { "review" } else { "" }.to_owned(),
            ]
        }),
    )
}

/// The `reconcile` output: what the provider adapter saw, what was done, the record after.
pub fn reconcile(row: &ReconcileRow) -> String {
    let observation = row.observation.as_ref();
    let mut fields = vec![
        ("operation_key", cell(&row.operation.operation_key)),
        (
            "observation",
            observation.map_or(EMPTY, |o| o.outcome).to_owned(),
        ),
        (
            "observed_external_id",
            opt(observation.and_then(|o| o.external_id.as_deref())),
        ),
        (
            "detail_code",
            opt(observation.and_then(|o| o.detail_code.as_deref())),
        ),
        ("action", row.action.to_owned()),
    ];
    fields.extend(
        operation_fields(&row.operation)
            .into_iter()
            .filter(|(name, _)| *name != "operation_key"),
    );
    block(&fields)
}

/// The `resolve` output: the record after the decision.
pub fn operation(row: &OperationRow) -> String {
    block(&operation_fields(row))
}

fn operation_fields(r: &OperationRow) -> Vec<(&'static str, String)> {
    let references = r
        .references
        .iter()
        .map(|(k, v)| format!("{}={}", cell(k), cell(v)))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        ("namespace", cell(&r.namespace)),
        ("operation_key", cell(&r.operation_key)),
        ("action_type", cell(&r.action_type)),
        ("status", r.status.to_owned()),
        ("attempt_count", r.attempt_count.to_string()),
        ("external_id", opt(r.external_id.as_deref())),
        ("error_code", opt(r.error_code.as_deref())),
        ("request_hash", opt(Some(&r.request_hash))),
        ("references", opt(Some(&references))),
        ("lease_until", time(r.lease_until.as_ref())),
        ("next_check_at", time(r.next_check_at.as_ref())),
        ("reconcile_attempts", r.reconcile_attempts.to_string()),
        ("review_required_at", time(r.review_required_at.as_ref())),
        ("review_reason", opt(r.review_reason.as_deref())),
        ("created_at", time(r.created_at.as_ref())),
        ("updated_at", time(r.updated_at.as_ref())),
    ]
}

/// `name: value` lines with the values aligned.
fn block(fields: &[(&str, String)]) -> String {
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (name, value) in fields {
        let label = format!("{name}:");
        // Writing to a String cannot fail.
        let _ = writeln!(out, "{label:<width$} {value}");
    }
    out
}

/// An aligned table with a header line; trailing blanks are trimmed.
fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = std::iter::once(headers.iter().map(|h| (*h).to_owned()).collect())
        .chain(rows)
        .collect();
    let mut widths = vec![0; headers.len()];
    for row in &rows {
        for (width, value) in widths.iter_mut().zip(row) {
            *width = (*width).max(value.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (value, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{value:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn opt(value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => cell(v),
        _ => EMPTY.to_owned(),
    }
}

fn time(value: Option<&DateTime<Utc>>) -> String {
    value.map_or_else(|| EMPTY.to_owned(), format_time)
}

/// A value safe to put in a line: control characters are escaped, so a stored value cannot
/// break the layout or drive the terminal.
fn cell(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_trailing_blanks() {
        let out = table(
            &["KEY", "STATUS", "REVIEW"],
            vec![
                vec!["a".into(), "unknown".into(), "review".into()],
                vec!["long-key".into(), "pending".into(), String::new()],
            ]
            .into_iter(),
        );
        assert_eq!(
            out,
            "KEY       STATUS   REVIEW\n\
             a         unknown  review\n\
             long-key  pending\n"
        );
    }

    #[test]
    fn control_characters_are_escaped_and_empty_values_are_a_dash() {
        assert_eq!(cell("a\nb\x1b"), "a\\nb\\u{1b}");
        assert_eq!(opt(Some("")), "-");
        assert_eq!(opt(None), "-");
    }
}
