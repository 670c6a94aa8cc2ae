//! `opjournal-held-streams`: one HTTP/2 connection opens many gRPC streams and never finishes
//! them, the way a misbehaving caller (or a broken proxy) would; meanwhile another client
//! keeps calling. Prints the server's resident memory (VmRSS from /proc/PID/status) before,
//! at its peak and after the connection closed, what became of the streams (opened and held,
//! refused with REFUSED_STREAM, ended by the server), and the other client's latency.
//!
//! The server is the release `opjournal serve` next to this binary, on a new embedded journal
//! file, tokens off, on a free loopback port. `--server-env KEY=VALUE` sets its settings, e.g.
//! `OPJOURNAL_MAX_CONCURRENT_STREAMS=4294967295 OPJOURNAL_MAX_IN_FLIGHT_REQUESTS=100000000`
//! for no bound at all. See docs/performance.md, "Held streams".

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Parser;
use futures::task::AtomicWaker;
use hdrhistogram::Histogram;
use opjournal::children::Process;
use opjournal::proto::GetOperationRequest;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::Code;

/// Holds many streams open on one connection and measures the server meanwhile.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Streams the one connection opens and never finishes.
    #[arg(long, default_value_t = 50_000)]
    streams: usize,
    /// Seconds the streams are held open before the connection closes.
    #[arg(long, default_value_t = 5.0)]
    hold: f64,
    /// Seconds after the close before the memory is read again.
    #[arg(long, default_value_t = 3.0)]
    settle: f64,
    /// Times the whole round is repeated on the same server.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Send every stream before reading the server's SETTINGS, ignoring its stream limit
    /// (as a hostile client would); off, the client honours the limit and queues the rest.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    ignore_limit: bool,
    /// A server setting as an environment variable, `KEY=VALUE` (repeatable).
    #[arg(long = "server-env", value_parser = parse_env)]
    server_env: Vec<(String, String)>,
}

