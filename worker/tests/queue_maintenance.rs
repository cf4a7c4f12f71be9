//! Promotion, vacuum, dead-letter purge and redrive against a real Redis
//! (`redis://127.0.0.1:6379`, or `TEST_REDIS_URL`; one key prefix per test,
//! deleted at the end) and against the SQLite queue.

use std::{collections::HashMap, time::Duration};

use redis::AsyncCommands;
use sea_orm::sqlx::{self, sqlite::SqlitePoolOptions};
use worker::{jobs::SendEmail, queue::CHUNK, Job, QueueName, Queues};

fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A queue handle on its own Redis prefix; the keys go when it drops.
struct RedisQueues {
    queues: Queues,
    prefix: String,
    conn: redis::aio::MultiplexedConnection,
}

impl RedisQueues {
    async fn new() -> Self {
        let prefix = format!("wtest-{}", ulid::Ulid::new()).to_lowercase();
        let url = redis_url();
        let map: HashMap<&str, &str> = [
            ("REDIS_URL", url.as_str()),
            ("QUEUE_PREFIX", prefix.as_str()),
            ("DEPENDENCY_TIMEOUT_MS", "5000"),
        ]
        .into_iter()
        .collect();
        let settings = entity::Settings::from_source(&map).expect("settings");
        let queues = Queues::connect(&settings).await.expect("queues");
        let conn = redis::Client::open(url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("Redis at {url} is required for this test: {e}"));
        RedisQueues {
            queues,
            prefix,
            conn,
        }
    }

    fn cfg(&self, q: QueueName) -> apalis_redis::Config {
        worker::queue::redis_config(self.queues.name(q))
    }

