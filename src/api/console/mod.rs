//! The review console: server-rendered HTML pages for the people who settle escalated
//! operations, on an HTTP(S) port of its own (`console_listen`, off unless configured).
//!
//! It is a transport beside the gRPC services and calls the same use cases as the
//! `Reconciler` service (`Reconciler::review_queue`, `history`, `resolve_by_reviewer`) and
//! the journal's reads (`Journal::get`, `Journal::search`): no SQL and no resolve rule of its
//! own. Each page checks the caller's role for the RPC it stands for (the queue is
//! `ListOperationsForReview`, an operation's page `GetOperation` and `GetOperationHistory`, a
//! resolution `ResolveOperation`, a search `ListOperations`) and the namespace it touches,
//! exactly as the gRPC handlers do, with the same tokens.
//!
//! What it shows is what the journal stores (payloads never are): an operation's fields,
//! business references, its sanitized result and its history. Sign-in, sessions and CSRF
//! protection are in [`session`], which requests it answers at all (`Host`, `Origin`) in
//! [`hosts`], and what it reads before anyone is signed in, for how long, in [`limits`] and
//! [`listener`]. The pages work without JavaScript; the vendored htmx
//! (`assets/console/`) only refreshes the counts and filters the queue in place. Every
//! asset is compiled into the binary: nothing is loaded from elsewhere.

pub mod assets;
pub mod hosts;
pub mod limits;
mod listener;
mod pages;
pub mod session;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tls::ServerTls;
use crate::journal::Journal;
use crate::reconcile::Reconciler;
use hosts::HostRule;
pub use limits::ConsoleLimits;
pub use session::ConsoleAccess;
use session::Sessions;
pub use view::operation_href;

/// How long a signed-in session lasts without requests, by default.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// How long a session lasts at most, by default.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// The console's settings.
#[derive(Clone)]
pub struct ConsoleOptions {
    /// Who may sign in: the server's tokens, or (without tokens) anyone, by name.
    pub access: ConsoleAccess,
    /// HTTPS with the server's certificates and client-certificate rule, reloaded with the
    /// gRPC port's; plain HTTP when `None`.
    pub tls: Option<ServerTls>,
    /// A session ends after this long without requests.
    pub session_idle: Duration,
    /// A session ends this long after sign-in at the latest.
    pub session_lifetime: Duration,
    /// Largest form accepted from a signed-in person, in bytes (a reviewer's result JSON is
    /// the largest field); the sign-in form's is `limits.sign_in_max_bytes`.
    pub max_form_bytes: usize,
    /// Connections, timeouts, the sign-in form's size and rate, and the names it answers to.
    pub limits: ConsoleLimits,
}

impl std::fmt::Debug for ConsoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleOptions")
            .field("access", &self.access)
            .field("tls", &self.tls.is_some())
            .field("session_idle", &self.session_idle)
            .field("session_lifetime", &self.session_lifetime)
            .field("max_form_bytes", &self.max_form_bytes)
            .field("limits", &self.limits)
            .finish()
    }
}

impl ConsoleOptions {
    /// Options with the default session lengths and limits, and a form limit fitting
    /// `max_result_bytes`.
    pub fn new(access: ConsoleAccess, tls: Option<ServerTls>, max_result_bytes: usize) -> Self {
        Self {
            access,
            tls,
            session_idle: DEFAULT_SESSION_IDLE,
            session_lifetime: DEFAULT_SESSION_LIFETIME,
            // A form encodes each byte of the result in up to three.
            max_form_bytes: max_result_bytes.saturating_mul(3) + 16 * 1024,
            limits: ConsoleLimits::default(),
        }
    }
}

/// What every page handler reaches: the use cases and the sessions.
#[derive(Clone)]
struct Console {
    journal: Journal,
    reconciler: Reconciler,
    sessions: Arc<Sessions>,
}

/// The console's routes over `journal` and `reconciler`, for a console listening on
/// `listen`.
pub fn router(
    journal: Journal,
    reconciler: Reconciler,
    options: &ConsoleOptions,
    listen: SocketAddr,
) -> Router {
    let sessions = Sessions::new(
        options.access.clone(),
        options.session_idle,
        options.session_lifetime,
        options.tls.is_some(),
    );
    let console = Console {
        journal,
        reconciler,
        sessions: Arc::new(sessions),
    };
    let limits = &options.limits;
    let gate = Arc::new(limits::SignInGate::new(limits));
    let sign_in = post(session::sign_in)
        .layer(DefaultBodyLimit::max(limits.sign_in_max_bytes))
        .layer(axum::middleware::from_fn_with_state(
            gate,
            limits::sign_in_gate,
        ));
    let hosts = Arc::new(HostRule::new(listen, &limits.allowed_hosts));
    Router::new()
        .route("/", get(pages::home))
        .route("/queue", get(pages::queue))
        .route("/operation", get(pages::operation))
        .route("/operation/resolve", post(pages::resolve))
        .route("/search", get(pages::search))
        .route("/sign-in", get(session::sign_in_page).merge(sign_in))
        .route("/sign-out", post(session::sign_out))
        .route("/assets/{name}", get(assets::serve))
        .fallback(pages::not_found)
        .layer(axum::middleware::map_response(rejection_pages))
        .layer(DefaultBodyLimit::max(options.max_form_bytes))
        .layer(axum::middleware::from_fn_with_state(
            limits.body_timeout,
            limits::body_deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            hosts::same_origin,
        ))
        .layer(axum::middleware::map_response_with_state(
            options.tls.is_some(),
            security_headers,
        ))
        .with_state(console)
}

/// Requests refused before a handler ran (a query parameter repeated or malformed, a form
/// over `max_form_bytes`) get axum's plain-text answer; the console answers them with its own
/// page instead, keeping the status (400, 413, 415, 422).
async fn rejection_pages(response: Response) -> Response {
    let status = response.status();
    let plain_text = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/plain"));
    if !status.is_client_error() || !plain_text {
        return response;
    }
    let (heading, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            "Request too large",
            "The form is larger than the console accepts. Nothing was changed.",
        ),
        _ => (
            "Invalid request",
            "The request's fields could not be read (one given twice, or malformed). \
             Nothing was changed.",
        ),
    };
    view::error_page(None, status, heading, message)
}

/// Headers on every answer, refusals and error pages included: no caching of pages, no
/// framing, no sniffing, no referrer, a content security policy that lets in only the
/// console's own scripts and styles, and over HTTPS (`https`) HSTS.
async fn security_headers(State(https): State<bool>, mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut axum::http::HeaderMap, name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, header::CACHE_CONTROL, "no-store");
    }
    if https {
        set(
            headers,
            header::STRICT_TRANSPORT_SECURITY,
            "max-age=31536000",
        );
    }
    response
}

/// Serves the console on `listener` until `shutdown` is cancelled, then lets requests in
/// flight finish (a few seconds at most); connections and requests are bounded by
/// `options.limits` (see [`listener`]).
///
/// Errors: the listener has no local address.
pub async fn serve(
    journal: Journal,
    reconciler: Reconciler,
    listener: TcpListener,
    options: ConsoleOptions,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listen = listener.local_addr()?;
    let app = router(journal, reconciler, &options, listen);
    listener::serve(listener, options.tls, app, &options.limits, shutdown).await;
    Ok(())
}
