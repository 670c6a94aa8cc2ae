//! The gRPC calls behind the operator commands, with pagination followed to the end or to
//! the operator's limit.

use std::path::PathBuf;
use std::time::Duration;

use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::api::auth::BearerToken;
use crate::api::convert::status_to_proto;
use crate::api::tls;
use crate::domain::model::Status as OperationStatus;
use crate::proto;
use crate::proto::operation_journal_client::OperationJournalClient;
use crate::proto::reconciler_client::ReconcilerClient;

/// How long to wait for the TCP connection to the server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call may take; a reconcile includes the provider lookup.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest page the server serves for operations.
const MAX_OPERATIONS_PAGE: u32 = 500;
/// The largest page the server serves for history events.
const MAX_HISTORY_PAGE: u32 = 1000;

/// Filters of `list`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Tenant namespace; empty means the server's default.
    pub namespace: String,
    /// Only this status.
    pub status: Option<OperationStatus>,
    /// Only this action type; empty means any.
    pub action_type: String,
}

/// A ReconcileOperation answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// The record after the observation was applied.
    pub operation: proto::Operation,
    /// What the provider adapter saw; `None` when no lookup was made.
    pub observation: Option<proto::Observation>,
    /// What was done, a `ReconcileAction` value.
    pub action: i32,
}

/// How the operator commands reach a server beyond its URL.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// With `https://`: the CA (PEM) to trust; `None` trusts the system's roots.
    pub ca_file: Option<PathBuf>,
    /// With `https://`: a client certificate and its key (PEM files) for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A bearer token sent with every call.
    pub token: Option<String>,
}

type Authorized = InterceptedService<Channel, BearerToken>;

/// A client of both services on one channel.
#[derive(Debug, Clone)]
pub struct OpsClient {
    journal: OperationJournalClient<Authorized>,
    reconciler: ReconcilerClient<Authorized>,
}

impl OpsClient {
    /// A plaintext client of the server at `server`, without a token. The connection is
    /// made by the first call, so an unreachable server shows up as that call's
    /// `UNAVAILABLE`.
    pub fn new(server: Uri) -> Self {
        Self::over(Self::endpoint(server).connect_lazy(), BearerToken::none())
    }

