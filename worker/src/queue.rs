//! Queue backends, the producer handle, the backlog guard, the vacuum and the
//! dead-letter reader.
//!
//! * `REDIS_URL` set: apalis-redis, one storage per [`QueueName`] under the key
//!   space `<QUEUE_PREFIX>:<queue>:*`. Producers clone the storage per push (no
//!   lock on the hot path); the connection is one multiplexed, lazily
//!   (re)connecting `ConnectionManager` with bounded timeouts, over TLS for
//!   `rediss://` ([`crate::redis_client`]).
//! * unset: apalis-sqlite in `<DATA_DIR>/queue.db`.
//!
//! Three apalis-redis 1.0 defects are neutralised here (the third, a
//! per-job scan of the whole backlog when leasing, by `lock_tasks(false)` in
//! [`redis_config`]):
//! * its `fetch_next.lua` moves *all* due jobs from `{queue}:scheduled` to the
//!   active list with one Lua `unpack`, which fails past ~8,000 ids and then
//!   every fetch fails. [`Queues::promote_due`] moves due jobs in bounded
//!   chunks; the worker runs it before its fetch loop starts and every
//!   [`PROMOTE_EVERY`] after (in its own task), so the set never holds more than
//!   a few hundred due ids.
//! * finished jobs stay in Redis forever. [`Queues::vacuum_step`] deletes jobs that
//!   finished (`Done`) more than `JOB_RETENTION_SECS` ago, examining at most
//!   [`CHUNK`] ids per call (one `SSCAN … COUNT`); the maintenance loop keeps the
//!   cursor between ticks. Dead-lettered jobs are kept: they are the dead-letter
//!   queue, purged after `DEAD_LETTER_RETENTION_SECS` by
//!   [`Queues::purge_dead_letters_step`] and redriven by [`Queues::redrive`].
//!
//! Why this file is long: it is the one place that reads and writes
//! apalis-redis's keys and apalis-sqlite's tables directly (dead letters,
//! vacuum, purge, promotion, redrive), the layout the workspace pins apalis
//! for (Cargo.toml); `tests/tests/queue_layout.rs` checks that layout.

use std::{collections::HashMap, sync::LazyLock, time::Duration};

use apalis::prelude::{TaskBuilder, TaskId, TaskSink};
use apalis_redis::{ConnectionManager, RedisStorage};
use apalis_sqlite::SqliteStorage;
use entity::Settings;
use redis::{aio::ConnectionManagerConfig, AsyncCommands, Script};
use sea_orm::sqlx::{
    self,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
    Row, SqlitePool,
};
use serde::Serialize;
use ulid::Ulid;

/// The SQLite condition for a dead letter: killed (permanent failure or retry
/// horizon spent), or failed with apalis's own attempts exhausted.
macro_rules! sqlite_dead {
    () => {
        "(status = 'Killed' OR (status = 'Failed' AND attempts >= max_attempts))"
    };
}

use crate::{
    jobs::{Envelope, Job, QueueName},
    retry::RetryState,
};

/// How often the worker promotes due scheduled jobs (retries) in chunks.
pub const PROMOTE_EVERY: Duration = Duration::from_millis(250);
/// The most ids one Lua call moves or deletes.
pub const CHUNK: usize = 1_000;
/// Default worker heartbeat (`WORKER_HEARTBEAT_MS`); a worker silent for
/// `heartbeat * MISSED_HEARTBEATS` is presumed dead and its in-flight jobs go
/// back to the queue.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// See [`HEARTBEAT`].
pub const MISSED_HEARTBEATS: usize = 4;

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis failed or timed out.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] sqlx::Error),
    /// apalis refused the push.
    #[error("push failed: {0}")]
    Push(String),
    /// The operation took longer than its bound.
    #[error("timed out")]
    Timeout,
    /// No dead letter with this id on the queue.
    #[error("no dead letter {id} on queue {queue}")]
    NotFound {
        /// The id asked for.
        id: String,
        /// The queue searched.
        queue: String,
    },
}

/// One job in the dead-letter queue.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// The queue's job id.
    pub id: String,
    /// The queue it died on.
    pub queue: String,
    /// Attempts made.
    pub attempts: Option<u64>,
    /// The last error (as recorded by apalis).
    pub last_error: Option<String>,
    /// The id the job got when first queued: the idempotency key it keeps on
    /// every retry and redrive.
    pub idempotency_key: Option<String>,
    /// The job payload.
    pub job: serde_json::Value,
}

