//! Opening the database: PostgreSQL in production, a SQLite file by default.

use std::time::Duration;

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbErr, SqliteTransactionMode,
    TransactionOptions, TransactionTrait,
};

use crate::base::settings::Settings;

/// How long startup work (applying migrations) may wait for a connection or
/// for the server to accept one, whatever `DEPENDENCY_TIMEOUT_MS` says: the
/// request pool's bound is tuned for answering quickly, not for a process
/// coming up beside others on a loaded host.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a pool for `settings.database_url` with bounded connect and acquire
/// timeouts (`DEPENDENCY_TIMEOUT_MS`, connect at least 1 s), at most
/// `DB_MAX_CONNECTIONS`, creating the embedded SQLite directory when needed.
/// This is the pool requests and jobs use.
pub async fn connect(settings: &Settings) -> Result<DatabaseConnection, DbErr> {
    let mut opts = options(settings)?;
    opts.max_connections(settings.db_max_connections)
        .min_connections(1)
        .connect_timeout(settings.dependency_timeout.max(Duration::from_secs(1)))
        .acquire_timeout(settings.dependency_timeout);
    Database::connect(opts).await
}

/// Opens a small pool for startup work (the api's `MIGRATE_ON_START`): at most
/// two connections (the migration lock's and the one migrations run on),
/// none kept idle, connect and acquire bounded by the larger of
/// `DEPENDENCY_TIMEOUT_MS` and [`STARTUP_TIMEOUT`]. Close it when done.
pub async fn connect_for_startup(settings: &Settings) -> Result<DatabaseConnection, DbErr> {
    let bound = settings.dependency_timeout.max(STARTUP_TIMEOUT);
    let mut opts = options(settings)?;
    opts.max_connections(2)
        .min_connections(0)
        .connect_timeout(bound)
        .acquire_timeout(bound);
    Database::connect(opts).await
}

/// The options both pools share: the URL, idle timeout, no statement logging,
/// SQLite's WAL mode, busy timeout and foreign keys (and its directory made).
fn options(settings: &Settings) -> Result<ConnectOptions, DbErr> {
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
    opts.idle_timeout(Duration::from_secs(300))
        .sqlx_logging(false)
        // Concurrent readers with one writer; wait instead of failing on a busy file.
        .map_sqlx_sqlite_opts(|o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
                .create_if_missing(true)
        });
    Ok(opts)
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

/// Whether `e` means the database cannot be used right now, as opposed to a
/// statement it refused or a bug: the api answers 503 for these, 500 for
/// anything else. True for:
/// - no connection acquired or opened (`ConnectionAcquire`, `Conn`);
/// - a connection that broke mid-statement: I/O or TLS errors, the pool
///   closed or timed out, sqlx's background worker gone;
/// - the server saying so itself, by SQLSTATE (PostgreSQL, Appendix A "Error
///   Codes"): class `08` (connection exception), `57P01` admin_shutdown,
///   `57P02` crash_shutdown, `57P03` cannot_connect_now, `53300`
///   too_many_connections;
/// - SQLite's `SQLITE_BUSY` / `SQLITE_LOCKED` (primary result codes 5 and 6,
///   extended codes included), i.e. still locked after the busy timeout.
pub fn is_unavailable(e: &DbErr) -> bool {
    use sea_orm::{sqlx, RuntimeErr};
    match e {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
        DbErr::Exec(RuntimeErr::SqlxError(s)) | DbErr::Query(RuntimeErr::SqlxError(s)) => {
            match &**s {
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(d) => d.code().is_some_and(|c| unavailable_code(&c)),
                _ => false,
            }
        }
        _ => false,
    }
}

/// A PostgreSQL SQLSTATE (five characters) or a SQLite result code (a number
/// of at most four digits) that says "unavailable"; see [`is_unavailable`].
fn unavailable_code(code: &str) -> bool {
    if code.len() == 5 {
        code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
    } else {
        code.parse::<u32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
    }
}

/// Runs `SELECT 1`; used by health.
pub async fn ping(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared("SELECT 1").await.map(|_| ())
}

/// The application's clock, as UTC with microseconds: the database's own
/// clock plus the offset of table `app_clock` (none in production; only
/// tests set one, with [`set_clock`]). It is the one clock every time-based
/// payment decision uses (key lifetimes, sweep, reconciliation and expiry
/// cut-offs, paid periods, the renewal loop), so that api and worker hosts
/// whose clocks disagree still decide alike, and a test can move the time of
/// every process at once. PostgreSQL: `app_now()` (`clock_timestamp()` plus
/// the offset); SQLite: `strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', …)`
/// (millisecond precision). The job queue's own timing (due times, leases)
/// keeps the real clock.
pub async fn now<C: ConnectionTrait>(db: &C) -> Result<chrono::DateTime<chrono::Utc>, DbErr> {
    use sea_orm::{DbBackend, Statement};
    let backend = db.get_database_backend();
    let sql = format!("SELECT {} AS now", now_sql(backend));
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

/// The SQL expression of [`now`], for statements that stamp or compare a
/// time themselves: a `timestamptz` on PostgreSQL, RFC 3339 text (the shape
/// sqlx writes) on SQLite.
pub fn now_sql(backend: sea_orm::DbBackend) -> &'static str {
    match backend {
        sea_orm::DbBackend::Sqlite => {
            "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', \
             COALESCE((SELECT printf('%+.6f seconds', offset_us / 1000000.0) \
                       FROM app_clock WHERE id = 1), '+0 seconds'))"
        }
        _ => "app_now()",
    }
}

