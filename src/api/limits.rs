//! Bounded resources on the gRPC port: what one connection, one request's headers and the
//! whole server may hold at once, so that no caller can grow the server's memory without
//! bound (a single HTTP/2 connection may otherwise open streams without limit).
//!
//! Four limits, each enforced at the earliest place that can:
//!
//! - **connections** ([`LimitedIncoming`]): past `max_connections` the server stops accepting
//!   until one closes; the kernel's backlog holds the rest.
//! - **streams per connection** (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, by h2): a client
//!   that opens more is refused per stream with `REFUSED_STREAM`, which gRPC clients see as
//!   `UNAVAILABLE` and may repeat: the server did not look at the request.
//! - **header list size** (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`, by h2): see
//!   docs/errors.md for what a client sees.
//! - **requests in flight** over all connections ([`InFlightLayer`]): past the limit a call is
//!   answered at once with `RESOURCE_EXHAUSTED`, `ErrorInfo` reason `SERVER_OVERLOADED` and a
//!   `RetryInfo` (load shedding), instead of queueing. Health checks are never shed: a probe
//!   that failed under load would restart a pod that is only busy.
//!
//! A connection also ends by age: at `max_connection_age` the server sends GOAWAY (tonic),
//! clients reconnect (and may land on another replica), and calls in flight finish; a
//! connection still open `max_connection_age_grace` later is closed ([`LimitedIo`]).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::Code;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

use crate::api::status::ERROR_DOMAIN;
use crate::domain::error::ErrorReason;

/// The limits of the gRPC port; every field has a safe default (see docs/configuration.md,
/// "Connection and load limits", for why each value).
#[derive(Debug, Clone, PartialEq)]
pub struct TransportLimits {
    /// Streams (calls) one HTTP/2 connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header list, in bytes, as HTTP/2 counts it (each field's name and
    /// value plus 32).
    pub max_header_list_bytes: u32,
    /// Calls being served at once over all connections; past it, `RESOURCE_EXHAUSTED`.
    pub max_in_flight_requests: usize,
    /// Connections open at once; past it the server stops accepting until one closes.
    pub max_connections: usize,
    /// What `RetryInfo` suggests to a shed call.
    pub overload_retry_after: Duration,
    /// Interval of HTTP/2 PING frames on an idle connection; `None` sends none.
    pub http2_keepalive_interval: Option<Duration>,
    /// How long an unanswered PING waits before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// Age at which a connection is asked to go away (GOAWAY); `None` never.
    pub max_connection_age: Option<Duration>,
    /// How long after `max_connection_age` a connection may still finish its calls before it
    /// is closed; `None` waits for them however long they take.
    pub max_connection_age_grace: Option<Duration>,
}

/// Default streams per connection: gRPC's own servers (Go, Java) use 100.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Default header list limit: 16 KiB, what hyper and gRPC C-core accept by default.
pub const DEFAULT_MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Default calls in flight over all connections.
pub const DEFAULT_MAX_IN_FLIGHT_REQUESTS: usize = 128;
/// Default connections open at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_bytes: DEFAULT_MAX_HEADER_LIST_BYTES,
            max_in_flight_requests: DEFAULT_MAX_IN_FLIGHT_REQUESTS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            overload_retry_after: Duration::from_secs(1),
            http2_keepalive_interval: Some(Duration::from_secs(60)),
            http2_keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Some(Duration::from_secs(1800)),
            max_connection_age_grace: Some(Duration::from_secs(60)),
        }
    }
}

impl TransportLimits {
    /// `builder` with the HTTP/2 limits, keepalive and connection age applied.
    pub fn apply(&self, builder: tonic::transport::Server) -> tonic::transport::Server {
        let builder = builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_max_header_list_size(self.max_header_list_bytes)
            .http2_keepalive_interval(self.http2_keepalive_interval)
            .http2_keepalive_timeout(Some(self.http2_keepalive_timeout));
        // tonic's own grace (0.14) closes the connection at age + grace without sending
        // GOAWAY at age first, so the grace is enforced here instead, by `LimitedIo`.
        match self.max_connection_age {
            Some(age) => builder.max_connection_age(age),
            None => builder,
        }
    }

    /// When a connection accepted now is closed whatever it is doing: age plus grace.
    fn close_after(&self) -> Option<Duration> {
        Some(self.max_connection_age? + self.max_connection_age_grace?)
    }
}

