//! The admin HTTP port: `GET /metrics`, the Prometheus text exposition format (version
//! 0.0.4) of every instrument in [`super::metrics`]. Plain HTTP/1.1; it serves nothing else
//! and never a payload, key or token.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder as _, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `GET /metrics` from `registry` on `listener` until `shutdown` is cancelled.
///
/// Errors: the listener fails.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: prometheus::Registry,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/metrics", get(scrape))
        .with_state(registry);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn scrape(State(registry): State<prometheus::Registry>) -> Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::warn!(error = %error, "cannot encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
