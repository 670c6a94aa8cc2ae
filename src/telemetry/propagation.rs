//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): reading `traceparent` from
//! incoming gRPC metadata, writing it into calls to provider adapters, and the form an
//! operation keeps of the request that registered it.
//!
//! The propagator is [`TraceContextPropagator`], always and explicitly (the OpenTelemetry
//! API's global default propagates nothing); `OTEL_PROPAGATORS` is not read. Baggage is not
//! propagated.

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A valid W3C `traceparent` in its version-00 form,
/// `00-<32 lowercase hex trace id>-<16 lowercase hex parent id>-<2 hex flags>`, with non-zero
/// ids. Names a trace and a span, nothing else: it is safe to store and to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// Reads a `traceparent` header value by the W3C rules (Trace Context level 1, 3.2):
    /// lowercase hex, version `ff` invalid, version `00` exactly 55 characters, a later
    /// version read by its version-00 prefix; `None` for anything invalid, including
    /// all-zero ids.
    pub fn parse(value: &str) -> Option<Self> {
        opjournal_traceparent::normalize(value).map(Self)
    }

    /// The `traceparent` of a span context; `None` when it is invalid.
    pub fn from_span_context(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| {
            Self(format!(
                "00-{}-{}-{:02x}",
                context.trace_id(),
                context.span_id(),
                context.trace_flags().to_u8()
            ))
        })
    }

    /// The `traceparent` carried by `headers` (gRPC metadata are HTTP/2 headers), if valid.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        Self::parse(headers.get(TRACEPARENT)?.to_str().ok()?)
    }

    /// The span context it names, marked remote (it was written by another process).
    pub fn span_context(&self) -> SpanContext {
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_str(&self.0) {
            headers.insert(TRACEPARENT, value);
        }
        TraceContextPropagator::new()
            .extract(&HeaderExtractor(&headers))
            .span()
            .span_context()
            .clone()
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The header naming the caller's span.
const TRACEPARENT: &str = "traceparent";

/// The trace context carried by `headers` (`traceparent`, checked by
/// [`TraceParent::parse`], and `tracestate`); an empty context when there is none or it is
/// invalid.
pub fn extract(headers: &http::HeaderMap) -> Context {
    if TraceParent::from_headers(headers).is_none() {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `context` into `headers` as `traceparent` (and `tracestate`); writes nothing for a
/// context without a valid span.
pub fn inject(context: &Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(context, &mut HeaderInjector(headers));
}

/// Writes the current `tracing` span's trace context into `headers`, so that the callee's
/// spans continue the trace; nothing when tracing is off.
pub fn inject_current(headers: &mut http::HeaderMap) {
    inject(&tracing::Span::current().context(), headers);
}

/// The trace context an operation keeps of the request registering it: the current span's
/// (the RPC's server span, in the trace the caller started) when tracing is on, else the
/// caller's own `traceparent` from `headers`, else none.
pub fn registering_trace_context(headers: &http::HeaderMap) -> Option<TraceParent> {
    let current = tracing::Span::current().context();
    TraceParent::from_span_context(current.span().span_context())
        .or_else(|| TraceParent::from_headers(headers))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_as_it_is() {
        let parsed = TraceParent::parse(VALID).unwrap();
        assert_eq!(parsed.as_str(), VALID);
        let context = parsed.span_context();
        assert!(context.is_remote());
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        assert!(context.is_sampled());
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_version_00_prefix() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future";
        let parsed = TraceParent::parse(later).unwrap();
        assert_eq!(
            parsed.as_str(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
    }

    #[test]
    fn inject_writes_what_extract_reads() {
        let context = Context::new()
            .with_remote_span_context(TraceParent::parse(VALID).unwrap().span_context());
        let mut headers = http::HeaderMap::new();
        inject(&context, &mut headers);
        assert_eq!(headers["traceparent"], VALID);
        assert_eq!(TraceParent::from_headers(&headers).unwrap().as_str(), VALID);
    }
}
