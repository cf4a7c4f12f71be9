//! Applying migrations from several processes at once (api replicas that all
//! start with `MIGRATE_ON_START`, or a release phase racing an api).
//!
//! On PostgreSQL, [`up_locked`] serialises the appliers with a session-level
//! advisory lock ([`MIGRATION_LOCK_KEY`]). The lock is taken and released on
//! one dedicated connection detached from the pool: sea-orm-migration runs
//! every migration on a connection of the pool it is given, so a session lock
//! taken through that pool could land on any pooled connection and stay held
//! by it after `up` returns. The second and later processes wait for the
//! first, then find nothing pending. On SQLite (one process owns the file)
//! `up` runs as is.

use sea_orm_migration::{
    sea_orm::{sqlx, DatabaseConnection, DbBackend, RuntimeErr},
    DbErr, MigratorTrait,
};

use crate::Migrator;

/// The PostgreSQL advisory lock key that serialises [`up_locked`] across
/// processes: the ASCII bytes of `"migrate!"` as a big-endian `i64`. Any other
/// user of advisory locks on the same database must avoid it.
pub const MIGRATION_LOCK_KEY: i64 = i64::from_be_bytes(*b"migrate!");

/// Applies pending migrations like `Migrator::up(db, steps)` (`steps`: at most
/// that many, `None`: all), safe to call from any number of processes at once
/// on one database.
///
/// PostgreSQL: takes a connection out of `db`'s pool for good (the pool opens
/// another in its place), blocks on `pg_advisory_lock(MIGRATION_LOCK_KEY)` on
/// it (logging once when another process holds it), runs `Migrator::up` on
/// the pool, then `pg_advisory_unlock` on the same connection and closes it,
/// whether `up` succeeded or not. Closing the session releases the lock
/// anyway, also when this future is dropped midway.
///
/// Errors: the connection could not be had or the lock statement failed
/// (`DbErr::Conn` / `DbErr::Exec`), or `up`'s own error. A failed unlock is
/// only logged: the lock goes with the closed session.
pub async fn up_locked(db: &DatabaseConnection, steps: Option<u32>) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Migrator::up(db, steps).await;
    }
    let conn_err = |e: sqlx::Error| DbErr::Conn(RuntimeErr::SqlxError(e.into()));
    let exec_err = |e: sqlx::Error| DbErr::Exec(RuntimeErr::SqlxError(e.into()));
    let mut lock = db
        .get_postgres_connection_pool()
        .acquire()
        .await
        .map_err(conn_err)?
        .detach();
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .fetch_one(&mut lock)
        .await
        .map_err(exec_err)?;
    if !got {
        tracing::info!("another process is applying migrations; waiting for it to finish");
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK_KEY)
            .execute(&mut lock)
            .await
            .map_err(exec_err)?;
    }
    let applied = Migrator::up(db, steps).await;
    let unlocked: Result<bool, sqlx::Error> = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .fetch_one(&mut lock)
        .await;
    match unlocked {
        Ok(true) => {}
        Ok(false) => tracing::warn!("the migration lock was not held at unlock"),
        Err(e) => {
            tracing::warn!(error = %e, "could not release the migration lock; closing its session")
        }
    }
    use sqlx::Connection as _;
    if let Err(e) = lock.close().await {
        tracing::debug!(error = %e, "closing the migration lock's connection");
    }
    applied
}
