//! Rendering: a statement file (see `README.md` here) made SQL for a dialect, fragments
//! first, then tokens; and the batch form of a statement, whose parameters come from rows.

use super::dialect::Dialect;

/// A fragment or statement file by name.
fn fragment(name: &str) -> &'static str {
    macro_rules! files { ($($name:literal),*) => { match name {
        $($name => include_str!(concat!($name, ".sql")),)*
        _ => panic!("no statement file {name}.sql"),
    } } }
    files!(
        "columns",
        "cleared",
        "lease_ended",
        "fence_read",
        "fence_report",
        "fence_renew",
        "fence_token",
        "insert",
        "reported",
        "expired",
        "due",
        "reconcile_free",
        "swept",
        "purgeable",
        "outbox_columns",
        "delivery_due"
    )
}

/// Renders `template` for dialect `D`: fragments first, then tokens. A `batch` rendering
/// reads each fragment's parameters `$2`, `$3`, ... from the columns `v.p2`, `v.p3`, ... of
/// the batch's rows (`v`, see [`values`]), and `{rows}` selects those rows in key order; the
/// clock stays `$1`.
pub(super) fn render<D: Dialect>(template: &str, batch: bool) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = open
            + rest[open..]
                .find('}')
                .expect("unclosed token in a statement file");
        let token = &rest[open + 1..close];
        match (token.strip_prefix('@'), token) {
            (Some(name), _) => {
                let fragment = render::<D>(fragment(name).trim_end(), batch);
                out.push_str(&if batch {
                    from_rows(&fragment)
                } else {
                    fragment
                });
            }
            (None, "rows") if batch => out.push_str("FROM v ORDER BY v.p2, v.p3"),
            (None, "rows") => out.push_str("WHERE true"),
            (None, _) => {
                let (name, arg) = token.split_once(' ').unwrap_or((token, ""));
                out.push_str(&D::token(name, arg));
            }
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// `sql` with each parameter `$n` but the clock (`$1`) read from column `v.pn` of a batch row.
pub(super) fn from_rows(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len() - at - 1, |end| end);
        let number = &rest[at + 1..at + 1 + digits];
        match number {
            "" | "1" => out.push_str(&rest[at..at + 1 + digits]),
            _ => out.push_str(&format!("v.p{number}")),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// The batch rows `v` of a statement whose single-row form binds `$2`, `$3`, ... of `types`:
/// one array per parameter, unnested side by side into columns `p2`, `p3`, ...
pub(super) fn values(types: &[&str]) -> String {
    let arrays = (0..types.len()).map(|i| format!("${}::{}[]", i + 2, types[i]));
    let names = (0..types.len()).map(|i| format!("p{}", i + 2));
    let arrays: Vec<_> = arrays.collect();
    let names: Vec<_> = names.collect();
    format!("unnest({}) AS v ({})", arrays.join(", "), names.join(", "))
}

/// Whether `sql` names parameter `$1` (not `$10`...).
pub(super) fn binds_first(sql: &str) -> bool {
    sql.match_indices("$1")
        .any(|(at, _)| !sql[at + 2..].starts_with(|c: char| c.is_ascii_digit()))
}

/// `template` with the variant placeholder `{@slot}` replaced by `part`.
pub(super) fn with(template: &str, slot: &str, part: &str) -> String {
    template.replace(&format!("{{@{slot}}}"), part)
}
