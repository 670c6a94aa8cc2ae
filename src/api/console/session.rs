//! Sign-in, sessions and CSRF protection of the review console.
//!
//! Browsers cannot send a bearer header, so a person signs in once: the sign-in form takes
//! one of the server's bearer tokens and checks it the way the gRPC API does (its SHA-256
//! against the configured digests, in constant time). The answer is a session cookie. The
//! session is opaque: 32 random bytes naming an entry in this process's memory, which holds
//! the token's principal (its name, namespaces and roles), never the token. It ends after a
//! while without requests, after a few hours at most, on sign-out, and with the process. The
//! cookie is `HttpOnly` and `SameSite=Strict`, and under TLS `Secure` with the `__Host-`
//! prefix.
//!
//! Without tokens ([`ConsoleAccess::Open`], allowed on loopback only unless the operator
//! says otherwise) the form asks for a name instead, recorded as the reviewer.
//!
//! CSRF: every form carries its session's random token (a synchronizer token), compared in
//! constant time before anything changes; the sign-in form, before any session exists,
//! carries a token that must equal a short-lived cookie of its own (double submit). A
//! request the browser marks as coming from another site (`Sec-Fetch-Site`, `Origin`) that
//! would change anything is refused before it reaches a handler ([`super::hosts`]).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use super::Console;
use super::view::{self, Page};
use crate::domain::access::{Caller, NamespaceScope, TokenRegistry};

/// Who may sign in to the console.
#[derive(Clone)]
pub enum ConsoleAccess {
    /// The server's bearer tokens: a token signs in as its principal.
    Tokens(Arc<TokenRegistry>),
    /// No tokens are configured: anyone who reaches the console signs in with a name and may
    /// do everything, like any gRPC caller of such a server.
    Open,
}

impl ConsoleAccess {
    /// Sign-in by the tokens of `registry`, or [`ConsoleAccess::Open`] when it is empty.
    pub fn from_registry(registry: TokenRegistry) -> Self {
        if registry.is_empty() {
            Self::Open
        } else {
            Self::Tokens(Arc::new(registry))
        }
    }
}

impl std::fmt::Debug for ConsoleAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokens(registry) => write!(f, "Tokens({})", registry.len()),
            Self::Open => f.write_str("Open"),
        }
    }
}

/// Sessions at most in memory at once; beyond, the least recently used go first.
const MAX_SESSIONS: u64 = 10_000;
/// The sign-in form's double-submit cookie.
const SIGN_IN_COOKIE: &str = "opjournal_console_sign_in";

/// A signed-in person.
pub struct Session {
    /// Who, as the gRPC API would see them.
    pub caller: Caller,
    /// The name shown and recorded as the reviewer: the token's name, or the name given.
    pub name: String,
    /// The session's CSRF token, in every form.
    pub csrf: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.name)
            .field("caller", &self.caller.name())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The reviewer to record for this session's resolutions (the token's name with tokens).
    pub fn reviewer(&self) -> String {
        match &self.caller {
            Caller::Principal(p) => p.name.clone(),
            Caller::Anyone => self.name.clone(),
        }
    }

    /// The roles, for the page header.
    pub fn roles(&self) -> String {
        match &self.caller {
            Caller::Anyone => "every role (no tokens configured)".to_owned(),
            Caller::Principal(p) => {
                let roles: Vec<&str> = p.roles.iter().map(|r| r.as_str()).collect();
                roles.join(", ")
            }
        }
    }

    /// The namespaces the session may choose from; `None` when any may be typed.
    pub fn namespaces(&self) -> Option<Vec<String>> {
        match &self.caller {
            Caller::Principal(p) => match &p.namespaces {
                NamespaceScope::Only(names) => Some(names.iter().cloned().collect()),
                NamespaceScope::Any => None,
            },
            Caller::Anyone => None,
        }
    }

    /// Whether `presented` is this session's CSRF token (constant time).
    fn csrf_matches(&self, presented: &str) -> bool {
        self.csrf.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

/// The sessions of this process.
pub struct Sessions {
    access: ConsoleAccess,
    live: moka::sync::Cache<String, Arc<Session>>,
    secure: bool,
}

impl Sessions {
    /// Sessions ending after `idle` without requests or `lifetime` after sign-in; `secure`
    /// when the console is served over TLS.
    pub fn new(access: ConsoleAccess, idle: Duration, lifetime: Duration, secure: bool) -> Self {
        Self {
            access,
            live: moka::sync::Cache::builder()
                .max_capacity(MAX_SESSIONS)
                .time_to_idle(idle)
                .time_to_live(lifetime)
                .build(),
            secure,
        }
    }

    /// The session cookie's name: `__Host-` prefixed under TLS, so that no other host or
    /// path can set it.
    fn cookie_name(&self) -> &'static str {
        if self.secure {
            "__Host-opjournal_console"
        } else {
            "opjournal_console"
        }
    }

    /// A cookie of the browser's session (no expiry of its own: the server ends sessions).
    fn cookie(&self, name: &'static str, value: String) -> Cookie<'static> {
        Cookie::build((name, value))
            .path("/")
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .build()
    }

    fn start(&self, caller: Caller, name: String) -> String {
        let id = random_token();
        let session = Session {
            caller,
            name,
            csrf: random_token(),
        };
        self.live.insert(id.clone(), Arc::new(session));
        id
    }

    /// The session named by the request's cookie, if it is live.
    pub fn find(&self, jar: &CookieJar) -> Option<Arc<Session>> {
        let id = jar.get(self.cookie_name())?.value();
        self.live.get(id)
    }
}

/// 32 random bytes, URL-safe base64.
fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// A signed-in request's session; a request without one is sent to the sign-in page (a
/// page) or refused with 401 (a form).
pub(super) struct SignedIn(pub Arc<Session>);

impl FromRequestParts<Console> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Response> {
        let jar = CookieJar::from_headers(&parts.headers);
        match console.sessions.find(&jar) {
            Some(session) => Ok(Self(session)),
            None if parts.method == Method::GET => Err(Redirect::to("/sign-in").into_response()),
            None => Err(view::error_page(
                None,
                StatusCode::UNAUTHORIZED,
                "Signed out",
                "Your session has ended (or the server restarted): nothing was changed. \
                 Sign in again and repeat the action.",
            )),
        }
    }
}

