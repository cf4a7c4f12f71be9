//! A backlog of 50,000 email jobs queued while no worker runs drains
//! completely once a worker starts (the apalis-redis "too many results to
//! unpack" defect is neutralised), and the vacuum gives Redis its memory back.
//!
//! Heavy on purpose; it runs in CI and prints its timings (`--nocapture`).

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use entity::base::mail::OutgoingEmail;
use futures::StreamExt;
use tests::{tail, Stack};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, Respond, ResponseTemplate,
};
use worker::{jobs::SendEmail, Job, QueueName, Queues};

const N: usize = 50_000;

/// Fake email API that only counts (request recording is off: 50k requests).
#[derive(Clone, Default)]
struct Counter {
    total: Arc<AtomicUsize>,
    keys: Arc<Mutex<HashSet<String>>>,
}

impl Respond for Counter {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = req
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
        {
            self.keys.lock().unwrap().insert(k.to_string());
        }
        ResponseTemplate::new(200)
            .insert_header("content-type", "application/json")
            .set_body_string(r#"{"id":"ok"}"#)
    }
}

impl Counter {
    fn distinct(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

fn job(i: usize) -> Job {
    Job::SendEmail(SendEmail {
        email: OutgoingEmail {
            from: "site@example.com".into(),
            to: vec!["inbox@example.com".into()],
            reply_to: Some(format!("sender{i}@example.com")),
            subject: format!("Backlog message {i}"),
            text: format!("backlog body {i}"),
            html: None,
        },
        request_id: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_backlog_of_50k_jobs_drains_and_memory_is_vacuumed() {
    let stack = Stack::new().await;
    let counter = Counter::default();
    let server = MockServer::builder()
        .disable_request_recording()
        .start()
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(counter.clone())
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_backlog")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("JOB_RETENTION_SECS", "0")
        .with("VACUUM_INTERVAL_SECS", "1")
        .with("RUST_LOG", "warn,worker::runtime=info");

    let (mem_start, keys_start) = stack.redis.memory().await;

    // Producer side, as the api does it.
    let source: HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
        ("DEPENDENCY_TIMEOUT_MS", "10000"),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    let queues = Queues::connect(&settings).await.expect("queue");
    let t = Instant::now();
    let failed = futures::stream::iter(0..N)
        .map(|i| {
            let q = queues.clone();
            async move { q.push(job(i)).await.err().map(|e| e.to_string()) }
        })
        .buffer_unordered(64)
        .filter_map(|e| async move { e })
        .collect::<Vec<_>>()
        .await;
    let push_secs = t.elapsed().as_secs_f64();
    assert!(
        failed.is_empty(),
        "{} pushes failed, first: {}",
        failed.len(),
        failed[0]
    );
    assert_eq!(
        queues.backlog(QueueName::Email).await.expect("backlog") as usize,
        N
    );
    let (mem_peak, keys_peak) = stack.redis.memory().await;
    tests::report(&format!(
        "backlog: pushed {N} jobs in {push_secs:.1}s ({:.0}/s); prefix memory {} KiB in {keys_peak} keys",
        N as f64 / push_secs,
        mem_peak / 1024
    ));

    // Drain.
    let t = Instant::now();
    let w = stack.worker(&env).await;
    let mut last_report = Instant::now();
    let drained = tests::wait_until(Duration::from_secs(240), || {
        let (q, c) = (queues.clone(), counter.clone());
        let report = last_report.elapsed() > Duration::from_secs(15);
        if report {
            last_report = Instant::now();
        }
        async move {
            let left = q.backlog(QueueName::Email).await.unwrap_or(u64::MAX);
            if report {
                tests::report(&format!(
                    "backlog: {left} waiting, {} delivered",
                    c.distinct()
                ));
            }
            left == 0 && c.distinct() >= N
        }
    })
    .await;
    let drain_secs = t.elapsed().as_secs_f64();
    let left = queues.backlog(QueueName::Email).await.unwrap_or(u64::MAX);
    assert!(
        drained,
        "backlog not drained in 240 s: {left} jobs waiting, {} distinct jobs delivered ({} calls); worker stderr (tail):\n{}",
        counter.distinct(),
        counter.total.load(Ordering::Relaxed),
        tail(&w.stderr(), 4000)
    );
    tests::report(&format!(
        "backlog: drained {N} jobs in {drain_secs:.1}s ({:.0}/s), {} calls to the email API",
        N as f64 / drain_secs,
        counter.total.load(Ordering::Relaxed)
    ));
    assert_eq!(
        stack.redis.count("SCARD", "email:dead").await,
        0,
        "no job should die"
    );

    // Vacuum: finished jobs leave Redis.
    let t = Instant::now();
    let vacuumed = tests::wait_until(Duration::from_secs(60), || async {
        stack.redis.count("HLEN", "email:data").await == 0
            && stack.redis.count("SCARD", "email:done").await == 0
    })
    .await;
    let (mem_end, keys_end) = stack.redis.memory().await;
    let meta_left = stack.redis.keys("email:meta:*").await.len();
    tests::report(&format!(
        "backlog: vacuumed in {:.1}s; prefix memory {} B in {keys_end} keys (start {mem_start} B in {keys_start} keys, peak {} KiB in {keys_peak} keys)",
        t.elapsed().as_secs_f64(),
        mem_end,
        mem_peak / 1024
    ));
    assert!(
        vacuumed,
        "finished jobs still in Redis 60 s after draining: data hash {} entries, done set {}",
        stack.redis.count("HLEN", "email:data").await,
        stack.redis.count("SCARD", "email:done").await
    );
    assert_eq!(meta_left, 0, "per-job metadata hashes left behind");
    assert!(
        mem_end <= mem_start + 64 * 1024,
        "prefix memory did not return near its start: {mem_end} B now, {mem_start} B at start, {mem_peak} B at peak; keys: {:?}",
        stack.redis.keys("*").await
    );
}
