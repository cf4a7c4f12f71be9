//! The queue library's edges: the project reads and writes apalis-redis's keys
//! itself (`worker/src/queue.rs`: dead letters, vacuum, purge, promotion;
//! `queue_stats.rs`; `drain.rs`). Here a real worker finishes, kills and
//! reschedules jobs, and the key types (`TYPE`), the metadata fields and their
//! units those modules rely on are checked on what it left; then the project's
//! own operations run on that layout. An apalis-redis upgrade that changes
//! any of it fails this test.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use entity::base::mail::OutgoingEmail;
use redis::AsyncCommands;
use serde_json::json;
use tests::{wait_until, EnvMap, Stack, EMAIL_FROM};
use wiremock::{
    matchers::{body_string_contains, method, path},
    Mock, MockServer, ResponseTemplate,
};
use worker::{
    jobs::{Job, QueueName, SendEmail},
    Queues,
};

/// A producer on the stack's Redis namespace, as the api has one.
async fn producer(stack: &Stack) -> Queues {
    let source: HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    Queues::connect(&settings).await.expect("queue")
}

/// Queues a `send_email` job whose subject carries `marker`; returns its task id.
async fn push_mail(queues: &Queues, marker: &str) -> String {
    let email = OutgoingEmail {
        from: EMAIL_FROM.into(),
        to: vec!["inbox@example.com".into()],
        reply_to: None,
        subject: format!("layout {marker}"),
        text: "queue layout test".into(),
        html: None,
    };
    queues
        .push(Job::SendEmail(SendEmail {
            email,
            request_id: None,
        }))
        .await
        .expect("push")
}

/// The email API answers `status` (after `delay`) to mails whose subject holds `marker`.
async fn answer(server: &MockServer, marker: &str, status: u16, delay: Duration) {
    let body = if status < 300 {
        json!({"id": format!("email_{marker}")})
    } else {
        json!({"name": "validation_error", "message": format!("refused {marker}")})
    };
    Mock::given(method("POST"))
        .and(path("/emails"))
        .and(body_string_contains(marker))
        .respond_with(
            ResponseTemplate::new(status)
                .set_body_json(body)
                .set_delay(delay),
        )
        .mount(server)
        .await;
}

