//! The console's pages: askama templates (`templates/console/`, HTML-escaped) and the view
//! models they show, made from the journal's records. Times are the database's, shown in
//! UTC; ages are measured against the database clock of the read that found them.

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::session::Session;
use crate::domain::model::{OperationEvent, OperationRecord};
use crate::store::{DeliveryState, OutboxEntry, OutboxStats, QueueStats, StateCount};

/// What every page shows around its content: who is signed in, and the sign-out form.
pub struct Chrome {
    /// The page's title.
    pub title: String,
    /// The signed-in person's name, roles and CSRF token; `None` before sign-in.
    pub person: Option<Person>,
}

/// The signed-in person, for the page header.
pub struct Person {
    /// Token name (or the name given without tokens).
    pub name: String,
    /// Roles, comma-separated.
    pub roles: String,
    /// The session's CSRF token, for the sign-out form.
    pub csrf: String,
}

impl Chrome {
    fn new(session: Option<&Session>, title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            person: session.map(|s| Person {
                name: s.name.clone(),
                roles: s.roles(),
                csrf: s.csrf.clone(),
            }),
        }
    }
}

/// A page template that renders into an HTML answer.
pub trait Page: Template + Sized {
    /// The page with `status`.
    fn with_status(self, status: StatusCode) -> Response {
        match self.render() {
            Ok(html) => (
                status,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                html,
            )
                .into_response(),
            Err(error) => {
                tracing::error!(%error, "a console page failed to render");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the page failed to render",
                )
                    .into_response()
            }
        }
    }

    /// The page, 200 OK.
    fn ok(self) -> Response {
        self.with_status(StatusCode::OK)
    }
}

/// A message above a page's content.
pub struct Banner {
    /// `ok`, `error` or `changed` (the CSS class, and the element id for `changed`).
    pub kind: &'static str,
    /// The first line, in bold.
    pub title: String,
    /// What happened and what to do.
    pub text: String,
}

/// The sign-in page.
#[derive(Template)]
#[template(path = "console/sign_in.html")]
pub struct SignInPage {
    chrome: Chrome,
    /// The form's double-submit token.
    pub csrf: String,
    /// Whether the form asks for a token (else for a name).
    pub by_token: bool,
    /// Why the last attempt failed.
    pub problem: Option<String>,
}

impl SignInPage {
    /// The sign-in form with its double-submit token `csrf`, asking for a token when
    /// `by_token` (else for a name), saying why the last attempt failed.
    pub fn new(csrf: String, by_token: bool, problem: Option<&str>) -> Self {
        Self {
            chrome: Chrome::new(None, "Sign in"),
            csrf,
            by_token,
            problem: problem.map(str::to_owned),
        }
    }
}

impl Page for SignInPage {}

/// A page that only says what went wrong.
#[derive(Template)]
#[template(path = "console/error.html")]
pub struct ErrorPage {
    chrome: Chrome,
    heading: String,
    message: String,
}

impl Page for ErrorPage {}

/// An error page with `status`.
pub fn error_page(
    session: Option<&Session>,
    status: StatusCode,
    heading: &str,
    message: &str,
) -> Response {
    ErrorPage {
        chrome: Chrome::new(session, heading),
        heading: heading.to_owned(),
        message: message.to_owned(),
    }
    .with_status(status)
}

/// One operation in a table of the queue or of search results.
pub struct Row {
    /// Link to its page.
    pub href: String,
    /// The idempotency key.
    pub key: String,
    /// Its action type.
    pub action_type: String,
    /// Its status.
    pub status: String,
    /// Its attempt count.
    pub attempt: i32,
    /// How long it has waited for review (empty when it does not).
    pub waiting: String,
    /// Why it was escalated.
    pub review_reason: String,
    /// Its last error or unknown-outcome code.
    pub error_code: String,
    /// Its last change, UTC.
    pub updated: String,
}

impl Row {
    /// The row of `record`.
    pub fn of(record: &OperationRecord) -> Self {
        Self {
            href: operation_href(record.namespace.as_str(), record.operation_key.as_str()),
            key: record.operation_key.to_string(),
            action_type: record.action_type.to_string(),
            status: record.status.to_string(),
            attempt: record.attempt_count,
            waiting: record
                .review_required_at
                .map(|at| age(record.observed_at - at))
                .unwrap_or_default(),
            review_reason: record.review_reason.clone().unwrap_or_default(),
            error_code: record.error_code.clone().unwrap_or_default(),
            updated: when(record.updated_at),
        }
    }
}

