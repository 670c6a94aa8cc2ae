//! The one SQL implementation of [`JournalStore`], for every backend: the statements are the
//! `.sql` files of `src/store/sql/` (see its README), rendered once per store for its
//! [`Dialect`]; the parameters of each are bound here, once; rows decode with
//! `derive(FromRow)` into row types and then into domain types through `TryFrom`. Every
//! statement runs inside `SqlStore::call`, which traces it and counts its failures.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
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

use super::group_commit::{GroupCommit, Queues};

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
pub(super) fn arguments<DB: BindColumns>(args: Vec<Arg>) -> Result<DB::Arguments, StoreError>
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
    /// The statements the backend writes its own way (`sql/postgres/`, `sql/sqlite/`), by
    /// the store method that sends them; every other method's statement is `sql/<method>.sql`.
    const OWN: &'static [(&'static str, &'static str)];
    /// Whether `register` and `settle` answer in one statement what else takes a second one:
    /// the existing row a registration met, the status a report left.
    const ANSWERS_IN_ONE: bool;
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
    /// Deletes up to `limit` terminal operations past retention, with their history,
    /// through the store's `purge` statement; answers how many operations went.
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
fn render<D: Dialect>(template: &str, batch: bool) -> String {
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
fn from_rows(sql: &str) -> String {
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
fn values(types: &[&str]) -> String {
    let arrays = (0..types.len()).map(|i| format!("${}::{}[]", i + 2, types[i]));
    let names = (0..types.len()).map(|i| format!("p{}", i + 2));
    let arrays: Vec<_> = arrays.collect();
    let names: Vec<_> = names.collect();
    format!("unnest({}) AS v ({})", arrays.join(", "), names.join(", "))
}

/// A rendered statement: `clocked` when it reads the clock, bound as `$1`; `method` is the
/// store method that sends it and `operation` its kind, for its span and error count.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub(super) sql: String,
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
        Self::rendered::<D>(method, operation, template, false)
    }

    /// The batch form of a statement (`sql/postgres/*_many.sql`): its fragments read each row's
    /// parameters from the batch rows `v`, whose columns have `types`.
    pub(super) fn batched<D: Dialect>(
        method: &'static str,
        operation: &'static str,
        template: &str,
        types: &[&str],
    ) -> Self {
        let template = with(template, "values", &values(types));
        Self::rendered::<D>(method, operation, &template, true)
    }

    fn rendered<D: Dialect>(
        method: &'static str,
        operation: &'static str,
        template: &str,
        batch: bool,
    ) -> Self {
        let sql = render::<D>(template, batch);
        let clocked = binds_first(&sql) && !binds_first(template);
        Self {
            sql,
            clocked,
            method,
            operation,
        }
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
pub(super) struct Statements {
    register: Statement,
    get: Statement,
    claim: Statement,
    settle: [Statement; 3],
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
    pub(super) purge: Statement,
    pub(super) outbox: super::outbox::Statements,
    /// The batch forms of `register` and of each report (Postgres: group commit).
    pub(super) register_many: Option<Statement>,
    pub(super) settle_many: Option<[Statement; 3]>,
}

/// The column types of a batch of registrations: `$2..$11` of `insert.sql`.
const REGISTER_COLUMNS: &[&str] = &[
    "text", "text", "text", "text", "float8", "text", "text", "text", "text", "text",
];

/// The column types of a batch of reports, by variant (`SETTLEMENTS`): the lease as
/// `$2..$5`, the outcome's from `$6` (see `report_args`).
const SETTLE_COLUMNS: [&[&str]; 3] = [
    &["text", "text", "int8", "text", "text", "text"],
    &["text", "text", "int8", "text", "text"],
    &["text", "text", "int8", "text", "text", "float8"],
];

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

/// The template of store method `method` for dialect `D`: the dialect's own, else `shared`
/// (`sql/<method>.sql`).
pub(super) fn template<D: Dialect>(method: &str, shared: Option<&'static str>) -> &'static str {
    let own = D::OWN.iter().find(|(name, _)| *name == method);
    let template = own.map(|(_, sql)| *sql).or(shared);
    template.unwrap_or_else(|| panic!("no statement for {method}"))
}

/// The statement of store method `$name` of kind `$operation` for dialect `$d`:
/// `sql/$name.sql` unless the dialect writes its own; with `own`, only the dialect's own
/// (`sql/postgres/`, `sql/sqlite/`).
macro_rules! file {
    ($d:ident $operation:literal $name:ident) => {{
        let shared = include_str!(concat!("sql/", stringify!($name), ".sql"));
        let template = $crate::store::sql::template::<$d>(stringify!($name), Some(shared));
        Statement::new::<$d>(stringify!($name), $operation, template)
    }};
    ($d:ident $operation:literal $name:ident own) => {{
        let template = $crate::store::sql::template::<$d>(stringify!($name), None);
        Statement::new::<$d>(stringify!($name), $operation, template)
    }};
}
pub(super) use file;

impl Statements {
    pub(super) fn new<D: Dialect>() -> Self {
        let st = Statement::new::<D>;
        let settle = template::<D>("settle", Some(include_str!("sql/settle.sql")));
        let resolve = include_str!("sql/resolve.sql");
        Self {
            register: file!(D "INSERT" register),
            get: file!(D "SELECT" get),
            claim: file!(D "UPDATE" claim),
            settle: SETTLEMENTS.map(|s| st("settle", "UPDATE", &with(settle, "settlement", s))),
            renew: file!(D "UPDATE" renew),
            list: file!(D "SELECT" list),
            resolve: RESOLUTIONS.map(|r| st("resolve", "UPDATE", &with(resolve, "resolution", r))),
            sweep: file!(D "UPDATE" sweep_expired_leases own),
            list_review: file!(D "SELECT" list_review),
            search: file!(D "SELECT" search),
            queue_stats: file!(D "SELECT" queue_stats),
            history: file!(D "SELECT" history),
            claim_due: file!(D "UPDATE" claim_due own),
            claim_for_reconcile: file!(D "UPDATE" claim_for_reconcile),
            find_same_request: file!(D "SELECT" find_same_request),
            backlog_stats: file!(D "SELECT" backlog_stats),
            purge: file!(D "DELETE" purge own),
            outbox: super::outbox::Statements::new::<D>(),
            register_many: D::OWN
                .iter()
                .find(|(name, _)| *name == "register_many")
                .map(|(_, many)| {
                    Statement::batched::<D>("register", "INSERT", many, REGISTER_COLUMNS)
                }),
            settle_many: D::OWN
                .iter()
                .find(|(name, _)| *name == "settle_many")
                .map(|(_, many)| {
                    std::array::from_fn(|variant| {
                        let settlement = from_rows(SETTLEMENTS[variant]);
                        let many = with(many, "settlement", &settlement);
                        let columns = SETTLE_COLUMNS[variant];
                        Statement::batched::<D>("settle", "UPDATE", &many, columns)
                    })
                }),
        }
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
    /// Group commit of registrations and reports, when on: its settings and its queues,
    /// started by the first write of this store or of any clone of it.
    pub(super) group: Option<(GroupCommit, Arc<OnceLock<Queues>>)>,
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn from_parts(pool: D::Pool, extra: D) -> Self {
        let statements = Statements::new::<D>();
        let batches = statements.register_many.is_some() && statements.settle_many.is_some();
        Self {
            pool,
            statements: Arc::new(statements),
            clock: Clock::default(),
            metrics: Metrics::disabled(),
            extra: Arc::new(extra),
            group: batches.then(|| (GroupCommit::default(), Arc::default())),
        }
    }

    /// This store with group commit set by `group` (`None`: every call goes alone). On by
    /// default on Postgres; SQLite has no batch statements and ignores it.
    pub fn with_group_commit(mut self, group: Option<GroupCommit>) -> Self {
        let batches = self.statements.register_many.is_some();
        self.group = group
            .filter(|_| batches)
            .map(|group| (group, Arc::default()));
        self
    }

    /// The group commit queues, started on first use; `None` when group commit is off.
    fn queues(&self) -> Option<&Queues> {
        let (group, queues) = self.group.as_ref()?;
        let alone = || Self {
            group: None,
            ..self.clone()
        };
        Some(queues.get_or_init(|| Queues::start(alone(), *group)))
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

    /// The statements whose cost must not grow with the journal, as this store sends them,
    /// each named after the method that sends it, for the query plans the benchmark shows
    /// (docs/performance.md); a report by its first variant (a success); the group commit
    /// forms as `register_many` and `settle_many_<variant>`.
    pub fn explained(&self) -> Vec<(&'static str, &str)> {
        let all = &self.statements;
        let mut explained: Vec<_> = [
            &all.register,
            &all.settle[0],
            &all.find_same_request,
            &all.sweep,
            &all.claim_due,
            &all.claim_for_reconcile,
            &all.purge,
            &all.backlog_stats,
            &all.history,
            &all.list,
            &all.list_review,
            &all.queue_stats,
        ]
        .map(|statement| (statement.method, statement.sql.as_str()))
        .into();
        // The group commit forms (Postgres), each report's variant by its name.
        let batches = all.register_many.iter().map(|many| ("register_many", many));
        let reports = all.settle_many.iter().flat_map(|many| {
            let names = [
                "settle_many_succeeded",
                "settle_many_failed_final",
                "settle_many_unknown",
            ];
            names.into_iter().zip(many)
        });
        explained.extend(
            batches
                .chain(reports)
                .map(|(name, many)| (name, many.sql.as_str())),
        );
        explained
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

    /// The rows of `statement`, each made a `T` (a record, an event) from its row type `R`.
    pub(super) async fn decoded<R: Decoded, T: TryFrom<R, Error = StoreError>>(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Vec<T>, StoreError> {
        let rows = self.rows::<R>(statement, args).await?;
        rows.into_iter().map(T::try_from).collect()
    }

    /// Runs one store method: `method` names it, `operation` is its statement's kind; its
    /// table is `operation_events` for `history`, `escalation_outbox` for the outbox's
    /// methods, none for `ping`, `agent_operations` for every other method. Inside a traced request or reconcile attempt it gets a client span
    /// (`db.system.name`, `db.operation.name`, `db.collection.name`); a failure counts in
    /// `opjournal.store.errors`. Background calls without a parent span are counted but not
    /// traced, so that an idle process sends no traces.
    async fn call<T>(
        &self,
        method: &'static str,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = if tracing::Span::current().is_none() {
            tracing::Span::none()
        } else {
            let collection = match method {
                "history" => "operation_events",
                "claim_deliveries" | "record_delivery" | "deliveries" | "outbox_stats" => {
                    "escalation_outbox"
                }
                "ping" => "",
                _ => "agent_operations",
            };
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

    /// Runs `call`, the work of `statement`'s method, through [`call`](Self::call).
    pub(super) async fn run<T>(
        &self,
        statement: &Statement,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call(statement.method, statement.operation, call).await
    }

    /// The row `get` reads (namespace and key in `key`), inside the span of the method that
    /// needs it.
    async fn read(&self, key: Vec<Arg>) -> Result<Option<OperationRecord>, StoreError> {
        let get = &self.statements.get;
        Ok(self.decoded::<OperationRow, _>(get, key).await?.pop())
    }

    /// A method that is one statement answering records (at most one: `pop` takes it).
    async fn many(
        &self,
        statement: &Statement,
        args: Vec<Arg>,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let records = self.decoded::<OperationRow, OperationRecord>(statement, args);
        self.run(statement, records).await
    }
}

impl<D: Dialect> SqlStore<D> {
    /// [`JournalStore::register`] in its own statement.
    pub(super) async fn register_one(
        &self,
        new: &NewOperation,
    ) -> Result<Registration, StoreError> {
        let statement = &self.statements.register;
        let registered = self.rows::<OperationRow>(statement, new_args(new)?);
        if let Some(row) = registered.await?.pop() {
            return row.registration();
        }
        if D::ANSWERS_IN_ONE {
            return Ok(Registration::Raced);
        }
        let key = args![new.namespace.as_str(), new.operation_key.as_str()];
        let existing = self.read(key).await?;
        Ok(existing.map_or(Registration::Raced, Registration::Existing))
    }

    /// [`JournalStore::settle`] in its own statement.
    pub(super) async fn settle_one(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        let (variant, args) = report_args(token, settlement);
        let statement = &self.statements.settle[variant];
        // Without a status answered, the one read first (see `JournalStore::settle`).
        let before = match D::ANSWERS_IN_ONE {
            true => None,
            false => match self.read(args[..2].to_vec()).await? {
                Some(row) => Some(row.status),
                None => return Ok(None),
            },
        };
        let row = self.rows::<OperationRow>(statement, args).await?.pop();
        row.map(|row| row.settled(before)).transpose()
    }
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

fn first(value: &str, chars: usize) -> String {
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
fn variant(settlement: &Settlement) -> usize {
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

#[async_trait]
impl<D: Dialect> JournalStore for SqlStore<D> {
    fn clock(&self) -> &Clock {
        &self.clock
    }

    async fn register(&self, new: &NewOperation) -> Result<Registration, StoreError> {
        let statement = &self.statements.register;
        match self.queues() {
            Some(queues) => {
                self.run(statement, queues.register.submit(new.clone()))
                    .await
            }
            None => self.run(statement, self.register_one(new)).await,
        }
    }

    async fn get(
        &self,
        namespace: &Namespace,
        key: &OperationKey,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let args = args![namespace.as_str(), key.as_str()];
        Ok(self.many(&self.statements.get, args).await?.pop())
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
        Ok(self.many(&self.statements.claim, args).await?.pop())
    }

    async fn settle(
        &self,
        token: &LeaseToken,
        settlement: &Settlement,
    ) -> Result<Option<Settled>, StoreError> {
        let statement = &self.statements.settle[variant(settlement)];
        match self.queues() {
            Some(queues) => {
                let report = (token.clone(), settlement.clone());
                self.run(statement, queues.settle.submit(report)).await
            }
            None => {
                self.run(statement, self.settle_one(token, settlement))
                    .await
            }
        }
    }

    async fn renew(
        &self,
        token: &LeaseToken,
        lease: Duration,
    ) -> Result<Option<OperationRecord>, StoreError> {
        let (ns, key) = (token.namespace.as_str(), token.operation_key.as_str());
        let args = args![ns, key, token.attempt, token.lease_id, lease];
        Ok(self.many(&self.statements.renew, args).await?.pop())
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<OperationRecord>, StoreError> {
        // No position: after the latest time both backends store.
        let end = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default();
        let (at, key) = query.after.clone().unwrap_or((end, String::new()));
        let (status, action) = (query.status.map(Status::as_str), query.action_type.as_ref());
        let (ns, action) = (query.namespace.as_str(), action.map(ActionType::as_str));
        let args = args![
            ns,
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
        let (status, attempt) = (expected.status.as_str(), expected.attempt_count);
        let (kind, actor) = (attribution.kind.as_str(), first(&attribution.actor, 200));
        let reason = attribution.reason.as_deref().map(|r| first(r, 500));
        let made = i32::from(lookup == Lookup::Made);
        let mut args = args![ns, key, status, attempt, made, kind, actor, reason];
        let (variant, values) = match resolution {
            Resolution::Succeeded {
                external_id,
                result_json,
            } => (
                0,
                args![
                    external_id.as_ref().map(|i| i.as_str()),
                    result_json.clone()
                ],
            ),
            Resolution::FailedFinal { error_code } => (1, args![error_code.as_str()]),
            Resolution::ReleaseForRetry => (2, Vec::new()),
            Resolution::KeepUnknown { next_check_after } => (3, args![*next_check_after]),
            Resolution::Escalate { reason } => (4, args![reason.as_str()]),
        };
        args.extend(values);
        Ok(self
            .many(&self.statements.resolve[variant], args)
            .await?
            .pop())
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
            // Each state's count and oldest time, then the clock (`queue_stats.sql`).
            let row = self.rows(statement, args![namespace.as_str()]).await?.pop();
            let row: (_, _, _, _, _, _, _, _, _) = row.ok_or_else(|| corrupt("queue_stats"))?;
            let count = |count, oldest| StateCount { count, oldest };
            Ok(QueueStats {
                unknown: count(row.0, row.1),
                in_progress: count(row.2, row.3),
                due: count(row.4, row.5),
                review: count(row.6, row.7),
                observed_at: row.8,
            })
        };
        self.run(statement, stats).await
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<OperationEvent>, StoreError> {
        let (ns, key) = (query.namespace.as_str(), query.operation_key.as_str());
        let args = args![ns, key, query.after_event_id, query.limit];
        let statement = &self.statements.history;
        let events = self.decoded::<EventRow, _>(statement, args);
        self.run(statement, events).await
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
        Ok(self
            .many(&self.statements.claim_for_reconcile, args)
            .await?
            .pop())
    }

    async fn find_same_request(&self, query: &SameRequest) -> Result<Option<String>, StoreError> {
        let (ns, action) = (query.namespace.as_str(), query.action_type.as_str());
        let (hash, other_than) = (query.request_hash.to_hex(), query.other_than.as_str());
        let args = args![ns, action, hash, other_than, query.window];
        let statement = &self.statements.find_same_request;
        let find = async { Ok(self.rows(statement, args).await?.pop().map(|(key,)| key)) };
        self.run(statement, find).await
    }
}

#[async_trait]
impl<D: Dialect> JournalMaintenance for SqlStore<D> {
    async fn purge(&self, limit: i64) -> Result<u64, StoreError> {
        self.run(&self.statements.purge, D::purge(self, limit))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let ping = D::execute(&self.pool, D::PING, Vec::new());
        self.call("ping", "SELECT", async { ping.await.map(drop) })
            .await
    }

    async fn backlog_stats(&self) -> Result<BacklogStats, StoreError> {
        let statement = &self.statements.backlog_stats;
        let stats = async {
            let row = self.rows(statement, Vec::new()).await?.pop();
            let (unknown, oldest, review, oldest_review, overdue, most_overdue) =
                row.ok_or_else(|| corrupt("backlog"))?;
            Ok(BacklogStats::from_columns(
                (unknown, oldest),
                (review, oldest_review),
                (overdue, most_overdue),
            ))
        };
        self.run(statement, stats).await
    }

    async fn analyze_new_tables(&self, min_changes: i64) -> Result<Option<u64>, StoreError> {
        let analyze = D::analyze_new_tables(&self.pool, min_changes);
        self.call("analyze_new_tables", "ANALYZE", analyze).await
    }
}

pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Other(format!("corrupt journal row: {what}").into())
}

pub(super) fn status(value: &str) -> Result<Status, StoreError> {
    Status::from_db(value).ok_or_else(|| corrupt("status"))
}

/// A journal row as both backends return it (`{@columns}`), with what `register` and `settle`
/// answer besides.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct OperationRow {
    pub(super) namespace: String,
    pub(super) operation_key: String,
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
    /// `register` only: whether it inserted the row.
    #[sqlx(default)]
    inserted: bool,
    /// `settle` on Postgres only: the status the report left.
    #[sqlx(default)]
    previous_status: Option<String>,
}

impl OperationRow {
    /// What `register` answers with this row.
    pub(super) fn registration(self) -> Result<Registration, StoreError> {
        let inserted = self.inserted;
        let record = self.try_into()?;
        Ok(match inserted {
            true => Registration::Inserted(record),
            false => Registration::Existing(record),
        })
    }

    /// What `settle` answers with this row: the status it left is the one the row answers,
    /// else `before` (read first).
    pub(super) fn settled(self, before: Option<Status>) -> Result<Settled, StoreError> {
        let answered = self.previous_status.as_deref().map(status).transpose()?;
        let previous = answered
            .or(before)
            .ok_or_else(|| corrupt("previous_status"))?;
        let record = self.try_into()?;
        Ok(Settled { record, previous })
    }
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
