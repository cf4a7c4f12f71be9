//! Graceful scale-in: a stopping worker's jobs in flight get
//! `WORKER_SHUTDOWN_TIMEOUT_SECS` to finish; the rest go back to the queue at
//! once instead of after the missed-heartbeat threshold.
//!
//! apalis 1.0 on shutdown stops fetching, waits for every job in flight
//! (without a bound), puts the jobs it fetched but never started back on the
//! queue, and acknowledges the finished ones. Around that, [`run_draining`]
//! bounds the wait, and keeps the worker's heartbeat going while it drains
//! (apalis beats only while it fetches, so a drain longer than the threshold
//! would let another worker take the jobs still running as orphans). When the
//! worker has ended, or was abandoned at the deadline (its handlers dropped
//! midway), [`release`] returns whatever is left of it to the queue:
//!
//! * Redis (apalis-redis 1.0's layout, see [`crate::queue`]): every id in the
//!   worker's in-flight set `{queue}:inflight:<worker>` is pushed back onto the
//!   front of `{queue}:active` (its metadata `status` back to `Pending`), the
//!   set is deleted, the worker is removed from `{queue}:workers` (apalis's
//!   own clean-up removes a wrong member) and waiting workers are signalled.
//!   One Lua script, so no job is lost or doubled between the steps.
//! * SQLite (apalis-sqlite's `Jobs`): rows locked by the worker and still
//!   `Queued` or `Running` become `Pending` and unlocked.
//!
//! A job cut mid-flight runs again from the start (at least once): the email
//! API gets the same `Idempotency-Key`, settlement takes its row locks again;
//! over SMTP a message cut mid-send may arrive twice.

use std::{future::Future, sync::LazyLock, time::Duration};

use redis::Script;
use sea_orm::sqlx;
use tokio_util::sync::CancellationToken;

use crate::{
    jobs::QueueName,
    queue::{redis_config, QueueError, Queues},
};

/// How a stopping worker drains.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    /// `WORKER_SHUTDOWN_TIMEOUT_SECS`: how long jobs in flight may still run
    /// after the shutdown signal.
    pub grace: Duration,
    /// `WORKER_HEARTBEAT_MS`: how often the draining worker still beats.
    pub heartbeat: Duration,
}

/// Runs `worker` (apalis worker `name` on queue `q`, stopping by itself when
/// `shutdown` is cancelled) to its end, but for at most `drain.grace` after
/// the cancellation: then it is dropped, and with it its jobs in flight.
/// Beats for the worker every `drain.heartbeat` while it drains. Returns the
/// worker's result, or `None` when the deadline cut it off. Call [`release`]
/// afterwards in either case.
pub async fn run_draining<F: Future>(
    worker: F,
    queues: &Queues,
    q: QueueName,
    name: &str,
    shutdown: &CancellationToken,
    drain: Drain,
) -> Option<F::Output> {
    let deadline = async {
        shutdown.cancelled().await;
        let until = tokio::time::sleep(drain.grace);
        tokio::pin!(until);
        let mut beat = tokio::time::interval(drain.heartbeat);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut until => return,
                _ = beat.tick() => {
                    if let Err(e) = keep_alive(queues, q, name).await {
                        tracing::debug!(worker = %name, error = %e, "draining worker's heartbeat failed");
                    }
                }
            }
        }
    };
    tokio::select! {
        res = worker => Some(res),
        _ = deadline => None,
    }
}

/// Marks worker `name` of `q` alive now (apalis's own heartbeat: the score
/// in `{queue}:workers` on Redis, `Workers.last_seen` on SQLite). Only
/// updates a worker still registered.
async fn keep_alive(queues: &Queues, q: QueueName, name: &str) -> Result<(), QueueError> {
    let timeout = Duration::from_secs(2);
    if let Some(mut conn) = queues.redis() {
        let cfg = redis_config(queues.name(q));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(cfg.workers_set()).arg("XX").arg(now).arg(name);
        tokio::time::timeout(timeout, cmd.query_async::<u64>(&mut conn))
            .await
            .map_err(|_| QueueError::Timeout)??;
    } else if let Some(pool) = queues.sqlite_pool() {
        let fut = sqlx::query("UPDATE Workers SET last_seen = strftime('%s', 'now') WHERE id = ?1")
            .bind(name)
            .execute(pool);
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| QueueError::Timeout)??;
    }
    Ok(())
}

/// Returns every job worker `name` of `q` holds but has not acknowledged to
/// the front of the queue, at once, and unregisters the worker (see the
/// module documentation). Only call it once the worker has ended or was
/// dropped. Returns how many jobs went back.
pub async fn release(queues: &Queues, q: QueueName, name: &str) -> Result<u64, QueueError> {
    let timeout = Duration::from_secs(5);
    if let Some(mut conn) = queues.redis() {
        let cfg = redis_config(queues.name(q));
        let mut invocation = RELEASE_SCRIPT.key(inflight_set(&cfg, name));
        invocation
            .key(cfg.active_jobs_list())
            .key(cfg.signal_list())
            .key(cfg.workers_set())
            .key(cfg.job_meta_hash())
            .arg(name);
        return tokio::time::timeout(timeout, invocation.invoke_async::<u64>(&mut conn))
            .await
            .map_err(|_| QueueError::Timeout)?
            .map_err(QueueError::from);
    }
    if let Some(pool) = queues.sqlite_pool() {
        let fut = sqlx::query(
            "UPDATE Jobs SET status = 'Pending', lock_by = NULL, lock_at = NULL \
             WHERE job_type = ?1 AND lock_by = ?2 AND status IN ('Queued', 'Running')",
        )
        .bind(queues.name(q))
        .bind(name)
        .execute(pool);
        let res = tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| QueueError::Timeout)??;
        return Ok(res.rows_affected());
    }
    Ok(0)
}

/// `{queue}:inflight:<worker>`, as apalis-redis's `Config::inflight_set_for`
/// builds it from a worker's context (here from its name alone).
fn inflight_set(cfg: &apalis_redis::Config, name: &str) -> String {
    format!("{}:{name}", cfg.inflight_jobs_set())
}

/// KEYS: the worker's in-flight set, active list, signal list, workers zset,
/// metadata prefix. ARGV: the worker name. Pushes each in-flight id back on
/// the front of the active list (one `LPUSH` per id: no `unpack` limit),
/// resets its metadata status to `Pending` when it has metadata, deletes the
/// set, unregisters the worker and signals waiting workers. Returns the count.
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('smembers', KEYS[1])
for _, id in ipairs(ids) do
  redis.call('lpush', KEYS[2], id)
  local meta = KEYS[5] .. ':' .. id
  if redis.call('exists', meta) == 1 then
    redis.call('hset', meta, 'status', 'Pending')
    redis.call('hdel', meta, 'locked_at', 'locked_by')
  end
end
redis.call('del', KEYS[1])
redis.call('zrem', KEYS[4], ARGV[1])
if #ids > 0 then
  redis.call('del', KEYS[3])
  redis.call('lpush', KEYS[3], 1)
end
return #ids
",
    )
});
