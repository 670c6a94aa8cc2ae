//! `opjournal dev`: the whole stand in one process for local development — the gRPC
//! server, the reconcile worker, the sandbox provider and the review console, on an embedded
//! SQLite journal in a data directory, on loopback addresses only. It prints the addresses,
//! the console's sign-in token, a Python snippet to paste and the command that runs the
//! seven-step check against it, then runs until SIGTERM or Ctrl-C, when every part stops.
//!
//! The gRPC API is unauthenticated here (loopback only, as `serve` without tokens); the
//! console signs in with a reviewer token made at start and printed, valid for this run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use opjournal::api::Authenticator;
use opjournal::api::console::ConsoleAccess;
use opjournal::app::{self, Components};
use opjournal::config::{Config, LogFormat};
use opjournal::domain::access::{NamespaceScope, Principal, Role, TokenDigest, TokenRegistry};
use opjournal::telemetry::{LogOptions, Metrics, Telemetry};
use opjournal_sandbox::{Sandbox, SandboxConfig};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the worker polls in dev mode, in seconds: an unknown outcome settles within
/// about a second.
const POLL_SECONDS: f64 = 0.5;

/// How long the sandbox stalls a `commit-then-timeout` request before it answers.
const SANDBOX_HANG: Duration = Duration::from_secs(5);

/// Flags of `opjournal dev`.
#[derive(Debug, clap::Args)]
pub struct DevFlags {
    /// Directory of the embedded journal (`journal.db`) and of the generated policy
    /// (`policy.yaml`); created if missing. The journal survives restarts.
    #[arg(long, default_value = "opjournal-dev-data")]
    data_dir: PathBuf,
    /// Start with an empty journal: delete the journal file of the data directory first.
    #[arg(long)]
    fresh: bool,
    /// gRPC listen address (loopback only; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Sandbox provider listen address (loopback only; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    sandbox_listen: SocketAddr,
    /// Review console listen address (loopback only; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8090")]
    console_listen: SocketAddr,
    /// Use this action policy file (YAML) instead of the generated one, which configures
    /// `create_payment` reconciled through the sandbox provider and accepts every other action
    /// type with the defaults.
    #[arg(long = "policy")]
    policy_file: Option<PathBuf>,
    /// Log format (logs go to standard error; `RUST_LOG` filters them, default `warn`).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// The settings `dev` imposes over the defaults and the `OPJOURNAL_*` variables.
#[derive(Serialize)]
struct DevSettings {
    database_url: String,
    policy_file: PathBuf,
    listen: SocketAddr,
    reconcile_poll_seconds: f64,
}

/// The Python snippet `dev` prints: the README's decorator example, `{address}` being the
/// gRPC address.
const PYTHON_SNIPPET: &str = r#"python3 -m venv .venv && .venv/bin/pip install --quiet ./clients/python
.venv/bin/python - <<'PY'
from opjournal_client import IdempotencyKeyReusedError, JournalClient, current_call, idempotent

journal = JournalClient.connect("{address}")
charges = []                                  # stands in for your payment provider

@idempotent(journal, action_type="create_payment",
            key=lambda order_id, **_: f"payment:order-{order_id}:intent-01")  # your code's key, never a model's
def create_payment(order_id: str, amount_minor: int, currency: str) -> dict:
    charges.append(current_call().provider_key)  # call the provider with this idempotency key
    return {"id": f"pay_{len(charges)}", "status": "succeeded"}

print(create_payment("815", 1000, "EUR"))     # runs once: {'id': 'pay_1', 'status': 'succeeded'}
print(create_payment("815", 1000, "EUR"))     # replays the stored result; the function is not called
try:
    create_payment("815", 2000, "EUR")        # the same intent with another amount
except IdempotencyKeyReusedError as error:
    print(error.reason)                       # IDEMPOTENCY_KEY_REUSED; not called either
print("provider calls:", len(charges))         # provider calls: 1
PY"#;

/// Refuses an address other hosts could reach.
fn loopback(flag: &str, address: SocketAddr) -> anyhow::Result<()> {
    if !address.ip().is_loopback() {
        bail!(
            "{flag} {address}: `opjournal dev` listens on loopback addresses only (127.0.0.1, \
             ::1); to serve other hosts, run `opjournal serve` with tokens (docs/configuration.md)"
        );
    }
    Ok(())
}

/// Binds `address`, naming the flag when it cannot.
async fn bind(flag: &str, address: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("{flag} {address}: cannot listen (another process on it?)"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Deletes the journal file and its SQLite companions (`-wal`, `-shm`), if present.
fn delete_journal(file: &Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::remove_file(&name) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("--fresh: cannot delete {}", file.display()));
            }
        }
    }
    Ok(())
}

