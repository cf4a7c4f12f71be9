//! The `migration` binary: `up`, `down [-n N]`, `status`, `fresh`, `refresh`,
//! `reset` (see `--help`).
//!
//! The database is taken from `-u/--database-url`, else `DATABASE_URL` (a
//! `.env` file is read first), else the embedded SQLite file
//! `sqlite://data/app.db?mode=rwc` under the current directory (its `data/`
//! directory is created when missing).

use std::process::ExitCode;

/// Database used when neither `--database-url` nor `DATABASE_URL` is given.
const DEFAULT_DATABASE_URL: &str = "sqlite://data/app.db?mode=rwc";

fn main() -> ExitCode {
    // Read `.env` before deciding on the default, so a DATABASE_URL kept there
    // wins over the embedded SQLite file (run_cli would read it too, but only
    // after we had already set the default).
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
    // run_cli exits the process with status 1 on error.
    runtime.block_on(sea_orm_migration::cli::run_cli(migration::Migrator));
    ExitCode::SUCCESS
}

/// True when `-u`/`--database-url` is on the command line (it beats the env var).
fn url_given_as_argument() -> bool {
    std::env::args()
        .skip(1)
        .any(|a| a.starts_with("-u") || a.starts_with("--database-url"))
}
