//! The server process (`opjournal serve`): the gRPC API with its health service, the
//! review console and the Prometheus endpoint over one set of [`Components`].

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::components::Components;
use super::listeners::{self, MetricsEndpoint, announce, bind};
use super::process::{self, finish};
use crate::api::{self, ServeOptions};
use crate::config::{Backend, Config};
use crate::telemetry::Telemetry;

/// The server, built and listening: every address bound and announced, the database
/// prepared; [`run_until_stopped`](Self::run_until_stopped) serves until SIGTERM or SIGINT.
pub struct Application {
    telemetry: Telemetry,
    running: Running,
}

/// What serves, once bound.
struct Running {
    components: Components,
    options: ServeOptions,
    grpc: TcpListener,
    health: Option<TcpListener>,
    metrics: MetricsEndpoint,
    console: Option<JoinHandle<()>>,
    shutdown: CancellationToken,
}

impl Application {
    /// Installs telemetry, builds the components `config` describes, prepares the database
    /// (with `migrate_on_start`, and always for the embedded file), binds the gRPC, health,
    /// metrics and console addresses, announcing each on standard output
    /// (`opjournal listening on ADDRESS` first), and starts the console. A failure is logged
    /// before it is returned.
    ///
    /// Errors: invalid settings, an unusable database, or an address that cannot be bound.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let telemetry = process::init_telemetry(config.telemetry.log_format, "opjournal-server")?;
        config.warn_deprecations();
        process::install_crypto_provider();
        match Running::start(&config, &telemetry).await {
            Ok(running) => Ok(Self { telemetry, running }),
            Err(error) => finish("the server", telemetry, Err(error)).await,
        }
    }

    /// Serves until SIGTERM or SIGINT, then drains: the gRPC server stops first, the console
    /// and the metrics endpoint after it, the database last; the telemetry of the last calls
    /// is exported before this returns.
    ///
    /// Errors: the gRPC server failed.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = self.running.serve().await;
        finish("the server", self.telemetry, result).await
    }
}

impl Running {
    async fn start(config: &Config, telemetry: &Telemetry) -> anyhow::Result<Self> {
        let components = Components::build(config, telemetry.metrics())?;
        let options = listeners::serve_options(config, telemetry.metrics())?;
        components.database.log_backend();
        // The embedded journal needs no setup: its file and schema are made at start.
        if config.database.migrate_on_start || components.database.backend() == Backend::Sqlite {
            components
                .database
                .prepare(config.database.url.expose())
                .await
                .context("migrate on start")?;
        }
        let (grpc, address) = bind(config.server.listen, "").await?;
        tracing::info!(%address, "opjournal serving gRPC");
        announce(&format!("opjournal listening on {address}"));
        // The metrics endpoint outlives the gRPC server's drain, so the last scrape sees it.
        let metrics =
            MetricsEndpoint::start(telemetry, config.server.metrics_listen, "opjournal").await?;
        let health = match config.server.health_listen {
            Some(address) => {
                let (listener, bound) = bind(address, " (health)").await?;
                tracing::info!(address = %bound, "serving gRPC health in plaintext");
                announce(&format!("opjournal health on {bound}"));
                Some(listener)
            }
            None => None,
        };
        listeners::log_security(config, &options);
        let shutdown = process::shutdown_on_signals();
        let console = match config.console.listen {
            Some(address) => {
                let console_options = listeners::console_options(config, &options)?;
                let (url, task) = listeners::serve_console(
                    &components,
                    address,
                    console_options,
                    shutdown.clone(),
                )
                .with_context(|| format!("cannot listen on {address} (console)"))?;
                announce(&format!("opjournal console on {url}"));
                Some(task)
            }
            None => None,
        };
        Ok(Self {
            components,
            options,
            grpc,
            health,
            metrics,
            console,
            shutdown,
        })
    }

    async fn serve(self) -> anyhow::Result<()> {
        let served = api::serve_with_health(
            self.components.journal,
            self.components.reconciler,
            self.grpc,
            self.health,
            self.options,
            self.shutdown.clone(),
        )
        .await;
        // A server that stopped on an error takes the console down with it.
        self.shutdown.cancel();
        if let Some(task) = self.console {
            let _ = task.await;
        }
        self.metrics.stop().await;
        self.components.database.close().await;
        served?;
        tracing::info!("stopped");
        Ok(())
    }
}