/// The `RESOURCE_EXHAUSTED` answer of a shed call: `ErrorInfo` reason `SERVER_OVERLOADED`
/// (metadata `limit`: `max_in_flight_requests`) and a `RetryInfo` of `retry_after`.
pub fn overloaded(retry_after: Duration) -> tonic::Status {
    let mut details = ErrorDetails::with_error_info(
        ErrorReason::ServerOverloaded.as_str(),
        ERROR_DOMAIN,
        HashMap::from([("limit".to_owned(), "max_in_flight_requests".to_owned())]),
    );
    details.set_retry_info(Some(retry_after));
    tonic::Status::with_error_details(
        Code::ResourceExhausted,
        "the server is serving as many calls as it allows; nothing was done, retry later",
        details,
    )
}

/// The gRPC path prefix of the health service, never shed.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// Load shedding over all connections: at most `max_in_flight_requests` calls are served at
/// once; one more is answered with [`overloaded`] without reaching its service.
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

impl InFlightLayer {
    /// A layer admitting `limit` calls at once (at least one).
    pub fn new(limit: usize, retry_after: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit.max(1))),
            retry_after,
        }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight {
            inner,
            permits: self.permits.clone(),
            retry_after: self.retry_after,
        }
    }
}

/// The service [`InFlightLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct InFlight<S> {
    inner: S,
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

impl<S, ReqBody> Service<http::Request<ReqBody>> for InFlight<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if request.uri().path().starts_with(HEALTH_PATH) {
            return Box::pin(self.inner.call(request));
        }
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await;
                    drop(permit);
                    response
                })
            }
            Err(_) => {
                let response = overloaded(self.retry_after).into_http();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

/// Accepted connections, at most `limit` open at once, each with `TCP_NODELAY` (an answer
/// goes out in several small writes, which Nagle's algorithm would hold back for the
/// client's delayed acknowledgement, some 40 ms on Linux) and closed at `close_after` of age.
pub fn incoming(
    listener: TcpListener,
    limits: &TransportLimits,
) -> impl Stream<Item = io::Result<LimitedIo>> + Send + 'static {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let close_after = limits.close_after();
    futures::stream::unfold(listener, move |listener| {
        let permits = permits.clone();
        async move {
            // Never closed, so acquiring only waits.
            let permit = permits.acquire_owned().await.ok()?;
            let accepted = listener.accept().await.and_then(|(stream, _)| {
                stream.set_nodelay(true)?;
                Ok(LimitedIo {
                    stream,
                    close_at: close_after.map(tokio::time::sleep).map(Box::pin),
                    _permit: permit,
                })
            });
            if let Err(error) = &accepted
                && !is_connection_error(error)
            {
                // Out of file descriptors and the like: let some connections close first.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Some((accepted, listener))
        }
    })
}

/// An error of one connection (the next accept may well succeed), as hyper and tonic tell.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Accepted connections as [`incoming`] makes them.
pub type LimitedIncoming = Pin<Box<dyn Stream<Item = io::Result<LimitedIo>> + Send>>;

pin_project! {
    /// One accepted connection: holds its place among `max_connections`, and fails its
    /// reads and writes once `max_connection_age` + grace has passed, which ends it.
    pub struct LimitedIo {
        #[pin]
        stream: TcpStream,
        close_at: Option<Pin<Box<Sleep>>>,
        _permit: OwnedSemaphorePermit,
    }
}

impl LimitedIo {
    fn expired(close_at: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(sleep) = close_at
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "max_connection_age_grace passed",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if let Err(error) = Self::expired(this.close_at, cx) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if let Err(error) = Self::expired(this.close_at, cx) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().stream.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().stream.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        if let Err(error) = Self::expired(this.close_at, cx) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for LimitedIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_shed_call_carries_error_info_and_retry_info() {
        let status = overloaded(Duration::from_millis(1500));
        assert_eq!(status.code(), Code::ResourceExhausted);
        let details = status.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "SERVER_OVERLOADED");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn connections_close_at_age_plus_grace_only_when_both_are_set() {
        let limits = TransportLimits::default();
        assert_eq!(limits.close_after(), Some(Duration::from_secs(1860)));
        let no_grace = TransportLimits {
            max_connection_age_grace: None,
            ..TransportLimits::default()
        };
        assert_eq!(no_grace.close_after(), None);
    }
}
