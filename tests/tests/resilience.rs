//! The worker under abuse: SIGKILL mid-delivery (at-least-once: every
//! accepted message arrives), SIGTERM (the job in flight finishes and is
//! acknowledged), and Redis / PostgreSQL outages (it keeps retrying, never exits).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::json;
use tests::{
    host_port, post_json, random_ip, Proc, ProxyMode, SmtpSink, Stack, TcpProxy, CONTACT_EMAIL,
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

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_delivery_loses_no_accepted_message() {
    const N: usize = 30;
    let stack = Stack::new().await;
    // Each message takes 300 ms to be accepted, so delivery is slow enough to interrupt.
    let sink = SmtpSink::start_with_delay(Duration::from_millis(300)).await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("WORKER_CONCURRENCY", "2");
    let api = stack.api(&env).await;
    for i in 0..N {
        let body = json!({"name": format!("Sender {i}"), "email": format!("s{i}@example.com"), "message": marker(i)});
        let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
        assert_eq!(r.status, 200, "message {i}: {}", r.text);
    }

    let mut worker = stack.worker(&env).await;
    let began = tests::wait_until(Duration::from_secs(30), || async { sink.count() >= 2 }).await;
    assert!(
        began,
        "the worker never began delivering; stderr:\n{}",
        worker.stderr()
    );
    worker.kill9();
    let at_kill = sink.count();
    assert!(
        at_kill < N,
        "all {N} were delivered before the kill ({at_kill}); the test proved nothing"
    );

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
    let dups: usize = seen.values().map(|c| c - 1).sum();
    tests::report(&format!(
        "sigkill: {at_kill} delivered before the kill, all {N} after {:.1}s more, {dups} duplicate deliveries",
        t.elapsed().as_secs_f64()
    ));
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
    let env = stack.env().with("SMTP_URL", sink.url());
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
    tokio::time::sleep(Duration::from_secs(4)).await;
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
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        worker.is_running(),
        "the worker gave up while PostgreSQL was down; stderr:\n{}",
        worker.stderr()
    );
    proxy.on();
    sink.wait_for(1, Duration::from_secs(45)).await;
    assert!(worker.is_running());
}
