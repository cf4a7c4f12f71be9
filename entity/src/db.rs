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

/// The database's own clock, as UTC with microseconds: the one clock every
/// time-based payment decision uses (key lifetimes, sweep, reconciliation and
/// expiry cut-offs, paid periods), so that api and worker hosts whose clocks
/// disagree still decide alike. PostgreSQL: `clock_timestamp()`; SQLite:
/// `strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')` (millisecond precision).
pub async fn now<C: ConnectionTrait>(db: &C) -> Result<chrono::DateTime<chrono::Utc>, DbErr> {
    use sea_orm::{DbBackend, Statement};
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Sqlite => "SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') AS now",
        _ => "SELECT clock_timestamp() AS now",
    };
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| DbErr::Custom("the database gave no time".into()))?;
    match backend {
        DbBackend::Sqlite => {
            let text: String = row.try_get("", "now")?;
            chrono::DateTime::parse_from_rfc3339(&text)
                .map(|t| t.with_timezone(&chrono::Utc))
                .map_err(|e| DbErr::Custom(format!("the database's time {text:?}: {e}")))
        }
        _ => row.try_get("", "now"),
    }
}
