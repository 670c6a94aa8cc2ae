//! Every statement of a store, rendered once for its dialect, each carrying what its span
//! and error count name: the store method that sends it, its kind and its table.

use super::dialect::Dialect;
use super::render::{binds_first, from_rows, render, values, with};

/// The table a statement works on: its span's `db.collection.name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Collection {
    /// `agent_operations`: the journal itself.
    Operations,
    /// `operation_events`: the history.
    Events,
    /// `escalation_outbox`: the webhook's events and their delivery.
    Outbox,
}

impl Collection {
    /// The table's name.
    pub(super) fn table(self) -> &'static str {
        match self {
            Self::Operations => "agent_operations",
            Self::Events => "operation_events",
            Self::Outbox => "escalation_outbox",
        }
    }
}

/// A rendered statement: `clocked` when it reads the clock, bound as `$1`; `method` is the
/// store method that sends it, `operation` its kind and `collection` its table, for its span
/// and error count.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) clocked: bool,
    pub(super) method: &'static str,
    pub(super) operation: &'static str,
    pub(super) collection: Collection,
}

impl Statement {
    fn new<D: Dialect>(
        method: &'static str,
        operation: &'static str,
        collection: Collection,
        template: &str,
    ) -> Self {
        let sql = render::<D>(template, false);
        Self::rendered(method, operation, collection, template, sql)
    }

    /// The batch form of a statement (`sql/postgres/*_many.sql`): its fragments read each row's
    /// parameters from the batch rows `v`, whose columns have `types`.
    fn batched<D: Dialect>(
        method: &'static str,
        operation: &'static str,
        template: &str,
        types: &[&str],
    ) -> Self {
        let template = with(template, "values", &values(types));
        let sql = render::<D>(&template, true);
        Self::rendered(method, operation, Collection::Operations, &template, sql)
    }

    fn rendered(
        method: &'static str,
        operation: &'static str,
        collection: Collection,
        template: &str,
        sql: String,
    ) -> Self {
        let clocked = binds_first(&sql) && !binds_first(template);
        Self {
            sql,
            clocked,
            method,
            operation,
            collection,
        }
    }
}

/// Every statement of a store, rendered once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) register: Statement,
    pub(super) get: Statement,
    pub(super) claim: Statement,
    pub(super) settle: [Statement; 3],
    pub(super) renew: Statement,
    pub(super) list: Statement,
    pub(super) resolve: [Statement; 5],
    pub(super) sweep: Statement,
    pub(super) list_review: Statement,
    pub(super) search: Statement,
    pub(super) queue_stats: Statement,
    pub(super) history: Statement,
    pub(super) claim_due: Statement,
    pub(super) claim_for_reconcile: Statement,
    pub(super) find_same_request: Statement,
    pub(super) backlog_stats: Statement,
    pub(super) purge: Statement,
    pub(super) claim_deliveries: Statement,
    pub(super) record_delivery: Statement,
    pub(super) deliveries: Statement,
    pub(super) outbox_stats: Statement,
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
    include_str!("settle_succeeded.sql"),
    include_str!("settle_failed_final.sql"),
    include_str!("settle_unknown.sql"),
];

const RESOLUTIONS: [&str; 5] = [
    include_str!("resolve_succeeded.sql"),
    include_str!("resolve_failed_final.sql"),
    include_str!("resolve_release.sql"),
    include_str!("resolve_keep_unknown.sql"),
    include_str!("resolve_escalate.sql"),
];

