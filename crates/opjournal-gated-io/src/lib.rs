//! A TCP connection whose reads wait until a gate opens.
//!
//! An HTTP/2 client over a [`GatedIo`] sends everything it queued before it can read the
//! server's SETTINGS — as a client that ignores them (the stream limit, say) would. The
//! transport-limit tests and the `opjournal-held-streams` bench both drive servers this way.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP connection from `addr`'s loopback peer `127.0.0.<host>` (so a server can tell
/// callers apart by address).
///
/// # Errors
///
/// The socket's bind or connect error.
pub async fn connect_from(host: u8, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, host], 0)))?;
    socket.connect(addr).await
}

/// Opens the reads of the [`GatedIo`] made with it; closed at first.
#[derive(Default)]
pub struct Gate {
    open: AtomicBool,
    waker: AtomicWaker,
}

impl Gate {
    /// Lets the connection's reads through from now on.
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

/// A connection whose reads wait until [`Gate::open`]; writes pass at once.
pub struct GatedIo {
    tcp: TcpStream,
    gate: Arc<Gate>,
}

impl GatedIo {
    /// `tcp` behind a new closed gate, and the gate.
    pub fn new(tcp: TcpStream) -> (Self, Arc<Gate>) {
        let gate = Arc::new(Gate::default());
        (
            Self {
                tcp,
                gate: gate.clone(),
            },
            gate,
        )
    }
}

impl AsyncRead for GatedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.gate.waker.register(cx.waker());
        if !self.gate.open.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for GatedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
