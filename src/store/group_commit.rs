//! Group commit (Postgres): concurrent registrations, and concurrent reports, go to the
//! database as one statement and one commit per batch.
//!
//! Each kind has a queue served by a few lanes. A lane takes everything that queued while it
//! was busy (at most [`GroupCommit::max_batch`]), sends it as one statement
//! (`sql/postgres/register_many.sql`, `settle_many.sql`: the single-row statement's fragments
//! over rows unnested from arrays) and answers each caller once that statement has
//! committed. There is no timer: at low load a lane is idle and a call goes alone at once; the
//! busier the database, the more each batch carries.
//!
//! Per item, a batch answers what the call alone would have: the same rows, the same history
//! (the triggers run per row). A key that comes twice in one batch goes once in the statement,
//! its repeat alone right after, so that it meets the row the first one left. A batch
//! statement that fails for anything but an outage is sent again item by item, so that a bad
//! item fails alone and never its neighbours.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};

use super::sql::{Arg, Decoded, Dialect, OperationRow, SqlStore, new_args, report_args};
use super::{NewOperation, Registration, Settled, Settlement, StoreError};
use crate::domain::lease::LeaseToken;
use crate::domain::model::{Namespace, OperationKey};

/// How a store coalesces concurrent writes; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    /// Batches of one kind (registrations, reports) in flight at once; each holds one pooled
    /// connection while it runs, so both kinds together take up to twice this many.
    pub lanes: usize,
    /// The most calls one statement carries.
    pub max_batch: usize,
}

impl Default for GroupCommit {
    fn default() -> Self {
        Self {
            lanes: 2,
            max_batch: 128,
        }
    }
}

/// One queued call and where its answer goes.
struct Job<I, O> {
    item: I,
    answer: oneshot::Sender<Result<O, StoreError>>,
}

/// The queue of one kind of call, served by its lanes.
pub(super) struct Queue<I, O> {
    jobs: mpsc::UnboundedSender<Job<I, O>>,
}

impl<I: Send + 'static, O: Send + 'static> Queue<I, O> {
    /// Starts `config.lanes` lanes, each sending what it takes through `run`, which answers
    /// every item of a batch in order. The lanes end when the queue is dropped.
    fn start<F, Fut>(config: GroupCommit, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<O, StoreError>>> + Send,
    {
        let (jobs, queued) = mpsc::unbounded_channel::<Job<I, O>>();
        let queued = Arc::new(Mutex::new(queued));
        let run = Arc::new(run);
        for _ in 0..config.lanes.max(1) {
            let (queued, run) = (queued.clone(), run.clone());
            let max_batch = config.max_batch.max(1);
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut queued = queued.lock().await;
                        let Some(first) = queued.recv().await else {
                            return;
                        };
                        let mut batch = vec![first];
                        while batch.len() < max_batch {
                            match queued.try_recv() {
                                Ok(job) => batch.push(job),
                                Err(_) => break,
                            }
                        }
                        batch
                    };
                    let (items, answers): (Vec<I>, Vec<_>) =
                        batch.into_iter().map(|job| (job.item, job.answer)).unzip();
                    for (answer, result) in answers.into_iter().zip(run(items).await) {
                        // A caller that gave up no longer listens; its item was still sent.
                        let _ = answer.send(result);
                    }
                }
            });
        }
        Self { jobs }
    }

    /// Queues `item` and waits for its answer.
    ///
    /// Errors: `Unavailable` when the lanes have stopped (their runtime is shutting down).
    pub(super) async fn submit(&self, item: I) -> Result<O, StoreError> {
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the group commit lanes have stopped".into());
        self.jobs
            .send(Job { item, answer })
            .map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// The queues of one store and of every clone of it, started by its first write.
pub(super) struct Queues {
    pub(super) register: Queue<NewOperation, Registration>,
    pub(super) settle: Queue<(LeaseToken, Settlement), Option<Settled>>,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Queues")
    }
}

impl Queues {
    /// The queues over `store`, which sends each batch (a store without group commit, so
    /// that the lanes hold no queue of their own and stop with the last clone).
    pub(super) fn start<D: Dialect>(store: SqlStore<D>, config: GroupCommit) -> Self {
        let registering = store.clone();
        Self {
            register: Queue::start(config, move |news| {
                let store = registering.clone();
                async move { store.register_batch(news).await }
            }),
            settle: Queue::start(config, move |reports| {
                let store = store.clone();
                async move { store.settle_batch(reports).await }
            }),
        }
    }
}

/// The namespace and key of an item, which a batch holds once.
type Key = (String, String);

fn key(namespace: &Namespace, key: &OperationKey) -> Key {
    (namespace.as_str().to_owned(), key.as_str().to_owned())
}

/// The rows `rows` of a batch by key.
fn by_key(rows: Vec<OperationRow>) -> HashMap<Key, OperationRow> {
    let key = |row: &OperationRow| (row.namespace.clone(), row.operation_key.clone());
    rows.into_iter().map(|row| (key(&row), row)).collect()
}

