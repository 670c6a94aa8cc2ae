//! `opjournal-console-flood`: many unfinished sign-in POSTs to the review console (each
//! sends its whole head and a piece of its form, then nothing), the way one unauthenticated
//! client would try to exhaust the server; meanwhile a gRPC client keeps calling and a
//! browser-like visitor asks for the sign-in page. Prints the server's resident memory (VmRSS
//! from /proc/PID/status) before, at its peak and after the connections closed, what became
//! of them (held open, accepted and closed at once, answered), the other callers' latency.
//!
//! The server is the release `opjournal serve` next to this binary, on a new embedded journal
//! file, tokens off, its console on a free loopback port. The connections come from
//! `--peers` loopback addresses (`127.0.1.1`, `127.0.1.2`, …), so that the per-peer share
//! does not hide the console-wide cap. `--server-env KEY=VALUE` sets the server's settings.
//! See docs/review-console.md, "Limits and timeouts".

mod server_process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use opjournal::children::Process;
use opjournal::proto::GetOperationRequest;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tonic::Code;

use server_process::{free_port, parse_env, rss_mib};

/// Floods the console with unfinished sign-ins and measures the server meanwhile.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Unfinished sign-in POSTs opened.
    #[arg(long, default_value_t = 1500)]
    connections: usize,
    /// Loopback addresses they come from.
    #[arg(long, default_value_t = 60)]
    peers: usize,
    /// The `Content-Length` each declares, in bytes.
    #[arg(long, default_value_t = 4000)]
    declared_bytes: usize,
    /// Bytes of the form each sends before going silent.
    #[arg(long, default_value_t = 1000)]
    sent_bytes: usize,
    /// Seconds the connections are held after the last one opened.
    #[arg(long, default_value_t = 5.0)]
    hold: f64,
    /// Seconds after the close before the memory is read again.
    #[arg(long, default_value_t = 3.0)]
    settle: f64,
    /// Times the whole flood is repeated on the same server.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// A server setting as an environment variable, `KEY=VALUE` (repeatable).
    #[arg(long = "server-env", value_parser = parse_env)]
    server_env: Vec<(String, String)>,
}

/// A connection to `console` from the loopback address `127.0.1.{peer}` (1-based).
async fn connect(console: SocketAddr, peer: usize) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    let low = u8::try_from(peer % 250 + 1).unwrap_or(1);
    let high = u8::try_from(peer / 250 + 1).unwrap_or(1);
    socket.bind(SocketAddr::from(([127, high, 1, low], 0)))?;
    socket.connect(console).await
}

/// What one unfinished sign-in came to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    /// Still open at the end of the hold.
    Held,
    /// Closed by the server without a word (past the connection cap or the peer's share).
    Closed,
    /// Answered (408 past the body timeout, 429 past the sign-in rate) and closed.
    Answered,
    /// Could not connect or send.
    Failed,
}

