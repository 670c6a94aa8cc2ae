//! The one SQL implementation of [`JournalStore`], for every backend: the statements are the
//! `.sql` files of `src/store/sql/` (see its README), rendered once per store for its
//! [`Dialect`]; the parameters of each are bound here, once; rows decode with
//! `derive(FromRow)` into row types and then into domain types through `TryFrom`. Every
//! statement runs inside `SqlStore::call`, which traces it and counts its failures.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use tracing::Instrument as _;
use tracing::field::Empty;
use uuid::Uuid;

use super::{
    BacklogStats, Claim, HistoryQuery, JournalMaintenance, JournalStore, ListQuery, Lookup,
    NewOperation, QueueStats, Registration, Resolution, ReviewQuery, SameRequest, SearchQuery,
    Settled, Settlement, StateCount, StoreError,
};
use crate::domain::canonical::RequestHash;
use crate::domain::lease::{AttemptDigest, LeaseToken};
use crate::domain::model::{
    ActionType, ActorKind, Attribution, Namespace, OperationEvent, OperationKey, OperationRecord,
    Status,
};
use crate::telemetry::Metrics;

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
}

/// The values `args` as sqlx arguments of database `DB`.
pub(super) fn arguments<DB: sqlx::Database>(args: Vec<Arg>) -> Result<DB::Arguments, StoreError>
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
        }
        .map_err(StoreError::Other)?;
    }
    Ok(out)
}

/// Splits sqlx errors into "unavailable" (retry later, nothing changed) and the rest; a
/// database error is unavailable when `unavailable_code` says so of its code.
pub(super) fn classify_by(error: sqlx::Error, unavailable_code: fn(&str) -> bool) -> StoreError {
    let unavailable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| unavailable_code(&code)),
        _ => false,
    };
    if unavailable {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Other(Box::new(error))
    }
}

/// A dialect's `fetch` and `execute`: the same sqlx calls on its own pool type.
macro_rules! run_on {
    ($pool:ty, $db:ty) => {
        async fn fetch<R: Decoded>(
            pool: &$pool,
            sql: &str,
            args: Vec<Arg>,
        ) -> Result<Vec<R>, StoreError> {
            let query =
                sqlx::query_as_with::<_, R, _>(sqlx::AssertSqlSafe(sql), arguments::<$db>(args)?);
            query.fetch_all(pool).await.map_err(classify)
        }

        async fn execute(pool: &$pool, sql: &str, args: Vec<Arg>) -> Result<u64, StoreError> {
            let query = sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments::<$db>(args)?);
            Ok(query.execute(pool).await.map_err(classify)?.rows_affected())
        }
    };
}
pub(super) use run_on;

/// A row type both backends decode with `derive(FromRow)`.
pub trait Decoded:
    for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin + 'static
{
}
impl<T> Decoded for T where
    T: for<'r> sqlx::FromRow<'r, PgRow>
        + for<'r> sqlx::FromRow<'r, SqliteRow>
        + Send
        + Unpin
        + 'static
{
}

