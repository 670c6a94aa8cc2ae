//! Accepted connections with the TLS handshake done, for tonic's `serve_with_incoming`. Each
//! handshake runs in a task of its own (a slow or silent client holds up nobody) with the
//! configuration current when the connection arrived, and is given up after
//! [`HANDSHAKE_TIMEOUT`]. The listener closes when tonic drops the stream at shutdown.

use std::io;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::ServerTls;

/// Longest time a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted on `listener`, after their handshake under `tls`. The accept loop runs
/// until the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: ServerTls,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, tls, sender));
    ReceiverStream::new(receiver)
}

async fn accept_loop(
    listener: TcpListener,
    tls: ServerTls,
    sender: mpsc::Sender<io::Result<TlsStream<TcpStream>>>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            () = sender.closed() => return,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // As on the plaintext port: no Nagle delay between an answer's writes.
                    let _ = stream.set_nodelay(true);
                    handshakes.spawn(handshake(stream, &tls, sender.clone()));
                }
                Err(error) => {
                    tracing::debug!(%error, "accept failed");
                    // Out of file descriptors and the like: let some connections close first.
                    if !is_connection_error(&error) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            },
        }
    }
}

/// Connections from `accepted` (the gRPC port's bounded accept loop,
/// [`crate::api::limits::incoming`], which keeps its own connection counts, age and
/// first-request timeout: a handshake is bounded by that timeout too), after their
/// handshake under `tls`. The loop runs until the returned stream is dropped.
pub fn incoming_from<IO>(
    accepted: impl Stream<Item = io::Result<IO>> + Send + 'static,
    tls: ServerTls,
) -> ReceiverStream<io::Result<TlsStream<IO>>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut accepted = std::pin::pin!(accepted);
        let mut handshakes = JoinSet::new();
        loop {
            tokio::select! {
                () = sender.closed() => return,
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
                next = accepted.next() => match next {
                    Some(Ok(stream)) => {
                        handshakes.spawn(handshake(stream, &tls, sender.clone()));
                    }
                    // The accept loop waits after an error itself.
                    Some(Err(error)) => tracing::debug!(%error, "accept failed"),
                    None => return,
                },
            }
        }
    });
    ReceiverStream::new(receiver)
}

/// The TLS handshake of one accepted connection under the configuration current now, given
/// up after [`HANDSHAKE_TIMEOUT`]; the connection goes to `sender` once it succeeds.
fn handshake<IO>(
    stream: IO,
    tls: &ServerTls,
    sender: mpsc::Sender<io::Result<TlsStream<IO>>>,
) -> impl Future<Output = ()> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls.config());
    async move {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                let _ = sender.send(Ok(stream)).await;
            }
            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    }
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
