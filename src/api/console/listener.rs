//! The console's connections, bounded before anything is read from them.
//!
//! - **Connections**: at most `max_connections` open at once, and at most
//!   `max_connections_per_peer` from one peer (an IPv4 address, or an IPv6 /64). A connection
//!   past either is accepted and closed at once: the listener never stops accepting, so a
//!   full console never leaves legitimate callers waiting in the kernel's backlog.
//! - **TLS handshake**: given up after [`tls::HANDSHAKE_TIMEOUT`].
//! - **Request head** (HTTP/1.1): hyper's header read timer closes a connection whose request
//!   line and headers have not all arrived `header_timeout` after it started waiting for them,
//!   on a new connection and on a kept-alive one between requests alike (slow-loris).
//! - **Idle**: a connection on which no byte moves either way for `idle_timeout` is closed,
//!   whatever its protocol (an HTTP/2 connection without streams, a stalled reader).
//! - **Head size**: at most [`MAX_HEAD_BYTES`] buffered per HTTP/1.1 connection, 100
//!   headers; over HTTP/2 [`MAX_HEADER_LIST_BYTES`] and [`MAX_STREAMS`] streams.
//!
//! The request body's deadline and sizes are the router's ([`super::limits`]). Plain HTTP is
//! HTTP/1.1 only; HTTPS offers HTTP/2 and HTTP/1.1 by ALPN.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::super::tls::{self, ServerTls};
use super::ConsoleLimits;

/// Largest request head buffered on one HTTP/1.1 connection, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request header list of one HTTP/2 stream, in bytes.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Streams one HTTP/2 connection may have open at once (a page and its few assets).
pub const MAX_STREAMS: u32 = 32;
/// How long a stopping console waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// The HTTP connection settings within `limits`: HTTP/1.1 and, over TLS only, HTTP/2.
fn connection_builder(limits: &ConsoleLimits, tls: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(100);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_BYTES);
    if tls { builder } else { builder.http1_only() }
}

/// Serves `app` on `listener` (over TLS with `tls`) within `limits` until `shutdown`, then
/// lets requests in flight finish for a few seconds at most. Each request carries its
/// peer's address as [`ConnectInfo`].
pub(super) async fn serve(
    listener: TcpListener,
    tls: Option<ServerTls>,
    app: Router,
    limits: &ConsoleLimits,
    shutdown: CancellationToken,
) {
    let builder = connection_builder(limits, tls.is_some());
    let tls = tls.map(|tls| tls.with_alpn(&[b"h2", b"http/1.1"]));
    let slots = Arc::new(Slots::new(
        limits.max_connections,
        limits.max_connections_per_peer,
    ));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "console accept failed");
                // Out of file descriptors and the like: let some connections close first.
                if !is_connection_error(&error) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let Some(slot) = slots.admit(peer.ip()) else {
            tracing::debug!("console connection closed: connection limit reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = IdleIo::new(stream, limits.idle_timeout);
        let service = app.clone().map_request(move |mut request: Request<_>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        });
        let service = TowerToHyperService::new(service);
        let (builder, tls, watcher) = (builder.clone(), tls.clone(), graceful.watcher());
        tokio::spawn(async move {
            let _slot = slot;
            let result = match tls {
                Some(tls) => {
                    let acceptor = TlsAcceptor::from(tls.config());
                    let io = match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(io))
                        .await
                    {
                        Ok(Ok(io)) => io,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "console TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("console TLS handshake timed out");
                            return;
                        }
                    };
                    let connection = builder.serve_connection(TokioIo::new(io), service);
                    watcher.watch(connection.into_owned()).await
                }
                None => {
                    let connection = builder.serve_connection(TokioIo::new(io), service);
                    watcher.watch(connection.into_owned()).await
                }
            };
            if let Err(error) = result {
                tracing::debug!(error = %error, "console connection ended");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN) => {}
    }
}

/// An error of one connection (the next accept may well succeed).
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Connections open, in all and per peer.
struct Slots {
    max: usize,
    per_peer: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Slots {
    fn new(max: usize, per_peer: usize) -> Self {
        Self {
            max,
            per_peer,
            open: Mutex::default(),
        }
    }

    /// A slot for a connection from `ip`, or `None` when the console or the peer's share is
    /// full.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let peer = peer_key(ip);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, peers) = &mut *open;
        let of_peer = peers.get(&peer).copied().unwrap_or(0);
        if *total >= self.max || of_peer >= self.per_peer {
            return None;
        }
        *total += 1;
        peers.insert(peer, of_peer + 1);
        Some(Slot {
            slots: Arc::clone(self),
            peer,
        })
    }
}

/// One open connection's place; given back when dropped.
struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (total, peers) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(count) = peers.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// Who counts as one peer: an IPv4 address, or an IPv6 /64 (what one host is usually given);
/// an IPv4-mapped IPv6 address is its IPv4 address.
pub(super) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

/// A connection closed (its next read or write fails with `TimedOut`) once no byte has
/// moved either way for its idle timeout.
struct IdleIo<T> {
    inner: T,
    idle: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl<T> IdleIo<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            idle: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }
    }

    /// Bytes moved: the idle time starts again.
    fn moved(&mut self) {
        let deadline = Instant::now() + self.timeout;
        self.idle.as_mut().reset(deadline);
    }

    /// What a pending read or write answers: still pending, or timed out.
    fn pending_or_idle<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "console connection idle",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The outcome of a write of `inner`.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match poll {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => self.pending_or_idle(cx),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.pending_or_idle(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_64() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(peer_key(v4), v4);
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(peer_key(mapped), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_key(a), peer_key(b));
        assert_ne!(peer_key(a), peer_key(other));
    }

    #[test]
    fn a_full_console_or_peer_share_admits_no_more_until_one_closes() {
        let slots = Arc::new(Slots::new(3, 2));
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let first = slots.admit(a);
        let second = slots.admit(a);
        assert!(first.is_some() && second.is_some());
        assert!(slots.admit(a).is_none(), "a's share is full");
        let third = slots.admit(b);
        assert!(third.is_some());
        assert!(slots.admit(b).is_none(), "the console is full");
        drop(first);
        assert!(
            slots.admit(b).is_some(),
            "a closed connection frees its place"
        );
        drop((second, third));
    }
}