fn parse_env(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| "expected KEY=VALUE".to_owned())
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// A connection whose reads wait until `open`: its HTTP/2 client sends what it queued before
/// it can read the server's SETTINGS.
struct GatedIo {
    tcp: tokio::net::TcpStream,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    open: AtomicBool,
    waker: AtomicWaker,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.waker.wake();
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

/// What became of the held connection's streams.
#[derive(Debug, Default)]
struct Streams {
    /// Never opened: the client held them back because the server's limit was reached.
    not_sent: usize,
    /// Answered (with a gRPC status) while held: shed, or a deadline.
    answered: usize,
    /// Refused with REFUSED_STREAM.
    refused: usize,
    /// Ended by another HTTP/2 error (a reset of another kind, GOAWAY).
    connection_ended: usize,
    /// Opened and unanswered when the connection was closed (open at the server, or
    /// queued in the client once it had read the server's limit).
    held: usize,
}

/// Opens `count` streams on one new connection, holds them for `hold`, then closes it.
async fn hold_streams(
    addr: SocketAddr,
    count: usize,
    hold: Duration,
    ignore_limit: bool,
) -> anyhow::Result<Streams> {
    let gate = Arc::new(Gate::default());
    if !ignore_limit {
        gate.open();
    }
    let io = GatedIo {
        tcp: tokio::net::TcpStream::connect(addr).await?,
        gate: gate.clone(),
    };
    let mut builder = h2::client::Builder::new();
    if ignore_limit {
        builder.initial_max_send_streams(count);
    }
    let (mut client, connection) = builder.handshake::<_, Bytes>(io).await?;
    let driver = tokio::spawn(connection);
    let mut responses = Vec::with_capacity(count);
    for _ in 0..count {
        let request = http::Request::builder()
            .method("POST")
            .uri("http://localhost/opjournal.v1.OperationJournal/GetOperation")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        // A client that honours the limit waits here once it is reached: it stops opening.
        let ready = futures::future::poll_fn(|cx| client.poll_ready(cx));
        if !matches!(
            tokio::time::timeout(Duration::from_secs(1), ready).await,
            Ok(Ok(()))
        ) {
            break;
        }
        match client.send_request(request, false) {
            Ok((response, stream)) => responses.push((response, stream)),
            Err(_) => break,
        }
        if responses.len() % 1000 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let mut streams = Streams {
        not_sent: count - responses.len(),
        ..Streams::default()
    };
    gate.open();
    let deadline = tokio::time::Instant::now() + hold;
    let outcomes =
        futures::future::join_all(responses.into_iter().map(|(response, stream)| async move {
            let outcome = tokio::time::timeout_at(deadline, response).await;
            drop(stream);
            outcome
        }))
        .await;
    for outcome in outcomes {
        match outcome {
            Err(_) => streams.held += 1,
            Ok(Ok(_)) => streams.answered += 1,
            Ok(Err(error)) if error.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                streams.refused += 1;
            }
            Ok(Err(_)) => streams.connection_ended += 1,
        }
    }
    drop(client);
    driver.abort();
    Ok(streams)
}

/// Another client's GetOperation calls, one after another, until `stop`: latencies of the
/// answered ones (NOT_FOUND is the answer) and the count of other outcomes.
async fn other_client(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(Histogram<u64>, usize)> {
    let mut client = OperationJournalClient::connect(format!("http://{addr}")).await?;
    let mut latencies = Histogram::<u64>::new(3)?;
    let mut failed = 0;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let mut request = tonic::Request::new(GetOperationRequest {
            namespace: String::new(),
            operation_key: "bench:held-streams:absent".into(),
        });
        request.set_timeout(Duration::from_secs(5));
        match client.get_operation(request).await {
            Err(status) if status.code() == Code::NotFound => {
                latencies.record(u64::try_from(started.elapsed().as_micros())?)?;
            }
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((latencies, failed))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("journal.db").display());
    let env: Vec<(&str, &str)> = std::iter::once(("RUST_LOG", "warn"))
        .chain(
            args.server_env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .collect();
    let (mut server, address) = Process::start(
        "opjournal",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--database-url",
            &url,
        ],
        &env,
        "opjournal listening on",
        dir.path(),
    )
    .await?;
    let addr: SocketAddr = address.parse()?;
    let pid = server.id().context("the server exited")?;

    // Warm up: a few calls, so the baseline includes a served connection.
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = tokio::spawn(other_client(addr, stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let (warm, _) = warmup.await??;
    if warm.is_empty() {
        bail!("the server answered no call");
    }
    let baseline = rss_mib(pid)?;
    println!(
        "held streams: {} per round, {} rounds, held {:.1} s, client {} the stream limit",
        args.streams,
        args.rounds,
        args.hold,
        if args.ignore_limit {
            "ignores"
        } else {
            "honours"
        }
    );
    for (key, value) in &args.server_env {
        println!("server setting: {key}={value}");
    }
    println!("baseline RSS: {baseline:.1} MiB");
    println!(
        "round | not sent | unanswered | refused | answered | ended | peak RSS MiB | after close MiB | other client p50 / p99 / max ms | other client errors"
    );
    let mut peak_overall = baseline;
    let mut last_after = baseline;
    for round in 1..=args.rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let other = tokio::spawn(other_client(addr, stop.clone()));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = tokio::spawn({
            let sampling = sampling.clone();
            async move {
                let mut peak: f64 = 0.0;
                while sampling.load(Ordering::SeqCst) {
                    peak = peak.max(rss_mib(pid).unwrap_or(0.0));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peak
            }
        });
        let streams = hold_streams(
            addr,
            args.streams,
            Duration::from_secs_f64(args.hold),
            args.ignore_limit,
        )
        .await?;
        stop.store(true, Ordering::SeqCst);
        let (latencies, errors) = other.await??;
        tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
        sampling.store(false, Ordering::SeqCst);
        let peak = sampler.await?;
        let after = rss_mib(pid)?;
        peak_overall = peak_overall.max(peak);
        last_after = after;
        let ms = |q: f64| latencies.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "{round} | {} | {} | {} | {} | {} | {peak:.1} | {after:.1} | {:.1} / {:.1} / {:.1} ({} calls) | {errors}",
            streams.not_sent,
            streams.held,
            streams.refused,
            streams.answered,
            streams.connection_ended,
            ms(0.5),
            ms(0.99),
            latencies.max() as f64 / 1000.0,
            latencies.len(),
        );
    }
    println!(
        "summary: baseline {baseline:.1} MiB, peak {peak_overall:.1} MiB, after the last close \
         {last_after:.1} MiB ({:+.1} MiB)",
        last_after - baseline
    );
    server.stop().await;
    Ok(())
}
