//! The sandbox's router and request logging.

use axum::Router;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post, put};

use crate::error::ApiError;
use crate::{Sandbox, admin, emails, payments};

/// Builds the full HTTP API bound to `sandbox`.
pub(crate) fn router(sandbox: Sandbox) -> Router {
    let router = Router::new();
    let router = route(router, "/v1/payments", post(payments::create));
    let router = route(
        router,
        "/v1/payments/by-idempotency-key/{key}",
        get(payments::by_key),
    );
    let router = route(router, "/v1/payments/{id}", get(payments::by_id));
    let router = route(router, "/v1/emails", post(emails::send));
    let router = route(
        router,
        "/v1/emails/by-reference/{reference}",
        get(emails::by_reference),
    );
    let router = route(router, "/v1/effects/{key}", get(admin::effects));
    let router = route(router, "/v1/stats", get(admin::stats));
    let router = route(router, "/v1/admin/lookup-lag", put(admin::set_lookup_lag));
    let router = route(router, "/v1/admin/ledger", get(admin::ledger));
    let router = route(router, "/healthz", get(admin::healthz));
    router.fallback(unknown_route).with_state(sandbox)
}

/// Adds one route whose requests are logged under its template.
fn route(
    router: Router<Sandbox>,
    template: &'static str,
    handlers: MethodRouter<Sandbox>,
) -> Router<Sandbox> {
    let handlers = handlers
        .fallback(method_not_allowed)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            log_request(template, request, next)
        }));
    router.route(template, handlers)
}

async fn unknown_route(method: Method) -> ApiError {
    tracing::info!(method = %method, route = "<unmatched>", status = 404, "sandbox request");
    ApiError::no_such_route()
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept this method",
    )
}

/// Logs method, route template and status only: never bodies, headers or
/// the concrete path (keys may carry personal data).
async fn log_request(template: &'static str, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    tracing::info!(
        method = %method,
        route = template,
        status = response.status().as_u16(),
        "sandbox request"
    );
    response.into_response()
}