#[derive(Clone)]
enum Backend {
    Redis {
        conn: ConnectionManager,
        storages: HashMap<QueueName, RedisStorage<Envelope>>,
    },
    Sqlite {
        pool: SqlitePool,
        storages: HashMap<QueueName, SqliteStorage<Envelope>>,
    },
}

/// Handle on every queue: push jobs (the api), run workers on them (the
/// worker), and the maintenance around them. Cheap to clone.
#[derive(Clone)]
pub struct Queues {
    backend: Backend,
    names: HashMap<QueueName, String>,
    timeout: Duration,
}

/// What the api uses to enqueue jobs.
pub type Producer = Queues;

/// apalis-redis configuration of one queue.
pub fn redis_config(name: &str) -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(name)
        .batch_size(50)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED_HEARTBEATS)
        .emit_events(false)
        // apalis-redis 1.0's acquire_leases.lua runs `LREM {queue}:active` per
        // task: a scan of the whole backlog for every job (~350 jobs/s with
        // 150k waiting, and Redis so busy that heartbeats slip and jobs are
        // re-queued as orphans). Leases only matter for jobs that outlive the
        // orphan threshold (20 s); ours are bounded well below it
        // (EMAIL_TIMEOUT_SECS ≤ 10 by default), and orphan recovery still works
        // from each worker's in-flight set.
        .lock_tasks(false)
}