/// How far [`now`] is ahead of the database's own clock (zero unless a test
/// moved it; the api warns at start when it is not).
pub async fn clock_offset<C: ConnectionTrait>(db: &C) -> Result<chrono::Duration, DbErr> {
    use sea_orm::Statement;
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_string(
            backend,
            "SELECT offset_us FROM app_clock WHERE id = 1",
        ))
        .await?;
    Ok(match row {
        Some(r) => chrono::Duration::microseconds(r.try_get::<i64>("", "offset_us")?),
        None => chrono::Duration::zero(),
    })
}

/// For tests: moves the application's clock ([`now`]) of the whole database
/// so that it reads `at` now and runs on from there, for every process
/// using it. Production never calls this.
pub async fn set_clock<C: ConnectionTrait>(
    db: &C,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), DbErr> {
    let offset = clock_offset(db).await?;
    let shown = now(db).await?;
    let real = shown - offset;
    set_offset(db, at - real).await
}

/// For tests: moves the application's clock ([`now`]) on by `by` (back when
/// negative).
pub async fn advance_clock<C: ConnectionTrait>(db: &C, by: chrono::Duration) -> Result<(), DbErr> {
    let offset = clock_offset(db).await?;
    set_offset(db, offset + by).await
}

async fn set_offset<C: ConnectionTrait>(db: &C, offset: chrono::Duration) -> Result<(), DbErr> {
    use sea_orm::Statement;
    let backend = db.get_database_backend();
    let us = offset
        .num_microseconds()
        .ok_or_else(|| DbErr::Custom("a clock offset beyond 292,000 years".into()))?;
    db.execute_raw(Statement::from_sql_and_values(
        backend,
        match backend {
            sea_orm::DbBackend::Sqlite => {
                "INSERT INTO app_clock (id, offset_us) VALUES (1, ?) \
                 ON CONFLICT (id) DO UPDATE SET offset_us = excluded.offset_us"
            }
            _ => {
                "INSERT INTO app_clock (id, offset_us) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET offset_us = excluded.offset_us"
            }
        },
        [us.into()],
    ))
    .await
    .map(|_| ())
}

/// Starts a transaction meant to write: `BEGIN IMMEDIATE` on SQLite (the write
/// lock is taken at once, so a read-then-write cannot fail with
/// `SQLITE_BUSY` half-way; other writers wait for the busy timeout), a plain
/// `BEGIN` elsewhere (PostgreSQL callers lock rows with `SELECT … FOR UPDATE`).
pub async fn begin_write<C: TransactionTrait>(db: &C) -> Result<C::Transaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..Default::default()
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::{borrow::Cow, error::Error, sync::Arc};

    use sea_orm::{sqlx, RuntimeErr};

    use super::*;

    /// A database error with the given code, as a driver reports it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error {}", self.0)
        }
    }

    impl Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn query(e: sqlx::Error) -> DbErr {
        DbErr::Query(RuntimeErr::SqlxError(Arc::new(e)))
    }

    fn coded(code: &'static str) -> DbErr {
        query(sqlx::Error::Database(Box::new(Coded(code))))
    }

    #[test]
    fn lost_connections_and_a_server_that_will_not_serve_are_unavailable() {
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert!(is_unavailable(&query(sqlx::Error::Io(eof))));
        assert!(is_unavailable(&DbErr::Exec(RuntimeErr::SqlxError(
            Arc::new(sqlx::Error::PoolTimedOut)
        ))));
        assert!(is_unavailable(&query(sqlx::Error::PoolClosed)));
        assert!(is_unavailable(&query(sqlx::Error::WorkerCrashed)));
        // PostgreSQL: connection exceptions, shutting down, starting up,
        // full; SQLite: busy and locked, extended codes included.
        for code in [
            "08000", "08003", "08006", "57P01", "57P02", "57P03", "53300", "5", "517", "6", "262",
        ] {
            assert!(is_unavailable(&coded(code)), "{code}");
        }
    }

    #[test]
    fn refused_statements_and_bugs_are_not() {
        // PostgreSQL: unique and foreign-key violations, an unknown table, a
        // serialization failure, a cancelled statement; SQLite: constraint
        // (plain and unique), generic error.
        for code in [
            "23505", "23503", "42P01", "40001", "57014", "19", "2067", "1",
        ] {
            assert!(!is_unavailable(&coded(code)), "{code}");
        }
        assert!(!is_unavailable(&query(sqlx::Error::RowNotFound)));
        assert!(!is_unavailable(&query(sqlx::Error::Protocol("?".into()))));
        assert!(!is_unavailable(&DbErr::RecordNotFound("x".into())));
        assert!(!is_unavailable(&DbErr::Custom("x".into())));
    }
}
