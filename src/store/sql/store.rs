//! The store itself: [`SqlStore`], its settings, and how it runs a statement (binding the
//! clock, decoding rows, tracing and counting failures); the journal's methods are in
//! `journal_store.rs`, the outbox's in `outbox.rs`, group commit's batches in `batch.rs`.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tracing::Instrument as _;
use tracing::field::Empty;

use super::bind::{Arg, args, new_args, report_args};
use super::clock::Clock;
use super::dialect::{Decoded, Dialect};
use super::rows::OperationRow;
use super::statements::{Collection, Statement, Statements};
use crate::domain::lease::LeaseToken;
use crate::domain::model::OperationRecord;
use crate::store::error::StoreError;
use crate::store::group_commit::{GroupCommit, Queues};
use crate::store::{NewOperation, Registration, Settled, Settlement};
use crate::telemetry::Metrics;

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

    /// Runs one store method: `method` names it, `operation` is its statement's kind and
    /// `collection` its table (none for `ping`). Inside a traced request or reconcile attempt
    /// it gets a client span (`db.system.name`, `db.operation.name`, `db.collection.name`); a
    /// failure counts in `opjournal.store.errors`. Background calls without a parent span are
    /// counted but not traced, so that an idle process sends no traces.
    pub(super) async fn call<T>(
        &self,
        method: &'static str,
        operation: &'static str,
        collection: Option<Collection>,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = if tracing::Span::current().is_none() {
            tracing::Span::none()
        } else {
            let collection = collection.map_or("", Collection::table);
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
        let collection = Some(statement.collection);
        self.call(statement.method, statement.operation, collection, call)
            .await
    }

    /// The row `get` reads (namespace and key in `key`), inside the span of the method that
    /// needs it.
    pub(super) async fn read(&self, key: Vec<Arg>) -> Result<Option<OperationRecord>, StoreError> {
        let get = &self.statements.get;
        Ok(self.decoded::<OperationRow, _>(get, key).await?.pop())
    }

    /// A method that is one statement answering records (at most one: `pop` takes it).
    pub(super) async fn many(
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