/// One count of the queue page.
pub struct Count {
    /// What is counted.
    pub label: &'static str,
    /// How many.
    pub count: i64,
    /// The oldest one's age, and what the age measures.
    pub oldest: String,
    /// The element id (for tests and styles).
    pub id: &'static str,
}

/// The queue page's counts from `stats`.
pub fn counts(stats: &QueueStats) -> Vec<Count> {
    let count = |label, id, state: StateCount, since: &str| Count {
        label,
        count: state.count,
        oldest: state
            .oldest
            .map(|at| format!("oldest {} {since}", age(stats.observed_at - at)))
            .unwrap_or_default(),
        id,
    };
    vec![
        count(
            "waiting for review",
            "count-review",
            stats.review,
            "since escalation",
        ),
        count("unknown", "count-unknown", stats.unknown, "unknown"),
        count(
            "due for a lookup",
            "count-due",
            stats.due,
            "past its check time",
        ),
        count(
            "in progress",
            "count-in-progress",
            stats.in_progress,
            "since its claim or renewal",
        ),
    ]
}

/// The namespace field of a page: a choice among the token's namespaces, or free text.
pub struct NamespaceField {
    /// The namespace shown.
    pub current: String,
    /// The choices; empty when any namespace may be typed.
    pub choices: Vec<Choice>,
}

/// One namespace to choose.
pub struct Choice {
    /// The namespace.
    pub name: String,
    /// Whether it is the one shown.
    pub selected: bool,
}

impl NamespaceField {
    /// The field for `session`, showing `current`.
    pub fn new(session: &Session, current: &str) -> Self {
        let names = session.namespaces().unwrap_or_default();
        Self {
            current: current.to_owned(),
            choices: names
                .into_iter()
                .map(|name| Choice {
                    selected: name == current,
                    name,
                })
                .collect(),
        }
    }
}

/// A choice of the queue's age filter: minutes, and its label.
pub struct AgeChoice {
    /// Minutes (0: any age).
    pub minutes: u64,
    /// Its label.
    pub label: &'static str,
}

/// The queue's age filter choices.
pub const AGE_CHOICES: [AgeChoice; 6] = [
    AgeChoice {
        minutes: 0,
        label: "any",
    },
    AgeChoice {
        minutes: 5,
        label: "5 minutes",
    },
    AgeChoice {
        minutes: 15,
        label: "15 minutes",
    },
    AgeChoice {
        minutes: 60,
        label: "1 hour",
    },
    AgeChoice {
        minutes: 240,
        label: "4 hours",
    },
    AgeChoice {
        minutes: 1440,
        label: "1 day",
    },
];

/// The review queue with its counts and filters.
#[derive(Template)]
#[template(path = "console/queue.html")]
pub struct QueuePage {
    /// Header.
    pub chrome: Chrome,
    /// The namespace shown.
    pub namespace: NamespaceField,
    /// The action type filter ("" for all).
    pub action_type: String,
    /// The age filter, minutes.
    pub min_age: u64,
    /// The age filter's choices.
    pub ages: &'static [AgeChoice],
    /// The counts.
    pub counts: Vec<Count>,
    /// The page of the queue.
    pub rows: Vec<Row>,
    /// The next page's link; empty on the last page.
    pub next: String,
    /// This page's own link, for the counts' refresh.
    pub refresh: String,
    /// The escalation webhook's outbox over every namespace; shown only to callers whose
    /// token covers every namespace.
    pub outbox: Option<OutboxView>,
}

impl Page for QueuePage {}

impl QueuePage {
    /// The queue page for `session`.
    pub fn new(session: &Session, namespace: &str) -> Self {
        Self {
            chrome: Chrome::new(Some(session), "Review queue"),
            namespace: NamespaceField::new(session, namespace),
            action_type: String::new(),
            min_age: 0,
            ages: &AGE_CHOICES,
            counts: Vec::new(),
            rows: Vec::new(),
            next: String::new(),
            refresh: String::new(),
            outbox: None,
        }
    }
}

/// A search form and its results.
#[derive(Template)]
#[template(path = "console/search.html")]
pub struct SearchPage {
    /// Header.
    pub chrome: Chrome,
    /// The namespace searched.
    pub namespace: NamespaceField,
    /// `key`, `external_id` or `reference`.
    pub by: String,
    /// The search text.
    pub query: String,
    /// Whether a search was made.
    pub searched: bool,
    /// What was found.
    pub rows: Vec<Row>,
    /// Why the search could not be made.
    pub problem: Option<String>,
}

impl Page for SearchPage {}

