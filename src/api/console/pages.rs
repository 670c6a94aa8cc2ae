//! The console's pages. Each checks the caller's role and namespace the way the gRPC handler
//! of the same RPC does, calls that RPC's use case, and renders what it answers.

use std::time::Duration;

use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use tonic::Code;

use super::Console;
use super::session::{Session, SignedIn, csrf_refusal};
use super::view::{
    self, Banner, DeliveryView, EventView, OperationPage, OutboxView, Page, QueuePage,
    ResolveValues, Row, SearchPage, encode, operation_href,
};
use crate::domain::access::{AccessError, Rpc};
use crate::domain::error::JournalError;
use crate::domain::model::{
    ActionType, Attribution, DEFAULT_NAMESPACE, ExternalId, Namespace, Status,
};
use crate::journal::{OperationRef, Page as ListPage, SearchTerm};
use crate::reconcile::{History, Resolve, ReviewDecision, ReviewFilter, ReviewQueue};

/// Operations per page of the queue and of search results.
const PAGE_SIZE: i32 = 50;
/// History entries read per call; an operation's page shows them all.
const HISTORY_PAGE: i32 = 1000;
/// Most history pages read for one operation's page.
const HISTORY_PAGES: usize = 20;

/// `GET /`: the queue.
pub async fn home() -> Redirect {
    Redirect::to("/queue")
}

/// Anything else: 404.
pub async fn not_found() -> Response {
    view::error_page(None, StatusCode::NOT_FOUND, "Not found", "No such page.")
}

/// The namespace a page shows when the request names none: the token's first namespace, or
/// `default`.
fn default_namespace(session: &Session) -> String {
    session
        .namespaces()
        .and_then(|names| names.into_iter().next())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

/// The namespace a page shows: the one asked for, or the session's first; `Err` the refusal
/// when the session may not call `rpc` in it.
fn page_namespace(
    session: &Session,
    asked: Option<String>,
    rpc: Rpc,
) -> Result<String, Box<Response>> {
    let namespace = asked.unwrap_or_else(|| default_namespace(session));
    match denied(session, rpc, &namespace) {
        Some(refusal) => Err(Box::new(refusal)),
        None => Ok(namespace),
    }
}

/// The refusal when the session may not call `rpc` in `namespace`, checked as the gRPC
/// handler checks it; `None` when it may.
fn denied(session: &Session, rpc: Rpc, namespace: &str) -> Option<Response> {
    if let Err(error) = session.caller.authorize(rpc) {
        return Some(refused(session, error));
    }
    match Namespace::parse(namespace) {
        Err(error) => Some(journal_error(session, error)),
        Ok(namespace) => session
            .caller
            .authorize_namespace(&namespace)
            .err()
            .map(|error| refused(session, error)),
    }
}

/// A refusal by access control: 403, saying which role or namespace was missing.
fn refused(session: &Session, error: AccessError) -> Response {
    tracing::info!(principal = session.name, %error, "console request refused");
    let message = match &error {
        AccessError::RoleNotAllowed { rpc } => {
            let roles: Vec<&str> = rpc.roles().iter().map(|r| r.as_str()).collect();
            format!(
                "Your token's roles ({}) do not allow this: it is {} in the gRPC API, which \
                 needs the role {}. Nothing was changed.",
                session.roles(),
                rpc.name(),
                roles.join(" or ")
            )
        }
        AccessError::NamespaceNotAllowed { namespace } => {
            format!("Your token does not allow the namespace {namespace}. Nothing was changed.")
        }
        other => format!("{other}. Nothing was changed."),
    };
    view::error_page(
        Some(session),
        StatusCode::FORBIDDEN,
        "Not allowed",
        &message,
    )
}

/// A use case's error as a page: the gRPC API's message and reason, with the HTTP status
/// closest to its code.
fn journal_error(session: &Session, error: JournalError) -> Response {
    let reason = error.reason();
    let status = crate::api::status::journal_status(error);
    let (http, heading) = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "Invalid request"),
        Code::NotFound => (StatusCode::NOT_FOUND, "Not found"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "Not allowed"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "Not signed in"),
        Code::FailedPrecondition | Code::Aborted | Code::AlreadyExists => {
            (StatusCode::CONFLICT, "Not possible now")
        }
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "Journal unavailable"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong"),
    };
    if http.is_server_error() {
        tracing::warn!(reason = reason.as_str(), "a console page failed");
    }
    let message = format!("{} ({})", status.message(), reason.as_str());
    view::error_page(Some(session), http, heading, &message)
}

