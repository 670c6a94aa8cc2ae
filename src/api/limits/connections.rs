//! Accepted connections: caps per listener and per peer, accept-then-close, the
//! first-request, idle and age deadlines (see the module above for the rules).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::task::AtomicWaker;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TlsConnectInfo};

use super::TransportLimits;

/// What the accept loop and the calls of one connection share.
#[derive(Debug)]
struct ConnectionState {
    accepted: Instant,
    /// Whether a request's headers have arrived.
    requested: AtomicBool,
    /// Calls open now.
    open_streams: AtomicUsize,
    /// When the last call ended, in milliseconds since `accepted`.
    idle_since_ms: AtomicU64,
    /// Pushed out by a newer connection: close now.
    evicted: AtomicBool,
    /// The connection's task, woken when it must look at its deadlines again.
    waker: AtomicWaker,
}

impl ConnectionState {
    /// A call opened on the connection; it counts as open until the guard is dropped.
    fn open_stream(self: &Arc<Self>) -> OpenStream {
        self.requested.store(true, Ordering::Release);
        self.open_streams.fetch_add(1, Ordering::AcqRel);
        OpenStream(self.clone())
    }

    /// Since when (absolute) the connection has had nothing open, or `None` when a call
    /// is open.
    fn idle_since(&self) -> Option<Instant> {
        if !self.requested.load(Ordering::Acquire) {
            return Some(self.accepted);
        }
        if self.open_streams.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire)))
    }
}

/// One open call of a connection.
#[derive(Debug)]
pub(super) struct OpenStream(Arc<ConnectionState>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let state = &self.0;
        // Before the count falls, so that a connection seen idle has its idle start.
        let since = u64::try_from(state.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        state.idle_since_ms.store(since, Ordering::Release);
        if state.open_streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            state.waker.wake();
        }
    }
}

/// The connection information tonic puts in each request's extensions: the peer's
/// addresses and the connection's shared state.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The server's address of the connection.
    pub local: Option<SocketAddr>,
    state: Arc<ConnectionState>,
}

impl ConnectionInfo {
    /// A call opened on the connection; it counts as open until the guard is dropped.
    pub(super) fn open_stream(&self) -> OpenStream {
        self.state.open_stream()
    }

    /// The connection of a request, over TLS or not.
    pub(super) fn of(extensions: &http::Extensions) -> Option<&Self> {
        extensions.get::<Self>().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Self>>()
                .map(TlsConnectInfo::get_ref)
        })
    }
}

/// The open connections of one listener, and how many per peer address.
#[derive(Debug, Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, (IpAddr, Arc<ConnectionState>)>,
    by_peer: HashMap<IpAddr, usize>,
}

impl Connections {
    /// Pushes out the connection that has been idle longest (or never sent a request), of
    /// `peer` only when given; false when every such connection has a call open.
    fn evict_idlest(&mut self, peer: Option<IpAddr>) -> bool {
        let idlest = self
            .open
            .iter()
            .filter(|(_, (ip, _))| peer.is_none_or(|peer| *ip == peer))
            .filter_map(|(id, (_, state))| Some((state.idle_since()?, *id)))
            .min();
        let Some((_, id)) = idlest else {
            return false;
        };
        if let Some((_, state)) = self.open.remove(&id) {
            state.evicted.store(true, Ordering::Release);
            state.waker.wake();
        }
        true
    }
}

/// One connection's place among its listener's connections, given back when dropped.
#[derive(Debug)]
struct ConnectionSlot {
    connections: Arc<Mutex<Connections>>,
    id: u64,
    peer: IpAddr,
}

fn lock(connections: &Mutex<Connections>) -> MutexGuard<'_, Connections> {
    connections
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut connections = lock(&self.connections);
        connections.open.remove(&self.id);
        if let Some(count) = connections.by_peer.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                connections.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Admits a connection from `peer`: within the per-peer and total limits, pushing out an
/// idle connection when either is reached; `None` when it must be closed.
fn admit(
    connections: &Arc<Mutex<Connections>>,
    peer: IpAddr,
    limits: &TransportLimits,
) -> Option<(ConnectionSlot, Arc<ConnectionState>)> {
    let mut open = lock(connections);
    let from_peer = open.by_peer.get(&peer).copied().unwrap_or(0);
    if from_peer >= limits.max_connections_per_peer.max(1) && !open.evict_idlest(Some(peer)) {
        return None;
    }
    if open.open.len() >= limits.max_connections.max(1) && !open.evict_idlest(None) {
        return None;
    }
    let state = Arc::new(ConnectionState {
        accepted: Instant::now(),
        requested: AtomicBool::new(false),
        open_streams: AtomicUsize::new(0),
        idle_since_ms: AtomicU64::new(0),
        evicted: AtomicBool::new(false),
        waker: AtomicWaker::new(),
    });
    open.next_id += 1;
    let id = open.next_id;
    open.open.insert(id, (peer, state.clone()));
    *open.by_peer.entry(peer).or_default() += 1;
    Some((
        ConnectionSlot {
            connections: connections.clone(),
            id,
            peer,
        },
        state,
    ))
}