impl SearchPage {
    /// An empty search page for `session`.
    pub fn new(session: &Session, namespace: &str) -> Self {
        Self {
            chrome: Chrome::new(Some(session), "Search"),
            namespace: NamespaceField::new(session, namespace),
            by: "key".to_owned(),
            query: String::new(),
            searched: false,
            rows: Vec::new(),
            problem: None,
        }
    }
}

/// One entry of an operation's history: who, when, from -> to, why.
pub struct EventView {
    /// When, UTC.
    pub when: String,
    /// Client, worker or reviewer, and which.
    pub who: String,
    /// The status before (empty for the registration).
    pub from: String,
    /// The status after.
    pub to: String,
    /// The attempt after.
    pub attempt: i32,
    /// Whether it waits for review after this.
    pub review: bool,
    /// Why.
    pub why: String,
}

impl EventView {
    /// The view of `event`.
    pub fn of(event: &OperationEvent) -> Self {
        let kind = event.actor_kind.as_str();
        Self {
            when: when(event.occurred_at),
            who: if event.actor.is_empty() {
                kind.to_owned()
            } else {
                format!("{kind} {}", event.actor)
            },
            from: event.from_status.map(|s| s.to_string()).unwrap_or_default(),
            to: event.to_status.to_string(),
            attempt: event.attempt_count,
            review: event.review_required,
            why: event.reason.clone().unwrap_or_default(),
        }
    }
}

/// The values of the resolve forms, kept when a resolution is refused.
#[derive(Debug, Clone, Default)]
pub struct ResolveValues {
    /// Which form was sent: `succeeded`, `failed_final` or `release_for_retry`.
    pub decision: String,
    /// The provider's id.
    pub external_id: String,
    /// The result JSON.
    pub result_json: String,
    /// The error code.
    pub error_code: String,
    /// The reason.
    pub reason: String,
}

/// An operation's page.
#[derive(Template)]
#[template(path = "console/operation.html")]
pub struct OperationPage {
    /// Header.
    pub chrome: Chrome,
    /// A message about the last action.
    pub banner: Option<Banner>,
    /// The operation's namespace.
    pub namespace: String,
    /// Its key.
    pub key: String,
    /// Its status.
    pub status: String,
    /// The attempt the page shows: the resolve forms' compare-and-set.
    pub attempt: i32,
    /// Label and value of every field shown.
    pub fields: Vec<(&'static str, String)>,
    /// Business references.
    pub references: Vec<(String, String)>,
    /// The stored (sanitized) result, indented.
    pub result: Option<String>,
    /// The history, oldest first; `None` when the caller may not read it.
    pub history: Option<Vec<EventView>>,
    /// The escalation webhook's events for the operation with their delivery state, oldest
    /// first; `None` when the caller may not read the history.
    pub deliveries: Option<Vec<DeliveryView>>,
    /// Whether the resolve forms are shown.
    pub may_resolve: bool,
    /// Why they are not, when the operation could be resolved by someone else.
    pub resolve_note: Option<String>,
    /// The session's CSRF token.
    pub csrf: String,
    /// The resolve forms' values.
    pub values: ResolveValues,
}

impl Page for OperationPage {}

impl OperationPage {
    /// The page of `record` for `session`.
    pub fn new(session: &Session, record: &OperationRecord) -> Self {
        let optional = |value: &Option<String>| value.clone().unwrap_or_default();
        let time = |value: Option<DateTime<Utc>>| value.map(when).unwrap_or_default();
        let fields = vec![
            ("namespace", record.namespace.to_string()),
            ("operation key", record.operation_key.to_string()),
            ("action type", record.action_type.to_string()),
            ("status", record.status.to_string()),
            ("attempt", record.attempt_count.to_string()),
            ("request hash (SHA-256)", record.request_hash.to_hex()),
            ("external id", optional(&record.external_id)),
            ("error code", optional(&record.error_code)),
            ("waiting for review since", time(record.review_required_at)),
            ("escalation reason", optional(&record.review_reason)),
            ("unknown since", time(record.unknown_since)),
            ("next lookup", time(record.next_check_at)),
            ("provider lookups", record.reconcile_attempts.to_string()),
            ("lease until", time(record.lease_until)),
            ("last change by", record.last_actor_kind.as_str().to_owned()),
            ("created", when(record.created_at)),
            ("updated", when(record.updated_at)),
            ("registering trace", optional(&record.trace_context)),
        ];
        let result = record.result_json.as_deref().map(|text| {
            serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|value| serde_json::to_string_pretty(&value).ok())
                .unwrap_or_else(|| text.to_owned())
        });
        Self {
            chrome: Chrome::new(Some(session), record.operation_key.to_string()),
            banner: None,
            namespace: record.namespace.to_string(),
            key: record.operation_key.to_string(),
            status: record.status.to_string(),
            attempt: record.attempt_count,
            fields,
            references: record
                .references
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            result,
            history: None,
            deliveries: None,
            may_resolve: false,
            resolve_note: None,
            csrf: session.csrf.clone(),
            values: ResolveValues::default(),
        }
    }
}