/// The refusal of a form whose CSRF token is not the session's: 403, nothing changed;
/// `None` when it is.
pub(super) fn csrf_refusal(session: &Session, presented: &str) -> Option<Response> {
    if session.csrf_matches(presented) {
        return None;
    }
    tracing::info!("console form refused: CSRF token missing or wrong");
    Some(view::error_page(
        Some(session),
        StatusCode::FORBIDDEN,
        "Form refused",
        "This form did not carry this session's security token (it may come from another \
         site, or from before you signed in again): nothing was changed. Reload the page and \
         try again.",
    ))
}

/// The sign-in page's form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SignInForm {
    csrf: String,
    token: String,
    name: String,
}

/// `GET /sign-in`: the form, with a fresh double-submit token.
pub(super) async fn sign_in_page(State(console): State<Console>, jar: CookieJar) -> Response {
    sign_in_form(&console, jar, StatusCode::OK, None)
}

fn sign_in_form(
    console: &Console,
    jar: CookieJar,
    status: StatusCode,
    problem: Option<&str>,
) -> Response {
    let sessions = &console.sessions;
    let csrf = random_token();
    let jar = jar.add(sessions.cookie(SIGN_IN_COOKIE, csrf.clone()));
    let by_token = matches!(sessions.access, ConsoleAccess::Tokens(_));
    let page = view::SignInPage::new(csrf, by_token, problem);
    (jar, page.with_status(status)).into_response()
}

/// `POST /sign-in`: a configured token (or, without tokens, a name) starts a session.
pub(super) async fn sign_in(
    State(console): State<Console>,
    jar: CookieJar,
    Form(form): Form<SignInForm>,
) -> Response {
    let expected = jar.get(SIGN_IN_COOKIE).map(|c| c.value().to_owned());
    let fresh = expected.is_some_and(|e| bool::from(e.as_bytes().ct_eq(form.csrf.as_bytes())));
    if !fresh {
        let problem = "The sign-in form had expired or came from elsewhere; try again.";
        return sign_in_form(&console, jar, StatusCode::FORBIDDEN, Some(problem));
    }
    let sessions = &console.sessions;
    let (caller, name) = match &sessions.access {
        ConsoleAccess::Tokens(registry) => match registry.authenticate(form.token.trim()) {
            Some(principal) => {
                let name = principal.name.clone();
                (Caller::Principal(principal), name)
            }
            None => {
                tracing::info!("console sign-in refused: token not configured");
                let problem = "This token is not configured on this server.";
                return sign_in_form(&console, jar, StatusCode::UNAUTHORIZED, Some(problem));
            }
        },
        ConsoleAccess::Open => {
            let name = form.name.trim().to_owned();
            let chars = name.chars().count();
            if chars == 0 || chars > 200 || name.chars().any(char::is_control) {
                let problem = "Give your name (1 to 200 characters): it is recorded with \
                               every resolution you make.";
                return sign_in_form(&console, jar, StatusCode::BAD_REQUEST, Some(problem));
            }
            (Caller::Anyone, name)
        }
    };
    tracing::info!(principal = %principal_name(&caller, &name), "console sign-in");
    let id = sessions.start(caller, name);
    let jar = jar
        .remove(Cookie::build(SIGN_IN_COOKIE).path("/"))
        .add(sessions.cookie(sessions.cookie_name(), id));
    (jar, Redirect::to("/queue")).into_response()
}

fn principal_name<'a>(caller: &'a Caller, name: &'a str) -> &'a str {
    caller.name().unwrap_or(name)
}

/// The sign-out form.
#[derive(Debug, Deserialize)]
pub struct SignOutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /sign-out`: ends the session.
pub(super) async fn sign_out(
    State(console): State<Console>,
    SignedIn(session): SignedIn,
    jar: CookieJar,
    Form(form): Form<SignOutForm>,
) -> Response {
    if let Some(refused) = csrf_refusal(&session, &form.csrf) {
        return refused;
    }
    let sessions = &console.sessions;
    if let Some(cookie) = jar.get(sessions.cookie_name()) {
        sessions.live.invalidate(cookie.value());
    }
    let jar = jar.remove(Cookie::build(sessions.cookie_name()).path("/"));
    (jar, Redirect::to("/sign-in")).into_response()
}
