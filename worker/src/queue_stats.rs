//! Queue depth, read with the project's own commands (apalis-redis 1.0's
//! `stats` queries run `ZCARD` on plain sets and read keys it never writes).
//!
//! Redis, per queue (key layout in [`crate::queue`]; one Lua call, so the
//! figures are one consistent snapshot):
//! * waiting: `LLEN {queue}:active` plus the due members of the
//!   `{queue}:scheduled` sorted set (every push lands there, run_at clamped
//!   to now, until it is promoted);
//! * scheduled: members of `{queue}:scheduled` due later (retries);
//! * in flight: the sum of `SCARD {queue}:inflight:<worker>` over the
//!   members of `{queue}:workers`;
//! * dead: `SCARD {queue}:dead`;
//! * oldest waiting age: now minus the earlier of the first active job's
//!   queueing time (its id is a ULID, which carries it) and the smallest due
//!   score of the scheduled set. A retry counts from when it was scheduled.
//!
//! SQLite (apalis-sqlite's `Jobs` table): waiting `Pending` rows with
//! `run_at` ≤ now, scheduled those later, in flight `Queued`/`Running`, dead
//! as [`crate::queue::Queues::dead_letters`] selects them, the oldest
//! waiting job's age from its `run_at`.

use std::{sync::LazyLock, time::Duration};

use redis::Script;
use sea_orm::sqlx::{self, Row};
use serde::Serialize;

use crate::{
    jobs::QueueName,
    queue::{redis_config, QueueError, Queues},
};

/// One queue's depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct QueueStats {
    /// Jobs due and not yet taken.
    pub waiting: u64,
    /// Jobs due later (retries).
    pub scheduled: u64,
    /// Jobs taken by a worker and not yet acknowledged.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Seconds the oldest waiting job has waited (0 when none waits).
    pub oldest_waiting_age_secs: f64,
}

/// KEYS: active list, scheduled zset, workers zset, dead set. ARGV: the
/// in-flight set prefix, now (s). Returns waiting (active), due, later,
/// in flight, dead, first active id (or ""), smallest due score (or -1).
static STATS_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local now = tonumber(ARGV[2])
local active = redis.call('llen', KEYS[1])
local due = redis.call('zcount', KEYS[2], '-inf', now)
local later = redis.call('zcount', KEYS[2], '(' .. now, '+inf')
local inflight = 0
for _, w in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
  inflight = inflight + redis.call('scard', ARGV[1] .. ':' .. w)
end
local dead = redis.call('scard', KEYS[4])
local head = redis.call('lindex', KEYS[1], 0) or ''
local first = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
local oldest = -1
if #first == 2 then oldest = first[2] end
return {active, due, later, inflight, dead, head, tostring(oldest)}
",
    )
});

fn now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Reads the depth of `q`, bounded by `within`.
pub async fn queue_stats(
    queues: &Queues,
    q: QueueName,
    within: Duration,
) -> Result<QueueStats, QueueError> {
    tokio::time::timeout(within, read(queues, q))
        .await
        .map_err(|_| QueueError::Timeout)?
}

async fn read(queues: &Queues, q: QueueName) -> Result<QueueStats, QueueError> {
    let now = now();
    if let Some(mut conn) = queues.redis() {
        let cfg = redis_config(queues.name(q));
        let (active, due, later, in_flight, dead, head, oldest): (
            u64,
            u64,
            u64,
            u64,
            u64,
            String,
            String,
        ) = STATS_SCRIPT
            .key(cfg.active_jobs_list())
            .key(cfg.scheduled_jobs_set())
            .key(cfg.workers_set())
            .key(cfg.dead_jobs_set())
            .arg(cfg.inflight_jobs_set())
            .arg(now.as_secs())
            .invoke_async(&mut conn)
            .await?;
        let mut since: Option<f64> = oldest.parse::<f64>().ok().filter(|s| *s >= 0.0);
        if let Ok(id) = head.parse::<ulid::Ulid>() {
            let queued = id.timestamp_ms() as f64 / 1000.0;
            since = Some(since.map_or(queued, |s| s.min(queued)));
        }
        return Ok(QueueStats {
            waiting: active + due,
            scheduled: later,
            in_flight,
            dead,
            oldest_waiting_age_secs: since.map_or(0.0, |s| (now.as_secs_f64() - s).max(0.0)),
        });
    }
    let Some(pool) = queues.sqlite_pool() else {
        return Ok(QueueStats::default());
    };
    let row = sqlx::query(concat!(
        "SELECT \
           COUNT(*) FILTER (WHERE status = 'Pending' AND run_at <= ?2) AS waiting, \
           COUNT(*) FILTER (WHERE status = 'Pending' AND run_at > ?2) AS scheduled, \
           COUNT(*) FILTER (WHERE status IN ('Queued', 'Running')) AS in_flight, \
           COUNT(*) FILTER (WHERE ",
        "(status = 'Killed' OR (status = 'Failed' AND attempts >= max_attempts))",
        ") AS dead, \
           MIN(run_at) FILTER (WHERE status = 'Pending' AND run_at <= ?2) AS oldest \
         FROM Jobs WHERE job_type = ?1"
    ))
    .bind(queues.name(q))
    .bind(now.as_secs() as i64)
    .fetch_one(pool)
    .await?;
    let count = |c: &str| row.try_get::<i64, _>(c).unwrap_or(0).max(0) as u64;
    let oldest: Option<i64> = row.try_get("oldest").ok().flatten();
    Ok(QueueStats {
        waiting: count("waiting"),
        scheduled: count("scheduled"),
        in_flight: count("in_flight"),
        dead: count("dead"),
        oldest_waiting_age_secs: oldest.map_or(0.0, |s| (now.as_secs_f64() - s as f64).max(0.0)),
    })
}

/// Sets the `queue_*` gauges of [`crate::metrics`] for every queue, each
/// read bounded by `within`; a queue whose read fails keeps its last values
/// (logged).
pub async fn record(queues: &Queues, within: Duration) {
    use crate::metrics as m;
    for q in QueueName::ALL {
        match queue_stats(queues, q, within).await {
            Ok(s) => {
                let name = q.as_str();
                metrics::gauge!(m::QUEUE_WAITING, "queue" => name).set(s.waiting as f64);
                metrics::gauge!(m::QUEUE_SCHEDULED, "queue" => name).set(s.scheduled as f64);
                metrics::gauge!(m::QUEUE_IN_FLIGHT, "queue" => name).set(s.in_flight as f64);
                metrics::gauge!(m::QUEUE_DEAD, "queue" => name).set(s.dead as f64);
                metrics::gauge!(m::QUEUE_OLDEST_AGE, "queue" => name)
                    .set(s.oldest_waiting_age_secs);
            }
            Err(e) => tracing::warn!(queue = %q, error = %e, "could not read the queue's depth"),
        }
    }
}

/// How long queue depths read for one scrape serve the next ones.
pub const QUEUE_STATS_TTL: Duration = Duration::from_secs(2);

/// Before a scrape: the database pool gauges, and the queue gauges read from
/// the queue store ([`record`]) unless read less than
/// [`QUEUE_STATS_TTL`] ago (by any scrape of this process).
pub async fn refresh(
    db: &sea_orm::DatabaseConnection,
    queues: &crate::Queues,
    settings: &entity::Settings,
) {
    static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    crate::metrics::record_db_pool(db, settings.db_max_connections);
    let due = {
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|t| t.elapsed() >= QUEUE_STATS_TTL);
        if due {
            *last = Some(std::time::Instant::now());
        }
        due
    };
    if due {
        record(queues, settings.dependency_timeout).await;
    }
}
