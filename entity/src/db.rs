//! Opening the database: PostgreSQL in production, a SQLite file by default.

use std::time::Duration;

use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbErr};

use crate::settings::Settings;

/// Opens a pool for `settings.database_url` with bounded connect and acquire
/// timeouts, creating the embedded SQLite directory when needed.
pub async fn connect(settings: &Settings) -> Result<DatabaseConnection, DbErr> {
    if settings.database_url.starts_with("sqlite:") {
        if let Some(path) = sqlite_path(&settings.database_url) {
            if let Some(dir) = std::path::Path::new(&path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        DbErr::Custom(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
        }
    }
    let mut opts = ConnectOptions::new(settings.database_url.clone());
    opts.max_connections(settings.db_max_connections)
        .min_connections(1)
        .connect_timeout(settings.dependency_timeout.max(Duration::from_secs(1)))
        .acquire_timeout(settings.dependency_timeout)
        .idle_timeout(Duration::from_secs(300))
        .sqlx_logging(false)
        // Concurrent readers with one writer; wait instead of failing on a busy file.
        .map_sqlx_sqlite_opts(|o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
                .create_if_missing(true)
        });
    Database::connect(opts).await
}

/// The file path of a `sqlite://path?…` or `sqlite:path` URL, if it names a file.
pub fn sqlite_path(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() || path == ":memory:" {
        None
    } else {
        Some(path.to_string())
    }
}

/// Runs `SELECT 1`; used by health.
pub async fn ping(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared("SELECT 1").await.map(|_| ())
}
