//! Graceful scale-in: a worker told to stop (SIGTERM) while its jobs hang on
//! a slow email API abandons them after `WORKER_SHUTDOWN_TIMEOUT_SECS`,
//! returns every job it held (running or fetched and waiting) to the queue
//! at once, and exits. A worker started afterwards delivers every job, long
//! before the missed-heartbeat threshold would have brought them back
//! (`WORKER_HEARTBEAT_MS=60000`: 4 minutes), under the jobs' own
//! idempotency keys.

use std::{
    collections::{BTreeSet, HashMap},
    time::Duration,
};

use entity::base::mail::OutgoingEmail;
use serde_json::json;
use tests::{wait_until, Stack, EMAIL_FROM};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};
use worker::{
    jobs::{Job, SendEmail},
    Queues,
};

const JOBS: usize = 20;

async fn producer(stack: &Stack) -> Queues {
    let source: HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    Queues::connect(&settings).await.expect("queue")
}

async fn push_mail(queues: &Queues, i: usize) -> String {
    let email = OutgoingEmail {
        from: EMAIL_FROM.into(),
        to: vec!["inbox@example.com".into()],
        reply_to: None,
        subject: format!("scale-in {i}"),
        text: "graceful scale-in test".into(),
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

/// A fake email API answering 200 after `delay`.
async fn email_api(delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"id": "email_ok"}))
                .set_delay(delay),
        )
        .mount(&server)
        .await;
    server
}