/// The statement values of a batch, `rows` of one statement's values each: one column per
/// parameter, of the parameter's kind. Errors when the rows disagree on a kind.
fn columns(rows: Vec<Vec<Arg>>) -> Result<Vec<Arg>, StoreError> {
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

/// Which items of a batch go in its statement: the first of each key. The others (a key
/// repeated in the batch) go alone after it.
fn firsts<T>(items: &[T], key: impl Fn(&T) -> Key) -> Vec<usize> {
    let mut seen = HashSet::new();
    (0..items.len())
        .filter(|&i| seen.insert(key(&items[i])))
        .collect()
}

impl<D: Dialect> SqlStore<D> {
    /// Runs `statement` over `rows`, one list of values per item: the rows it answers; `None`
    /// when it failed for anything but an outage (the items then go alone).
    async fn batch_rows<R: Decoded>(
        &self,
        statement: &super::sql::Statement,
        rows: Vec<Vec<Arg>>,
    ) -> Result<Option<Vec<R>>, StoreError> {
        let Ok(values) = columns(rows) else {
            return Ok(None);
        };
        match self.rows::<R>(statement, values).await {
            Ok(rows) => Ok(Some(rows)),
            Err(StoreError::Unavailable(error)) => Err(StoreError::Unavailable(error)),
            Err(StoreError::Other(_)) => Ok(None),
        }
    }

    /// Registers a batch: every item answered as [`register`](super::JournalStore::register)
    /// would answer it.
    pub(super) async fn register_batch(
        &self,
        news: Vec<NewOperation>,
    ) -> Vec<Result<Registration, StoreError>> {
        let mut answers: Vec<Option<Result<Registration, StoreError>>> =
            news.iter().map(|_| None).collect();
        let key_of = |new: &NewOperation| key(&new.namespace, &new.operation_key);
        let firsts = firsts(&news, key_of);
        let many = self.statements.register_many.as_ref();
        if let (Some(statement), true) = (many, firsts.len() > 1) {
            let values: Result<Vec<_>, _> = firsts.iter().map(|&i| new_args(&news[i])).collect();
            let rows = match values {
                Ok(values) => self.batch_rows::<OperationRow>(statement, values).await,
                Err(_) => Ok(None),
            };
            match rows {
                Ok(Some(rows)) => {
                    let mut rows = by_key(rows);
                    for &i in &firsts {
                        answers[i] = Some(match rows.remove(&key_of(&news[i])) {
                            Some(row) => row.registration(),
                            None => Ok(Registration::Raced),
                        });
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    let message = error.to_string();
                    for &i in &firsts {
                        answers[i] = Some(Err(StoreError::Unavailable(message.clone().into())));
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(news.len());
        for (new, answer) in news.iter().zip(answers) {
            out.push(match answer {
                Some(answer) => answer,
                None => self.register_one(new).await,
            });
        }
        out
    }

    /// Applies a batch of reports: every item answered as
    /// [`settle`](super::JournalStore::settle) would answer it.
    pub(super) async fn settle_batch(
        &self,
        reports: Vec<(LeaseToken, Settlement)>,
    ) -> Vec<Result<Option<Settled>, StoreError>> {
        let mut answers: Vec<Option<Result<Option<Settled>, StoreError>>> =
            reports.iter().map(|_| None).collect();
        let key_of = |token: &LeaseToken| key(&token.namespace, &token.operation_key);
        let firsts = firsts(&reports, |(token, _)| key_of(token));
        if let (Some(statements), true) = (&self.statements.settle_many, firsts.len() > 1) {
            let mut by_variant: [Vec<usize>; 3] = Default::default();
            let mut values: [Vec<Vec<Arg>>; 3] = Default::default();
            for &i in &firsts {
                let (variant, args) = report_args(&reports[i].0, &reports[i].1);
                by_variant[variant].push(i);
                values[variant].push(args);
            }
            for (variant, values) in values.into_iter().enumerate() {
                let items = &by_variant[variant];
                if items.len() < 2 {
                    continue; // alone below
                }
                match self
                    .batch_rows::<OperationRow>(&statements[variant], values)
                    .await
                {
                    Ok(Some(rows)) => {
                        let mut rows = by_key(rows);
                        for &i in items {
                            let row = rows.remove(&key_of(&reports[i].0));
                            answers[i] = Some(row.map(|row| row.settled(None)).transpose());
                        }
                    }
                    Ok(None) => {}
                    Err(error) => {
                        let message = error.to_string();
                        for &i in items {
                            let error = StoreError::Unavailable(message.clone().into());
                            answers[i] = Some(Err(error));
                        }
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(reports.len());
        for ((token, settlement), answer) in reports.iter().zip(answers) {
            out.push(match answer {
                Some(answer) => answer,
                None => self.settle_one(token, settlement).await,
            });
        }
        out
    }
}
