//! A TCP proxy on loopback that injects network faults into every connection through it:
//! latency (each forwarded chunk waits), a stall (nothing is forwarded either way until it
//! ends; new connections are accepted and held, as behind a partition), and resets (every
//! open connection is closed with RST on both sides).
//!
//! Why a proxy of our own: this machine's kernel has no `sch_netem` (`tc qdisc ... netem`
//! answers "unknown qdisc"), Debian does not package Toxiproxy, and the Rust port of it
//! (`noxious`) has not been released since 2021. The proxy only moves bytes with tokio; the
//! faults are a few flags it reads between reads and writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The faults in force on one proxy, shared by its connections.
struct Faults {
    target: SocketAddr,
    latency_ms: AtomicU64,
    stalled: watch::Sender<bool>,
    /// Bumped by each reset; every connection open at that moment is cut.
    resets: watch::Sender<u64>,
    connections: AtomicU64,
}

/// A running fault proxy; it stops when the runtime does.
#[derive(Clone)]
pub struct FaultProxy {
    name: String,
    addr: SocketAddr,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to `target`.
    ///
    /// Errors: the port cannot be bound.
    pub async fn start(name: &str, target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Faults {
            target,
            latency_ms: AtomicU64::new(0),
            stalled: watch::channel(false).0,
            resets: watch::channel(0).0,
            connections: AtomicU64::new(0),
        });
        let accepting = Arc::clone(&faults);
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((client, _)) => {
                        accepting.connections.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(forward(client, Arc::clone(&accepting)));
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(Self {
            name: name.to_owned(),
            addr,
            faults,
        })
    }

    /// The proxy's name in the report.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays each forwarded chunk, in both directions, by `latency` (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        let millis = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.faults.latency_ms.store(millis, Ordering::Relaxed);
    }

    /// Stops (`true`) or resumes (`false`) forwarding on every connection, old and new.
    pub fn set_stalled(&self, stalled: bool) {
        self.faults.stalled.send_replace(stalled);
    }

    /// Cuts every open connection with RST on both sides.
    pub fn reset(&self) {
        self.faults
            .resets
            .send_modify(|generation| *generation += 1);
    }

    /// Lifts every fault.
    pub fn heal(&self) {
        self.set_latency(Duration::ZERO);
        self.set_stalled(false);
    }

    /// How many connections the proxy has accepted.
    pub fn connections(&self) -> u64 {
        self.faults.connections.load(Ordering::Relaxed)
    }
}

/// Forwards one connection until both sides are done, or a reset cuts it.
async fn forward(client: TcpStream, faults: Arc<Faults>) {
    let mut resets = faults.resets.subscribe();
    resets.mark_unchanged();
    let upstream = tokio::select! {
        connected = TcpStream::connect(faults.target) => connected,
        _ = resets.changed() => return abort(&client),
    };
    let Ok(upstream) = upstream else {
        // The target is down: the client sees its connection cut, as it would.
        return abort(&client);
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let cut = tokio::select! {
        _ = async {
            tokio::join!(
                pump(&mut client_read, &mut upstream_write, &faults),
                pump(&mut upstream_read, &mut client_write, &faults),
            )
        } => false,
        _ = resets.changed() => true,
    };
    if cut {
        // Reunited, the halves close without the FIN a dropped write half would send first.
        for (read, write) in [(client_read, client_write), (upstream_read, upstream_write)] {
            if let Ok(stream) = read.reunite(write) {
                abort(&stream);
            }
        }
    }
}

/// Copies `from` to `to` under the faults in force, then half-closes `to`.
async fn pump(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf, faults: &Faults) {
    let mut buffer = vec![0_u8; 16 * 1024];
    let mut stalled = faults.stalled.subscribe();
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if stalled.wait_for(|stalled| !*stalled).await.is_err() {
            break;
        }
        let latency = faults.latency_ms.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Makes the socket's close send RST instead of FIN (`SO_LINGER` 0); the close itself happens
/// when the last half is dropped.
fn abort(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut answer = [0_u8; 4];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn a_stall_holds_every_byte_until_it_ends_and_a_reset_cuts_the_connection() {
        let proxy = FaultProxy::start("test", echo().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut stream).await.unwrap(), b"ping");

        proxy.set_stalled(true);
        let held = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut stream)).await;
        assert!(held.is_err(), "nothing may pass a stall");
        proxy.set_stalled(false);
        let mut answer = [0_u8; 4];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping", "held bytes pass once the stall ends");

        proxy.reset();
        let mut rest = [0_u8; 1];
        let cut = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut rest))
            .await
            .unwrap();
        assert!(
            matches!(&cut, Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset),
            "{cut:?}"
        );
        // New connections work after a reset.
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut again).await.unwrap(), b"ping");
        assert_eq!(proxy.connections(), 2);
    }
}
