//! The reading and reviewing side of [`JournalClient`]: listings and histories followed
//! across their pages, the review queue, and a reviewer's decision.

use std::future::Future;

use crate::client::JournalClient;
use crate::error::ClientError;
use crate::intent::required;
use crate::proto::{self, Operation};

/// The largest page the server serves for operations (`ListOperations`, the review queue).
pub const MAX_OPERATIONS_PAGE: u32 = 500;
/// The largest page the server serves for history events.
pub const MAX_HISTORY_PAGE: u32 = 1000;

/// Which operations [`JournalClient::list_operations`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Tenant namespace; empty means the server's default (`default`).
    pub namespace: String,
    /// Only operations in this status; `None` means any.
    pub status: Option<proto::OperationStatus>,
    /// Only this action type; empty means any.
    pub action_type: String,
}

impl JournalClient {
    /// `ListOperations`, every page: up to `limit` operations matching `filter`, newest
    /// first. Each page asks for what is still wanted, at most [`MAX_OPERATIONS_PAGE`]; a
    /// page token the server repeats ends the listing. Each page has its own deadline.
    ///
    /// Errors: `INVALID_ARGUMENT` for a bad namespace or action type;
    /// `PERMISSION_DENIED`/`UNAUTHENTICATED` when tokens are on and the caller may not read.
    pub async fn list_operations(
        &self,
        filter: &ListFilter,
        limit: u32,
    ) -> Result<Vec<Operation>, ClientError> {
        let status: i32 = filter.status.unwrap_or_default().into();
        collect_pages(limit, MAX_OPERATIONS_PAGE, |page_token, page_size| {
            let request = self.request(proto::ListOperationsRequest {
                namespace: filter.namespace.clone(),
                status,
                action_type: filter.action_type.clone(),
                page_size,
                page_token,
            });
            let mut stub = self.journal.clone();
            async move { self.answer(stub.list_operations(request)).await }
        })
        .await
    }

    /// `GetOperationHistory`, every page: the whole history of an operation, oldest first,
    /// pages of [`MAX_HISTORY_PAGE`] events. An empty `namespace` means `default`.
    ///
    /// Errors: `NOT_FOUND`/[`crate::ErrorReason::OperationNotFound`].
    pub async fn history(
        &self,
        namespace: &str,
        operation_key: &str,
    ) -> Result<Vec<proto::OperationEvent>, ClientError> {
        collect_pages(u32::MAX, MAX_HISTORY_PAGE, |page_token, page_size| {
            let request = self.request(proto::GetOperationHistoryRequest {
                namespace: namespace.to_owned(),
                operation_key: operation_key.to_owned(),
                page_size,
                page_token,
            });
            let mut stub = self.reconciler.clone();
            async move { self.answer(stub.get_operation_history(request)).await }
        })
        .await
    }

    /// `ListOperationsForReview`, every page: up to `limit` operations waiting for a
    /// reviewer, oldest escalation first (pages as [`Self::list_operations`]).
    ///
    /// Errors: `INVALID_ARGUMENT` for a bad namespace; `PERMISSION_DENIED` without the
    /// `reviewer` or `admin` role when tokens are on.
    pub async fn review_queue(
        &self,
        namespace: &str,
        limit: u32,
    ) -> Result<Vec<Operation>, ClientError> {
        collect_pages(limit, MAX_OPERATIONS_PAGE, |page_token, page_size| {
            let request = self.request(proto::ListOperationsForReviewRequest {
                namespace: namespace.to_owned(),
                page_size,
                page_token,
            });
            let mut stub = self.reconciler.clone();
            async move { self.answer(stub.list_operations_for_review(request)).await }
        })
        .await
    }