/// Runs every part until SIGTERM or Ctrl-C.
pub async fn run(flags: DevFlags) -> anyhow::Result<()> {
    loopback("--listen", flags.listen)?;
    loopback("--sandbox-listen", flags.sandbox_listen)?;
    loopback("--console-listen", flags.console_listen)?;
    install_logging(flags.log_format);
    app::install_crypto_provider();
    let journal_file = prepare_data_dir(&flags)?;

    // The gRPC and sandbox addresses are bound before anything starts and the console's as
    // the first part starts, so a busy port stops nothing half-way.
    let (grpc_listener, grpc_address) = bind("--listen", flags.listen).await?;
    let (sandbox_listener, sandbox_address) =
        bind("--sandbox-listen", flags.sandbox_listen).await?;
    let sandbox_url = format!("http://{sandbox_address}");
    let policy_file = policy_file(&flags, &sandbox_url)?;
    let config = Config::load(
        None,
        DevSettings {
            database_url: format!("sqlite://{}", journal_file.display()),
            policy_file: policy_file.clone(),
            listen: grpc_address,
            reconcile_poll_seconds: POLL_SECONDS,
        },
    )?;
    config.warn_deprecations();
    let parts = Components::build(&config, &Metrics::disabled())?;
    parts
        .database
        .prepare(config.database.url.expose())
        .await
        .context("prepare the journal file")?;
    let token = ConsoleToken::generate();
    let running = Running::start(
        &config,
        &parts,
        flags.console_listen,
        &token,
        grpc_listener,
        sandbox_listener,
    )?;
    announce_stand(&Stand {
        fresh: flags.fresh,
        grpc_address,
        sandbox_url: &sandbox_url,
        console_url: &running.console_url,
        token: &token,
        journal_file: &journal_file,
        policy_file: &policy_file,
    });
    let stopped = running.wait().await;
    parts.database.close().await;
    stopped?;
    app::announce("opjournal dev stopped");
    Ok(())
}

/// Logs to standard error, `warn` and above unless `RUST_LOG` says otherwise; nothing is
/// exported.
fn install_logging(format: LogFormat) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "warn".to_owned());
    let _ = Telemetry::disabled().install(LogOptions {
        filter,
        ..LogOptions::from_env(format)
    });
}

/// Creates the data directory; with `--fresh`, deletes its journal. Returns the journal
/// file.
fn prepare_data_dir(flags: &DevFlags) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&flags.data_dir)
        .with_context(|| format!("cannot create {}", flags.data_dir.display()))?;
    let journal_file = flags.data_dir.join("journal.db");
    if flags.fresh {
        delete_journal(&journal_file)?;
    }
    Ok(journal_file)
}

/// The policy file: `--policy`, or one written into the data directory that reconciles
/// `create_payment` through the sandbox at `sandbox_url`.
fn policy_file(flags: &DevFlags, sandbox_url: &str) -> anyhow::Result<PathBuf> {
    if let Some(file) = &flags.policy_file {
        return Ok(file.clone());
    }
    let file = flags.data_dir.join("policy.yaml");
    let yaml = format!(
        "{}# Every other action type, with the defaults (no lookup: an unknown outcome \
         goes to review).\ndefault_action: {{}}\n",
        opjournal::children::payments_policy_yaml(
            sandbox_url,
            "`opjournal dev` at each start; edits are lost, use `--policy FILE`"
        )
    );
    std::fs::write(&file, yaml).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(file)
}

/// The parts of the stand, started.
struct Running {
    shutdown: CancellationToken,
    console_url: String,
    console: JoinHandle<()>,
    sandbox: JoinHandle<std::io::Result<()>>,
    reconcile: JoinHandle<()>,
    server: JoinHandle<Result<(), opjournal::api::ServeError>>,
}

