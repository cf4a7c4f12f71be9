//! The worker under abuse: SIGKILL mid-delivery (at-least-once: every
//! accepted message arrives), SIGTERM (the job in flight finishes and is
//! acknowledged), and Redis / PostgreSQL outages (it keeps retrying, never exits);
//! the api's database connections closed by PostgreSQL while idle.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::json;
use tests::{
    client, host_port, hs256_token, post_json, random_ip, session_claims, Proc, ProxyMode, Reply,
    SmtpSink, Stack, TcpProxy, CONTACT_EMAIL,
};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

fn marker(i: usize) -> String {
    format!("resilience-marker-{i:03}")
}

/// How many times each marker was delivered.
fn delivered(sink: &SmtpSink, n: usize) -> BTreeMap<usize, usize> {
    let mut seen = BTreeMap::new();
    for m in sink.mails() {
        let body = m.body();
        for i in 0..n {
            if body.contains(&marker(i)) {
                *seen.entry(i).or_insert(0) += 1;
            }
        }
    }
    seen
}

/// `WORKER_HEARTBEAT_MS` in these tests: a killed worker's jobs go back to
/// the queue after 4 missed beats (4 s instead of 20 s).
const HEARTBEAT_MS: u64 = 1000;

/// How long to wait, after the last expected delivery, before counting
/// duplicates: past the orphan re-queue interval (4 beats), plus the
/// whole-second resolution of apalis-redis heartbeats, plus a fetch.
const PAST_REQUEUE: Duration = Duration::from_millis(4 * HEARTBEAT_MS + 3000);

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_delivery_loses_no_accepted_message() {
    const N: usize = 12;
    let stack = Stack::new().await;
    // The SMTP server holds each message 2 s before its 250, so a delivery is
    // provably in flight (inside DATA, unanswered) when the kill lands.
    let sink = SmtpSink::start_with_delay(Duration::from_secs(2)).await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("WORKER_CONCURRENCY", "2")
        .with("WORKER_HEARTBEAT_MS", HEARTBEAT_MS.to_string());
    let api = stack.api(&env).await;
    for i in 0..N {
        let body = json!({"name": format!("Sender {i}"), "email": format!("s{i}@example.com"), "message": marker(i)});
        let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
        assert_eq!(r.status, 200, "message {i}: {}", r.text);
    }

    let mut worker = stack.worker(&env).await;
    let in_flight = tests::wait_until(Duration::from_secs(30), || async {
        sink.count() >= 1 && sink.in_data() >= 1
    })
    .await;
    assert!(
        in_flight,
        "no delivery in flight after the first one; stderr:\n{}",
        worker.stderr()
    );
    worker.kill9();
    let cut = sink.in_data();
    let at_kill = sink.count();
    let before = delivered(&sink, N);
    assert!(
        cut >= 1,
        "the kill landed between deliveries; the test proved nothing"
    );
    assert!(
        at_kill + cut < N,
        "all {N} were delivered before the kill ({at_kill}); the test proved nothing"
    );

    // The server finishes receiving what was cut (a real MTA would too) and
    // counts it: these messages were sent, but their jobs never acknowledged.
    let drained =
        tests::wait_until(Duration::from_secs(10), || async { sink.in_data() == 0 }).await;
    assert!(drained, "the sink never finished the cut sessions");
    let touched = delivered(&sink, N);
    let cut_markers: Vec<usize> = touched
        .keys()
        .filter(|i| !before.contains_key(i))
        .copied()
        .collect();
    assert!(!cut_markers.is_empty(), "no message was cut mid-send");

    let t = Instant::now();
    let _worker2 = stack.worker(&env).await;
    let all = tests::wait_until(Duration::from_secs(90), || async {
        delivered(&sink, N).len() == N
    })
    .await;
    let seen = delivered(&sink, N);
    let missing: Vec<usize> = (0..N).filter(|i| !seen.contains_key(i)).collect();
    assert!(
        all,
        "after SIGKILL and restart, {} of {N} accepted messages never arrived within 90 s: {missing:?} ({} delivered before the kill)",
        missing.len(),
        at_kill
    );
    // Count only once an orphan of the kill would have been re-queued and sent.
    tokio::time::sleep(PAST_REQUEUE).await;
    let seen = delivered(&sink, N);
    let dups: usize = seen.values().map(|c| c - 1).sum();
    // At least once: a message the killed worker had sent (or was sending)
    // but not acknowledged is sent again once its job is re-queued as an
    // orphan; a message it had not touched is sent exactly once.
    for (i, count) in &seen {
        if !touched.contains_key(i) {
            assert_eq!(
                *count, 1,
                "message {i} untouched at the kill, delivered {count} times: {seen:?}"
            );
        }
    }
    for i in &cut_markers {
        assert!(
            seen[i] >= 2,
            "message {i} was cut mid-send but its job was never re-run (orphan not re-queued): {seen:?}"
        );
    }
    tests::report(&format!(
        "sigkill: {cut} in flight and {at_kill} delivered at the kill, all {N} after {:.1}s more, {dups} duplicate deliveries",
        t.elapsed().as_secs_f64()
    ));
}