/// The `{queue}:inflight:<worker>` key whose set holds `id`, if any.
async fn inflight_set_holding(stack: &Stack, id: &str) -> Option<String> {
    let mut c = stack.redis.conn().await;
    for k in stack.redis.keys("email:inflight:*").await {
        if c.sismember::<_, _, bool>(&k, id).await.unwrap_or(false) {
            return Some(k);
        }
    }
    None
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// `TYPE <prefix>:<suffix>`.
async fn key_type(stack: &Stack, suffix: &str) -> String {
    let mut c = stack.redis.conn().await;
    redis::cmd("TYPE")
        .arg(stack.redis.key(suffix))
        .query_async(&mut c)
        .await
        .expect("TYPE")
}

/// A value that must be whole seconds since the epoch, close to now (not
/// milliseconds, not a formatted date): apalis-redis's scores and `done_at`.
fn assert_epoch_secs(what: &str, v: i64, from: i64, to: i64) {
    assert!(
        (from..=to).contains(&v),
        "{what} = {v} is not epoch seconds in [{from}, {to}]"
    );
}

fn env(stack: &Stack, server: &MockServer) -> EnvMap {
    stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_layout")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("WORKER_QUEUES", "email")
        // A failed attempt's retry lands far in the future: it stays scheduled.
        .with("JOB_RETRY_BASE_SECS", "3600")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_worker_leaves_the_layout_the_project_reads() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    answer(&server, "slow-", 200, Duration::from_secs(3)).await;
    answer(&server, "done-", 200, Duration::ZERO).await;
    answer(&server, "dead-", 422, Duration::ZERO).await;
    answer(&server, "retry-", 503, Duration::ZERO).await;
    answer(&server, "later-", 200, Duration::ZERO).await;
    let env = env(&stack, &server);
    let mut worker = stack.worker(&env).await;
    let queues = producer(&stack).await;
    let started = now_secs();

    // A job in flight: the worker's registry and its in-flight set.
    let slow = push_mail(&queues, "slow-1").await;
    let inflight_key = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(k) = inflight_set_holding(&stack, &slow).await {
                break k;
            }
            assert!(
                Instant::now() < deadline,
                "the running job is in no in-flight set; stderr:\n{}",
                worker.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let prefix = stack.redis.key("email:inflight:");
    let worker_name = inflight_key
        .strip_prefix(&prefix)
        .expect("in-flight set named {queue}:inflight:<worker>")
        .to_string();
    let inflight_suffix = inflight_key[stack.redis.prefix.len() + 1..].to_string();
    assert_eq!(key_type(&stack, &inflight_suffix).await, "set");
    assert_eq!(key_type(&stack, "email:workers").await, "zset");
    let mut c = stack.redis.conn().await;
    let beat: Option<f64> = c
        .zscore(stack.redis.key("email:workers"), &worker_name)
        .await
        .expect("ZSCORE");
    let beat = beat.expect("the worker is a member of {queue}:workers under its name");
    assert_epoch_secs(
        "worker heartbeat score",
        beat as i64,
        started - 5,
        now_secs() + 5,
    );

    // Finished, killed and rescheduled jobs.
    let done = push_mail(&queues, "done-1").await;
    let dead = push_mail(&queues, "dead-1").await;
    let retry = push_mail(&queues, "retry-1").await;
    let settled = wait_until(Duration::from_secs(60), || async {
        let mut c = stack.redis.conn().await;
        let done_set = stack.redis.key("email:done");
        let all_done = c.sismember(&done_set, &slow).await.unwrap_or(false)
            && c.sismember(&done_set, &done).await.unwrap_or(false)
            && c.sismember(&done_set, &retry).await.unwrap_or(false);
        all_done
            && c.sismember(stack.redis.key("email:dead"), &dead)
                .await
                .unwrap_or(false)
            && stack.redis.count("ZCARD", "email:scheduled").await == 1
    })
    .await;
    assert!(settled, "jobs did not settle; stderr:\n{}", worker.stderr());
    let finished = now_secs();

    for (suffix, ty) in [
        ("email:done", "set"),
        ("email:dead", "set"),
        ("email:data", "hash"),
        ("email:scheduled", "zset"),
        ("email:workers", "zset"),
    ] {
        assert_eq!(key_type(&stack, suffix).await, ty, "TYPE {suffix}");
    }
    // Payloads in the data hash, under the task id, as JSON of the envelope.
    for id in [&slow, &done, &dead, &retry] {
        let data: Option<Vec<u8>> = c
            .hget(stack.redis.key("email:data"), id)
            .await
            .expect("HGET data");
        let data = data.unwrap_or_else(|| panic!("no payload for {id} in {{queue}}:data"));
        let v: serde_json::Value = serde_json::from_slice(&data).expect("payload is JSON");
        assert_eq!(v["type"], "send_email", "{v}");
    }
    // Metadata: a hash per job with status, done_at (epoch seconds), attempts, result.
    for (id, status) in [
        (&slow, Some("Done")),
        (&done, Some("Done")),
        (&retry, Some("Done")),
        (&dead, None),
    ] {
        let suffix = format!("email:meta:{id}");
        assert_eq!(key_type(&stack, &suffix).await, "hash", "TYPE {suffix}");
        let meta: HashMap<String, String> =
            c.hgetall(stack.redis.key(&suffix)).await.expect("HGETALL");
        if let Some(status) = status {
            assert_eq!(
                meta.get("status").map(String::as_str),
                Some(status),
                "{meta:?}"
            );
        } else {
            assert_ne!(
                meta.get("status").map(String::as_str),
                Some("Done"),
                "{meta:?}"
            );
        }
        let done_at: i64 = meta
            .get("done_at")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("done_at missing or not an integer: {meta:?}"));
        assert_epoch_secs("done_at", done_at, started - 5, finished + 5);
        let attempts: u64 = meta
            .get("attempts")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("attempts missing or not an integer: {meta:?}"));
        assert!(attempts >= 1, "{meta:?}");
        assert!(meta.contains_key("result"), "{meta:?}");
    }
    // The retry: a new task in the scheduled set, scored by its due time in epoch seconds.
    let scheduled: Vec<(String, f64)> = c
        .zrange_withscores(stack.redis.key("email:scheduled"), 0, -1)
        .await
        .expect("ZRANGE");
    let (retry_task, due) = scheduled.first().cloned().expect("one scheduled retry");
    // JOB_RETRY_BASE_SECS=3600 with equal jitter: 1800–3600 s after the failure.
    assert_epoch_secs(
        "scheduled score",
        due as i64,
        started + 1800 - 5,
        finished + 3600 + 5,
    );

    // The project's own readers on this layout: the dead-letter listing ...
    let listed = queues
        .dead_letters(QueueName::Email, 10)
        .await
        .expect("dead letters");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, dead);
    assert!(listed[0].attempts.is_some_and(|a| a >= 1), "{listed:?}");
    let last_error = listed[0].last_error.clone().unwrap_or_default();
    assert!(
        last_error.contains("422"),
        "the provider's refusal is the last error: {last_error}"
    );
    // ... and the queue depth.
    let stats = worker::queue_stats::queue_stats(&queues, QueueName::Email, Duration::from_secs(5))
        .await
        .expect("stats");
    assert_eq!(
        (stats.dead, stats.scheduled, stats.in_flight),
        (1, 1, 0),
        "{stats:?}"
    );

    // With the worker stopped, the project's maintenance alone: promotion ...
    worker.term();
    assert!(
        worker.wait_exit(Duration::from_secs(60)).await.is_some(),
        "worker did not stop"
    );
    let later = push_mail(&queues, "later-1").await;
    assert_eq!(
        queues.promote_due(QueueName::Email).await.expect("promote"),
        1
    );
    assert_eq!(key_type(&stack, "email:active").await, "list");
    let active: Vec<String> = c
        .lrange(stack.redis.key("email:active"), 0, -1)
        .await
        .expect("LRANGE");
    assert_eq!(active, vec![later.clone()]);
    let still: Vec<String> = c
        .zrange(stack.redis.key("email:scheduled"), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(still, vec![retry_task], "the retry is not due yet");
    // ... the vacuum of finished jobs (data and metadata with them) ...
    let mut removed = 0;
    let mut cursor = 0;
    loop {
        let (next, n) = queues
            .vacuum_step(QueueName::Email, Duration::ZERO, cursor)
            .await
            .expect("vacuum");
        removed += n;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(removed, 3, "slow, done and the retried attempt");
    for id in [&slow, &done, &retry] {
        let exists: bool = c
            .hexists(stack.redis.key("email:data"), id)
            .await
            .expect("HEXISTS");
        assert!(!exists, "{id} still has data");
        assert_eq!(key_type(&stack, &format!("email:meta:{id}")).await, "none");
    }
    // ... and the dead-letter purge.
    let (_, purged) = queues
        .purge_dead_letters_step(QueueName::Email, Duration::ZERO, 0)
        .await
        .expect("purge");
    assert_eq!(purged, 1);
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);

    // A new worker fetches what our promotion put on the active list.
    let worker = stack.worker(&env).await;
    let delivered = wait_until(Duration::from_secs(30), || async {
        let mut c = stack.redis.conn().await;
        c.sismember(stack.redis.key("email:done"), &later)
            .await
            .unwrap_or(false)
    })
    .await;
    assert!(
        delivered,
        "the promoted job was not run; stderr:\n{}",
        worker.stderr()
    );
}