    async fn cleanup(mut self) {
        let keys: Vec<String> = self
            .conn
            .keys(format!("{}:*", self.prefix))
            .await
            .expect("KEYS");
        if !keys.is_empty() {
            let _: () = self.conn.del(keys).await.expect("DEL");
        }
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn email_job(tag: &str) -> Job {
    Job::SendEmail(SendEmail {
        email: entity::base::mail::OutgoingEmail {
            from: "site@example.com".into(),
            to: vec!["inbox@example.com".into()],
            reply_to: None,
            subject: format!("subject {tag}"),
            text: format!("text {tag}"),
            html: None,
        },
        request_id: None,
    })
}

#[tokio::test]
async fn promote_moves_due_jobs_in_chunks_and_leaves_future_ones() {
    let rq = RedisQueues::new().await;
    let mut c = rq.conn.clone();
    let cfg = rq.cfg(QueueName::Email);

    // Empty set: nothing to do, no error.
    assert_eq!(rq.queues.promote_due(QueueName::Email).await.unwrap(), 0);

    // More than two chunks due, plus jobs not yet due.
    let due = 2 * CHUNK + 500;
    let past = now_s() - 10;
    let mut pipe = redis::pipe();
    for i in 0..due {
        pipe.zadd(cfg.scheduled_jobs_set(), format!("due-{i}"), past);
    }
    for i in 0..7 {
        pipe.zadd(
            cfg.scheduled_jobs_set(),
            format!("later-{i}"),
            now_s() + 3600,
        );
    }
    let _: () = pipe.query_async(&mut c).await.unwrap();

    let moved = rq.queues.promote_due(QueueName::Email).await.unwrap();
    assert_eq!(moved, due);
    let active: usize = c.llen(cfg.active_jobs_list()).await.unwrap();
    assert_eq!(active, due, "every due job is on the active list");
    let left: Vec<String> = c.zrange(cfg.scheduled_jobs_set(), 0, -1).await.unwrap();
    assert_eq!(left.len(), 7, "jobs not yet due stay scheduled");
    assert!(left.iter().all(|id| id.starts_with("later-")));
    let signal: usize = c.llen(cfg.signal_list()).await.unwrap();
    assert_eq!(signal, 1, "fetchers are woken");

    // Nothing due any more.
    assert_eq!(rq.queues.promote_due(QueueName::Email).await.unwrap(), 0);
    rq.cleanup().await;
}

async fn mark(
    c: &mut redis::aio::MultiplexedConnection,
    cfg: &apalis_redis::Config,
    set: &str,
    id: &str,
    status: &str,
    done_at: u64,
) {
    let _: () = redis::pipe()
        .hset(cfg.job_data_hash(), id, b"{}".as_slice())
        .hset_multiple(
            format!("{}:{}", cfg.job_meta_hash(), id),
            &[
                ("status", status.to_string()),
                ("done_at", done_at.to_string()),
            ],
        )
        .sadd(set, id)
        .query_async(c)
        .await
        .unwrap();
}

#[tokio::test]
async fn vacuum_is_bounded_per_step_and_keeps_recent_jobs_and_dead_letters() {
    let rq = RedisQueues::new().await;
    let mut c = rq.conn.clone();
    let cfg = rq.cfg(QueueName::Email);
    let retention = Duration::from_secs(3600);

    // Empty done set: one step, cursor back to 0.
    assert_eq!(
        rq.queues
            .vacuum_step(QueueName::Email, retention, 0)
            .await
            .unwrap(),
        (0, 0)
    );

    let old = now_s() - 7200;
    let recent = now_s() - 10;
    let n_old = 3 * CHUNK;
    for i in 0..n_old {
        mark(
            &mut c,
            &cfg,
            &cfg.done_jobs_set(),
            &format!("old-{i}"),
            "Done",
            old,
        )
        .await;
    }
    for i in 0..20 {
        mark(
            &mut c,
            &cfg,
            &cfg.done_jobs_set(),
            &format!("recent-{i}"),
            "Done",
            recent,
        )
        .await;
    }
    for i in 0..5 {
        mark(
            &mut c,
            &cfg,
            &cfg.dead_jobs_set(),
            &format!("dead-{i}"),
            "Killed",
            old,
        )
        .await;
    }

    let (mut cursor, first) = rq
        .queues
        .vacuum_step(QueueName::Email, retention, 0)
        .await
        .unwrap();
    assert!(cursor != 0, "one step does not scan the whole set");
    assert!(
        first < n_old,
        "one step removed {first} of {n_old}: not bounded"
    );
    let mut removed = first;
    let mut steps = 1;
    while cursor != 0 {
        let (next, n) = rq
            .queues
            .vacuum_step(QueueName::Email, retention, cursor)
            .await
            .unwrap();
        cursor = next;
        removed += n;
        steps += 1;
        assert!(steps < 100, "the scan does not end");
    }
    assert_eq!(removed, n_old);
    let done: usize = c.scard(cfg.done_jobs_set()).await.unwrap();
    assert_eq!(done, 20, "recent jobs stay");
    let dead: usize = c.scard(cfg.dead_jobs_set()).await.unwrap();
    assert_eq!(dead, 5, "dead letters stay");
    let data: usize = c.hlen(cfg.job_data_hash()).await.unwrap();
    assert_eq!(data, 25, "data of the removed jobs is gone, the rest kept");
    let meta_left: bool = c
        .exists(format!("{}:old-0", cfg.job_meta_hash()))
        .await
        .unwrap();
    assert!(!meta_left, "metadata of removed jobs is gone");
    rq.cleanup().await;
}

#[tokio::test]
async fn dead_letter_purge_removes_only_expired_dead_letters() {
    let rq = RedisQueues::new().await;
    let mut c = rq.conn.clone();
    let cfg = rq.cfg(QueueName::Email);
    let retention = Duration::from_secs(14 * 86_400);
    let expired = now_s() - 15 * 86_400;
    let kept = now_s() - 86_400;
    for i in 0..3 {
        mark(
            &mut c,
            &cfg,
            &cfg.dead_jobs_set(),
            &format!("exp-{i}"),
            "Killed",
            expired,
        )
        .await;
    }
    for i in 0..2 {
        mark(
            &mut c,
            &cfg,
            &cfg.dead_jobs_set(),
            &format!("keep-{i}"),
            "Killed",
            kept,
        )
        .await;
    }
    mark(
        &mut c,
        &cfg,
        &cfg.done_jobs_set(),
        "done-old",
        "Done",
        expired,
    )
    .await;

    let mut cursor = 0;
    let mut removed = 0;
    loop {
        let (next, n) = rq
            .queues
            .purge_dead_letters_step(QueueName::Email, retention, cursor)
            .await
            .unwrap();
        removed += n;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(removed, 3);
    let mut left: Vec<String> = c.smembers(cfg.dead_jobs_set()).await.unwrap();
    left.sort();
    assert_eq!(left, vec!["keep-0", "keep-1"]);
    let done: usize = c.scard(cfg.done_jobs_set()).await.unwrap();
    assert_eq!(done, 1, "the purge leaves finished jobs to the vacuum");
    rq.cleanup().await;
}

#[tokio::test]
async fn redrive_requeues_a_redis_dead_letter_with_its_idempotency_key() {
    let rq = RedisQueues::new().await;
    let mut c = rq.conn.clone();
    let cfg = rq.cfg(QueueName::Email);

    let id = rq.queues.push(email_job("dl")).await.unwrap();
    // Kill it the way apalis does: off the active list, into the dead set.
    let _: () = redis::pipe()
        .lrem(cfg.active_jobs_list(), 0, &id)
        .zrem(cfg.scheduled_jobs_set(), &id)
        .sadd(cfg.dead_jobs_set(), &id)
        .hset(
            format!("{}:{}", cfg.job_meta_hash(), id),
            "status",
            "Killed",
        )
        .query_async(&mut c)
        .await
        .unwrap();

    let listed = rq.queues.dead_letters(QueueName::Email, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].idempotency_key.as_deref(), Some(id.as_str()));

    // An id that is not a dead letter is refused.
    let missing = rq
        .queues
        .redrive(QueueName::Email, Some(&["nope".to_string()]))
        .await;
    assert!(missing.is_err());

    let moved = rq.queues.redrive(QueueName::Email, None).await.unwrap();
    assert_eq!(moved.len(), 1);
    let (old, new) = &moved[0];
    assert_eq!(old, &id);
    assert_ne!(new, &id, "a new task id");
    assert!(rq
        .queues
        .dead_letters(QueueName::Email, 10)
        .await
        .unwrap()
        .is_empty());
    // apalis-redis queues every push through the scheduled set, due now.
    let queued: Vec<(String, u64)> = c
        .zrange_withscores(cfg.scheduled_jobs_set(), 0, -1)
        .await
        .unwrap();
    assert_eq!(queued.len(), 1, "back on its queue: {queued:?}");
    assert_eq!(&queued[0].0, new);
    assert!(queued[0].1 <= now_s() + 1, "due now, not later");
    let data: Vec<u8> = c.hget(cfg.job_data_hash(), new).await.unwrap();
    let payload: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(payload["type"], "send_email");
    assert_eq!(payload["retry"]["idempotency_key"], id.as_str(), "same key");
    assert_eq!(payload["retry"]["attempt"], 1, "fresh retry budget");
    assert_eq!(payload["retry"]["delayed_ms"], 0, "fresh retry budget");
    let old_data: Option<Vec<u8>> = c.hget(cfg.job_data_hash(), &id).await.unwrap();
    assert!(old_data.is_none(), "the dead letter is gone");
    rq.cleanup().await;
}

#[tokio::test]
async fn sqlite_dead_letters_are_redriven_and_purged() {
    let dir = std::env::temp_dir().join(format!("wtest-{}", ulid::Ulid::new()));
    let dir_s = dir.display().to_string();
    let map: HashMap<&str, &str> = [("DATA_DIR", dir_s.as_str())].into_iter().collect();
    let settings = entity::Settings::from_source(&map).unwrap();
    let queues = Queues::connect(&settings).await.unwrap();
    let pool = SqlitePoolOptions::new()
        .connect(&format!("sqlite://{}", dir.join("queue.db").display()))
        .await
        .unwrap();

    let a = queues.push(email_job("a")).await.unwrap();
    let c = queues.push(email_job("c")).await.unwrap();
    // a: died 15 days ago; c: died now.
    sqlx::query(
        "UPDATE Jobs SET status = 'Killed', done_at = strftime('%s','now') - 1296000 WHERE id = ?1",
    )
    .bind(&a)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE Jobs SET status = 'Killed', done_at = strftime('%s','now') WHERE id = ?1")
        .bind(&c)
        .execute(&pool)
        .await
        .unwrap();

    let listed = queues.dead_letters(QueueName::Email, 10).await.unwrap();
    assert_eq!(listed.len(), 2);

    let (_, n) = queues
        .purge_dead_letters_step(QueueName::Email, Duration::from_secs(14 * 86_400), 0)
        .await
        .unwrap();
    assert_eq!(n, 1, "only the expired dead letter goes");
    let listed = queues.dead_letters(QueueName::Email, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, c);

    let moved = queues
        .redrive(QueueName::Email, Some(std::slice::from_ref(&c)))
        .await
        .unwrap();
    assert_eq!(moved.len(), 1);
    let new = &moved[0].1;
    assert!(queues
        .dead_letters(QueueName::Email, 10)
        .await
        .unwrap()
        .is_empty());
    let (status, job): (String, Vec<u8>) =
        sqlx::query_as("SELECT status, job FROM Jobs WHERE id = ?1")
            .bind(new)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "Pending");
    let payload: serde_json::Value = serde_json::from_slice(&job).unwrap();
    assert_eq!(payload["retry"]["idempotency_key"], c.as_str());
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scheduler's tick lock: one worker per tick. A second taker within the
/// hold is refused; once the hold lapses (Redis's clock alone) the next tick's
/// taker gets it.
#[tokio::test]
async fn the_tick_lock_admits_one_worker_per_tick() {
    let rq = RedisQueues::new().await;
    let key = format!("{}:scheduler:lock", rq.prefix);
    let hold = Duration::from_millis(400);
    assert!(rq
        .queues
        .take_tick_lock(&key, "worker-a", hold)
        .await
        .unwrap());
    assert!(!rq
        .queues
        .take_tick_lock(&key, "worker-b", hold)
        .await
        .unwrap());
    assert!(!rq
        .queues
        .take_tick_lock(&key, "worker-a", hold)
        .await
        .unwrap());
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    assert!(rq
        .queues
        .take_tick_lock(&key, "worker-b", hold)
        .await
        .unwrap());
    rq.cleanup().await;
}