/// The queue page's filters and position.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct QueueQuery {
    namespace: Option<String>,
    action_type: String,
    min_age: String,
    page: String,
}

/// `GET /queue`: counts, then the review queue oldest first, filtered.
pub async fn queue(
    State(console): State<Console>,
    SignedIn(session): SignedIn,
    Query(query): Query<QueueQuery>,
) -> Response {
    let namespace = match page_namespace(
        &session,
        query.namespace.clone(),
        Rpc::ListOperationsForReview,
    ) {
        Ok(namespace) => namespace,
        Err(refusal) => return *refusal,
    };
    let min_age = match query.min_age.trim() {
        "" => 0,
        text => match text.parse::<u64>() {
            Ok(minutes) if minutes <= 525_600 => minutes,
            _ => {
                return view::error_page(
                    Some(&session),
                    StatusCode::BAD_REQUEST,
                    "Invalid filter",
                    "The age filter is a number of minutes (at most a year).",
                );
            }
        },
    };
    let action_type = query.action_type.trim().to_owned();
    let reconciler = &console.reconciler;
    let stats = match reconciler.queue_stats(&namespace).await {
        Ok(stats) => stats,
        Err(error) => return journal_error(&session, error),
    };
    let command = || {
        Ok::<_, JournalError>(ReviewQueue {
            namespace: Namespace::parse(&namespace)?,
            filter: ReviewFilter {
                action_type: (!action_type.is_empty())
                    .then(|| ActionType::parse(&action_type))
                    .transpose()?,
                min_age: Duration::from_secs(min_age * 60),
            },
            page: ListPage {
                size: PAGE_SIZE,
                token: query.page.clone(),
            },
        })
    };
    let listed = match command() {
        Ok(command) => reconciler.list_for_review(&command).await,
        Err(error) => Err(error),
    };
    let (records, next) = match listed {
        Ok(page) => page,
        Err(error) => return journal_error(&session, error),
    };
    let here = format!(
        "/queue?namespace={}&action_type={}&min_age={min_age}",
        encode(&namespace),
        encode(&action_type)
    );
    let mut page = QueuePage::new(&session, &namespace);
    page.action_type = action_type;
    page.min_age = min_age;
    page.counts = view::counts(&stats);
    page.rows = records.iter().map(Row::of).collect();
    if session.caller.covers_every_namespace() {
        match reconciler.outbox_stats().await {
            Ok(stats) => page.outbox = Some(OutboxView::of(&stats)),
            Err(error) => return journal_error(&session, error),
        }
    }
    if !next.is_empty() {
        page.next = format!("{here}&page={}", encode(&next));
    }
    page.refresh = here;
    page.ok()
}

/// Which operation a page shows.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct OperationQuery {
    namespace: String,
    key: String,
    resolved: String,
}

/// `GET /operation`: an operation's fields, references, result and history, and the
/// resolve forms when it is unknown and the caller may resolve.
pub async fn operation(
    State(console): State<Console>,
    SignedIn(session): SignedIn,
    Query(query): Query<OperationQuery>,
) -> Response {
    if let Some(refusal) = denied(&session, Rpc::GetOperation, &query.namespace) {
        return refusal;
    }
    let mut page = match operation_page(&console, &session, &query.namespace, &query.key).await {
        Ok(page) => page,
        Err(response) => return response,
    };
    if matches!(
        query.resolved.as_str(),
        "succeeded" | "failed_final" | "release_for_retry"
    ) {
        page.banner = Some(Banner {
            kind: "ok",
            title: format!("Resolved: {}", query.resolved.replace('_', " ")),
            text: format!(
                "The operation is now {}; your decision and reason are in its history below.",
                page.status
            ),
        });
    }
    page.ok()
}

