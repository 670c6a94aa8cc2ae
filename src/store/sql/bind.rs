//! Binding: every statement's values are built once, as a list of [`Arg`] in parameter
//! order, whatever the backend; a batch binds the same lists as columns.

use std::time::Duration;

use uuid::Uuid;

use crate::domain::lease::LeaseToken;
use crate::store::error::StoreError;
use crate::store::{NewOperation, Settlement};

/// One bound value. Every statement's values are built once, as a list of these, whatever
/// the backend.
#[derive(Debug, Clone)]
pub enum Arg {
    /// Text, or `NULL`.
    Text(Option<String>),
    /// An integer.
    Int(i64),
    /// Seconds, or any other float.
    Float(f64),
    /// One column of a batch (Postgres only, unnested in the statement): text or `NULL`s.
    Texts(Vec<Option<String>>),
    /// One column of a batch: integers.
    Ints(Vec<i64>),
    /// One column of a batch: seconds, or any other floats.
    Floats(Vec<f64>),
}

/// A database that binds the batch columns of [`Arg`] (as arrays), or refuses them.
pub trait BindColumns: sqlx::Database {
    /// Adds `column` (an `Arg::Texts`, `Ints` or `Floats`) to `out`.
    fn add_column(out: &mut Self::Arguments, column: Arg) -> Result<(), sqlx::error::BoxDynError>;
}

/// The values `args` as sqlx arguments of database `DB`.
pub(in crate::store) fn arguments<DB: BindColumns>(
    args: Vec<Arg>,
) -> Result<DB::Arguments, StoreError>
where
    Option<String>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    f64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    use sqlx::Arguments as _;
    let mut out = DB::Arguments::default();
    for arg in args {
        match arg {
            Arg::Text(value) => out.add(value),
            Arg::Int(value) => out.add(value),
            Arg::Float(value) => out.add(value),
            column => DB::add_column(&mut out, column),
        }
        .map_err(StoreError::Other)?;
    }
    Ok(out)
}

/// `Arg::from` for each bindable type: text, integers, seconds, ids.
macro_rules! arg_from {
    ($($type:ty => |$value:ident| $arg:expr),* $(,)?) => {$(
        impl From<$type> for Arg {
            fn from($value: $type) -> Self {
                $arg
            }
        }
    )*};
}
arg_from!(
    &str => |value| Self::Text(Some(value.to_owned())),
    String => |value| Self::Text(Some(value)),
    i64 => |value| Self::Int(value),
    i32 => |value| Self::Int(value.into()),
    Duration => |value| Self::Float(value.as_secs_f64()),
    Uuid => |value| Self::Text(Some(value.hyphenated().to_string())),
);

impl<T: Into<String>> From<Option<T>> for Arg {
    fn from(value: Option<T>) -> Self {
        Self::Text(value.map(Into::into))
    }
}

/// The values of a statement, in parameter order.
macro_rules! args {
    ($($value:expr),* $(,)?) => { vec![$($crate::store::sql::Arg::from($value)),*] };
}
pub(super) use args;

/// The first `chars` characters of `value` (the columns that keep a bounded text).
pub(super) fn first(value: &str, chars: usize) -> String {
    value.chars().take(chars).collect()
}

fn json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(Box::new(e)))
}

/// A report's statement variant and its values: the token's lease as `$2..$5`, the outcome's
/// from `$6`.
pub(super) fn report_args(token: &LeaseToken, settlement: &Settlement) -> (usize, Vec<Arg>) {
    let (ns, key) = (token.namespace.as_str(), token.operation_key.as_str());
    let lease = args![ns, key, token.attempt, token.lease_id];
    let outcome = match settlement {
        Settlement::Succeeded {
            external_id,
            result_json,
        } => args![
            external_id.as_ref().map(|i| i.as_str()),
            result_json.clone()
        ],
        Settlement::FailedFinal { error_code } => args![error_code.as_str()],
        Settlement::Unknown {
            error_code,
            first_check_after,
        } => args![error_code.as_ref().map(|c| c.as_str()), *first_check_after],
    };
    (variant(settlement), [lease, outcome].concat())
}

/// The statement variant of a report: its index in `SETTLEMENTS`.
pub(super) fn variant(settlement: &Settlement) -> usize {
    match settlement {
        Settlement::Succeeded { .. } => 0,
        Settlement::FailedFinal { .. } => 1,
        Settlement::Unknown { .. } => 2,
    }
}

/// `$2..$11` of the insert.
pub(super) fn new_args(new: &NewOperation) -> Result<Vec<Arg>, StoreError> {
    Ok(args![
        new.namespace.as_str(),
        new.operation_key.as_str(),
        new.action_type.as_str(),
        new.request_hash.to_hex(),
        new.lease,
        new.lease_id,
        json(&new.references)?,
        json(&new.action_policy)?,
        new.trace_context.clone(),
        new.attempt.map(|a| a.to_hex())
    ])
}

/// The values of a batch, `rows` of one statement's values each: one column per parameter,
/// of the parameter's kind. Errors when the rows disagree on a kind.
pub(super) fn columns(rows: Vec<Vec<Arg>>) -> Result<Vec<Arg>, StoreError> {
    let mismatch = || StoreError::Other("batch rows of different kinds".into());
    let mut columns: Vec<Arg> = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        for (j, value) in row.into_iter().enumerate() {
            if i == 0 {
                columns.push(match value {
                    Arg::Text(value) => Arg::Texts(vec![value]),
                    Arg::Int(value) => Arg::Ints(vec![value]),
                    Arg::Float(value) => Arg::Floats(vec![value]),
                    _ => return Err(mismatch()),
                });
                continue;
            }
            match (columns.get_mut(j), value) {
                (Some(Arg::Texts(column)), Arg::Text(value)) => column.push(value),
                (Some(Arg::Ints(column)), Arg::Int(value)) => column.push(value),
                (Some(Arg::Floats(column)), Arg::Float(value)) => column.push(value),
                _ => return Err(mismatch()),
            }
        }
    }
    Ok(columns)
}