impl Queues {
    /// Opens the backend the settings select. Redis connects lazily (the
    /// process starts, and health reports, while Redis is down); SQLite
    /// creates `<DATA_DIR>/queue.db` and its tables.
    pub async fn connect(settings: &Settings) -> Result<Self, QueueError> {
        let names: HashMap<QueueName, String> = QueueName::ALL
            .into_iter()
            .map(|q| (q, settings.queue_name(q.as_str())))
            .collect();
        let timeout = settings.dependency_timeout;
        let backend = match crate::redis_client::client(settings)? {
            Some(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_lazy_with_config(client, config)?;
                let storages = names
                    .iter()
                    .map(|(q, n)| {
                        (
                            *q,
                            RedisStorage::new(conn.clone()).with_config(
                                redis_config(n).heartbeat_interval(settings.worker_heartbeat),
                            ),
                        )
                    })
                    .collect();
                Backend::Redis { conn, storages }
            }
            None => {
                std::fs::create_dir_all(&settings.data_dir).map_err(|e| {
                    QueueError::Push(format!(
                        "cannot create {}: {e}",
                        settings.data_dir.display()
                    ))
                })?;
                let opts = SqliteConnectOptions::new()
                    .filename(settings.data_dir.join("queue.db"))
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(5));
                let pool = SqlitePoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(timeout.max(Duration::from_secs(5)))
                    .connect_with(opts)
                    .await?;
                setup_sqlite(&pool, timeout.max(Duration::from_secs(5))).await?;
                let storages = names
                    .iter()
                    .map(|(q, n)| {
                        (
                            *q,
                            SqliteStorage::new(&pool).with_config(
                                apalis_sqlite::Config::default()
                                    .queue(n)
                                    .heartbeat_interval(settings.worker_heartbeat)
                                    .missed_heartbeats(MISSED_HEARTBEATS),
                            ),
                        )
                    })
                    .collect();
                Backend::Sqlite { pool, storages }
            }
        };
        Ok(Queues {
            backend,
            names,
            timeout,
        })
    }

    /// `redis` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Redis { .. } => "redis",
            Backend::Sqlite { .. } => "sqlite",
        }
    }

    /// The full (prefixed) name of a queue.
    pub fn name(&self, q: QueueName) -> &str {
        &self.names[&q]
    }

    /// Enqueues `job` on its queue and returns the job id (a ULID). Bounded by
    /// `DEPENDENCY_TIMEOUT_MS`; on error nothing was enqueued or the caller
    /// cannot know, so it should answer 503 and let the client retry.
    pub async fn push(&self, job: Job) -> Result<String, QueueError> {
        self.push_within(job, self.timeout).await
    }

    /// [`Queues::push`] bounded by `limit` instead of `DEPENDENCY_TIMEOUT_MS`
    /// (for a request that already spent part of its time budget).
    pub async fn push_within(&self, job: Job, limit: Duration) -> Result<String, QueueError> {
        let id = Ulid::new().to_string();
        let env = Envelope::first(job, &id);
        self.push_envelope(&id, env, None, limit).await?;
        Ok(id)
    }

    /// [`Queues::push`] under the idempotency key `key` instead of the new
    /// task id (a job from the job outbox keeps its row id as key on every
    /// push). Returns the task id.
    pub async fn push_keyed(&self, job: Job, key: &str) -> Result<String, QueueError> {
        let id = Ulid::new().to_string();
        self.push_envelope(&id, Envelope::first(job, key), None, self.timeout)
            .await?;
        Ok(id)
    }

    /// Schedules the retry of `job` `delay` from now under a new task id, with
    /// `state` (the same idempotency key). Returns the new task id.
    pub async fn schedule_retry(
        &self,
        job: Job,
        state: RetryState,
        delay: Duration,
    ) -> Result<String, QueueError> {
        let id = Ulid::new().to_string();
        let env = Envelope {
            job,
            retry: Some(state),
        };
        self.push_envelope(&id, env, Some(delay), self.timeout)
            .await?;
        Ok(id)
    }

    async fn push_envelope(
        &self,
        id: &str,
        env: Envelope,
        delay: Option<Duration>,
        limit: Duration,
    ) -> Result<(), QueueError> {
        let q = env.job.queue();
        let mut builder = TaskBuilder::new(env).task_id(TaskId::from_string(id.to_string()));
        if let Some(d) = delay {
            builder = builder.run_after(d);
        }
        let task = builder.build();
        let fut = async {
            match &self.backend {
                Backend::Redis { storages, .. } => {
                    let mut s = storages[&q].clone();
                    s.push_task(task)
                        .await
                        .map_err(|e| QueueError::Push(e.to_string()))
                }
                Backend::Sqlite { storages, .. } => {
                    let mut s = storages[&q].clone();
                    s.push_task(task)
                        .await
                        .map_err(|e| QueueError::Push(e.to_string()))
                }
            }
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| QueueError::Timeout)??;
        Ok(())
    }

    /// Round trip to the queue store (`PING` / `SELECT 1`), bounded.
    pub async fn ping(&self) -> Result<(), QueueError> {
        let fut = async {
            match &self.backend {
                Backend::Redis { conn, .. } => {
                    let mut c = conn.clone();
                    redis::cmd("PING").query_async::<String>(&mut c).await?;
                    Ok(())
                }
                Backend::Sqlite { pool, .. } => {
                    sqlx::query("SELECT 1").execute(pool).await?;
                    Ok(())
                }
            }
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| QueueError::Timeout)?
    }

    /// Takes the scheduler's tick lock `key` for `ttl` on behalf of `owner`
    /// (Redis `SET key owner NX PX ttl`): true when this worker got it, so it
    /// runs this tick. On SQLite (a single process) always true.
    pub async fn take_tick_lock(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let mut conn = conn.clone();
                let ms = ttl.as_millis().max(1) as u64;
                let set: Option<String> = tokio::time::timeout(
                    self.timeout,
                    redis::cmd("SET")
                        .arg(key)
                        .arg(owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(ms)
                        .query_async(&mut conn),
                )
                .await
                .map_err(|_| QueueError::Timeout)??;
                Ok(set.is_some())
            }
            Backend::Sqlite { .. } => Ok(true),
        }
    }

    /// The Redis connection (None on SQLite); the api's rate limiter shares it.
    pub fn redis(&self) -> Option<ConnectionManager> {
        match &self.backend {
            Backend::Redis { conn, .. } => Some(conn.clone()),
            Backend::Sqlite { .. } => None,
        }
    }

    /// The SQLite queue's pool (None on Redis); [`crate::queue_stats`] reads it.
    pub(crate) fn sqlite_pool(&self) -> Option<&SqlitePool> {
        match &self.backend {
            Backend::Sqlite { pool, .. } => Some(pool),
            Backend::Redis { .. } => None,
        }
    }

    pub(crate) fn redis_storage(&self, q: QueueName) -> Option<RedisStorage<Envelope>> {
        match &self.backend {
            Backend::Redis { storages, .. } => Some(storages[&q].clone()),
            Backend::Sqlite { .. } => None,
        }
    }

    pub(crate) fn sqlite_storage(&self, q: QueueName) -> Option<SqliteStorage<Envelope>> {
        match &self.backend {
            Backend::Sqlite { storages, .. } => Some(storages[&q].clone()),
            Backend::Redis { .. } => None,
        }
    }

    /// Moves due jobs from `{queue}:scheduled` to the active list, at most
    /// [`CHUNK`] per Lua call, until none is due. Returns how many moved.
    /// No-op on SQLite.
    pub async fn promote_due(&self, q: QueueName) -> Result<usize, QueueError> {
        let Backend::Redis { conn, .. } = &self.backend else {
            return Ok(0);
        };
        let cfg = redis_config(self.name(q));
        let mut c = conn.clone();
        let mut total = 0;
        loop {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let moved: usize = PROMOTE_SCRIPT
                .key(cfg.scheduled_jobs_set())
                .key(cfg.active_jobs_list())
                .key(cfg.signal_list())
                .arg(now)
                .arg(CHUNK)
                .invoke_async(&mut c)
                .await?;
            total += moved;
            if moved < CHUNK {
                return Ok(total);
            }
        }
    }

    /// One bounded step of the vacuum: examines at most [`CHUNK`] ids of the
    /// done set of `q` from `cursor` (one `SSCAN … COUNT`; start with 0) and
    /// deletes those that finished successfully more than `retention` ago
    /// (data, metadata and done-set entry). Dead-lettered jobs stay. Returns
    /// the cursor to continue from (0 when the scan is complete) and how many
    /// jobs were removed. On SQLite one step deletes at most [`CHUNK`] rows and
    /// returns cursor 0.
    pub async fn vacuum_step(
        &self,
        q: QueueName,
        retention: Duration,
        cursor: u64,
    ) -> Result<(u64, usize), QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                self.sweep_step(
                    conn,
                    &VACUUM_SCRIPT,
                    &cfg.done_jobs_set(),
                    &cfg,
                    retention,
                    cursor,
                )
                .await
            }
            Backend::Sqlite { pool, .. } => {
                let res = sqlx::query(
                    "DELETE FROM Jobs WHERE rowid IN (SELECT rowid FROM Jobs WHERE job_type = ?1 \
                     AND status = 'Done' AND done_at IS NOT NULL \
                     AND done_at <= strftime('%s','now') - ?2 LIMIT ?3)",
                )
                .bind(self.name(q))
                .bind(retention.as_secs() as i64)
                .bind(CHUNK as i64)
                .execute(pool)
                .await?;
                Ok((0, res.rows_affected() as usize))
            }
        }
    }

    /// One bounded step of the dead-letter purge: like [`Queues::vacuum_step`]
    /// on the dead-letter queue of `q`, deleting dead letters that died more
    /// than `retention` ago (`DEAD_LETTER_RETENTION_SECS`).
    pub async fn purge_dead_letters_step(
        &self,
        q: QueueName,
        retention: Duration,
        cursor: u64,
    ) -> Result<(u64, usize), QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                self.sweep_step(
                    conn,
                    &PURGE_DEAD_SCRIPT,
                    &cfg.dead_jobs_set(),
                    &cfg,
                    retention,
                    cursor,
                )
                .await
            }
            Backend::Sqlite { pool, .. } => {
                let res = sqlx::query(concat!(
                    "DELETE FROM Jobs WHERE rowid IN (SELECT rowid FROM Jobs WHERE job_type = ?1 AND ",
                    sqlite_dead!(),
                    " AND done_at IS NOT NULL \
                     AND done_at <= strftime('%s','now') - ?2 LIMIT ?3)"
                ))
                .bind(self.name(q))
                .bind(retention.as_secs() as i64)
                .bind(CHUNK as i64)
                .execute(pool)
                .await?;
                Ok((0, res.rows_affected() as usize))
            }
        }
    }

    async fn sweep_step(
        &self,
        conn: &ConnectionManager,
        script: &Script,
        set: &str,
        cfg: &apalis_redis::Config,
        retention: Duration,
        cursor: u64,
    ) -> Result<(u64, usize), QueueError> {
        let mut c = conn.clone();
        let cutoff = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            .saturating_sub(retention.as_secs());
        let (next, ids): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(set)
            .arg(cursor)
            .arg("COUNT")
            .arg(CHUNK)
            .query_async(&mut c)
            .await?;
        if ids.is_empty() {
            return Ok((next, 0));
        }
        let mut inv = script.key(cfg.job_data_hash());
        inv.key(cfg.job_meta_hash()).key(set).arg(cutoff);
        for id in &ids {
            inv.arg(id);
        }
        let n: usize = inv.invoke_async(&mut c).await?;
        Ok((next, n))
    }

    /// Puts dead letters of `q` back on their queue with a fresh retry budget
    /// and their original idempotency key, under a new task id, and removes
    /// them from the dead-letter queue. `ids` selects them (`None`: all).
    /// Returns `(dead letter id, new task id)` pairs. An id that is not a dead
    /// letter of `q` is [`QueueError::NotFound`] (ids before it were redriven).
    pub async fn redrive(
        &self,
        q: QueueName,
        ids: Option<&[String]>,
    ) -> Result<Vec<(String, String)>, QueueError> {
        let queue = self.name(q).to_string();
        let ids: Vec<String> = match ids {
            Some(ids) => ids.to_vec(),
            None => self.dead_letter_ids(q).await?,
        };
        let mut out = Vec::new();
        for id in ids {
            let Some(env) = self.dead_letter_payload(q, &id).await? else {
                return Err(QueueError::NotFound {
                    id,
                    queue: queue.clone(),
                });
            };
            let key = env.state(&id).idempotency_key;
            let new_id = Ulid::new().to_string();
            self.push_envelope(&new_id, Envelope::first(env.job, &key), None, self.timeout)
                .await?;
            self.forget(q, &id).await?;
            out.push((id, new_id));
        }
        Ok(out)
    }

    async fn dead_letter_ids(&self, q: QueueName) -> Result<Vec<String>, QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                let mut c = conn.clone();
                Ok(c.smembers(cfg.dead_jobs_set()).await?)
            }
            Backend::Sqlite { pool, .. } => Ok(sqlx::query_scalar(concat!(
                "SELECT id FROM Jobs WHERE job_type = ?1 AND ",
                sqlite_dead!(),
                " ORDER BY done_at"
            ))
            .bind(self.name(q))
            .fetch_all(pool)
            .await?),
        }
    }

    /// Whether `id` is a dead letter of `q`.
    pub async fn dead_letters_contains(&self, q: QueueName, id: &str) -> Result<bool, QueueError> {
        Ok(self.dead_letter_payload(q, id).await?.is_some())
    }

    /// The payload of dead letter `id` of `q`, or `None` when it is not one.
    async fn dead_letter_payload(
        &self,
        q: QueueName,
        id: &str,
    ) -> Result<Option<Envelope>, QueueError> {
        let data: Option<Vec<u8>> = match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                let mut c = conn.clone();
                let dead: bool = c.sismember(cfg.dead_jobs_set(), id).await?;
                if !dead {
                    return Ok(None);
                }
                c.hget(cfg.job_data_hash(), id).await?
            }
            Backend::Sqlite { pool, .. } => {
                sqlx::query_scalar(concat!(
                    "SELECT job FROM Jobs WHERE job_type = ?1 AND id = ?2 AND ",
                    sqlite_dead!()
                ))
                .bind(self.name(q))
                .bind(id)
                .fetch_optional(pool)
                .await?
            }
        };
        let Some(data) = data else {
            return Ok(None);
        };
        serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| QueueError::Push(format!("dead letter {id} does not decode: {e}")))
    }

    /// Removes job `id` of `q` (data, metadata, dead-set entry).
    async fn forget(&self, q: QueueName, id: &str) -> Result<(), QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                let mut c = conn.clone();
                redis::pipe()
                    .atomic()
                    .srem(cfg.dead_jobs_set(), id)
                    .hdel(cfg.job_data_hash(), id)
                    .hdel(format!("{}:result", cfg.job_meta_hash()), id)
                    .del(format!("{}:{}", cfg.job_meta_hash(), id))
                    .query_async::<()>(&mut c)
                    .await?;
            }
            Backend::Sqlite { pool, .. } => {
                sqlx::query("DELETE FROM Jobs WHERE job_type = ?1 AND id = ?2")
                    .bind(self.name(q))
                    .bind(id)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// Lists up to `limit` dead-lettered jobs of `q` (the first page of
    /// [`Queues::dead_letters_after`]).
    pub async fn dead_letters(
        &self,
        q: QueueName,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        self.dead_letters_after(q, None, limit).await
    }

    /// Lists up to `limit` dead-lettered jobs of `q` in id order (ids are
    /// ULIDs: the order they were queued in), starting after id `after`
    /// (exclusive; `None`: from the first). A page ends short only at the
    /// end; the last id of a full page continues the listing. Used by
    /// `worker dead-letters` and the admin route.
    pub async fn dead_letters_after(
        &self,
        q: QueueName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let queue = self.name(q).to_string();
        let after = after.unwrap_or("");
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(&queue);
                let mut c = conn.clone();
                let mut ids: Vec<String> = c.smembers(cfg.dead_jobs_set()).await?;
                ids.retain(|id| id.as_str() > after);
                ids.sort_unstable();
                ids.truncate(limit);
                let mut out = Vec::new();
                for id in ids {
                    let data: Option<Vec<u8>> = c.hget(cfg.job_data_hash(), &id).await?;
                    let meta: HashMap<String, String> =
                        c.hgetall(format!("{}:{}", cfg.job_meta_hash(), id)).await?;
                    let job: serde_json::Value = data
                        .and_then(|d| serde_json::from_slice(&d).ok())
                        .unwrap_or(serde_json::Value::Null);
                    out.push(DeadLetter {
                        idempotency_key: Some(idempotency_key(&job, &id)),
                        job,
                        attempts: meta.get("attempts").and_then(|a| a.parse().ok()),
                        last_error: meta.get("result").cloned(),
                        queue: queue.clone(),
                        id,
                    });
                }
                Ok(out)
            }
            Backend::Sqlite { pool, .. } => {
                let rows = sqlx::query(concat!(
                    "SELECT id, job, attempts, last_result FROM Jobs WHERE job_type = ?1 AND id > ?3 AND ",
                    sqlite_dead!(),
                    " ORDER BY id LIMIT ?2"
                ))
                .bind(&queue)
                .bind(limit as i64)
                .bind(after)
                .fetch_all(pool)
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|r| {
                        let job: Vec<u8> = r.try_get("job").unwrap_or_default();
                        let job: serde_json::Value =
                            serde_json::from_slice(&job).unwrap_or(serde_json::Value::Null);
                        let id: String = r.try_get("id").unwrap_or_default();
                        DeadLetter {
                            idempotency_key: Some(idempotency_key(&job, &id)),
                            id,
                            queue: queue.clone(),
                            attempts: r.try_get::<i64, _>("attempts").ok().map(|a| a as u64),
                            last_error: r.try_get("last_result").ok(),
                            job,
                        }
                    })
                    .collect())
            }
        }
    }

    /// Jobs waiting (active + scheduled on Redis; pending on SQLite).
    pub async fn backlog(&self, q: QueueName) -> Result<u64, QueueError> {
        match &self.backend {
            Backend::Redis { conn, .. } => {
                let cfg = redis_config(self.name(q));
                let mut c = conn.clone();
                let active: u64 = c.llen(cfg.active_jobs_list()).await?;
                let scheduled: u64 = c.zcard(cfg.scheduled_jobs_set()).await?;
                Ok(active + scheduled)
            }
            Backend::Sqlite { pool, .. } => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM Jobs WHERE job_type = ?1 AND status IN ('Pending','Queued','Running')",
                )
                .bind(self.name(q))
                .fetch_one(pool)
                .await?;
                Ok(n as u64)
            }
        }
    }
}

