//! Group commit's side of the SQL store (Postgres): what a batch of registrations or of
//! reports sends (`sql/postgres/register_many.sql`, `settle_many.sql`) and how it answers
//! each item as the call alone would have; the queues and lanes are `store::group_commit`.

use std::collections::HashMap;

use super::bind::{Arg, columns, new_args, report_args};
use super::dialect::{Decoded, Dialect};
use super::rows::OperationRow;
use super::statements::Statement;
use super::store::SqlStore;
use crate::domain::lease::LeaseToken;
use crate::domain::model::{Namespace, OperationKey};
use crate::store::error::StoreError;
use crate::store::group_commit::{Queues, firsts};
use crate::store::{NewOperation, Registration, Settled, Settlement};

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

impl<D: Dialect> SqlStore<D> {
    /// The group commit queues, started on first use; `None` when group commit is off. Their
    /// lanes send each batch through a clone of this store without group commit, so that they
    /// hold no queue of their own and stop with the last clone.
    pub(super) fn queues(&self) -> Option<&Queues> {
        let (group, queues) = self.group.as_ref()?;
        Some(queues.get_or_init(|| {
            let registering = Self {
                group: None,
                ..self.clone()
            };
            let settling = registering.clone();
            let register = move |news| {
                let store = registering.clone();
                async move { store.register_batch(news).await }
            };
            let settle = move |reports| {
                let store = settling.clone();
                async move { store.settle_batch(reports).await }
            };
            Queues::start(*group, register, settle)
        }))
    }

    /// Runs `statement` over `rows`, one list of values per item: the rows it answers; `None`
    /// when it failed for anything but an outage (the items then go alone).
    async fn batch_rows<R: Decoded>(
        &self,
        statement: &Statement,
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

    /// Registers a batch: every item answered as [`register`](crate::store::JournalStore::register)
    /// would answer it.
    async fn register_batch(
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
    /// [`settle`](crate::store::JournalStore::settle) would answer it.
    async fn settle_batch(
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