async fn keys(server: &MockServer) -> Vec<String> {
    let reqs: Vec<Request> = server.received_requests().await.expect("recording on");
    reqs.iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// Members of every `{queue}:inflight:<worker>` set of the email queue.
async fn in_flight(stack: &Stack) -> u64 {
    let mut n = 0;
    for k in stack.redis.keys("email:inflight:*").await {
        let suffix = &k[stack.redis.prefix.len() + 1..];
        n += stack.redis.count("SCARD", suffix).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_worker_returns_its_jobs_at_once_and_a_new_one_delivers_them_all() {
    let stack = Stack::new().await;
    let slow = email_api(Duration::from_secs(60)).await;
    let fast = email_api(Duration::ZERO).await;
    let base = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_scale")
        .with("WORKER_QUEUES", "email")
        .with("WORKER_CONCURRENCY", "4")
        .with("EMAIL_TIMEOUT_SECS", "120")
        .with("WORKER_HEARTBEAT_MS", "60000")
        .with("WORKER_SHUTDOWN_TIMEOUT_SECS", "2");
    let mut first = stack
        .worker(&base.clone().with("EMAIL_PROVIDER_BASE_URL", slow.uri()))
        .await;
    let queues = producer(&stack).await;
    let mut ids = BTreeSet::new();
    for i in 0..JOBS {
        ids.insert(push_mail(&queues, i).await);
    }

    // The first worker holds jobs (4 sending, more fetched and waiting).
    let busy = wait_until(Duration::from_secs(30), || async {
        keys(&slow).await.len() >= 4 && in_flight(&stack).await >= 4
    })
    .await;
    assert!(
        busy,
        "the first worker took no jobs; stderr:\n{}",
        first.stderr()
    );

    first.term();
    let exited = first.wait_exit(Duration::from_secs(2 + 20)).await;
    let status = exited.unwrap_or_else(|| {
        panic!(
            "the worker did not exit within WORKER_SHUTDOWN_TIMEOUT_SECS plus slack; stderr:\n{}",
            first.stderr()
        )
    });
    assert!(status.success(), "{status}; stderr:\n{}", first.stderr());
    let err = first.stderr();
    assert!(
        err.contains("did not finish within WORKER_SHUTDOWN_TIMEOUT_SECS"),
        "{err}"
    );
    assert!(
        err.contains("returned unfinished jobs to the queue"),
        "{err}"
    );

    // Nothing is held by the stopped worker any more, nothing was finished,
    // and every job waits on the queue again.
    assert_eq!(in_flight(&stack).await, 0, "jobs left in flight");
    assert_eq!(stack.redis.count("SCARD", "email:done").await, 0);
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
    assert_eq!(
        stack.redis.count("LLEN", "email:active").await
            + stack.redis.count("ZCARD", "email:scheduled").await,
        JOBS as u64,
        "every job is back on the queue"
    );
    assert_eq!(
        stack.redis.count("ZCARD", "email:workers").await,
        0,
        "unregistered"
    );

    // A second worker delivers every job, well before the 4-minute
    // missed-heartbeat threshold.
    let second = stack
        .worker(&base.with("EMAIL_PROVIDER_BASE_URL", fast.uri()))
        .await;
    let all = wait_until(Duration::from_secs(60), || async {
        stack.redis.count("SCARD", "email:done").await == JOBS as u64
    })
    .await;
    assert!(
        all,
        "not every job was delivered; stderr:\n{}",
        second.stderr()
    );
    let delivered: BTreeSet<String> = keys(&fast).await.into_iter().collect();
    assert_eq!(
        delivered, ids,
        "every job delivered under its own idempotency key"
    );
    // The attempts cut off mid-send were repeated with the same key.
    let cut: BTreeSet<String> = keys(&slow).await.into_iter().collect();
    assert!(cut.is_subset(&ids), "{cut:?}");
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
}

/// The same on the embedded SQLite queue (`api --with-worker`, no Redis): the
/// stopped process's locked rows become `Pending` again at once.
#[tokio::test(flavor = "multi_thread")]
async fn on_the_embedded_queue_a_stopped_worker_returns_its_jobs_too() {
    use sea_orm::sqlx::{self, sqlite::SqlitePoolOptions};
    use tests::{plans_file, post_json, random_ip, EnvMap, Proc, TempDir};

    let dir = TempDir::new();
    let slow = email_api(Duration::from_secs(60)).await;
    let fast = email_api(Duration::ZERO).await;
    let base = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("LOG_FORMAT", "json")
        .with("RATE_LIMIT_PUBLIC_PER_HOUR", "100000")
        .with("EMAIL_FROM", EMAIL_FROM)
        .with("EMAIL_PROVIDER_API_KEY", "re_scale")
        .with("WORKER_QUEUES", "email")
        .with("WORKER_CONCURRENCY", "4")
        .with("EMAIL_TIMEOUT_SECS", "120")
        .with("WORKER_HEARTBEAT_MS", "60000")
        .with("WORKER_SHUTDOWN_TIMEOUT_SECS", "2");
    let mut first = Proc::api(
        &base.clone().with("EMAIL_PROVIDER_BASE_URL", slow.uri()),
        &["--with-worker"],
        dir.path(),
    )
    .await;
    const N: usize = 8;
    for i in 0..N {
        let body =
            json!({"name": format!("Scale {i}"), "email": "s@example.org", "message": "drain"});
        let r = post_json(&first.url("/api/contact"), &random_ip(), &body).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let busy = wait_until(Duration::from_secs(30), || async {
        keys(&slow).await.len() >= 4
    })
    .await;
    assert!(busy, "no job taken; stderr:\n{}", first.stderr());

    first.term();
    let status = first
        .wait_exit(Duration::from_secs(2 + 20))
        .await
        .unwrap_or_else(|| panic!("did not exit in time; stderr:\n{}", first.stderr()));
    assert!(status.success(), "{status}; stderr:\n{}", first.stderr());
    assert!(
        first
            .stderr()
            .contains("returned unfinished jobs to the queue"),
        "{}",
        first.stderr()
    );

    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&format!(
            "sqlite://{}",
            dir.path().join("data/queue.db").display()
        ))
        .await
        .expect("queue.db");
    let held: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM Jobs WHERE status IN ('Queued', 'Running') OR lock_by IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .expect("count held");
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM Jobs WHERE status = 'Pending'")
        .fetch_one(&pool)
        .await
        .expect("count pending");
    pool.close().await;
    assert_eq!(
        (held, pending),
        (0, N as i64),
        "every job is back, unlocked"
    );

    let second = Proc::api(
        &base.with("EMAIL_PROVIDER_BASE_URL", fast.uri()),
        &["--with-worker"],
        dir.path(),
    )
    .await;
    let all = wait_until(Duration::from_secs(60), || async {
        keys(&fast).await.into_iter().collect::<BTreeSet<_>>().len() == N
    })
    .await;
    assert!(
        all,
        "not every job was delivered; stderr:\n{}",
        second.stderr()
    );
    let delivered: BTreeSet<String> = keys(&fast).await.into_iter().collect();
    let cut: BTreeSet<String> = keys(&slow).await.into_iter().collect();
    assert!(cut.is_subset(&delivered), "{cut:?} vs {delivered:?}");
}