/// The idempotency key recorded in a queued payload, else the task id.
fn idempotency_key(job: &serde_json::Value, id: &str) -> String {
    job.get("retry")
        .and_then(|r| r.get("idempotency_key"))
        .and_then(|k| k.as_str())
        .unwrap_or(id)
        .to_string()
}

/// KEYS: scheduled zset, active list, signal list. ARGV: now (s), chunk size.
static PROMOTE_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('zrangebyscore', KEYS[1], 0, ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('rpush', KEYS[2], unpack(ids))
  redis.call('zrem', KEYS[1], unpack(ids))
  redis.call('del', KEYS[3])
  redis.call('lpush', KEYS[3], 1)
end
return #ids
",
    )
});

/// KEYS: data hash, meta prefix, done set. ARGV: cutoff (s), then task ids.
/// Deletes each id whose metadata says Done at or before the cutoff.
static VACUUM_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local deleted = 0
local cutoff = tonumber(ARGV[1])
for i = 2, #ARGV do
  local id = ARGV[i]
  local meta = KEYS[2] .. ':' .. id
  local status = redis.call('hget', meta, 'status')
  local done_at = tonumber(redis.call('hget', meta, 'done_at'))
  if (status == 'Done' and done_at and done_at <= cutoff) or status == false then
    redis.call('hdel', KEYS[1], id)
    redis.call('hdel', KEYS[2] .. ':result', id)
    redis.call('del', meta)
    redis.call('srem', KEYS[3], id)
    deleted = deleted + 1
  end
