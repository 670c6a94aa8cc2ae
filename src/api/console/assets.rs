//! The console's static files, compiled into the binary: its stylesheet and the vendored
//! htmx (`assets/console/`, npm package `htmx.org`, Zero-Clause BSD licence beside it).

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The vendored htmx version (`assets/console/README.md` says where it came from).
pub const HTMX_VERSION: &str = "2.0.11";

const FILES: [(&str, &str, &str); 3] = [
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../../assets/console/console.css"),
    ),
    (
        "htmx.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../assets/console/htmx.min.js"),
    ),
    (
        "htmx.LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../../assets/console/htmx.LICENSE"),
    ),
];

/// `GET /assets/{name}`: one of the files above (cached for an hour), or 404.
pub async fn serve(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            *body,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