/// The page of an operation as it is now.
async fn operation_page(
    console: &Console,
    session: &Session,
    namespace: &str,
    key: &str,
) -> Result<OperationPage, Response> {
    let operation = OperationRef::new(namespace, key).map_err(|e| journal_error(session, e))?;
    let record = console
        .journal
        .get(&operation)
        .await
        .map_err(|e| journal_error(session, e))?;
    let mut page = OperationPage::new(session, &record);
    if session.caller.authorize(Rpc::GetOperationHistory).is_ok() {
        page.history = Some(history(console, session, namespace, key).await?);
        let deliveries = console.reconciler.deliveries(&operation).await;
        let deliveries = deliveries.map_err(|e| journal_error(session, e))?;
        page.deliveries = Some(deliveries.iter().map(DeliveryView::of).collect());
    }
    if record.status == Status::Unknown {
        if session.caller.authorize(Rpc::ResolveOperation).is_ok() {
            page.may_resolve = true;
        } else {
            page.resolve_note = Some(format!(
                "Resolving needs the reviewer or admin role; your token's roles are {}.",
                session.roles()
            ));
        }
    }
    Ok(page)
}

/// An operation's whole history, oldest first (up to [`HISTORY_PAGES`] pages).
async fn history(
    console: &Console,
    session: &Session,
    namespace: &str,
    key: &str,
) -> Result<Vec<EventView>, Response> {
    let mut events = Vec::new();
    let mut token = String::new();
    for _ in 0..HISTORY_PAGES {
        let command = History {
            operation: OperationRef::new(namespace, key).map_err(|e| journal_error(session, e))?,
            page: ListPage {
                size: HISTORY_PAGE,
                token,
            },
        };
        let page = console
            .reconciler
            .history(&command)
            .await
            .map_err(|e| journal_error(session, e))?;
        events.extend(page.0.iter().map(EventView::of));
        token = page.1;
        if token.is_empty() {
            break;
        }
    }
    Ok(events)
}

/// A resolve form: the decision, its fields, the reason, and the attempt the page showed.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ResolveForm {
    csrf: String,
    namespace: String,
    key: String,
    expected_attempt: String,
    decision: String,
    external_id: String,
    result_json: String,
    error_code: String,
    reason: String,
}

impl ResolveForm {
    /// The command, its fields parsed as `ResolveOperation`'s are (`api::convert`).
    fn command(&self, reviewer: &str, expected: i32) -> Result<Resolve, JournalError> {
        let operation = OperationRef::new(&self.namespace, &self.key)?;
        let attribution = Attribution::reviewer(reviewer, self.reason.trim())?;
        let decision = match self.decision.as_str() {
            "succeeded" => ReviewDecision::Succeeded {
                external_id: ExternalId::parse_optional(self.external_id.trim())?,
                result_json: self.result_json.trim().to_owned(),
            },
            "failed_final" => ReviewDecision::failed_final(self.error_code.trim())?,
            _ => ReviewDecision::ReleaseForRetry,
        };
        Resolve::new(operation, expected, attribution, decision)
    }