/// Opens one unfinished sign-in and waits until `until` or the server closes it.
async fn unfinished_sign_in(
    console: SocketAddr,
    peer: usize,
    args: Arc<Args>,
    until: Arc<tokio::sync::Notify>,
) -> Fate {
    let Ok(mut stream) = connect(console, peer).await else {
        return Fate::Failed;
    };
    let head = format!(
        "POST /sign-in HTTP/1.1\r\nHost: {console}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\ncsrf=",
        args.declared_bytes
    );
    let form = "a".repeat(args.sent_bytes.saturating_sub(5));
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream.write_all(form.as_bytes()).await.is_err()
    {
        return Fate::Closed;
    }
    let mut received = Vec::new();
    let mut chunk = [0_u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::select! {
        () = read => if received.is_empty() { Fate::Closed } else { Fate::Answered },
        () = until.notified() => Fate::Held,
    }
}

/// The gRPC caller of the same process: GetOperation of an absent key, every 5 ms.
async fn grpc_caller(
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
            operation_key: "bench:console-flood:absent".into(),
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

/// A visitor's `GET /sign-in` from `127.0.0.9`: its status line and how long it took.
async fn visit(console: SocketAddr) -> (String, Duration) {
    let started = Instant::now();
    let answer = async {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from(([127, 0, 0, 9], 0)))?;
        let mut stream = socket.connect(console).await?;
        let request =
            format!("GET /sign-in HTTP/1.1\r\nHost: {console}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        std::io::Result::Ok(answer)
    };
    let status = match tokio::time::timeout(Duration::from_secs(10), answer).await {
        Ok(Ok(answer)) => String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or("closed without an answer")
            .to_owned(),
        Ok(Err(error)) => format!("failed: {error}"),
        Err(_) => "no answer in 10 s".to_owned(),
    };
    (status, started.elapsed())
}

/// One flood: the connections opened and held, then closed; the peak and after-close RSS.
async fn flood_round(
    args: &Arc<Args>,
    console: SocketAddr,
    addr: SocketAddr,
    pid: u32,
) -> anyhow::Result<(f64, f64, usize)> {
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let sampling = sampling.clone();
        async move {
            let mut peak: f64 = 0.0;
            while sampling.load(Ordering::SeqCst) {
                peak = peak.max(rss_mib(pid).unwrap_or(0.0));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let caller = tokio::spawn(grpc_caller(addr, stop.clone()));
    let until = Arc::new(tokio::sync::Notify::new());
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..args.connections {
        flood.spawn(unfinished_sign_in(
            console,
            i % args.peers,
            Arc::clone(args),
            until.clone(),
        ));
    }
    // Every connection is open (or refused) well before the hold ends.
    tokio::time::sleep(Duration::from_secs_f64(args.hold)).await;
    let (visitor_status, visitor_took) = visit(console).await;
    let held_for = started.elapsed();
    until.notify_waiters();
    let mut fates = Vec::new();
    while let Some(fate) = flood.join_next().await {
        fates.push(fate?);
    }
    stop.store(true, Ordering::SeqCst);
    let (latencies, errors) = caller.await??;
    tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
    sampling.store(false, Ordering::SeqCst);
    let peak = sampler.await?;
    let after = rss_mib(pid)?;
    let count = |fate: Fate| fates.iter().filter(|f| **f == fate).count();
    println!(
        "  connections: held open {}, accepted and closed at once {}, answered {}, failed {} \
         (after {:.1} s)",
        count(Fate::Held),
        count(Fate::Closed),
        count(Fate::Answered),
        count(Fate::Failed),
        held_for.as_secs_f64()
    );
    println!(
        "  visitor GET /sign-in during the flood: {visitor_status} in {:.1} ms",
        visitor_took.as_secs_f64() * 1000.0
    );
    let ms = |q: f64| latencies.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "  gRPC caller: {} calls, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {errors} errors",
        latencies.len(),
        ms(0.5),
        ms(0.99),
        latencies.max() as f64 / 1000.0
    );
    Ok((peak, after, errors))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("journal.db").display());
    let console: SocketAddr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let console_listen = console.to_string();
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
            "--console-listen",
            &console_listen,
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

    // Warm up: gRPC calls and a page, so the baseline includes served connections.
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = tokio::spawn(grpc_caller(addr, stop.clone()));
    let mut warm_page = visit(console).await.0;
    for _ in 0..50 {
        if warm_page.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        warm_page = visit(console).await.0;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let (warm, _) = warmup.await??;
    if warm.is_empty() || !warm_page.starts_with("HTTP/1.1 200") {
        bail!("the server did not answer ({warm_page})");
    }
    let baseline = rss_mib(pid)?;
    println!(
        "console flood: {} unfinished sign-in POSTs from {} peers, each declaring {} bytes and \
         sending {}, held {:.1} s",
        args.connections, args.peers, args.declared_bytes, args.sent_bytes, args.hold
    );
    for (key, value) in &args.server_env {
        println!("server setting: {key}={value}");
    }
    println!("baseline RSS: {baseline:.1} MiB");

    let mut peak_overall = baseline;
    let mut last_after = baseline;
    let mut caller_errors = 0;
    for round in 1..=args.rounds {
        println!("round {round}:");
        let (peak, after, errors) = flood_round(&args, console, addr, pid).await?;
        caller_errors += errors;
        println!(
            "  RSS: peak {peak:.1} MiB ({:+.1}), after close {after:.1} MiB ({:+.1})",
            peak - baseline,
            after - baseline
        );
        peak_overall = peak_overall.max(peak);
        last_after = after;
    }
    println!(
        "summary: baseline {baseline:.1} MiB, peak {peak_overall:.1} MiB ({:+.1}), after the \
         last close {last_after:.1} MiB ({:+.1})",
        peak_overall - baseline,
        last_after - baseline
    );
    server.stop().await;
    if caller_errors > 0 {
        bail!("the gRPC caller failed {caller_errors} times during the flood");
    }
    Ok(())
}
