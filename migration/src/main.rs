//! The `migration` binary: `up [-n N]`, `down [-n N]`, `status`, `fresh`,
//! `refresh`, `reset` (see `--help`); no command means `up`.
//!
//! `up` applies pending migrations under the PostgreSQL advisory lock of
//! [`migration::up_locked`], so a release phase and api replicas started with
//! `MIGRATE_ON_START` may all migrate at once. The other commands are
//! sea-orm-migration's own.
//!
//! The database is taken from `-u/--database-url`, else `DATABASE_URL` (a
//! `.env` file is read first), else the embedded SQLite file
//! `sqlite://data/app.db?mode=rwc` under the current directory (its `data/`
//! directory is created when missing). `-s/--database-schema` (or
//! `DATABASE_SCHEMA`, default `public`) is PostgreSQL's schema search path.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use migration::{Migrator, MigratorTrait};
use sea_orm_migration::sea_orm::{ConnectOptions, Database};

/// Database used when neither `--database-url` nor `DATABASE_URL` is given.
const DEFAULT_DATABASE_URL: &str = "sqlite://data/app.db?mode=rwc";

/// Applies and rolls back the database migrations.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Show debug messages.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    /// PostgreSQL schema search path (ignored for SQLite).
    #[arg(
        short = 's',
        long,
        global = true,
        env = "DATABASE_SCHEMA",
        default_value = "public"
    )]
    database_schema: String,
    /// Database URL (default: the embedded SQLite file).
    #[arg(short = 'u', long, global = true, env = "DATABASE_URL")]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations (under the migration lock on PostgreSQL).
    Up {
        /// Number of pending migrations to apply (default: all).
        #[arg(short, long)]
        num: Option<u32>,
    },
    /// Roll back applied migrations.
    Down {
        /// Number of applied migrations to roll back.
        #[arg(short, long, default_value = "1")]
        num: u32,
    },
    /// Show the status of every migration.
    Status,
    /// Drop all tables, then apply every migration.
    Fresh,
    /// Roll back every applied migration, then apply them all again.
    Refresh,
    /// Roll back every applied migration.
    Reset,
}

fn main() -> ExitCode {
    // Read `.env` before deciding on the default, so a DATABASE_URL kept there
    // wins over the embedded SQLite file.
    dotenvy::dotenv().ok();
    if std::env::var_os("DATABASE_URL").is_none() {
        // Create data/ only when the default will really be used.
        if !url_given_as_argument() {
            if let Err(e) = std::fs::create_dir_all("data") {
                eprintln!("cannot create the data/ directory for {DEFAULT_DATABASE_URL}: {e}");
                return ExitCode::FAILURE;
            }
        }
        // Set before the runtime starts any thread.
        std::env::set_var("DATABASE_URL", DEFAULT_DATABASE_URL);
    }
    let cli = Cli::parse();
    init_tracing(cli.verbose);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), sea_orm_migration::DbErr> {
    let url = cli
        .database_url
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_string());
    let mut opts = ConnectOptions::new(url);
    opts.set_schema_search_path(cli.database_schema)
        .sqlx_logging(cli.verbose);
    let db = Database::connect(opts).await?;
    let res = match cli.command.unwrap_or(Command::Up { num: None }) {
        Command::Up { num } => migration::up_locked(&db, num).await,
        Command::Down { num } => Migrator::down(&db, Some(num)).await,
        Command::Status => Migrator::status(&db).await,
        Command::Fresh => Migrator::fresh(&db).await,
        Command::Refresh => Migrator::refresh(&db).await,
        Command::Reset => Migrator::reset(&db).await,
    };
    let _ = db.close().await;
    res
}

/// Logs sea-orm-migration's progress ("Applying migration …", the status
/// table) and ours on stdout, as sea-orm-migration's own CLI does; everything
/// at debug with `-v`.
fn init_tracing(verbose: bool) {
    let filter = if verbose {
        "debug"
    } else {
        "sea_orm_migration=info,migration=info"
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_target(false)
        .without_time()
        .try_init();
}

/// True when `-u`/`--database-url` is on the command line (it beats the env var).
fn url_given_as_argument() -> bool {
    std::env::args()
        .skip(1)
        .any(|a| a.starts_with("-u") || a.starts_with("--database-url"))
}
