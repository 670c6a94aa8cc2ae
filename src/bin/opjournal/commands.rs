//! The commands of `opjournal` that run and exit: `migrate`, `check-config`, `copy-journal`
//! and `purge`.

use anyhow::Context as _;
use opjournal::app::{self, Components, Database};
use opjournal::cli::CommonFlags;
use opjournal::config::{Backend, Config};
use opjournal::telemetry::Metrics;

/// Flags of `opjournal purge`.
#[derive(clap::Args)]
pub struct PurgeFlags {
    #[command(flatten)]
    common: CommonFlags,
    /// Operations deleted per statement (default: the `purge_batch_size` setting).
    #[arg(long)]
    batch_size: Option<i64>,
    /// Most statements to run.
    #[arg(long, default_value_t = 1000)]
    max_batches: u32,
}

/// Flags of `opjournal copy-journal`.
#[derive(clap::Args)]
pub struct CopyFlags {
    #[command(flatten)]
    common: CommonFlags,
    /// Postgres URL of the target journal; the database is created and migrated if missing,
    /// and must hold no operations.
    #[arg(long, value_name = "POSTGRES_URL")]
    to: String,
}

/// The configuration of a command that runs and exits, with logging installed.
fn configured(flags: &CommonFlags) -> anyhow::Result<Config> {
    let config = Config::load(flags.config.as_ref(), flags)?;
    app::init_tracing(config.telemetry.log_format);
    config.warn_deprecations();
    Ok(config)
}

/// `opjournal migrate`.
pub async fn migrate(flags: CommonFlags) -> anyhow::Result<()> {
    let config = configured(&flags)?;
    let parts = Components::build(&config, &Metrics::disabled())?;
    parts
        .database
        .prepare(config.database.url.expose())
        .await
        .context("migrate")?;
    println!("migrations applied ({})", parts.database.backend().name());
    Ok(())
}

/// `opjournal purge`.
pub async fn purge(flags: PurgeFlags) -> anyhow::Result<()> {
    let config = configured(&flags.common)?;
    let parts = Components::build(&config, &Metrics::disabled())?;
    let purged = opjournal::reconcile::worker::purge(
        parts.store.as_ref(),
        flags
            .batch_size
            .unwrap_or(config.reconcile.purge_batch_size),
        flags.max_batches,
    )
    .await
    .context("purge")?;
    parts.database.close().await;
    println!("purged {purged} operations past retention");
    Ok(())
}

/// `opjournal check-config`.
pub fn check_config(flags: CommonFlags) -> anyhow::Result<()> {
    let config = Config::load(flags.config.as_ref(), &flags)?;
    for notice in config.deprecations() {
        eprintln!("warning: {notice}");
    }
    for warning in app::check_config(&config)? {
        eprintln!("warning: {warning}");
    }
    print!("{}", config.to_toml());
    println!("# configuration and policy are valid");
    Ok(())
}

/// `opjournal copy-journal`.
pub async fn copy_journal(flags: CopyFlags) -> anyhow::Result<()> {
    let config = configured(&flags.common)?;
    let Database::Sqlite(source) = Database::connect_lazy(config.database.url.expose(), 2)? else {
        anyhow::bail!(
            "copy-journal copies an embedded journal: database_url must be a sqlite: URL"
        );
    };
    if Backend::of_url(&flags.to) != Some(Backend::Postgres) {
        anyhow::bail!("--to must be a postgres:// or postgresql:// URL");
    }
    if !source.file().exists() {
        anyhow::bail!("no journal file at {}", source.file().display());
    }
    source.migrate().await.context("migrate the journal file")?;
    let target = Database::connect_lazy(&flags.to, 2)?;
    target
        .prepare(&flags.to)
        .await
        .context("prepare the Postgres journal")?;
    let Database::Postgres(pg) = &target else {
        anyhow::bail!("--to must be a postgres:// or postgresql:// URL");
    };
    let report = opjournal::store::copy::sqlite_to_postgres(&source, pg)
        .await
        .context("copy-journal")?;
    target.close().await;
    source.pool().close().await;
    println!(
        "copied {} operations and {} history entries from {} to Postgres; \
         set database_url to the Postgres URL before starting again",
        report.operations,
        report.events,
        source.file().display()
    );
    Ok(())
}
