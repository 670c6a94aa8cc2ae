//! The reconciler's reads: the review queue, queue statistics, an operation's history and its
//! escalation events, the outbox's state.

use super::{History, Reconciler, ReviewFilter, ReviewQueue};
use crate::domain::error::JournalError;
use crate::domain::model::{ActionType, Namespace, OperationEvent, OperationRecord};
use crate::journal::{OperationRef, PageToken, page_limit};
use crate::store::{HistoryQuery, OutboxEntry, OutboxStats, QueueStats, ReviewQuery};

impl Reconciler {
    /// Operations waiting for review that pass the command's filter, oldest escalation
    /// first, and the next page token (bound to the filter: a token of other filters is
    /// refused).
    ///
    /// Errors: `INVALID_ARGUMENT`/`INVALID_PAGE_TOKEN` or `INVALID_PAGE_SIZE`.
    pub async fn list_for_review(
        &self,
        command: &ReviewQueue,
    ) -> Result<(Vec<OperationRecord>, String), JournalError> {
        let ReviewQueue {
            namespace,
            filter,
            page,
        } = command;
        let limit = self.limits.page_limit(page.size)?;
        let filters = if filter == &ReviewFilter::default() {
            format!("review|{namespace}")
        } else {
            let action_type = filter.action_type.as_ref().map_or("", ActionType::as_str);
            let min_age = filter.min_age.as_millis();
            format!("review|{namespace}|{action_type}|{min_age}")
        };
        let after = if page.token.is_empty() {
            None
        } else {
            Some(PageToken::decode(&page.token, &filters)?)
        };
        let mut rows = self
            .store
            .list_review(&ReviewQuery {
                namespace: namespace.clone(),
                action_type: filter.action_type.clone(),
                min_age: filter.min_age,
                after,
                limit: limit + 1,
            })
            .await?;
        let next = next_token(&mut rows, limit, |last| {
            last.review_required_at
                .map(|at| PageToken::encode(at, last.operation_key.as_str(), &filters))
        });
        Ok((rows, next))
    }

    /// How many of `namespace`'s operations are unknown, in progress, due for a lookup and
    /// waiting for review, and since when the oldest of each.
    ///
    /// Errors: a malformed namespace; `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    pub async fn queue_stats(&self, namespace: &str) -> Result<QueueStats, JournalError> {
        let namespace = Namespace::parse(namespace)?;
        Ok(self.store.queue_stats(&namespace).await?)
    }

    /// The escalation webhook's events for one operation (entering and leaving review),
    /// oldest first, each with its delivery state: what the review console shows. Events are
    /// written whether or not a webhook URL is configured; without one they stay pending.
    ///
    /// Errors: `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    pub async fn deliveries(
        &self,
        operation: &OperationRef,
    ) -> Result<Vec<OutboxEntry>, JournalError> {
        let OperationRef {
            namespace,
            operation_key,
        } = operation;
        Ok(self.store.deliveries(namespace, operation_key).await?)
    }

    /// The whole outbox's pending and given-up events, and the oldest pending event's age.
    ///
    /// Errors: `UNAVAILABLE`/`STORE_UNAVAILABLE`.
    pub async fn outbox_stats(&self) -> Result<OutboxStats, JournalError> {
        Ok(self.store.outbox_stats().await?)
    }

    /// An operation's history, oldest first, and the next page token.
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND` when the operation does not exist;
    /// `INVALID_ARGUMENT`/`INVALID_PAGE_TOKEN`.
    pub async fn history(
        &self,
        command: &History,
    ) -> Result<(Vec<OperationEvent>, String), JournalError> {
        let History { operation, page } = command;
        let (namespace, key) = (&operation.namespace, &operation.operation_key);
        let limit = page_limit(page.size, 100, 1000)?;
        let filters = format!("history|{namespace}|{key}");
        let after = if page.token.is_empty() {
            0
        } else {
            let (event_id, _) = PageToken::decode_position(&page.token, &filters)?;
            event_id
        };
        if after == 0 && self.store.get(namespace, key).await?.is_none() {
            return Err(JournalError::NotFound);
        }
        let mut events = self
            .store
            .history(&HistoryQuery {
                namespace: namespace.clone(),
                operation_key: key.clone(),
                after_event_id: after,
                limit: limit + 1,
            })
            .await?;
        let next = next_token(&mut events, limit, |last| {
            Some(PageToken::encode_position(last.event_id, "", &filters))
        });
        Ok((events, next))
    }
}

/// Cuts `rows` (fetched with one extra) to `limit` and makes the next token from the last kept.
fn next_token<T>(rows: &mut Vec<T>, limit: i64, token: impl Fn(&T) -> Option<String>) -> String {
    if rows.len() as i64 > limit {
        rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        rows.last().and_then(token).unwrap_or_default()
    } else {
        String::new()
    }
}