end
return deleted
",
    )
});

/// KEYS: data hash, meta prefix, dead set. ARGV: cutoff (s), then task ids.
/// Deletes each id that died at or before the cutoff (or has no metadata).
static PURGE_DEAD_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local deleted = 0
local cutoff = tonumber(ARGV[1])
for i = 2, #ARGV do
  local id = ARGV[i]
  local meta = KEYS[2] .. ':' .. id
  local done_at = tonumber(redis.call('hget', meta, 'done_at'))
  if (done_at and done_at <= cutoff) or redis.call('exists', meta) == 0 then
    redis.call('hdel', KEYS[1], id)
    redis.call('hdel', KEYS[2] .. ':result', id)
    redis.call('del', meta)
    redis.call('srem', KEYS[3], id)
    deleted = deleted + 1
  end
end
return deleted
",
    )
});

/// apalis-sqlite's setup (pragmas, `PRAGMA optimize`, its migrations), again
/// while SQLite answers `SQLITE_BUSY` ("database is locked"), for up to
/// `within`. Another process on the same file (the api's or a worker's
/// queue, while `worker dead-letters` starts) can hold the write lock at a
/// moment SQLite reports busy without waiting out `busy_timeout` (a read
/// that must become a write in WAL mode); every step of the setup is
/// idempotent, so running it again is safe.
async fn setup_sqlite(pool: &SqlitePool, within: Duration) -> Result<(), QueueError> {
    let deadline = std::time::Instant::now() + within;
    let mut pause = Duration::from_millis(20);
    loop {
        match SqliteStorage::<()>::setup(pool).await {
            Ok(()) => return Ok(()),
            Err(e) if is_sqlite_busy(&e) && std::time::Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "SQLite queue busy while setting up; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(QueueError::Push(format!(
                    "cannot set up the SQLite queue: {e}"
                )))
            }
        }
    }
}

