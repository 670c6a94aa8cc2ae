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
//! This module is the mechanism: the settings, the queues and their lanes. What a batch sends
//! and how it answers each item is the SQL store's (`sql/batch.rs`).
//!
//! Per item, a batch answers what the call alone would have: the same rows, the same history
//! (the triggers run per row). A key that comes twice in one batch goes once in the statement,
//! its repeat alone right after, so that it meets the row the first one left. A batch
//! statement that fails for anything but an outage is sent again item by item, so that a bad
//! item fails alone and never its neighbours.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};

use super::error::StoreError;
use super::{NewOperation, Registration, Settled, Settlement};
use crate::domain::lease::LeaseToken;

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
    /// The queues whose lanes send each batch through `register` and `settle`, which answer
    /// every item of a batch in order.
    pub(super) fn start<R, RF, S, SF>(config: GroupCommit, register: R, settle: S) -> Self
    where
        R: Fn(Vec<NewOperation>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Vec<Result<Registration, StoreError>>> + Send,
        S: Fn(Vec<(LeaseToken, Settlement)>) -> SF + Send + Sync + 'static,
        SF: Future<Output = Vec<Result<Option<Settled>, StoreError>>> + Send,
    {
        Self {
            register: Queue::start(config, register),
            settle: Queue::start(config, settle),
        }
    }
}

/// Which items of a batch go in its statement: the first of each key. The others (a key
/// repeated in the batch) go alone after it.
pub(super) fn firsts<T, K: Eq + Hash>(items: &[T], key: impl Fn(&T) -> K) -> Vec<usize> {
    let mut seen = HashSet::new();
    (0..items.len())
        .filter(|&i| seen.insert(key(&items[i])))
        .collect()
}