impl Running {
    /// Starts the console (the reviewer signs in with `token`), the sandbox on
    /// `sandbox_listener`, the reconcile worker and the gRPC server on `grpc_listener`; all
    /// stop on SIGTERM or SIGINT.
    fn start(
        config: &Config,
        parts: &Components,
        console_listen: SocketAddr,
        token: &ConsoleToken,
        grpc_listener: TcpListener,
        sandbox_listener: TcpListener,
    ) -> anyhow::Result<Self> {
        let worker = parts.worker(config)?;
        let mut options = app::serve_options(config, &Metrics::disabled())?;
        // Loopback only: the API needs no token and speaks plaintext, whatever OPJOURNAL_*
        // variables say about tokens and TLS.
        options.auth = Authenticator::disabled();
        options.tls = None;
        let shutdown = app::shutdown_on_signals();
        let access = ConsoleAccess::from_registry(token.registry()?);
        let console_options = app::console_options_with(config, access, None);
        let (console_url, console) =
            app::serve_console(parts, console_listen, console_options, shutdown.clone())
                .with_context(|| {
                    format!(
                        "--console-listen {console_listen}: cannot listen (another process on it?)"
                    )
                })?;
        let sandbox = tokio::spawn(
            Sandbox::new(SandboxConfig {
                lookup_lag: Duration::ZERO,
                hang: SANDBOX_HANG,
                ..SandboxConfig::default()
            })
            .serve(sandbox_listener, shutdown.clone().cancelled_owned()),
        );
        let reconcile = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { worker.run(shutdown).await }
        });
        let server = tokio::spawn(opjournal::api::serve(
            parts.journal.clone(),
            parts.reconciler.clone(),
            grpc_listener,
            options,
            shutdown.clone(),
        ));
        Ok(Self {
            shutdown,
            console_url,
            console,
            sandbox,
            reconcile,
            server,
        })
    }

    /// Waits for the gRPC server to stop (on a signal, or on an error, which stops the
    /// other parts too), then for every other part.
    async fn wait(self) -> anyhow::Result<()> {
        let served = self.server.await.context("the gRPC server panicked")?;
        self.shutdown.cancel();
        let sandboxed = self
            .sandbox
            .await
            .context("the sandbox provider panicked")?;
        self.reconcile
            .await
            .context("the reconcile worker panicked")?;
        self.console.await.context("the review console panicked")?;
        served.context("the gRPC server stopped")?;
        sandboxed.context("the sandbox provider stopped")?;
        Ok(())
    }
}

/// The console's sign-in token for one run: 32 random bytes in hexadecimal, held by the
/// principal `dev-reviewer` with the reviewer and admin roles in every namespace; only its
/// digest is kept in the registry.
struct ConsoleToken(String);

impl ConsoleToken {
    /// A fresh token from the thread's cryptographically secure generator.
    fn generate() -> Self {
        Self(hex::encode(rand::random::<[u8; 32]>()))
    }

    /// The registry of this one token.
    fn registry(&self) -> anyhow::Result<TokenRegistry> {
        let principal = Principal {
            name: "dev-reviewer".to_owned(),
            namespaces: NamespaceScope::Any,
            roles: [Role::Reviewer, Role::Admin].into(),
        };
        TokenRegistry::new([(TokenDigest::of(&self.0), principal)])
            .map_err(|e| anyhow::anyhow!("the console token: {e}"))
    }
}

/// What `dev` started, for the banner.
struct Stand<'a> {
    fresh: bool,
    grpc_address: SocketAddr,
    sandbox_url: &'a str,
    console_url: &'a str,
    token: &'a ConsoleToken,
    journal_file: &'a Path,
    policy_file: &'a Path,
}

/// Prints what runs where and how to use it.
fn announce_stand(stand: &Stand<'_>) {
    let Stand {
        grpc_address,
        sandbox_url,
        console_url,
        ..
    } = *stand;
    let fresh = if stand.fresh { ", started empty" } else { "" };
    let lines = [
        "opjournal dev: server, reconcile worker, sandbox provider and review console in one \
         process."
            .to_owned(),
        String::new(),
        format!("  gRPC API     {grpc_address}  (no token needed; loopback only)"),
        format!("  sandbox      {sandbox_url}  (fake payment and e-mail provider)"),
        format!("  reconciler   polling every {POLL_SECONDS} s"),
        format!("  console      {console_url}  (sign in with the token below)"),
        format!(
            "  token        {}  (reviewer and admin, this run only)",
            stand.token.0
        ),
        format!(
            "  journal      {}  (embedded SQLite{fresh})",
            stand.journal_file.display()
        ),
        format!("  policy       {}", stand.policy_file.display()),
        String::new(),
        "Protect a function from Python (from the repository's root):".to_owned(),
        String::new(),
        PYTHON_SNIPPET.replace("{address}", &grpc_address.to_string()),
        String::new(),
        "Run the source article's seven-step check against this stand:".to_owned(),
        String::new(),
        format!(
            "  cargo run --release -- demo --against {grpc_address} --sandbox-url {sandbox_url}"
        ),
        String::new(),
        "opjournal dev ready; Ctrl-C stops it.".to_owned(),
    ];
    app::announce(&lines.join("\n"));
}