    /// The values to show again in the form after a refusal.
    fn values(&self) -> ResolveValues {
        ResolveValues {
            decision: self.decision.clone(),
            external_id: self.external_id.clone(),
            result_json: self.result_json.clone(),
            error_code: self.error_code.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// " The last change was by … at …: “why”." for the newest of `history`; empty without one.
fn last_change(history: Option<&[EventView]>) -> String {
    history
        .and_then(|events| events.last())
        .map(|e| {
            let why = if e.why.is_empty() {
                String::new()
            } else {
                format!(": \u{201c}{}\u{201d}", e.why)
            };
            format!(" The last change was by {} at {}{why}.", e.who, e.when)
        })
        .unwrap_or_default()
}

/// `POST /operation/resolve`: a reviewer's decision, through the same use case as
/// `ResolveOperation`, compare-and-set on the attempt the page showed.
pub async fn resolve(
    State(console): State<Console>,
    SignedIn(session): SignedIn,
    Form(form): Form<ResolveForm>,
) -> Response {
    if let Some(refusal) = csrf_refusal(&session, &form.csrf) {
        return refusal;
    }
    if let Some(refusal) = denied(&session, Rpc::ResolveOperation, &form.namespace) {
        return refusal;
    }
    if !["succeeded", "failed_final", "release_for_retry"].contains(&form.decision.as_str()) {
        return view::error_page(
            Some(&session),
            StatusCode::BAD_REQUEST,
            "Invalid request",
            "A resolution is succeeded, failed_final or release_for_retry.",
        );
    }
    let reviewer = match session.caller.reviewer(&session.reviewer()) {
        Ok(reviewer) => reviewer,
        Err(error) => return refused(&session, error),
    };
    // Not a number: 0, which the use case refuses as no attempt seen.
    let expected = form.expected_attempt.trim().parse::<i32>().unwrap_or(0);
    let (namespace, key) = (form.namespace.as_str(), form.key.as_str());
    let resolved = match form.command(&reviewer, expected) {
        Ok(command) => console.reconciler.resolve_by_reviewer(command).await,
        Err(error) => Err(error),
    };
    let values = form.values();
    match resolved {
        Ok(record) => {
            tracing::info!(
                reviewer = reviewer,
                status = record.status.as_str(),
                "operation resolved in the console"
            );
            let href = operation_href(namespace, key);
            Redirect::to(&format!("{href}&resolved={}", form.decision)).into_response()
        }
        Err(JournalError::OperationChanged {
            status,
            attempt_count,
        }) => {
            let mut page = match operation_page(&console, &session, namespace, key).await {
                Ok(page) => page,
                Err(response) => return response,
            };
            let last = last_change(page.history.as_deref());
            page.banner = Some(Banner {
                kind: "changed",
                title: "Not resolved: this operation changed while your page was open".into(),
                text: format!(
                    "Your page showed it unknown at attempt {expected}; it is now {status} at \
                     attempt {attempt_count}.{last} Nothing was applied (your reason was \
                     \u{201c}{}\u{201d}). Read its current state and history below before \
                     deciding again.",
                    form.reason.trim()
                ),
            });
            page.values = values;
            page.with_status(StatusCode::CONFLICT)
        }
        Err(JournalError::InvalidArgument { violation, .. }) => {
            let mut page = match operation_page(&console, &session, namespace, key).await {
                Ok(page) => page,
                Err(response) => return response,
            };
            page.banner = Some(Banner {
                kind: "error",
                title: "Not resolved".into(),
                text: format!(
                    "{}: {}. Nothing was applied.",
                    violation.field, violation.description
                ),
            });
            page.values = values;
            page.with_status(StatusCode::UNPROCESSABLE_ENTITY)
        }
        Err(error) => journal_error(&session, error),
    }
}

/// The search form's fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SearchForm {
    namespace: Option<String>,
    by: String,
    q: String,
}

/// `GET /search`: an operation by its key, or operations by external id or by a business
/// reference (`name=value`).
pub async fn search(
    State(console): State<Console>,
    SignedIn(session): SignedIn,
    Query(form): Query<SearchForm>,
) -> Response {
    let namespace = match page_namespace(&session, form.namespace.clone(), Rpc::ListOperations) {
        Ok(namespace) => namespace,
        Err(refusal) => return *refusal,
    };
    let mut page = SearchPage::new(&session, &namespace);
    let query = form.q.trim();
    if !form.by.is_empty() {
        page.by = form.by.clone();
    }
    page.query = query.to_owned();
    if query.is_empty() {
        return page.ok();
    }
    let term = match form.by.as_str() {
        "external_id" => SearchTerm::ExternalId(query.to_owned()),
        "reference" => match query.split_once('=') {
            Some((name, value)) => SearchTerm::Reference {
                name: name.trim().to_owned(),
                value: value.trim().to_owned(),
            },
            None => {
                page.problem = Some("A reference is searched as name=value.".into());
                return page.with_status(StatusCode::BAD_REQUEST);
            }
        },
        "" | "key" => SearchTerm::OperationKey(query.to_owned()),
        _ => {
            page.problem =
                Some("Search by key, external_id or reference (the form's choices).".into());
            page.by = "key".to_owned();
            return page.with_status(StatusCode::BAD_REQUEST);
        }
    };
    page.searched = true;
    match console.journal.search(&namespace, &term, PAGE_SIZE).await {
        Ok(records) => {
            page.rows = records.iter().map(Row::of).collect();
            page.ok()
        }
        Err(JournalError::InvalidArgument { violation, .. }) => {
            page.searched = false;
            page.problem = Some(format!("{}: {}", violation.field, violation.description));
            page.with_status(StatusCode::BAD_REQUEST)
        }
        Err(error) => journal_error(&session, error),
    }
}
