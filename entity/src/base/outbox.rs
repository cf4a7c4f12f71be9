//! The job outbox (table `job_outbox`): a job that follows a change already
//! made and answered for (the avatar cleanup after a profile save, the usage
//! row after an AI answer) is kept here when the queue cannot take it, and the
//! worker's relay moves it to the queue later. Nothing here knows the queue:
//! a row holds the job as the queue's JSON, opaque to the model.
//!
//! * Written in the same transaction as the change where there is one
//!   ([`crate::accounts::profile::save_with_followup`]), due after a hold
//!   ([`FOLLOWUP_HOLD`]) during which the writer pushes the job itself and
//!   deletes the row; or written after a failed push, due at once
//!   ([`insert`] with a zero hold).
//! * Taken by [`claim`]: a bounded batch of due rows, each leased (its due time
//!   pushed forward by the lease) so that two relays never take the same row;
//!   [`delete`] after the push succeeded, [`retry_later`] after it failed. A
//!   relay that dies mid-batch leaves its rows to the next one once the lease
//!   ends. Delivery is therefore at least once: the jobs are idempotent.
//!
//! Every time is epoch milliseconds by the database's clock (never the
//! caller's), so api and worker hosts whose clocks disagree still agree on
//! what is due.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

/// How long a row written with its change waits before the relay may take it:
/// the writer pushes the job itself right after the commit and then deletes
/// the row, or, when the push failed, makes it due at once
/// ([`retry_later`] with no delay). So the relay only sees rows whose push
/// failed, or whose writer died or lost the database meanwhile. Longer than a
/// push and a delete take (each bounded by `DEPENDENCY_TIMEOUT_MS`, at most
/// 60 s); a writer slower than this makes the job run twice, which the
/// idempotent jobs allow.
pub const FOLLOWUP_HOLD: Duration = Duration::from_secs(150);

/// A job to keep: its type (for logs) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// The job's type, e.g. `delete_avatar`.
    pub kind: String,
    /// The job as the queue's JSON.
    pub job: String,
}

impl NewJob {
    /// The row of a job the worker's tagged job enum knows as `kind`:
    /// `payload`'s JSON object with `"type": kind` added.
    pub fn tagged(kind: &str, payload: &impl serde::Serialize) -> Self {
        let mut v = serde_json::to_value(payload).expect("a job serialises");
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("type".into(), serde_json::Value::String(kind.into()));
        }
        NewJob {
            kind: kind.to_string(),
            job: v.to_string(),
        }
    }
}

/// A row taken by [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Row id: the job's idempotency key on the queue.
    pub id: Uuid,
    /// The job's type.
    pub kind: String,
    /// The job's JSON.
    pub job: String,
    /// Pushes tried so far, this one included.
    pub attempts: i32,
}

/// The database's clock in epoch milliseconds, as SQL.
fn now_ms(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        _ => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `$n` on PostgreSQL, `?` on SQLite (parameters in order).
fn sql(backend: DbBackend, template: &str) -> String {
    let now = now_ms(backend);
    let s = template.replace("{now}", now);
    match backend {
        DbBackend::Sqlite => (1..=9).fold(s, |s, n| s.replace(&format!("${n}"), "?")),
        _ => s,
    }
}

/// Keeps `job`, due `hold` from now by the database's clock (zero: due at
/// once). Returns the row id, which is also the job's idempotency key.
pub async fn insert<C: ConnectionTrait>(
    db: &C,
    job: &NewJob,
    hold: Duration,
) -> Result<Uuid, DbErr> {
    let backend = db.get_database_backend();
    let id = Uuid::now_v7();
    let stmt = Statement::from_sql_and_values(
        backend,
        sql(
            backend,
            "INSERT INTO job_outbox (id, kind, job, available_at_ms, attempts) \
             VALUES ($1, $2, $3, {now} + $4, 0)",
        ),
        [
            id.into(),
            job.kind.clone().into(),
            job.job.clone().into(),
            ms(hold).into(),
        ],
    );
    db.execute_raw(stmt).await?;
    Ok(id)
}

/// Deletes row `id` (its job is on the queue). Returns whether it was there.
pub async fn delete<C: ConnectionTrait>(db: &C, id: Uuid) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let stmt = Statement::from_sql_and_values(
        backend,
        sql(backend, "DELETE FROM job_outbox WHERE id = $1"),
        [id.into()],
    );
    Ok(db.execute_raw(stmt).await?.rows_affected() > 0)
}

/// Deletes the rows `ids` (their jobs were pushed) in one statement;
/// answers how many were still there.
pub async fn delete_many<C: ConnectionTrait>(db: &C, ids: &[Uuid]) -> Result<u64, DbErr> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(crate::entities::job_outbox::Entity::delete_many()
        .filter(crate::entities::job_outbox::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?
        .rows_affected)
}

/// Takes up to `limit` due rows, oldest due first, and leases them for
/// `lease`: they are not due again before that, so another relay skips them
/// (on PostgreSQL rows locked by a concurrent claim are skipped, not waited
/// for). Counts the attempt.
pub async fn claim<C: ConnectionTrait>(
    db: &C,
    limit: u64,
    lease: Duration,
) -> Result<Vec<Claimed>, DbErr> {
    let backend = db.get_database_backend();
    let lock = match backend {
        DbBackend::Postgres => " FOR UPDATE SKIP LOCKED",
        _ => "",
    };
    let stmt = Statement::from_sql_and_values(
        backend,
        sql(
            backend,
            &format!(
                "UPDATE job_outbox SET available_at_ms = {{now}} + $1, attempts = attempts + 1 \
                 WHERE id IN (SELECT id FROM job_outbox WHERE available_at_ms <= {{now}} \
                 ORDER BY available_at_ms LIMIT $2{lock}) \
                 RETURNING id, kind, job, attempts"
            ),
        ),
        [
            ms(lease).into(),
            Value::BigInt(Some(i64::try_from(limit).unwrap_or(i64::MAX))),
        ],
    );
    db.query_all_raw(stmt)
        .await?
        .into_iter()
        .map(|row| {
            Ok(Claimed {
                id: row.try_get("", "id")?,
                kind: row.try_get("", "kind")?,
                job: row.try_get("", "job")?,
                attempts: row.try_get("", "attempts")?,
            })
        })
        .collect()
}

/// Row `id` could not be pushed: due again `delay` from now, with `error`
/// recorded.
pub async fn retry_later<C: ConnectionTrait>(
    db: &C,
    id: Uuid,
    delay: Duration,
    error: &str,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let stmt = Statement::from_sql_and_values(
        backend,
        sql(
            backend,
            "UPDATE job_outbox SET available_at_ms = {now} + $1, last_error = $2 WHERE id = $3",
        ),
        [ms(delay).into(), error.to_string().into(), id.into()],
    );
    db.execute_raw(stmt).await?;
    Ok(())
}

/// Rows waiting (due or not).
pub async fn waiting<C: ConnectionTrait>(db: &C) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_string(
            backend,
            "SELECT COUNT(*) AS n FROM job_outbox",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("COUNT(*) gave no row".into()))?;
    Ok(row.try_get::<i64>("", "n")?.max(0) as u64)
}
