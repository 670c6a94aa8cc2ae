//! `opjournal-held-streams`: attacks on the gRPC listeners by callers that hold what the server
//! gives them, each against a fresh release server, while another caller keeps calling
//! `BeginOperation`. Prints the server's resident memory (VmRSS from /proc/PID/status) and
//! open file descriptors (/proc/PID/fd) before, at their peak and after the attack ended,
//! what became of the attacker's streams or connections, and the other caller's latency.
//!
//! `--attack`:
//!
//! - `streams` (default): one HTTP/2 connection opens many `GetOperation` streams and never
//!   finishes them.
//! - `health-watch`: `--connections` connections each open `--watches` health `Watch`
//!   streams and hold them, on the journal's port or (`--port health`) on the health-only
//!   port.
//! - `idle`: `--connections` TCP connections that never send a byte (`--tls`: after the TLS
//!   handshake).
//! - `tenant`: tokens on; one tenant's token sends `--streams` header-only
//!   `BeginOperation` streams (HEADERS, never a body) over `--connections` connections,
//!   while another tenant's token calls Begin.
//!
//! Attackers connect from other loopback addresses than the other caller (127.0.0.2 and up,
//! `--peers` of them), as other hosts would. The server is the release `opjournal serve` next
//! to this binary, on a new embedded journal file, on a free loopback port. `--server-env
//! KEY=VALUE` sets its settings. See docs/performance.md, "Held streams".

mod server_process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use opjournal::children::Process;
use opjournal::proto::BeginOperationRequest;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use opjournal_gated_io::{GatedIo, connect_from};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tonic::transport::{Channel, ClientTlsConfig};

use server_process::{free_port, parse_env, rss_mib};

/// Which attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Attack {
    /// Many streams held open on one connection.
    Streams,
    /// Health `Watch` streams held open on many connections.
    HealthWatch,
    /// Connections that never send anything.
    Idle,
    /// One tenant's header-only Begins while another tenant calls.
    Tenant,
}

/// Which port the health watches go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Port {
    /// The journal's port.
    Main,
    /// The health-only port (`health_listen`).
    Health,
}

/// Attacks a fresh server and measures it meanwhile.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The attack.
    #[arg(long, value_enum, default_value_t = Attack::Streams)]
    attack: Attack,
    /// `streams`: streams the one connection opens (default 50,000); `tenant`: header-only
    /// Begins in all (default 128).
    #[arg(long)]
    streams: Option<usize>,
    /// Attacker connections: `health-watch` 1,000, `idle` 1,030, `tenant` 2 by default.
    #[arg(long)]
    connections: Option<usize>,
    /// `health-watch`: watches per connection.
    #[arg(long, default_value_t = 100)]
    watches: usize,
    /// `health-watch`: the port attacked.
    #[arg(long, value_enum, default_value_t = Port::Main)]
    port: Port,
    /// `idle`: the server speaks TLS, and attackers finish the handshake before going silent.
    #[arg(long)]
    tls: bool,
    /// Attacker addresses, 127.0.0.2 and up.
    #[arg(long, default_value_t = 8)]
    peers: u8,
    /// Seconds the attack is held before the attacker closes everything (default 5 for
    /// `streams`, 15 otherwise: past the server's 10 s timeouts).
    #[arg(long)]
    hold: Option<f64>,
    /// Seconds after the close before the memory is read again.
    #[arg(long, default_value_t = 3.0)]
    settle: f64,
    /// Times the whole round is repeated on the same server.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `streams`: send every stream before reading the server's SETTINGS, ignoring its
    /// stream limit (as a hostile client would); off, the client honours the limit.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    ignore_limit: bool,
    /// A server setting as an environment variable, `KEY=VALUE` (repeatable).
    #[arg(long = "server-env", value_parser = parse_env)]
    server_env: Vec<(String, String)>,
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// A TCP connection to `addr` from attacker address number `peer` (127.0.0.2 and up).
/// A `HealthCheckRequest` of service `""` as one gRPC message frame: uncompressed, length
/// 0 (every field at its default).
const EMPTY_MESSAGE_FRAME: [u8; 5] = [0, 0, 0, 0, 0];