/// What a backend adds to the one store: how it spells the clock, intervals and types, how
/// it runs a statement, and the few statements that really differ.
pub trait Dialect: Clone + Send + Sync + Sized + 'static {
    /// The connection pool.
    type Pool: Clone + Send + Sync + std::fmt::Debug + 'static;
    /// The OpenTelemetry `db.system.name` of the backend: `postgresql` or `sqlite`.
    const SYSTEM: &'static str;
    /// `register` in one statement, when the backend can (else insert, then get).
    const REGISTER: Option<&'static str>;
    /// `settle` in one statement, answering the status it left, when the backend can (else
    /// get, then the plain report).
    const SETTLE_WITH_PREVIOUS: Option<&'static str>;
    /// The batch claims: the lease sweep and the reconcile claim.
    const SWEEP: &'static str;
    /// See [`Dialect::SWEEP`].
    const CLAIM_DUE: &'static str;
    /// The outbox's delivery claim (`store::outbox`).
    const CLAIM_DELIVERIES: &'static str;
    /// The readiness check.
    const PING: &'static str;
    /// The spelling of `token` (a README token without its braces) with argument `arg`.
    fn token(token: &str, arg: &str) -> String;
    /// A time as bound into a statement.
    fn time_text(at: DateTime<Utc>) -> String;
    /// Runs `sql` and decodes every row.
    fn fetch<R: Decoded>(
        pool: &Self::Pool,
        sql: &str,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<Vec<R>, StoreError>> + Send;
    /// Runs `sql`; the number of rows it changed.
    fn execute(
        pool: &Self::Pool,
        sql: &str,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Deletes up to `limit` terminal operations past retention, with their history.
    fn purge(
        store: &SqlStore<Self>,
        limit: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// See [`JournalMaintenance::analyze_new_tables`].
    fn analyze_new_tables(
        _pool: &Self::Pool,
        _min_changes: i64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// A fragment or statement file by name.
fn fragment(name: &str) -> &'static str {
    macro_rules! files { ($($name:literal),*) => { match name {
        $($name => include_str!(concat!("sql/", $name, ".sql")),)*
        _ => panic!("no statement file {name}.sql"),
    } } }
    files!(
        "columns",
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

/// Renders `template` for dialect `D`: fragments first, then tokens.
pub fn render<D: Dialect>(template: &str) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = open
            + rest[open..]
                .find('}')
                .expect("unclosed token in a statement file");
        let token = &rest[open + 1..close];
        match token.strip_prefix('@') {
            Some(name) => out.push_str(&render::<D>(fragment(name).trim_end())),
            None => {
                let (name, arg) = token.split_once(' ').unwrap_or((token, ""));
                out.push_str(&D::token(name, arg));
            }
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A rendered statement: `clocked` when it reads the clock, bound as `$1`; `method` is the
/// store method that sends it and `operation` its kind, for its span and error count. Its
/// table is `operation_events` for `history`, `agent_operations` for every other method.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: String,
    clocked: bool,
    method: &'static str,
    operation: &'static str,
}

impl Statement {
    pub(super) fn new<D: Dialect>(
        method: &'static str,
        operation: &'static str,
        template: &str,
    ) -> Self {
        let sql = render::<D>(template);
        let clocked = binds_first(&sql) && !binds_first(template);
        Self {
            sql,
            clocked,
            method,
            operation,
        }
    }

    /// The statement as sent, with `$n` parameters.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

/// Whether `sql` names parameter `$1` (not `$10`...).
fn binds_first(sql: &str) -> bool {
    sql.match_indices("$1")
        .any(|(at, _)| !sql[at + 2..].starts_with(|c: char| c.is_ascii_digit()))
}

/// `template` with the variant placeholder `{@slot}` replaced by `part`.
fn with(template: &str, slot: &str, part: &str) -> String {
    template.replace(&format!("{{@{slot}}}"), part)
}

/// Every statement of a store, rendered once.
#[derive(Debug)]
pub struct Statements {
    insert: Statement,
    register: Option<Statement>,
    get: Statement,
    claim: Statement,
    settle: [Statement; 3],
    settle_with_previous: Option<[Statement; 3]>,
    renew: Statement,
    list: Statement,
    resolve: [Statement; 5],
    sweep: Statement,
    list_review: Statement,
    search: Statement,
    queue_stats: Statement,
    history: Statement,
    claim_due: Statement,
    claim_for_reconcile: Statement,
    find_same_request: Statement,
    backlog_stats: Statement,
    pub(super) outbox: super::outbox::Statements,
}

const SETTLEMENTS: [&str; 3] = [
    include_str!("sql/settle_succeeded.sql"),
    include_str!("sql/settle_failed_final.sql"),
    include_str!("sql/settle_unknown.sql"),
];

const RESOLUTIONS: [&str; 5] = [
    include_str!("sql/resolve_succeeded.sql"),
    include_str!("sql/resolve_failed_final.sql"),
    include_str!("sql/resolve_release.sql"),
    include_str!("sql/resolve_keep_unknown.sql"),
    include_str!("sql/resolve_escalate.sql"),
];

impl Statements {
    pub(super) fn new<D: Dialect>() -> Self {
        let st = Statement::new::<D>;
        let update = |m, t: &str| st(m, "UPDATE", t);
        // The statement of method `$name`, in `sql/$name.sql`.
        macro_rules! file {
            ($operation:literal $name:ident) => {{
                let name = stringify!($name);
                st(
                    name,
                    $operation,
                    include_str!(concat!("sql/", stringify!($name), ".sql")),
                )
            }};
        }
        let settle = |template: &str| {
            SETTLEMENTS.map(|s| update("settle", &with(template, "settlement", s)))
        };
        let resolve = include_str!("sql/resolve.sql");
        Self {
            insert: st("register", "INSERT", "{@insert} RETURNING {@columns}"),
            register: D::REGISTER.map(|t| st("register", "INSERT", t)),
            get: file!("SELECT" get),
            claim: file!("UPDATE" claim),
            settle: settle(include_str!("sql/settle.sql")),
            settle_with_previous: D::SETTLE_WITH_PREVIOUS.map(settle),
            renew: file!("UPDATE" renew),
            list: file!("SELECT" list),
            resolve: RESOLUTIONS.map(|r| update("resolve", &with(resolve, "resolution", r))),
            sweep: update("sweep_expired_leases", D::SWEEP),
            list_review: file!("SELECT" list_review),
            search: file!("SELECT" search),
            queue_stats: file!("SELECT" queue_stats),
            history: file!("SELECT" history),
            claim_due: update("claim_due", D::CLAIM_DUE),
            claim_for_reconcile: file!("UPDATE" claim_for_reconcile),
            find_same_request: file!("SELECT" find_same_request),
            backlog_stats: file!("SELECT" backlog_stats),
            outbox: super::outbox::Statements::new::<D>(),
        }
    }

    /// The statements whose cost must not grow with the journal, by the method that runs
    /// them, for the query plans the benchmark shows (docs/performance.md).
    pub fn explained(&self) -> Vec<(&'static str, &str)> {
        let mut all = vec![
            (
                "register",
                self.register.as_ref().unwrap_or(&self.insert).sql(),
            ),
            ("settle (succeeded)", self.settle[0].sql()),
            ("find_same_request", self.find_same_request.sql()),
            ("sweep_expired_leases", self.sweep.sql()),
            ("claim_due", self.claim_due.sql()),
            ("claim_for_reconcile", self.claim_for_reconcile.sql()),
            ("backlog_stats", self.backlog_stats.sql()),
            ("history", self.history.sql()),
            ("list (by status)", self.list.sql()),
            ("list_review", self.list_review.sql()),
            ("queue_stats", self.queue_stats.sql()),
        ];
        if let Some(settle) = &self.settle_with_previous {
            all[1].1 = settle[0].sql();
        }
        all
    }
}

/// The clock of a store's statements: the database's, unless a test moved it.
///
/// Production never moves it: every statement then binds `NULL` as `$1` and reads the
/// database clock. A test moves it forward to end leases and pass grace windows without
/// sleeping; every store cloned from the one it came from sees the move.
#[derive(Debug, Clone, Default)]
pub struct Clock(Arc<Mutex<Duration>>);

impl Clock {
    /// Moves the statements' clock `by` further ahead of the real one.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }

    /// The time statements read: `None` (the database clock) until moved.
    pub fn now(&self) -> Option<DateTime<Utc>> {
        let ahead = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        (!ahead.is_zero()).then(|| Utc::now() + ahead)
    }
}

/// The journal in a SQL database of dialect `D`.
#[derive(Debug, Clone)]
pub struct SqlStore<D: Dialect> {
    pub(crate) pool: D::Pool,
    pub(super) statements: Arc<Statements>,
    pub(super) clock: Clock,
    pub(super) metrics: Metrics,
    pub(crate) extra: Arc<D>,
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn from_parts(pool: D::Pool, extra: D) -> Self {
        Self {
            pool,
            statements: Arc::new(Statements::new::<D>()),
            clock: Clock::default(),
            metrics: Metrics::disabled(),
            extra: Arc::new(extra),
        }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &D::Pool {
        &self.pool
    }

    /// This store, counting failed statements in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// This store, reading `clock` (shared with another store, as tests do).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock of this store's statements, shared with its clones (tests move it).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The rendered statements.
    pub fn statements(&self) -> &Statements {
        &self.statements
    }

    pub(super) fn args(&self, statement: &Statement, mut args: Vec<Arg>) -> Vec<Arg> {
        if statement.clocked {
            let now = self.clock.now().map(D::time_text);
            args.insert(0, Arg::Text(now));
        }
        args
    }

    pub(super) async fn rows<R: Decoded>(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Vec<R>, StoreError> {
        D::fetch(&self.pool, &statement.sql, self.args(statement, args)).await
    }

    async fn row<R: Decoded>(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Option<R>, StoreError> {
        Ok(self.rows(statement, args).await?.into_iter().next())
    }

    async fn record(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.row::<OperationRow>(statement, args)
            .await?
            .map(OperationRecord::try_from)
            .transpose()
    }

    async fn records(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let rows = self.rows::<OperationRow>(statement, args).await?;
        rows.into_iter().map(OperationRecord::try_from).collect()
    }

    /// Runs one store method: `method` names it, `operation` and `collection` are its
    /// statement's kind and main table. Inside a traced request or reconcile attempt it gets
    /// a client span (`db.system.name`, `db.operation.name`, `db.collection.name`); a failure
    /// counts in `opjournal.store.errors`. Background calls without a parent span are counted
    /// but not traced, so that an idle process sends no traces.
    async fn call<T>(
        &self,
        method: &'static str,
        operation: &'static str,
        collection: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = if tracing::Span::current().is_none() {
            tracing::Span::none()
        } else {
            let name = match collection {
                "" => operation.to_owned(),
                _ => format!("{operation} {collection}"),
            };
            tracing::info_span!(
                "store",
                otel.name = name,
                otel.kind = "client",
                otel.status_code = Empty,
                db.system.name = D::SYSTEM,
                db.operation.name = operation,
                db.collection.name = collection,
                opjournal.store.method = method,
                error.type = Empty,
            )
        };
        let result = call.instrument(span.clone()).await;
        if let Err(error) = &result {
            let kind = match error {
                StoreError::Unavailable(_) => "unavailable",
                StoreError::Other(_) => "other",
            };
            self.metrics.store_error(method, kind);
            span.record("error.type", kind);
            span.record("otel.status_code", "error");
        }
        result
    }
}

const OPERATIONS: &str = "agent_operations";

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
    ($($value:expr),* $(,)?) => { vec![$(Arg::from($value)),*] };
}
pub(super) use args;

const NULL: Option<String> = None;

fn first(value: &str, chars: usize) -> String {
    value.chars().take(chars).collect()
}

fn json(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(Box::new(e)))
}

/// A report's statement variant and its values: the token's lease as `$2..$5`, the outcome's
/// from `$6`.
fn report_args(token: &LeaseToken, settlement: &Settlement) -> (usize, Vec<Arg>) {
    let (ns, key) = (token.namespace.as_str(), token.operation_key.as_str());
    let lease = args![ns, key, token.attempt, token.lease_id];
    let (variant, outcome) = match settlement {
        Settlement::Succeeded {
            external_id,
            result_json,
        } => (
            0,
            args![
                external_id.as_ref().map(|i| i.as_str()),
                result_json.clone()
            ],
        ),
        Settlement::FailedFinal { error_code } => (1, args![error_code.as_str()]),
        Settlement::Unknown {
            error_code,
            first_check_after,
        } => (
            2,
            args![error_code.as_ref().map(|c| c.as_str()), *first_check_after],
        ),
    };
    (variant, [lease, outcome].concat())
}

/// `$2..$11` of the insert.
fn new_args(new: &NewOperation) -> Result<Vec<Arg>, StoreError> {
    let (ns, key, action) = (
        new.namespace.as_str(),
        new.operation_key.as_str(),
        new.action_type.as_str(),
    );
    let (references, policy) = (json(&new.references)?, json(&new.action_policy)?);
    let trace = new.trace_context.clone();
    Ok(args![
        ns,
        key,
        action,
        new.request_hash.to_hex(),
        new.lease,
        new.lease_id,
        references,
        policy,
        trace,
        new.attempt.map(|a| a.to_hex())
    ])
}

impl<D: Dialect> SqlStore<D> {
    /// Runs `call`, the work of `statement`'s method, through [`call`](Self::call).
    pub(super) async fn run<T>(
        &self,
        statement: &Statement,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let collection = match statement.method {
            "history" => "operation_events",
            "claim_deliveries" | "record_delivery" | "deliveries" | "outbox_stats" => {
                "escalation_outbox"
            }
            _ => OPERATIONS,
        };
        let (method, operation) = (statement.method, statement.operation);
        self.call(method, operation, collection, call).await
    }

    /// A method that is one statement answering at most one record.
    async fn one(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Option<OperationRecord>, StoreError> {
        self.run(statement, self.record(statement, args)).await
    }

    /// A method that is one statement answering records.
    async fn many(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.run(statement, self.records(statement, args)).await
    }
}

#[async_trait]
impl<D: Dialect> JournalStore for SqlStore<D> {
    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError> {
        let register = async {
            let Some(statement) = &self.statements.register else {
                if let Some(record) = self.record(&self.statements.insert, new_args(new)?).await? {
                    return Ok(Registration::Inserted(record));
                }
                let args = args![new.namespace.as_str(), new.operation_key.as_str()];
                let existing = self.record(&self.statements.get, args).await?;
                return Ok(existing.map_or(Registration::Raced, Registration::Existing));
            };
            let row = self.row::<RegisteredRow>(statement, new_args(new)?).await?;
            Ok(match row {
                None => Registration::Raced,
                Some(RegisteredRow {
                    row,
                    inserted: true,
                }) => Registration::Inserted(row.try_into()?),
                Some(RegisteredRow { row, .. }) => Registration::Existing(row.try_into()?),
            })
        };
        let statement = self.statements.register.as_ref();
        self.run(statement.unwrap_or(&self.statements.insert), register)
            .await
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let args = args![namespace.as_str(), key.as_str()];
        self.one(&self.statements.get, args).await
    }

    async fn claim(&self, claim: &Claim) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (claim.namespace.as_str(), claim.operation_key.as_str());
        let (status, attempt) = (claim.expected_status.as_str(), claim.expected_attempt);
        let granted_to = claim.attempt.map(|a| a.to_hex());
        let args = args![
            ns,
            key,
            status,
            attempt,
            claim.lease,
            claim.lease_id,
            granted_to
        ];
        self.one(&self.statements.claim, args).await
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        let (variant, args) = report_args(token, settlement);
        let settle = async {
            if let Some(statements) = &self.statements.settle_with_previous {
                let row = self.row::<SettledRow>(&statements[variant], args).await?;
                return row
                    .map(|row| {
                        Ok(Settled {
                            record: row.row.try_into()?,
                            previous: status(&row.previous_status)?,
                        })
                    })
                    .transpose();
            }
            let key = args[..2].to_vec();
            let Some(before) = self.record(&self.statements.get, key).await? else {
                return Ok(None);
            };
            let settled = self.record(&self.statements.settle[variant], args).await?;
            Ok(settled.map(|record| Settled {
                record,
                previous: before.status,
            }))
        };
        self.run(&self.statements.settle[variant], settle).await
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (token.namespace.as_str(), token.operation_key.as_str());
        let args = args![ns, key, token.attempt, token.lease_id, lease];
        self.one(&self.statements.renew, args).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        // No position: after the latest time both backends store.
        let end = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default();
        let (at, key) = query.after.clone().unwrap_or((end, String::new()));
        let (status, action) = (query.status.map(Status::as_str), query.action_type.as_ref());
        let action = action.map(|a| a.as_str().to_owned());
        let args = args![
            query.namespace.as_str(),
            status,
            action,
            D::time_text(at.min(end)),
            key,
            query.limit
        ];
        self.many(&self.statements.list, args).await
    }

    async fn resolve(
        &self,
        expected: &OperationRecord,
        resolution: &Resolution,
        attribution: &Attribution,
        lookup: Lookup,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (expected.namespace.as_str(), expected.operation_key.as_str());
        let reason = attribution.reason.as_deref().map(|r| first(r, 500));
        let mut args = args![
            ns,
            key,
            expected.status.as_str(),
            expected.attempt_count,
            i32::from(lookup == Lookup::Made),
            attribution.kind.as_str(),
            first(&attribution.actor, 200),
            reason,
        ];
        let (variant, values) = match resolution {
            Resolution::Succeeded {
                external_id,
                result_json,
            } => (0, args![external_id.clone(), result_json.clone()]),
            Resolution::FailedFinal { error_code } => (1, args![error_code.as_str()]),
            Resolution::ReleaseForRetry => (2, args![NULL]),
            Resolution::KeepUnknown { next_check_after } => (3, args![*next_check_after]),
            Resolution::Escalate { reason } => (4, args![reason.as_str()]),
        };
        args.extend(values);
        self.one(&self.statements.resolve[variant], args).await
    }

    async fn sweep_expired_leases(&self, limit: i64, worker: &str) -> Result<u64, StoreError> {
        let statement = &self.statements.sweep;
        let args = self.args(statement, args![limit, first(worker, 200)]);
        let sweep = D::execute(&self.pool, &statement.sql, args);
        self.run(statement, sweep).await
    }

    async fn list_review(&self, query: &ReviewQuery) -> Result<Vec<OperationRecord>, StoreError> {
        // No position: before the beginning of time.
        let start = (DateTime::<Utc>::UNIX_EPOCH, String::new());
        let (at, key) = query.after.clone().unwrap_or(start);
        let action = query.action_type.as_ref().map(|a| a.as_str().to_owned());
        let (ns, min_age) = (query.namespace.as_str(), query.min_age);
        let args = args![ns, D::time_text(at), key, query.limit, action, min_age];
        self.many(&self.statements.list_review, args).await
    }

    async fn search(&self, query: &SearchQuery) -> Result<Vec<OperationRecord>, StoreError> {
        let (name, value) = query.reference.clone().unzip();
        let (ns, external_id) = (query.namespace.as_str(), query.external_id.clone());
        let args = args![ns, external_id, name, value, query.limit];
        self.many(&self.statements.search, args).await
    }

    async fn queue_stats(&self, namespace: &Namespace) -> Result<QueueStats, StoreError> {
        let statement = &self.statements.queue_stats;
        let stats = async {
            let row = self.row::<QueueRow>(statement, args![namespace.as_str()]);
            let row = row.await?.ok_or_else(|| corrupt("queue_stats"))?;
            let count = |count, oldest| StateCount { count, oldest };
            Ok(QueueStats {
                unknown: count(row.unknown, row.oldest_unknown),
                in_progress: count(row.in_progress, row.oldest_in_progress),
                due: count(row.due, row.oldest_due),
                review: count(row.review, row.oldest_review),
                observed_at: row.observed_at,
            })
        };
        self.run(statement, stats).await
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<OperationEvent>, StoreError> {
        let (ns, key) = (query.namespace.as_str(), query.operation_key.as_str());
        let args = args![ns, key, query.after_event_id, query.limit];
        let history = async {
            let rows = self
                .rows::<EventRow>(&self.statements.history, args)
                .await?;
            rows.into_iter().map(OperationEvent::try_from).collect()
        };
        self.run(&self.statements.history, history).await
    }

    async fn claim_due(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        self.many(&self.statements.claim_due, args![limit, hold])
            .await
    }

    async fn claim_for_reconcile(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
        hold: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let args = args![namespace.as_str(), key.as_str(), hold];
        self.one(&self.statements.claim_for_reconcile, args).await
    }

    async fn find_same_request(&self, query: &SameRequest) -> Result<Option<String>, StoreError> {
        let (ns, action) = (query.namespace.as_str(), query.action_type.as_str());
        let (hash, other_than) = (query.request_hash.to_hex(), query.other_than.as_str());
        let args = args![ns, action, hash, other_than, query.window];
        let find = self.row::<KeyRow>(&self.statements.find_same_request, args);
        let find = async { Ok(find.await?.map(|row| row.operation_key)) };
        self.run(&self.statements.find_same_request, find).await
    }
}

#[async_trait]
impl<D: Dialect> JournalMaintenance for SqlStore<D> {
    async fn purge(&self, limit: i64) -> Result<u64, StoreError> {
        self.call("purge", "DELETE", OPERATIONS, D::purge(self, limit))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let ping = D::execute(&self.pool, D::PING, Vec::new());
        self.call("ping", "SELECT", "", async { ping.await.map(drop) })
            .await
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        let stats = async {
            let row = self.row::<BacklogRow>(&self.statements.backlog_stats, Vec::new());
            let row = row.await?.ok_or_else(|| corrupt("backlog"))?;
            Ok(BacklogStats::from_columns(
                (row.unknown, row.oldest_unknown_seconds),
                (row.review_queue, row.oldest_review_seconds),
                (row.overdue, row.most_overdue_seconds),
            ))
        };
        self.run(&self.statements.backlog_stats, stats).await
    }

    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        let analyze = D::analyze_new_tables(&self.pool, min_changes);
        self.call("analyze_new_tables", "ANALYZE", OPERATIONS, analyze)
            .await
    }
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("corrupt journal row: {what}").into())
}

pub(super) fn status(value: &str) -> Result<Status, StoreError> {
    Status::from_db(value).ok_or_else(|| corrupt("status"))
}

/// A journal row as both backends return it (`{@columns}`).
#[derive(Debug, sqlx::FromRow)]
struct OperationRow {
    namespace: String,
    operation_key: String,
    action_type: String,
    request_hash: String,
    status: String,
    attempt_count: i32,
    external_id: Option<String>,
    result_json: Option<String>,
    error_code: Option<String>,
    lease_until: Option<DateTime<Utc>>,
    lease_id: Option<String>,
    lease_attempt_sha256: Option<String>,
    business_references: String,
    unknown_since: Option<DateTime<Utc>>,
    next_check_at: Option<DateTime<Utc>>,
    reconcile_attempts: i32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    review_required_at: Option<DateTime<Utc>>,
    review_reason: Option<String>,
    last_actor_kind: String,
    action_policy: Option<String>,
    trace_context: Option<String>,
    observed_at: DateTime<Utc>,
}

impl TryFrom<OperationRow> for OperationRecord {
    type Error = StoreError;

    fn try_from(row: OperationRow) -> Result<Self, StoreError> {
        let lease_id = row.lease_id.as_deref().map(Uuid::parse_str);
        Ok(OperationRecord {
            namespace: Namespace::parse(&row.namespace).map_err(|_| corrupt("namespace"))?,
            operation_key: OperationKey::parse(&row.operation_key)
                .map_err(|_| corrupt("operation_key"))?,
            action_type: ActionType::parse(&row.action_type).map_err(|_| corrupt("action_type"))?,
            request_hash: RequestHash::from_hex(&row.request_hash)
                .ok_or_else(|| corrupt("request_hash"))?,
            status: status(&row.status)?,
            attempt_count: row.attempt_count,
            lease_id: lease_id.transpose().map_err(|_| corrupt("lease_id"))?,
            lease_until: row.lease_until,
            lease_attempt: match row.lease_attempt_sha256.as_deref() {
                Some(hex) => Some(
                    AttemptDigest::from_hex(hex).ok_or_else(|| corrupt("lease_attempt_sha256"))?,
                ),
                None => None,
            },
            external_id: row.external_id,
            result_json: row.result_json,
            error_code: row.error_code,
            references: serde_json::from_str::<BTreeMap<String, String>>(&row.business_references)
                .map_err(|_| corrupt("business_references"))?,
            unknown_since: row.unknown_since,
            next_check_at: row.next_check_at,
            reconcile_attempts: row.reconcile_attempts,
            review_required_at: row.review_required_at,
            review_reason: row.review_reason,
            // A policy recorded by a newer version may not parse here: fall back to the
            // current file for it rather than fail the operation.
            action_policy: row
                .action_policy
                .and_then(|text| serde_json::from_str(&text).ok()),
            last_actor_kind: ActorKind::from_db(&row.last_actor_kind)
                .ok_or_else(|| corrupt("last_actor_kind"))?,
            trace_context: row.trace_context,
            created_at: row.created_at,
            updated_at: row.updated_at,
            observed_at: row.observed_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct RegisteredRow {
    #[sqlx(flatten)]
    row: OperationRow,
    inserted: bool,
}

#[derive(Debug, sqlx::FromRow)]
struct SettledRow {
    #[sqlx(flatten)]
    row: OperationRow,
    previous_status: String,
}

#[derive(Debug, sqlx::FromRow)]
struct KeyRow {
    operation_key: String,
}

/// One number (`count`).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct CountRow {
    pub(super) count: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct BacklogRow {
    unknown: i64,
    oldest_unknown_seconds: Option<f64>,
    review_queue: i64,
    oldest_review_seconds: Option<f64>,
    overdue: i64,
    most_overdue_seconds: Option<f64>,
}

#[derive(Debug, sqlx::FromRow)]
struct QueueRow {
    unknown: i64,
    oldest_unknown: Option<DateTime<Utc>>,
    in_progress: i64,
    oldest_in_progress: Option<DateTime<Utc>>,
    due: i64,
    oldest_due: Option<DateTime<Utc>>,
    review: i64,
    oldest_review: Option<DateTime<Utc>>,
    observed_at: DateTime<Utc>,
}

#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    event_id: i64,
    from_status: Option<String>,
    to_status: String,
    attempt_count: i32,
    review: bool,
    actor_kind: String,
    actor: String,
    reason: Option<String>,
    occurred_at: DateTime<Utc>,
}

impl TryFrom<EventRow> for OperationEvent {
    type Error = StoreError;

    fn try_from(row: EventRow) -> Result<Self, StoreError> {
        Ok(OperationEvent {
            event_id: row.event_id,
            from_status: row.from_status.as_deref().map(status).transpose()?,
            to_status: status(&row.to_status)?,
            attempt_count: row.attempt_count,
            review_required: row.review,
            actor_kind: ActorKind::from_db(&row.actor_kind).ok_or_else(|| corrupt("actor_kind"))?,
            actor: row.actor,
            reason: row.reason,
            occurred_at: row.occurred_at,
        })
    }
}