    /// A client of the server at `server` (`https://` for TLS) with `options`. Like
    /// [`OpsClient::new`], it connects on the first call.
    ///
    /// Errors: `INVALID_ARGUMENT` for TLS files with an `http://` server, an unusable
    /// certificate file (named by its flag), or a token a header cannot carry.
    pub fn connect(server: Uri, options: &ClientOptions) -> Result<Self, Status> {
        let https = server.scheme_str() == Some("https");
        let token = match &options.token {
            Some(token) => BearerToken::new(token)
                .map_err(|e| Status::invalid_argument(format!("--token: {e}")))?,
            None => BearerToken::none(),
        };
        let mut endpoint = Self::endpoint(server);
        if https {
            let identity = options
                .identity
                .as_ref()
                .map(|(cert, key)| (cert.as_path(), key.as_path()));
            let config = tls::client_config(options.ca_file.as_deref(), identity)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| Status::invalid_argument(format!("TLS: {e}")))?;
        } else if options.ca_file.is_some() || options.identity.is_some() {
            return Err(Status::invalid_argument(
                "--ca-file, --cert-file and --key-file need an https:// server",
            ));
        }
        Ok(Self::over(endpoint.connect_lazy(), token))
    }

    fn endpoint(server: Uri) -> Endpoint {
        Endpoint::from(server)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
    }

    fn over(channel: Channel, token: BearerToken) -> Self {
        Self {
            journal: OperationJournalClient::with_interceptor(channel.clone(), token.clone()),
            reconciler: ReconcilerClient::with_interceptor(channel, token),
        }
    }

    /// Up to `limit` operations matching `filter`, newest first (ListOperations).
    pub async fn list(
        &mut self,
        filter: &ListFilter,
        limit: u32,
    ) -> Result<Vec<proto::Operation>, Status> {
        let status: i32 = filter
            .status
            .map(status_to_proto)
            .unwrap_or_default()
            .into();
        let journal = &self.journal;
        collect_pages(limit, MAX_OPERATIONS_PAGE, |page_token, page_size| {
            let mut journal = journal.clone();
            let request = proto::ListOperationsRequest {
                namespace: filter.namespace.clone(),
                status,
                action_type: filter.action_type.clone(),
                page_size,
                page_token,
            };
            async move {
                let page = journal.list_operations(request).await?.into_inner();
                Ok((page.operations, page.next_page_token))
            }
        })
        .await
    }

    /// One operation (GetOperation).
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`.
    pub async fn get(&mut self, namespace: &str, key: &str) -> Result<proto::Operation, Status> {
        self.journal
            .get_operation(proto::GetOperationRequest {
                namespace: namespace.to_owned(),
                operation_key: key.to_owned(),
            })
            .await?
            .into_inner()
            .operation
            .ok_or_else(|| missing("GetOperationResponse.operation"))
    }

    /// The whole history of an operation, oldest first (GetOperationHistory, every page).
    pub async fn history(
        &mut self,
        namespace: &str,
        key: &str,
    ) -> Result<Vec<proto::OperationEvent>, Status> {
        let reconciler = &self.reconciler;
        collect_pages(u32::MAX, MAX_HISTORY_PAGE, |page_token, page_size| {
            let mut reconciler = reconciler.clone();
            let request = proto::GetOperationHistoryRequest {
                namespace: namespace.to_owned(),
                operation_key: key.to_owned(),
                page_size,
                page_token,
            };
            async move {
                let page = reconciler
                    .get_operation_history(request)
                    .await?
                    .into_inner();
                Ok((page.events, page.next_page_token))
            }
        })
        .await
    }

    /// Up to `limit` operations waiting for review, oldest escalation first.
    pub async fn review(
        &mut self,
        namespace: &str,
        limit: u32,
    ) -> Result<Vec<proto::Operation>, Status> {
        let reconciler = &self.reconciler;
        collect_pages(limit, MAX_OPERATIONS_PAGE, |page_token, page_size| {
            let mut reconciler = reconciler.clone();
            let request = proto::ListOperationsForReviewRequest {
                namespace: namespace.to_owned(),
                page_size,
                page_token,
            };
            async move {
                let page = reconciler
                    .list_operations_for_review(request)
                    .await?
                    .into_inner();
                Ok((page.operations, page.next_page_token))
            }
        })
        .await
    }

    /// Reconciles one operation now (ReconcileOperation).
    ///
    /// Errors: `NOT_FOUND`/`OPERATION_NOT_FOUND`; `FAILED_PRECONDITION` with
    /// `OPERATION_NOT_RECONCILABLE` or `NO_PROVIDER_ADAPTER`.
    pub async fn reconcile(&mut self, namespace: &str, key: &str) -> Result<Reconciled, Status> {
        let response = self
            .reconciler
            .reconcile_operation(proto::ReconcileOperationRequest {
                namespace: namespace.to_owned(),
                operation_key: key.to_owned(),
            })
            .await?
            .into_inner();
        Ok(Reconciled {
            operation: response
                .operation
                .ok_or_else(|| missing("ReconcileOperationResponse.operation"))?,
            observation: response.observation,
            action: response.action,
        })
    }

    /// Settles an unknown operation by a reviewer's decision (ResolveOperation).
    ///
    /// Errors: `FAILED_PRECONDITION`/`OPERATION_CHANGED` when the operation is no longer
    /// unknown at the expected attempt; `INVALID_ARGUMENT` for a bad reviewer, reason or field.
    pub async fn resolve(
        &mut self,
        request: proto::ResolveOperationRequest,
    ) -> Result<proto::Operation, Status> {
        self.reconciler
            .resolve_operation(request)
            .await?
            .into_inner()
            .operation
            .ok_or_else(|| missing("ResolveOperationResponse.operation"))
    }
}

/// Follows a listing's pages until its end, `limit` rows, or a repeated page token: `fetch`
/// is given the page token and the page size (at most `max_page`) and answers a page's rows
/// and the next page's token. At most `limit` rows come back.
async fn collect_pages<T, Fut>(
    limit: u32,
    max_page: u32,
    mut fetch: impl FnMut(String, i32) -> Fut,
) -> Result<Vec<T>, Status>
where
    Fut: Future<Output = Result<(Vec<T>, String), Status>>,
{
    let mut rows = Vec::new();
    let mut page_token = String::new();
    loop {
        let (page, next) =
            fetch(page_token.clone(), page_size(limit, rows.len(), max_page)).await?;
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

/// The error for a response without a field the contract promises (decoded, but malformed).
fn missing(field: &str) -> Status {
    Status::internal(format!("the server's response has no {field}"))
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