/// One escalation webhook event of an operation and where its delivery stands.
pub struct DeliveryView {
    /// The event id: the receivers' de-duplication key (the `webhook-id` header).
    pub event_id: String,
    /// `operation.review_required` or `operation.review_resolved`.
    pub event_type: &'static str,
    /// When the change behind it committed, UTC.
    pub occurred: String,
    /// `pending`, `delivered` or `dead` (given up after its max age).
    pub state: &'static str,
    /// Attempts made so far.
    pub attempts: i32,
    /// The last attempt's answer: `HTTP 503 (http_503)`, `timeout`, ...; empty before the
    /// first attempt.
    pub last: String,
    /// When: the next attempt (pending), delivery or giving up (finished).
    pub when: String,
}

impl DeliveryView {
    /// The view of `entry`.
    pub fn of(entry: &OutboxEntry) -> Self {
        let last = match (entry.last_status_code, entry.last_error.as_deref()) {
            (Some(code), Some(error)) => format!("HTTP {code} ({error})"),
            (Some(code), None) => format!("HTTP {code}"),
            (None, Some(error)) => error.to_owned(),
            (None, None) => String::new(),
        };
        let when_text = match (entry.state, entry.finished_at) {
            (DeliveryState::Pending, _) if entry.next_attempt_at <= entry.observed_at => {
                "due now".to_owned()
            }
            (DeliveryState::Pending, _) => format!(
                "next attempt in {}",
                age(entry.next_attempt_at - entry.observed_at)
            ),
            (DeliveryState::Delivered, Some(at)) => format!("delivered {}", when(at)),
            (DeliveryState::Dead, Some(at)) => format!("given up {}", when(at)),
            (_, None) => String::new(),
        };
        Self {
            event_id: entry.event.event_id.to_string(),
            event_type: entry.event.event_type.as_str(),
            occurred: when(entry.event.occurred_at),
            state: entry.state.as_str(),
            attempts: entry.attempts,
            last,
            when: when_text,
        }
    }
}

/// The escalation webhook's outbox as the queue page shows it.
pub struct OutboxView {
    /// Events not yet delivered.
    pub pending: u64,
    /// The oldest pending event's age, empty when none is pending.
    pub oldest: String,
    /// Events given up on.
    pub dead: u64,
}

impl OutboxView {
    /// The view of `stats`.
    pub fn of(stats: &OutboxStats) -> Self {
        Self {
            pending: stats.pending,
            oldest: stats
                .oldest_pending_age
                .and_then(|age_of| chrono::TimeDelta::from_std(age_of).ok())
                .map(|delta| format!("oldest waiting {}", age(delta)))
                .unwrap_or_default(),
            dead: stats.dead,
        }
    }
}

/// The link to an operation's page.
pub fn operation_href(namespace: &str, key: &str) -> String {
    format!(
        "/operation?namespace={}&key={}",
        encode(namespace),
        encode(key)
    )
}

/// `value` percent-encoded for a query string.
pub fn encode(value: &str) -> String {
    utf8_percent_encode(value, NON_ALPHANUMERIC).to_string()
}

/// A time as shown: `2026-12-01 18:46:31 UTC`.
pub fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// An age as shown: `45s`, `12m 5s`, `3h 20m`, `2d 4h`.
pub fn age(duration: chrono::TimeDelta) -> String {
    let seconds = duration.num_seconds().max(0);
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds % 86_400 / 3600,
        seconds % 3600 / 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_the_two_largest_units() {
        let s = chrono::TimeDelta::seconds;
        assert_eq!(age(s(-3)), "0s");
        assert_eq!(age(s(45)), "45s");
        assert_eq!(age(s(12 * 60 + 5)), "12m 5s");
        assert_eq!(age(s(3 * 3600 + 20 * 60 + 9)), "3h 20m");
        assert_eq!(age(s(2 * 86_400 + 4 * 3600)), "2d 4h");
    }

    #[test]
    fn links_encode_namespaces_and_keys() {
        assert_eq!(
            operation_href("tenant-a", "payment:order-817/x&y"),
            "/operation?namespace=tenant%2Da&key=payment%3Aorder%2D817%2Fx%26y"
        );
    }
}
