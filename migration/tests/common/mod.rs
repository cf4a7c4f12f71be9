//! Databases for the model and migration tests, each with the schema the
//! migrations make (as production runs them).
//!
//! PostgreSQL is not optional: [`Scratch::create`] makes a scratch database
//! `t_<random>` from the admin URL `TEST_DATABASE_ADMIN_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`, as the black-box harness in
//! `tests/src/lib.rs`) and panics with a message when PostgreSQL cannot be
//! reached, so no PostgreSQL test ever passes by skipping.

#![allow(dead_code)]

use std::{future::Future, panic::resume_unwind, time::Duration};

use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};
use uuid::Uuid;

/// The administrative PostgreSQL URL (`TEST_DATABASE_ADMIN_URL`).
pub fn admin_database_url() -> String {
    std::env::var("TEST_DATABASE_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// Runs every migration on `db`.
pub async fn migrate(db: &DatabaseConnection) {
    Migrator::up(db, None).await.expect("apply the migrations");
}

/// An in-memory SQLite database (one connection), migrated.
pub async fn sqlite_memory() -> DatabaseConnection {
    let mut o = ConnectOptions::new("sqlite::memory:");
    o.max_connections(1).min_connections(1).sqlx_logging(false);
    let db = Database::connect(o).await.expect("sqlite");
    migrate(&db).await;
    db
}

/// A SQLite file with a pool of several connections, as the embedded default
/// runs it (WAL, busy timeout): real write contention between connections.
pub struct SqliteFile {
    /// The pool.
    pub db: DatabaseConnection,
    path: std::path::PathBuf,
}

impl SqliteFile {
    /// Creates and migrates the file.
    pub async fn create() -> Self {
        let path = std::env::temp_dir().join(format!("model_{}.db", Uuid::new_v4().simple()));
        let mut o = ConnectOptions::new(format!("sqlite://{}?mode=rwc", path.display()));
        o.max_connections(8)
            .sqlx_logging(false)
            .map_sqlx_sqlite_opts(|o| {
                o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10))
                    .foreign_keys(true)
            });
        let db = Database::connect(o).await.expect("sqlite file");
        migrate(&db).await;
        Self { db, path }
    }

    /// Closes the pool and deletes the files.
    pub async fn remove(self) {
        let _ = self.db.close().await;
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", self.path.display()));
        }
    }
}

/// A scratch PostgreSQL database, dropped by [`Scratch::remove`].
pub struct Scratch {
    admin: DatabaseConnection,
    /// Database name.
    pub name: String,
    /// A pool of 8 connections on it.
    pub db: DatabaseConnection,
}

impl Scratch {
    /// Creates an empty scratch database (no schema). Panics, naming the URL,
    /// when PostgreSQL is unreachable.
    pub async fn empty() -> Self {
        Self::copy_of(None).await
    }

    /// Creates `n` scratch databases with the schema the migrations make,
    /// cloned from one migrated template (`CREATE DATABASE … TEMPLATE`: the
    /// migrations run once), which is dropped once they exist.
    pub async fn clones(n: usize) -> Vec<Self> {
        let Self { admin, name, db } = Self::create().await;
        let _ = db.close().await;
        let mut clones = Vec::with_capacity(n);
        for _ in 0..n {
            clones.push(Self::copy_of(Some(&name)).await);
        }
        admin
            .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await
            .expect("drop the template database");
        clones
    }

    /// A new scratch database: empty, or a copy of `template`.
    async fn copy_of(template: Option<&str>) -> Self {
        let admin_url = admin_database_url();
        let mut o = ConnectOptions::new(admin_url.clone());
        o.max_connections(1)
            .connect_timeout(Duration::from_secs(10))
            .acquire_timeout(Duration::from_secs(10))
            .sqlx_logging(false);
        let admin = Database::connect(o).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is required for this test and is unreachable at {admin_url} \
                 (set TEST_DATABASE_ADMIN_URL): {e}"
            )
        });
        let name = format!("t_{}", Uuid::new_v4().simple());
        let from = template.map_or(String::new(), |t| format!(" TEMPLATE \"{t}\""));
        admin
            .execute_unprepared(&format!("CREATE DATABASE \"{name}\"{from}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} at {admin_url}: {e}"));
        let mut url = url::Url::parse(&admin_url).expect("TEST_DATABASE_ADMIN_URL is a URL");
        url.set_path(&format!("/{name}"));
        let mut o = ConnectOptions::new(url.to_string());
        o.max_connections(8).sqlx_logging(false);
        let db = Database::connect(o)
            .await
            .unwrap_or_else(|e| panic!("connect to the scratch database {name}: {e}"));
        Self { admin, name, db }
    }

    /// Creates a scratch database with the schema the migrations make.
    pub async fn create() -> Self {
        let scratch = Self::empty().await;
        migrate(&scratch.db).await;
        scratch
    }

    /// Closes the pool and drops the database.
    pub async fn remove(self) {
        let _ = self.db.close().await;
        self.admin
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .await
            .expect("drop scratch database");
    }
}

/// Runs `scenario` on a migrated scratch PostgreSQL database, dropping it
/// even when the scenario panics (the panic is then re-raised).
pub async fn on_postgres<F, Fut>(scenario: F)
where
    F: FnOnce(DatabaseConnection) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let scratch = Scratch::create().await;
    let outcome = tokio::spawn(scenario(scratch.db.clone())).await;
    scratch.remove().await;
    if let Err(e) = outcome {
        resume_unwind(e.into_panic());
    }
}

/// Runs `scenario` on in-memory SQLite, then on scratch PostgreSQL (always).
pub async fn on_each_backend<F, Fut>(scenario: F)
where
    F: Fn(DatabaseConnection) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    scenario(sqlite_memory().await).await;
    on_postgres(scenario).await;
}

/// Runs `scenario` where connections really contend: a multi-connection
/// SQLite file, then scratch PostgreSQL (always).
pub async fn on_concurrent_backends<F, Fut>(scenario: F)
where
    F: Fn(DatabaseConnection) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let file = SqliteFile::create().await;
    let outcome = tokio::spawn(scenario(file.db.clone())).await;
    file.remove().await;
    if let Err(e) = outcome {
        resume_unwind(e.into_panic());
    }
    on_postgres(scenario).await;
}