/// Accepted connections within `limits` (see the module's documentation), each with
/// `TCP_NODELAY` (an answer goes out in several small writes, which Nagle's algorithm would
/// hold back for the client's delayed acknowledgement, some 40 ms on Linux). The listener
/// never stops accepting: a connection over a limit that cannot push out an idle one is
/// closed as soon as it is accepted.
pub fn incoming(
    listener: TcpListener,
    limits: &TransportLimits,
) -> impl Stream<Item = io::Result<LimitedIo>> + Send + 'static {
    let connections = Arc::new(Mutex::new(Connections::default()));
    let limits = limits.clone();
    futures::stream::unfold(listener, move |listener| {
        let connections = connections.clone();
        let limits = limits.clone();
        async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        if !is_connection_error(&error) {
                            // Out of file descriptors and the like: let some connections
                            // close first.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        return Some((Err(error), listener));
                    }
                };
                let Some((slot, state)) = admit(&connections, peer.ip(), &limits) else {
                    tracing::debug!("connection closed at once: the connection limit is reached");
                    drop(stream);
                    continue;
                };
                if let Err(error) = stream.set_nodelay(true) {
                    return Some((Err(error), listener));
                }
                let io = LimitedIo {
                    stream,
                    close_at: limits.close_after().map(tokio::time::sleep).map(Box::pin),
                    timer: None,
                    first_request_timeout: limits.first_request_timeout,
                    max_idle: limits.max_connection_idle,
                    state,
                    _slot: slot,
                };
                return Some((Ok(io), listener));
            }
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

pin_project! {
    /// One accepted connection: holds its place among the listener's connections, and fails
    /// its reads and writes (which ends it) once it is pushed out, once it sent no request
    /// within the first-request timeout, once it has had no call open for the idle timeout,
    /// or once its age plus grace has passed.
    pub struct LimitedIo {
        #[pin]
        stream: TcpStream,
        close_at: Option<Pin<Box<Sleep>>>,
        timer: Option<Pin<Box<Sleep>>>,
        first_request_timeout: Duration,
        max_idle: Option<Duration>,
        state: Arc<ConnectionState>,
        _slot: ConnectionSlot,
    }
}

fn closed(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, why)
}

impl LimitedIo {
    /// An error once the connection must be closed; otherwise its next deadline armed.
    fn check(
        state: &ConnectionState,
        close_at: &mut Option<Pin<Box<Sleep>>>,
        timer: &mut Option<Pin<Box<Sleep>>>,
        first_request_timeout: Duration,
        max_idle: Option<Duration>,
        cx: &mut Context<'_>,
    ) -> io::Result<()> {
        state.waker.register(cx.waker());
        if state.evicted.load(Ordering::Acquire) {
            return Err(closed(
                "pushed out by a newer connection: the server was full",
            ));
        }
        if let Some(sleep) = close_at
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Err(closed("max_connection_age_grace passed"));
        }
        loop {
            let deadline = if !state.requested.load(Ordering::Acquire) {
                Some((state.accepted + first_request_timeout, "no request in time"))
            } else {
                match (state.idle_since(), max_idle) {
                    (Some(since), Some(idle)) => Some((since + idle, "idle for too long")),
                    _ => None,
                }
            };
            let Some((deadline, why)) = deadline else {
                return Ok(());
            };
            if deadline <= Instant::now() {
                return Err(closed(why));
            }
            let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
        }
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
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
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
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
        if let Err(error) = Self::check(
            this.state,
            this.close_at,
            this.timer,
            *this.first_request_timeout,
            *this.max_idle,
            cx,
        ) {
            return Poll::Ready(Err(error));
        }
        this.stream.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for LimitedIo {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo {
            remote: self.stream.peer_addr().ok(),
            local: self.stream.local_addr().ok(),
            state: self.state.clone(),
        }
    }
}

/// Accepted connections as [`incoming`] makes them.
pub type LimitedIncoming = Pin<Box<dyn Stream<Item = io::Result<LimitedIo>> + Send>>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn state(accepted: Instant) -> Arc<ConnectionState> {
        Arc::new(ConnectionState {
            accepted,
            requested: AtomicBool::new(false),
            open_streams: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }

    #[tokio::test]
    async fn a_full_listener_pushes_out_the_idlest_connection_and_never_a_busy_one() {
        let peer = IpAddr::from([127, 0, 0, 2]);
        let mut connections = Connections::default();
        let now = Instant::now();
        let busy = state(now - Duration::from_secs(30));
        let _open = busy.open_stream();
        let silent = state(now - Duration::from_secs(5));
        let fresh = state(now);
        for (id, state) in [(1, busy.clone()), (2, silent.clone()), (3, fresh.clone())] {
            connections.open.insert(id, (peer, state));
        }
        assert!(connections.evict_idlest(None));
        assert!(silent.evicted.load(Ordering::Acquire));
        assert!(!busy.evicted.load(Ordering::Acquire));
        assert!(connections.evict_idlest(Some(peer)));
        assert!(fresh.evicted.load(Ordering::Acquire));
        // Only the busy one is left.
        assert!(!connections.evict_idlest(None));
        assert!(!connections.evict_idlest(Some(IpAddr::from([10, 0, 0, 1]))));
    }
}