/// Whether `e` is SQLite's `SQLITE_BUSY` (primary result code 5, with any
/// extended code), also when wrapped in a migration error.
fn is_sqlite_busy(e: &apalis_sqlite::Error) -> bool {
    match e {
        apalis_sqlite::Error::Database(sqlx::Error::Database(d)) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| c & 0xff == 5),
        _ => e.to_string().contains("database is locked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool on a fresh SQLite file that reports busy at once (no
    /// `busy_timeout`), and a second connection to the same file.
    async fn busy_file() -> (std::path::PathBuf, SqlitePool, SqlitePool) {
        let path = std::env::temp_dir().join(format!("queue-busy-{}.db", Ulid::new()));
        let opts = || {
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::ZERO)
        };
        let holder = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts())
            .await
            .unwrap();
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts())
            .await
            .unwrap();
        (path, holder, pool)
    }

    #[tokio::test]
    async fn setup_waits_out_a_write_lock_held_elsewhere() {
        let (path, holder, pool) = busy_file().await;
        let mut lock = holder.acquire().await.unwrap();
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut *lock)
            .await
            .unwrap();

        // Busy is recognised for what it is (a real error from SQLite) ...
        let busy = SqliteStorage::<()>::setup(&pool).await.unwrap_err();
        assert!(is_sqlite_busy(&busy), "{busy}");
        // ... and another failure is not.
        let other = apalis_sqlite::Error::Database(
            sqlx::query("SELEC 1").execute(&pool).await.unwrap_err(),
        );
        assert!(!is_sqlite_busy(&other), "{other}");

        // Setting up while the lock is held succeeds once it is released.
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            sqlx::query("COMMIT").execute(&mut *lock).await.unwrap();
        });
        setup_sqlite(&pool, Duration::from_secs(5)).await.unwrap();
        release.await.unwrap();
        let tables: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'Jobs'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(tables, 1, "apalis's table exists after the setup");

        // A lock that outlasts the bound is reported, naming the cause.
        let mut lock = holder.acquire().await.unwrap();
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut *lock)
            .await
            .unwrap();
        let e = setup_sqlite(&pool, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("database is locked"), "{e}");
        sqlx::query("COMMIT").execute(&mut *lock).await.unwrap();
        drop(lock);
        pool.close().await;
        holder.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