/// A gRPC request's head for `path`, with `authorization` when given.
fn grpc_request(path: &str, authorization: Option<&str>) -> anyhow::Result<http::Request<()>> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    Ok(request.body(())?)
}

/// The `grpc-status` of an answer whose headers are all there is (trailers-only), if any.
fn trailers_only_status(headers: &http::HeaderMap) -> Option<String> {
    let code = headers.get("grpc-status")?.to_str().ok()?;
    Some(code.to_owned())
}

/// What became of the attacker's streams or connections, as counts by outcome.
#[derive(Debug, Default)]
struct Outcomes(std::collections::BTreeMap<String, usize>);

impl Outcomes {
    fn add(&mut self, outcome: impl Into<String>) {
        *self.0.entry(outcome.into()).or_default() += 1;
    }

    fn merge(&mut self, other: Outcomes) {
        for (outcome, count) in other.0 {
            *self.0.entry(outcome).or_default() += count;
        }
    }
}

impl std::fmt::Display for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k} {v}")).collect();
        f.write_str(&parts.join(", "))
    }
}

/// `streams`: opens `count` streams on one new connection, holds them for `hold`, then
/// closes it.
async fn hold_streams(
    addr: SocketAddr,
    count: usize,
    hold: Duration,
    ignore_limit: bool,
) -> anyhow::Result<Outcomes> {
    let (io, gate) = GatedIo::new(connect_from(0, addr).await?);
    if !ignore_limit {
        gate.open();
    }
    let mut builder = h2::client::Builder::new();
    if ignore_limit {
        builder.initial_max_send_streams(count);
    }
    let (mut client, connection) = builder.handshake::<_, Bytes>(io).await?;
    let driver = tokio::spawn(connection);
    let mut responses = Vec::with_capacity(count);
    for _ in 0..count {
        let request = grpc_request("/opjournal.v1.OperationJournal/GetOperation", None)?;
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
    let mut outcomes = Outcomes::default();
    for _ in responses.len()..count {
        outcomes.add("not sent");
    }
    gate.open();
    let deadline = tokio::time::Instant::now() + hold;
    let results =
        futures::future::join_all(responses.into_iter().map(|(response, stream)| async move {
            let outcome = tokio::time::timeout_at(deadline, response).await;
            drop(stream);
            outcome
        }))
        .await;
    for result in results {
        outcomes.add(match result {
            Err(_) => "unanswered".to_owned(),
            Ok(Ok(response)) => match trailers_only_status(response.headers()) {
                Some(code) => format!("answered grpc-status {code}"),
                None => "answered".to_owned(),
            },
            Ok(Err(error)) if error.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                "refused".to_owned()
            }
            Ok(Err(_)) => "ended".to_owned(),
        });
    }
    drop(client);
    driver.abort();
    Ok(outcomes)
}

