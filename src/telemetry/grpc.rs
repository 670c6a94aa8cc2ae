//! Server-side RPC telemetry, as a tower layer around every gRPC service: one server span per
//! journal RPC, continuing the caller's W3C trace context, and the `rpc.server.call.duration`
//! histogram for every call, by the current RPC semantic conventions
//! (<https://opentelemetry.io/docs/specs/semconv/rpc/>): `rpc.system.name` = `grpc`,
//! `rpc.method` fully qualified (`opjournal.v1.OperationJournal/BeginOperation`),
//! `rpc.response.status_code` the gRPC status code's name (`OK`, `UNAVAILABLE`).
//!
//! A call ends, and is measured, when its answer's last frame is sent: the status comes from
//! the `grpc-status` header of a trailers-only answer or from the trailers. A call whose
//! answer is dropped before that (the client went away) is counted as `CANCELLED`. Health and
//! reflection calls are measured but get no span (probes every few seconds would fill the
//! traces); unknown methods are measured as `_OTHER`.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tonic::Code;
use tower::{Layer, Service};
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::metrics::Metrics;
use super::propagation;

/// The layer; add it with `tonic::transport::Server::builder().layer(..)`.
#[derive(Clone, Debug)]
pub struct RpcTelemetryLayer {
    metrics: Metrics,
}

impl RpcTelemetryLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RpcTelemetryLayer {
    type Service = RpcTelemetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcTelemetry {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service the layer wraps around the server's routes.
#[derive(Clone, Debug)]
pub struct RpcTelemetry<S> {
    inner: S,
    metrics: Metrics,
}

/// The fully qualified methods this server serves and measures by name.
static KNOWN_METHODS: LazyLock<HashSet<String>> = LazyLock::new(|| {
    use prost::Message as _;
    let mut methods: HashSet<String> = [
        "grpc.health.v1.Health/Check",
        "grpc.health.v1.Health/Watch",
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if let Ok(set) = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET) {
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let name = service.name.unwrap_or_default();
                if !crate::proto::SERVICES.contains(&format!("{package}.{name}").as_str()) {
                    continue;
                }
                for method in service.method {
                    methods.insert(format!(
                        "{package}.{name}/{}",
                        method.name.unwrap_or_default()
                    ));
                }
            }
        }
    }
    methods
});

/// The `rpc.method` of a request path: the fully qualified method when this server serves
/// it, `_OTHER` otherwise (an unbounded value never becomes an attribute).
pub fn rpc_method(path: &str) -> &'static str {
    let method = path.strip_prefix('/').unwrap_or(path);
    KNOWN_METHODS.get(method).map_or("_OTHER", String::as_str)
}

/// Whether a server span ends in error for `code` (the gRPC semantic conventions: only codes
/// that say the server failed; a refused request is the caller's error).
fn is_server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from_i32(value.trim().parse().ok()?))
}

/// One call in flight: finished once, with its status, or as `CANCELLED` when dropped first.
struct Call {
    metrics: Metrics,
    method: &'static str,
    started: Instant,
    span: tracing::Span,
    finished: bool,
}

impl Call {
    fn finish(&mut self, code: Code) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let name = code_name(code);
        self.metrics
            .rpc_call(self.method, name, self.started.elapsed());
        self.span.record("rpc.response.status_code", name);
        if is_server_error(code) {
            self.span.record("otel.status_code", "error");
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(Code::Cancelled);
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcTelemetry<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<ObservedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let method = rpc_method(request.uri().path());
        let span = if method.starts_with("opjournal.") {
            let span = tracing::info_span!(
                "rpc",
                otel.name = method,
                otel.kind = "server",
                otel.status_code = Empty,
                rpc.system.name = "grpc",
                rpc.method = method,
                rpc.response.status_code = Empty,
                opjournal.begin.decision = Empty,
            );
            // The caller's trace continues here; without a valid traceparent a new one starts.
            let _ = span.set_parent(propagation::extract(request.headers()));
            span
        } else {
            tracing::Span::none()
        };
        let mut call = Call {
            metrics: self.metrics.clone(),
            method,
            started: Instant::now(),
            span: span.clone(),
            finished: false,
        };
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(
            async move {
                let response = match future.await {
                    Ok(response) => response,
                    Err(error) => {
                        call.finish(Code::Unknown);
                        return Err(error);
                    }
                };
                // A trailers-only answer (every error) carries its status in the headers.
                if let Some(code) = grpc_status(response.headers()) {
                    call.finish(code);
                }
                Ok(response.map(|inner| ObservedBody {
                    inner,
                    call: Some(call),
                }))
            }
            .instrument(span),
        )
    }
}

pin_project! {
    /// An answer's body that finishes its call at the trailers (or when dropped).
    pub struct ObservedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for ObservedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status)
                    && let Some(mut call) = this.call.take()
                {
                    call.finish(code);
                }
            }
            Some(Err(_)) => {
                if let Some(mut call) = this.call.take() {
                    call.finish(Code::Unknown);
                }
            }
            None => {
                // The end without trailers: the status was in the headers (already finished)
                // or the stream broke off.
                if let Some(mut call) = this.call.take() {
                    call.finish(Code::Unknown);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The canonical UPPER_SNAKE name of a gRPC code.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_methods_are_named_and_others_are_other() {
        assert_eq!(
            rpc_method("/opjournal.v1.OperationJournal/BeginOperation"),
            "opjournal.v1.OperationJournal/BeginOperation"
        );
        assert_eq!(
            rpc_method("/opjournal.v1.Reconciler/ResolveOperation"),
            "opjournal.v1.Reconciler/ResolveOperation"
        );
        assert_eq!(
            rpc_method("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        assert_eq!(
            rpc_method("/opjournal.v1.ProviderAdapter/LookupOperation"),
            "_OTHER"
        );
        assert_eq!(rpc_method("/anything/at-all"), "_OTHER");
    }

    #[test]
    fn status_codes_are_named_as_the_conventions_say() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
        assert!(is_server_error(Code::Unavailable));
        assert!(!is_server_error(Code::InvalidArgument));
    }
}