/// With the HTTP email API, the job cut mid-request is sent again with the same
/// `Idempotency-Key`: the provider sees every message under exactly one key.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_request_keeps_the_idempotency_key() {
    const N: usize = 6;
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    // The fake holds every request 2 s before answering.
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"id": "email_ok"}))
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_kill")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("WORKER_CONCURRENCY", "1")
        .with("WORKER_HEARTBEAT_MS", HEARTBEAT_MS.to_string());
    let api = stack.api(&env).await;
    for i in 0..N {
        let body = json!({"name": format!("Sender {i}"), "email": format!("k{i}@example.com"), "message": marker(i)});
        let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
        assert_eq!(r.status, 200, "message {i}: {}", r.text);
    }
    let requests = || async {
        server
            .received_requests()
            .await
            .expect("request recording on")
    };

    let mut worker = stack.worker(&env).await;
    // The fake has received a request it has not answered yet (it holds each 2 s).
    let in_flight = tests::wait_until(Duration::from_secs(30), || async {
        !requests().await.is_empty()
    })
    .await;
    assert!(
        in_flight,
        "no request reached the email API; stderr:\n{}",
        worker.stderr()
    );
    worker.kill9();
    let at_kill = requests().await.len();
    assert!(
        at_kill < N,
        "the test proved nothing: {at_kill} requests before the kill"
    );

    let _worker2 = stack.worker(&env).await;
    let key_of = |r: &Request| {
        r.headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let marker_of = |r: &Request| {
        let sent: serde_json::Value = r.body_json().expect("JSON body");
        (0..N)
            .find(|i| sent["text"].as_str().unwrap_or("").contains(&marker(*i)))
            .expect("a marker in every mail")
    };
    // Every message reaches the email API, and the request cut by the kill
    // is sent again (once its job is back from the dead worker, at the end
    // of the queue): no fixed wait decides either.
    let all = tests::wait_until(Duration::from_secs(120), || async {
        let reqs = requests().await;
        reqs.len() > N
            && reqs
                .iter()
                .map(marker_of)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == N
    })
    .await;
    assert!(
        all,
        "not every message reached the email API after the restart, or the request cut by the kill was not sent again ({} requests)",
        requests().await.len()
    );
    let reqs = requests().await;
    let mut keys: BTreeMap<String, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for r in &reqs {
        let k = key_of(r);
        assert!(!k.is_empty(), "Idempotency-Key missing");
        keys.entry(k).or_default().insert(marker_of(r));
    }
    assert_eq!(
        keys.len(),
        N,
        "every message under exactly one key ({} requests): {keys:?}",
        reqs.len()
    );
    assert!(
        keys.values().all(|m| m.len() == 1),
        "one key per message: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_job_in_flight_finish() {
    graceful_stop("TERM").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_lets_the_job_in_flight_finish() {
    graceful_stop("INT").await;
}

async fn graceful_stop(signal: &str) {
    let stack = Stack::new().await;
    let sink = SmtpSink::start_with_delay(Duration::from_secs(3)).await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("WORKER_HEARTBEAT_MS", HEARTBEAT_MS.to_string());
    let api = stack.api(&env).await;
    let body = json!({"name": "Graceful", "email": "g@example.com", "message": marker(0)});
    assert_eq!(
        post_json(&api.url("/api/contact"), &random_ip(), &body)
            .await
            .status,
        200
    );

    let mut worker = stack.worker(&env).await;
    let in_flight =
        tests::wait_until(Duration::from_secs(30), || async { sink.in_data() == 1 }).await;
    assert!(
        in_flight,
        "the job never reached the SMTP server; stderr:\n{}",
        worker.stderr()
    );
    let t = Instant::now();
    worker.signal(signal);
    let status = worker
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| {
            panic!(
                "worker still running 30 s after SIG{signal}; stderr:\n{}",
                worker.stderr()
            )
        });
    assert!(
        status.success(),
        "worker exit status {status} after SIG{signal}; stderr:\n{}",
        worker.stderr()
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "the worker exited {:?} after SIG{signal}, before the send in flight could finish",
        t.elapsed()
    );
    assert_eq!(sink.count(), 1);
    // Acknowledged: done, not waiting for a retry or an orphan sweep.
    assert_eq!(
        stack.redis.count("SCARD", "email:done").await,
        1,
        "the finished job is not marked done"
    );
    assert_eq!(stack.redis.count("LLEN", "email:active").await, 0);
    assert_eq!(stack.redis.count("ZCARD", "email:scheduled").await, 0);

    // A new worker does not deliver it again.
    let _w2 = stack.worker(&env).await;
    tokio::time::sleep(PAST_REQUEUE).await;
    assert_eq!(
        sink.count(),
        1,
        "the message was delivered again after a graceful stop"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_rides_out_a_redis_outage() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let proxy = TcpProxy::start(&host_port(&stack.redis.url)).await;
    let api_env = stack.env().with("SMTP_URL", sink.url());
    let worker_env = api_env
        .clone()
        .with("REDIS_URL", stack.redis.url_via(proxy.addr));
    let api = stack.api(&api_env).await;
    let mut worker = stack.worker(&worker_env).await;

    let send = |i: usize| {
        let url = api.url("/api/contact");
        async move {
            let body = json!({"name": "Outage", "email": "o@example.com", "message": marker(i)});
            let r = post_json(&url, &random_ip(), &body).await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
    };
    send(0).await;
    sink.wait_for(1, Duration::from_secs(30)).await;

    for mode in [ProxyMode::Refuse, ProxyMode::Blackhole] {
        proxy.set(mode);
        // Queued while the worker cannot see Redis.
        send(if mode == ProxyMode::Refuse { 1 } else { 2 }).await;
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(
            worker.is_running(),
            "the worker exited during a Redis outage ({mode:?}); stderr:\n{}",
            worker.stderr()
        );
        proxy.on();
    }
    let all = tests::wait_until(Duration::from_secs(60), || async {
        delivered(&sink, 3).len() == 3
    })
    .await;
    assert!(
        all,
        "messages queued during the outage were not delivered after it: {:?}; worker stderr:\n{}",
        delivered(&sink, 3),
        worker.stderr()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_started_before_postgres_waits_for_it() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let proxy = TcpProxy::start(&host_port(&stack.db.url)).await;
    let env = stack.env().with("SMTP_URL", sink.url());
    let api = stack.api(&env).await;
    let body = json!({"name": "Early", "email": "e@example.com", "message": marker(0)});
    assert_eq!(
        post_json(&api.url("/api/contact"), &random_ip(), &body)
            .await
            .status,
        200
    );

    proxy.set(ProxyMode::Refuse);
    let mut worker = Proc::spawn(
        "worker",
        &[],
        &env.clone()
            .with("DATABASE_URL", stack.db.url_via(proxy.addr)),
        stack.dir.path(),
    );
    // It says it waits, and keeps waiting: a second attempt is logged while
    // PostgreSQL still refuses, and nothing is delivered meanwhile (a worker
    // that ignored PostgreSQL would have sent the queued mail by now).
    let waited = tests::wait_until(Duration::from_secs(30), || async {
        worker.stderr().matches("database unavailable").count() >= 2
    })
    .await;
    assert!(
        waited,
        "the worker did not log that it waits for PostgreSQL; stderr:\n{}",
        worker.stderr()
    );
    assert!(
        worker.is_running(),
        "the worker gave up while PostgreSQL was down; stderr:\n{}",
        worker.stderr()
    );
    assert_eq!(
        sink.count(),
        0,
        "a job ran before the worker had its database"
    );
    assert!(!worker.stderr().contains("worker started"));
    proxy.on();
    sink.wait_for(1, Duration::from_secs(45)).await;
    assert!(worker.stderr().contains("worker started"));
    assert!(worker.is_running());
}

/// PostgreSQL closes the api's pooled connections (a restart, a failover, an
/// operator's `pg_terminate_backend`) while they sit idle, and the next
/// requests are answered as before, because a pooled connection is pinged
/// before it is handed out, found dead and replaced before a statement is
/// sent on it. (Pinging only connections idle for a while was tried: a
/// statement on a connection closed since its last use then failed with a
/// 500; see BENCHMARKS.md.)
#[tokio::test(flavor = "multi_thread")]
async fn api_replaces_database_connections_closed_while_idle() {
    const SECRET: &str = "resilience-test-secret-0123456789abcdef0123456789";
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.session_env(SECRET, "service-role-test-key-0123456789abcdef"))
        .await;
    let users: Vec<String> = (0..8)
        .map(|_| {
            let sub = uuid::Uuid::new_v4().to_string();
            hs256_token(
                SECRET.as_bytes(),
                &session_claims(&sub, Some("idle@example.com")),
            )
        })
        .collect();
    let round = |label: &'static str| {
        let url = api.url("/api/profile");
        let users = users.clone();
        async move {
            let replies = futures::future::join_all(users.iter().map(|tok| {
                Reply::send(
                    client()
                        .post(&url)
                        .bearer_auth(tok)
                        .json(&json!({"full_name": "Idle"})),
                )
            }))
            .await;
            let failed: Vec<String> = replies
                .iter()
                .filter(|r| r.status != 200)
                .map(|r| format!("{} {}", r.status, r.text))
                .collect();
            assert!(
                failed.is_empty(),
                "{label}: {} of {} profile saves failed: {failed:?}",
                failed.len(),
                replies.len()
            );
        }
    };
    // Several requests at once, so the pool holds several connections.
    round("before").await;

    let pool = stack.db.pool().await;
    let killed: i64 = sea_orm::sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) AS k",
    )
    .fetch_one(&pool)
    .await
    .expect("terminate the api's connections");
    assert!(killed >= 1, "the api held no database connection to close");
    pool.close().await;

    // `pg_terminate_backend` only signals the backends: let them exit.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    round("after the api's idle connections were closed").await;
}