/// `health-watch`: `connections` connections, each with `watches` health `Watch` streams of
/// `""`, all held for `hold`.
async fn hold_watches(
    addr: SocketAddr,
    connections: usize,
    watches: usize,
    peers: u8,
    hold: Duration,
) -> anyhow::Result<Outcomes> {
    let deadline = tokio::time::Instant::now() + hold;
    let mut tasks = Vec::with_capacity(connections);
    for index in 0..connections {
        let peer = u8::try_from(index % usize::from(peers.max(1)))?;
        let tcp = match connect_from(peer, addr).await {
            Ok(tcp) => tcp,
            Err(_) => {
                tasks.push(tokio::spawn(async {
                    Outcomes(std::iter::once(("connect failed".to_owned(), 1)).collect())
                }));
                continue;
            }
        };
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Outcomes::default();
            let Ok(Ok((client, connection))) =
                tokio::time::timeout(Duration::from_secs(10), h2::client::handshake(tcp)).await
            else {
                outcomes.add("connection closed before HTTP/2");
                return outcomes;
            };
            let driver = tokio::spawn(connection);
            let mut opened = Vec::with_capacity(watches);
            for _ in 0..watches {
                let Ok(request) = grpc_request("/grpc.health.v1.Health/Watch", None) else {
                    break;
                };
                let Ok(mut client) = client.clone().ready().await else {
                    outcomes.add("connection ended");
                    break;
                };
                match client.send_request(request, false) {
                    Ok((response, mut stream)) => {
                        let _ = stream.send_data(Bytes::from_static(&EMPTY_MESSAGE_FRAME), true);
                        opened.push(response);
                    }
                    Err(_) => {
                        outcomes.add("connection ended");
                        break;
                    }
                }
            }
            let answers = futures::future::join_all(opened.into_iter().map(|response| async {
                match tokio::time::timeout_at(deadline, response).await {
                    Ok(Ok(response)) => match trailers_only_status(response.headers()) {
                        Some(code) => (format!("refused grpc-status {code}"), None),
                        None => ("watching".to_owned(), Some(response.into_body())),
                    },
                    Ok(Err(_)) => ("reset".to_owned(), None),
                    Err(_) => ("unanswered".to_owned(), None),
                }
            }))
            .await;
            let mut bodies = Vec::new();
            for (outcome, body) in answers {
                outcomes.add(outcome);
                bodies.extend(body);
            }
            tokio::time::sleep_until(deadline).await;
            drop(bodies);
            drop(client);
            driver.abort();
            outcomes
        }));
    }
    let mut outcomes = Outcomes::default();
    for task in tasks {
        outcomes.merge(task.await?);
    }
    Ok(outcomes)
}

/// `idle`: `connections` connections that never send a byte (after the TLS handshake with
/// `tls`), for at most `hold`: how many the server closed, and when.
async fn hold_idle(
    addr: SocketAddr,
    connections: usize,
    peers: u8,
    tls: Option<tokio_rustls::TlsConnector>,
    hold: Duration,
) -> anyhow::Result<Outcomes> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + hold;
    let mut tasks = Vec::with_capacity(connections);
    for index in 0..connections {
        let peer = u8::try_from(index % usize::from(peers.max(1)))?;
        let Ok(tcp) = connect_from(peer, addr).await else {
            tasks.push(tokio::spawn(async { "connect failed".to_owned() }));
            continue;
        };
        let tls = tls.clone();
        tasks.push(tokio::spawn(async move {
            let connected = Instant::now();
            let mut buffer = [0u8; 1024];
            let closed_after = match tls {
                None => {
                    let mut tcp = tcp;
                    read_until_closed(&mut tcp, &mut buffer, deadline).await
                }
                Some(connector) => {
                    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
                        .map(|name| name.to_owned());
                    let Ok(name) = name else {
                        return "bad name".to_owned();
                    };
                    match tokio::time::timeout_at(deadline, connector.connect(name, tcp)).await {
                        Ok(Ok(mut stream)) => {
                            read_until_closed(&mut stream, &mut buffer, deadline).await
                        }
                        Ok(Err(_)) => Some(()),
                        Err(_) => None,
                    }
                }
            };
            match closed_after {
                None => "still open at the end".to_owned(),
                Some(()) => {
                    let seconds = connected.elapsed().as_secs_f64();
                    if seconds < 1.0 {
                        "closed within 1 s".to_owned()
                    } else {
                        format!("closed after {:.0} s", seconds.floor())
                    }
                }
            }
        }));
    }
    let mut outcomes = Outcomes::default();
    for task in tasks {
        outcomes.add(task.await?);
    }
    println!(
        "  all {connections} attacker connections made in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(outcomes)
}