/// The template of store method `method` for dialect `D`: the dialect's own, else `shared`
/// (`sql/<method>.sql`).
fn template<D: Dialect>(method: &str, shared: Option<&'static str>) -> &'static str {
    let own = D::OWN.iter().find(|(name, _)| *name == method);
    let template = own.map(|(_, sql)| *sql).or(shared);
    template.unwrap_or_else(|| panic!("no statement for {method}"))
}

/// The statement of store method `$name`, of kind `$operation` on table `$collection`, for
/// dialect `$d`: `sql/$name.sql` unless the dialect writes its own; with `own`, only the
/// dialect's own (`sql/postgres/`, `sql/sqlite/`).
macro_rules! statement {
    ($d:ident $operation:literal $collection:ident $name:ident) => {{
        let shared = include_str!(concat!(stringify!($name), ".sql"));
        let template = template::<$d>(stringify!($name), Some(shared));
        let collection = Collection::$collection;
        Statement::new::<$d>(stringify!($name), $operation, collection, template)
    }};
    ($d:ident $operation:literal $collection:ident $name:ident own) => {{
        let template = template::<$d>(stringify!($name), None);
        let collection = Collection::$collection;
        Statement::new::<$d>(stringify!($name), $operation, collection, template)
    }};
}

impl Statements {
    pub(super) fn new<D: Dialect>() -> Self {
        let ops = Collection::Operations;
        let st = |method, template: String| Statement::new::<D>(method, "UPDATE", ops, &template);
        let settle = template::<D>("settle", Some(include_str!("settle.sql")));
        let resolve = include_str!("resolve.sql");
        Self {
            register: statement!(D "INSERT" Operations register),
            get: statement!(D "SELECT" Operations get),
            claim: statement!(D "UPDATE" Operations claim),
            settle: SETTLEMENTS.map(|s| st("settle", with(settle, "settlement", s))),
            renew: statement!(D "UPDATE" Operations renew),
            list: statement!(D "SELECT" Operations list),
            resolve: RESOLUTIONS.map(|r| st("resolve", with(resolve, "resolution", r))),
            sweep: statement!(D "UPDATE" Operations sweep_expired_leases own),
            list_review: statement!(D "SELECT" Operations list_review),
            search: statement!(D "SELECT" Operations search),
            queue_stats: statement!(D "SELECT" Operations queue_stats),
            history: statement!(D "SELECT" Events history),
            claim_due: statement!(D "UPDATE" Operations claim_due own),
            claim_for_reconcile: statement!(D "UPDATE" Operations claim_for_reconcile),
            find_same_request: statement!(D "SELECT" Operations find_same_request),
            backlog_stats: statement!(D "SELECT" Operations backlog_stats),
            purge: statement!(D "DELETE" Operations purge own),
            claim_deliveries: statement!(D "UPDATE" Outbox claim_deliveries own),
            record_delivery: statement!(D "UPDATE" Outbox record_delivery),
            deliveries: statement!(D "SELECT" Outbox deliveries),
            outbox_stats: statement!(D "SELECT" Outbox outbox_stats),
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

    /// Every statement, each once, in a fixed order: the single-row forms (the same for
    /// every dialect), then the batch forms the dialect has. The whole set is taken apart
    /// here, so that a statement added to the store is listed, or this does not compile.
    #[cfg(test)]
    pub(super) fn all(&self) -> Vec<&Statement> {
        macro_rules! every {
            ($($field:ident),* $(,)?) => {{
                let Self { $($field),* } = self;
                let mut all = Vec::new();
                $(all.extend($field.each());)*
                all
            }};
        }
        every!(
            register,
            get,
            claim,
            settle,
            renew,
            list,
            resolve,
            sweep,
            list_review,
            search,
            queue_stats,
            history,
            claim_due,
            claim_for_reconcile,
            find_same_request,
            backlog_stats,
            purge,
            claim_deliveries,
            record_delivery,
            deliveries,
            outbox_stats,
            register_many,
            settle_many,
        )
    }
}

/// The statements one field of [`Statements`] holds: one, one per variant, or none.
#[cfg(test)]
trait Each {
    fn each(&self) -> Vec<&Statement>;
}

#[cfg(test)]
impl Each for Statement {
    fn each(&self) -> Vec<&Statement> {
        vec![self]
    }
}

#[cfg(test)]
impl<const N: usize> Each for [Statement; N] {
    fn each(&self) -> Vec<&Statement> {
        self.iter().collect()
    }
}

#[cfg(test)]
impl<T: Each> Each for Option<T> {
    fn each(&self) -> Vec<&Statement> {
        self.iter().flat_map(Each::each).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::store::postgres::Pg;
    use crate::store::sqlite::Lite;

    /// The parameters `$n` that `sql` names.
    fn parameters(sql: &str) -> BTreeSet<usize> {
        let mut found = BTreeSet::new();
        for (at, _) in sql.match_indices('$') {
            let digits: String = sql[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(number) = digits.parse() {
                found.insert(number);
            }
        }
        found
    }

    /// What is checked of each statement of dialect `D`, which must render: no token left,
    /// parameters `$1..$n` each named, the clock only as `$1`. Answers each statement's
    /// method, kind, table, clock and parameters.
    fn rendered<D: Dialect>() -> Vec<String> {
        let statements = Statements::new::<D>();
        let all = statements.all();
        for statement in &all {
            let (sql, method) = (&statement.sql, statement.method);
            let name = format!("{} ({method})", D::SYSTEM);
            assert!(!sql.trim().is_empty(), "{name}: empty");
            assert!(!sql.contains(['{', '}']), "{name}: a token is left: {sql}");
            let parameters = parameters(sql);
            let expected: BTreeSet<_> = (1..=parameters.len()).collect();
            assert_eq!(parameters, expected, "{name}: parameters not $1..$n: {sql}");
            if statement.clocked {
                assert!(parameters.contains(&1), "{name}: clocked without $1");
            }
        }
        let shape = |s: &&Statement| {
            let parameters = parameters(&s.sql).len();
            let (method, operation, table) = (s.method, s.operation, s.collection.table());
            format!(
                "{method} {operation} {table} clock={} ${parameters}",
                s.clocked
            )
        };
        all.iter().map(shape).collect()
    }

    #[test]
    fn every_statement_renders_for_every_database() {
        let postgres = rendered::<Pg>();
        let sqlite = rendered::<Lite>();
        // The bind lists are written once: both databases take the same values. Postgres
        // has the batch forms besides (group commit), last.
        assert_eq!(postgres[..sqlite.len()], sqlite);
        assert_eq!(postgres.len() - sqlite.len(), 4);
    }

    #[test]
    fn each_statement_names_its_table() {
        let statements = Statements::new::<Pg>();
        let table = |s: &Statement| s.collection.table();
        assert_eq!(table(&statements.history), "operation_events");
        assert_eq!(table(&statements.record_delivery), "escalation_outbox");
        assert_eq!(table(&statements.settle[2]), "agent_operations");
    }

    #[tokio::test]
    async fn every_statement_prepares_on_sqlite() {
        use sqlx::{Executor as _, SqlSafeStr as _};
        let options = "sqlite::memory:".parse::<sqlx::sqlite::SqliteConnectOptions>();
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.unwrap())
            .await
            .unwrap();
        crate::store::sqlite::SQLITE_MIGRATOR
            .run(&pool)
            .await
            .unwrap();
        let statements = Statements::new::<Lite>();
        for statement in statements.all() {
            let sql = sqlx::AssertSqlSafe(statement.sql.clone()).into_sql_str();
            let prepared = pool.prepare(sql).await;
            assert!(prepared.is_ok(), "{}: {prepared:?}", statement.method);
        }
    }
}