    /// `ResolveOperation`: settles an `unknown` operation by a reviewer's decision, compared
    /// and set on the attempt count the reviewer saw; answers the record after.
    ///
    /// Errors: `FAILED_PRECONDITION`/[`crate::ErrorReason::OperationChanged`] when the
    /// operation is no longer unknown at `expected_attempt_count`; `NOT_FOUND`/
    /// `OPERATION_NOT_FOUND`; `INVALID_ARGUMENT` with field violations for a bad reviewer,
    /// reason, external id, result or error code.
    pub async fn resolve(
        &self,
        request: proto::ResolveOperationRequest,
    ) -> Result<Operation, ClientError> {
        let request = self.request(request);
        let response = self
            .answer(self.reconciler.clone().resolve_operation(request))
            .await?;
        required(response.operation)
    }
}

/// A page of a listing: its rows and the next page's token (empty at the end).
trait Page {
    type Row;
    fn split(self) -> (Vec<Self::Row>, String);
}

impl Page for proto::ListOperationsResponse {
    type Row = Operation;
    fn split(self) -> (Vec<Operation>, String) {
        (self.operations, self.next_page_token)
    }
}

impl Page for proto::ListOperationsForReviewResponse {
    type Row = Operation;
    fn split(self) -> (Vec<Operation>, String) {
        (self.operations, self.next_page_token)
    }
}

impl Page for proto::GetOperationHistoryResponse {
    type Row = proto::OperationEvent;
    fn split(self) -> (Vec<proto::OperationEvent>, String) {
        (self.events, self.next_page_token)
    }
}

/// Follows a listing's pages until its end, `limit` rows, or a repeated page token: `fetch`
/// is given the page token and the page size (at most `max_page`) and answers the page. At most `limit` rows come back.
async fn collect_pages<P: Page, Fut>(
    limit: u32,
    max_page: u32,
    mut fetch: impl FnMut(String, i32) -> Fut,
) -> Result<Vec<P::Row>, ClientError>
where
    Fut: Future<Output = Result<P, ClientError>>,
{
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let (page, next) = fetch(page_token.clone(), page_size(limit, rows.len(), max_page))
            .await?
            .split();
        rows.extend(page);
        if !next_page(&mut page_token, next, rows.len(), limit) {
            break;
        }
    }
    rows.truncate(limit_len(limit));
    Ok(rows)
}

/// The page size to ask for when `have` of `limit` rows are in hand, at most `max_page`.
fn page_size(limit: u32, have: usize, max_page: u32) -> i32 {
    let have = u32::try_from(have).unwrap_or(u32::MAX);
    let wanted = limit.saturating_sub(have).clamp(1, max_page);
    i32::try_from(wanted).unwrap_or(1)
}

fn limit_len(limit: u32) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}

/// Moves to the next page; false at the end, at the limit, or when the server repeats the
/// previous token (which would loop forever).
fn next_page(current: &mut String, next: String, have: usize, limit: u32) -> bool {
    if next.is_empty() || next == *current || have >= limit_len(limit) {
        return false;
    }
    *current = next;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_ask_for_what_is_still_wanted_within_the_server_maximum() {
        assert_eq!(page_size(50, 0, MAX_OPERATIONS_PAGE), 50);
        assert_eq!(page_size(50, 30, MAX_OPERATIONS_PAGE), 20);
        assert_eq!(page_size(2000, 0, MAX_OPERATIONS_PAGE), 500);
        assert_eq!(page_size(10, 10, MAX_OPERATIONS_PAGE), 1);
        assert_eq!(page_size(u32::MAX, 0, MAX_HISTORY_PAGE), 1000);
    }

    #[test]
    fn paging_stops_at_the_end_the_limit_or_a_repeated_token() {
        let mut token = String::new();
        assert!(next_page(&mut token, "a".into(), 5, 10));
        assert_eq!(token, "a");
        assert!(!next_page(&mut token, "a".into(), 6, 10));
        assert!(!next_page(&mut token, "b".into(), 10, 10));
        assert!(!next_page(&mut token, String::new(), 1, 10));
    }
}