/// Reads until the peer closes (`Some`) or `deadline` (`None`).
async fn read_until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    buffer: &mut [u8],
    deadline: tokio::time::Instant,
) -> Option<()> {
    tokio::time::timeout_at(deadline, async {
        loop {
            match stream.read(buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// `tenant`: `streams` header-only BeginOperation streams with `token` over `connections`
/// connections from one address, held for `hold`: how each ended, and when.
async fn hold_header_only(
    addr: SocketAddr,
    streams: usize,
    connections: usize,
    token: &str,
    hold: Duration,
) -> anyhow::Result<Outcomes> {
    let deadline = tokio::time::Instant::now() + hold;
    let authorization = format!("Bearer {token}");
    let mut pending = Vec::new();
    let mut drivers = Vec::new();
    let mut clients = Vec::new();
    let per_connection = streams.div_ceil(connections.max(1));
    for _ in 0..connections.max(1) {
        let (client, connection) = h2::client::handshake(connect_from(0, addr).await?).await?;
        drivers.push(tokio::spawn(connection));
        for _ in 0..per_connection {
            if pending.len() == streams {
                break;
            }
            let mut client = client.clone().ready().await?;
            let request = grpc_request(
                "/opjournal.v1.OperationJournal/BeginOperation",
                Some(&authorization),
            )?;
            pending.push(client.send_request(request, false)?);
        }
        clients.push(client);
    }
    let started = Instant::now();
    let answers = futures::future::join_all(pending.into_iter().map(|(response, stream)| async {
        let outcome = tokio::time::timeout_at(deadline, async {
            let response = response.await?;
            let reason = |headers: &http::HeaderMap| {
                let code = headers
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let status = tonic::Status::from_header_map(headers);
                let reason = status
                    .as_ref()
                    .and_then(|s| {
                        use tonic_types::StatusExt as _;
                        s.get_details_error_info()
                    })
                    .map_or_else(String::new, |info| format!(" {}", info.reason));
                format!("grpc-status {code}{reason}")
            };
            let when = || {
                let seconds = started.elapsed().as_secs_f64();
                if seconds < 1.0 {
                    "within 1 s".to_owned()
                } else {
                    format!("after {:.0} s", seconds.floor())
                }
            };
            if response.headers().contains_key("grpc-status") {
                return Ok::<_, h2::Error>(format!("{} {}", reason(response.headers()), when()));
            }
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                chunk?;
            }
            let trailers = body.trailers().await?.unwrap_or_default();
            Ok(format!("{} {}", reason(&trailers), when()))
        })
        .await;
        drop(stream);
        match outcome {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => "reset".to_owned(),
            Err(_) => "still open at the end".to_owned(),
        }
    }))
    .await;
    let mut outcomes = Outcomes::default();
    for answer in answers {
        outcomes.add(answer);
    }
    drop(clients);
    for driver in drivers {
        driver.abort();
    }
    Ok(outcomes)
}

/// How the other caller reaches the server.
#[derive(Clone)]
struct OtherCaller {
    url: String,
    tls: Option<ClientTlsConfig>,
    token: Option<String>,
    namespace: String,
}

/// The other caller's Begins of new keys, one after another with a 5 s deadline each, until
/// `stop`: latencies of the served ones, the count of others and the first such error.
async fn other_client(
    caller: OtherCaller,
    label: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(Histogram<u64>, usize, Option<String>)> {
    let mut latencies = Histogram::<u64>::new(3)?;
    let mut failed = 0;
    let mut first_error = None;
    let mut endpoint = Channel::from_shared(caller.url.clone())?;
    if let Some(tls) = caller.tls.clone() {
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint.connect_lazy();
    let mut client = OperationJournalClient::new(channel);
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let started = Instant::now();
        let mut request = tonic::Request::new(BeginOperationRequest {
            namespace: caller.namespace.clone(),
            operation_key: format!("bench:held:{label}:{n}"),
            action_type: "create_payment".into(),
            payload_json: r#"{"amount_minor":1000,"currency":"EUR"}"#.into(),
            ..BeginOperationRequest::default()
        });
        request.set_timeout(Duration::from_secs(5));
        if let Some(token) = &caller.token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse()?);
        }
        match tokio::time::timeout(Duration::from_secs(5), client.begin_operation(request)).await {
            Ok(Ok(_)) => latencies.record(u64::try_from(started.elapsed().as_micros())?)?,
            Ok(Err(status)) => {
                failed += 1;
                first_error
                    .get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
            }
            Err(_) => {
                failed += 1;
                first_error.get_or_insert_with(|| "no answer within 5 s".to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((latencies, failed, first_error))
}

/// A CA and a server certificate for 127.0.0.1 in `dir`: the server's files, a tonic
/// client trusting the CA, and a raw rustls client for attackers.
fn make_tls(
    dir: &std::path::Path,
) -> anyhow::Result<(ClientTlsConfig, tokio_rustls::TlsConnector)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), server.pem())?;
    std::fs::write(dir.join("server-key.pem"), key.serialize_pem())?;
    let client = opjournal::api::tls::client_config(Some(&dir.join("ca.pem")), None)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    let raw = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok((client, tokio_rustls::TlsConnector::from(Arc::new(raw))))
}

const TOKEN_ATTACKER: &str = "bench-tenant-a.4f1c8e2b9d7a6035";
const TOKEN_OTHER: &str = "bench-tenant-b.a93e5d0c1b2f4876";

fn token_entry(name: &str, token: &str, namespace: &str) -> String {
    format!(
        "{{name=\"{name}\", sha256=\"{}\", namespaces=[\"{namespace}\"], roles=[\"client\"]}}",
        hex::encode(sha2::Sha256::digest(token.as_bytes()))
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    opjournal::reconcile::adapter::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("journal.db").display());
    let mut env: Vec<(String, String)> = vec![("RUST_LOG".into(), "warn".into())];
    let mut health_addr = None;
    if args.attack == Attack::HealthWatch && args.port == Port::Health {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        env.push((
            "OPJOURNAL_SERVER__HEALTH_LISTEN".into(),
            address.to_string(),
        ));
        health_addr = Some(address);
    }
    let tls = if args.tls {
        let (client, connector) = make_tls(dir.path())?;
        for (key, file) in [
            ("OPJOURNAL_TLS__CERT_FILE", "server.pem"),
            ("OPJOURNAL_TLS__KEY_FILE", "server-key.pem"),
        ] {
            env.push((key.into(), dir.path().join(file).display().to_string()));
        }
        Some((client, connector))
    } else {
        None
    };
    if args.attack == Attack::Tenant {
        env.push((
            "OPJOURNAL_AUTH__TOKENS".into(),
            format!(
                "[{}, {}]",
                token_entry("tenant-a-agent", TOKEN_ATTACKER, "tenant-a"),
                token_entry("tenant-b-agent", TOKEN_OTHER, "tenant-b")
            ),
        ));
    }
    env.extend(args.server_env.iter().cloned());
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
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
        &env_refs,
        "opjournal listening on",
        dir.path(),
    )
    .await?;
    let addr: SocketAddr = address.parse()?;
    let pid = server.id().context("the server exited")?;
    let other = OtherCaller {
        url: format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }),
        tls: tls.as_ref().map(|(client, _)| client.clone()),
        token: (args.attack == Attack::Tenant).then(|| TOKEN_OTHER.to_owned()),
        namespace: if args.attack == Attack::Tenant {
            "tenant-b".into()
        } else {
            String::new()
        },
    };

    // Warm up: a second of calls, so the baseline includes a served connection.
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = tokio::spawn(other_client(other.clone(), "warmup".into(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let (warm, _, error) = warmup.await??;
    if warm.is_empty() {
        bail!("the server answered no call: {}", error.unwrap_or_default());
    }
    let baseline = rss_mib(pid)?;
    let baseline_fds = fds(pid);
    let hold = Duration::from_secs_f64(args.hold.unwrap_or(match args.attack {
        Attack::Streams => 5.0,
        _ => 15.0,
    }));
    let streams = args.streams.unwrap_or(match args.attack {
        Attack::Tenant => 128,
        _ => 50_000,
    });
    let connections = args.connections.unwrap_or(match args.attack {
        Attack::HealthWatch => 1000,
        Attack::Idle => 1030,
        _ => 2,
    });
    println!(
        "attack {:?}: {}; held {:.1} s, {} rounds, from {} addresses",
        args.attack,
        match args.attack {
            Attack::Streams => format!(
                "{streams} streams on one connection, client {} the stream limit",
                if args.ignore_limit {
                    "ignores"
                } else {
                    "honours"
                }
            ),
            Attack::HealthWatch => format!(
                "{connections} connections x {} Watch streams on the {} port",
                args.watches,
                if health_addr.is_some() {
                    "health"
                } else {
                    "journal's"
                }
            ),
            Attack::Idle => format!(
                "{connections} silent connections{}",
                if tls.is_some() {
                    " after a TLS handshake"
                } else {
                    ""
                }
            ),
            Attack::Tenant => format!(
                "{streams} header-only Begins with one tenant's token on {connections} connections; the other caller has another tenant's token"
            ),
        },
        hold.as_secs_f64(),
        args.rounds,
        args.peers,
    );
    for (key, value) in &args.server_env {
        println!("server setting: {key}={value}");
    }
    println!("baseline: RSS {baseline:.1} MiB, {baseline_fds} fds");
    println!(
        "round | attacker outcomes | peak RSS MiB | peak fds | after close: RSS MiB, fds | other caller's Begin p50 / p99 / max ms (calls) | other caller errors"
    );
    let mut peak_overall = baseline;
    let mut last_after = baseline;
    let mut other_errors = 0;
    for round in 1..=args.rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let other_task = tokio::spawn(other_client(
            other.clone(),
            format!("round-{round}"),
            stop.clone(),
        ));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = tokio::spawn({
            let sampling = sampling.clone();
            async move {
                let (mut peak, mut peak_fds): (f64, usize) = (0.0, 0);
                while sampling.load(Ordering::SeqCst) {
                    peak = peak.max(rss_mib(pid).unwrap_or(0.0));
                    peak_fds = peak_fds.max(fds(pid));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (peak, peak_fds)
            }
        });
        let outcomes = match args.attack {
            Attack::Streams => hold_streams(addr, streams, hold, args.ignore_limit).await?,
            Attack::HealthWatch => {
                hold_watches(
                    health_addr.unwrap_or(addr),
                    connections,
                    args.watches,
                    args.peers,
                    hold,
                )
                .await?
            }
            Attack::Idle => {
                hold_idle(
                    addr,
                    connections,
                    args.peers,
                    tls.as_ref().map(|(_, connector)| connector.clone()),
                    hold,
                )
                .await?
            }
            Attack::Tenant => {
                hold_header_only(addr, streams, connections, TOKEN_ATTACKER, hold).await?
            }
        };
        stop.store(true, Ordering::SeqCst);
        let (latencies, errors, first_error) = other_task.await??;
        other_errors += errors;
        tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
        sampling.store(false, Ordering::SeqCst);
        let (peak, peak_fds) = sampler.await?;
        let after = rss_mib(pid)?;
        let after_fds = fds(pid);
        peak_overall = peak_overall.max(peak);
        last_after = after;
        let ms = |q: f64| latencies.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "{round} | {outcomes} | {peak:.1} | {peak_fds} | {after:.1}, {after_fds} | {:.1} / {:.1} / {:.1} ({} calls) | {errors}{}",
            ms(0.5),
            ms(0.99),
            latencies.max() as f64 / 1000.0,
            latencies.len(),
            first_error.map_or_else(String::new, |e| format!(" (first: {e})")),
        );
    }
    println!(
        "summary: baseline {baseline:.1} MiB, peak {peak_overall:.1} MiB, after the last close \
         {last_after:.1} MiB ({:+.1} MiB)",
        last_after - baseline
    );
    server.stop().await;
    if other_errors > 0 {
        bail!("the other caller was refused {other_errors} times during the attack");
    }
    Ok(())
}
