//! Managed Redis over TLS (`rediss://`), against a local `redis-server` that
//! speaks TLS only, with a certificate from a private CA made by the test
//! ([`tests::TlsRedis`]): the api and the worker reach it with
//! `REDIS_CA_FILE`, the queue delivers, the rate limit is counted in it (two
//! apis share one count), and a server whose certificate the client cannot
//! verify is refused.

use std::time::Duration;

use serde_json::json;
use tests::{get, post_json, random_ip, EnvMap, SmtpSink, Stack, TlsRedis, CONTACT_EMAIL};

fn contact_body(i: usize) -> serde_json::Value {
    json!({"name": "TLS", "email": "tls@example.com", "message": format!("over rediss {i}")})
}

/// The stack's environment pointed at the TLS Redis, with the default public
/// limit (5 per hour per client IP).
fn tls_env(stack: &Stack, redis: &TlsRedis, sink: &SmtpSink) -> EnvMap {
    stack
        .env()
        .with("REDIS_URL", redis.url())
        .with("REDIS_CA_FILE", redis.pki.ca_file().display().to_string())
        .with("SMTP_URL", sink.url())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("DEPENDENCY_TIMEOUT_MS", "2000")
        .without("RATE_LIMIT_PUBLIC_PER_HOUR")
}

#[tokio::test(flavor = "multi_thread")]
async fn api_and_worker_queue_and_limit_over_rediss_with_a_private_ca() {
    let stack = Stack::new().await;
    let redis = TlsRedis::start().await;
    let sink = SmtpSink::start().await;
    let env = tls_env(&stack, &redis, &sink);
    let api1 = stack.api(&env).await;
    let api2 = stack.api(&env).await;

    let h = get(&api1.url("/api/health")).await;
    assert_eq!(
        h.json["queue"]["ok"],
        json!(true),
        "health over rediss: {}; api stderr:\n{}",
        h.text,
        api1.stderr()
    );

    // Five messages from one client, alternating between the two apis: one
    // count in the TLS Redis, so the sixth is refused whichever api takes it.
    let ip = random_ip();
    for i in 0..5 {
        let api = if i % 2 == 0 { &api1 } else { &api2 };
        let r = post_json(&api.url("/api/contact"), &ip, &contact_body(i)).await;
        assert_eq!(
            r.status,
            200,
            "message {i}: {}; stderr:\n{}",
            r.text,
            api.stderr()
        );
        assert_eq!(
            r.header_u64("X-RateLimit-Remaining"),
            4 - i as u64,
            "message {i}: the count is shared through Redis"
        );
    }
    let r = post_json(&api2.url("/api/contact"), &ip, &contact_body(5)).await;
    r.assert_problem(429, Some("rate_limited"), None);
    let limit_key = format!("{}:rl:contact:{ip}", stack.redis.prefix);
    assert_eq!(
        redis.keys(&limit_key).await,
        vec![limit_key.clone()],
        "the limit is counted in the TLS Redis"
    );
    assert!(
        !redis
            .keys(&format!("{}:email:*", stack.redis.prefix))
            .await
            .is_empty(),
        "the jobs are queued in the TLS Redis"
    );
    assert!(
        stack.redis.keys("*").await.is_empty(),
        "nothing went to the plain-text Redis"
    );

    // The worker, over TLS too, delivers all five.
    let worker = stack.worker(&env).await;
    let all = tests::wait_until(Duration::from_secs(30), || async { sink.count() >= 5 }).await;
    assert!(
        all,
        "{} of 5 messages delivered over rediss; worker stderr:\n{}",
        sink.count(),
        worker.stderr()
    );
    assert!(
        !api1.stderr().contains("\"level\":\"ERROR\""),
        "{}",
        api1.stderr()
    );
}

/// A `rediss://` server is trusted only through its certificate: with
/// `REDIS_CA_FILE` naming a CA that did not sign it, or without
/// `REDIS_CA_FILE` (the public web roots), the api cannot use it — health
/// reports the queue down and the contact form answers 503 — and says why.
#[tokio::test(flavor = "multi_thread")]
async fn rediss_refuses_a_server_certificate_it_cannot_verify() {
    let stack = Stack::new().await;
    let redis = TlsRedis::start().await;
    let sink = SmtpSink::start().await;
    let base = tls_env(&stack, &redis, &sink).with("DEPENDENCY_TIMEOUT_MS", "1000");
    for (label, env) in [
        (
            "a CA that did not sign the server's certificate",
            base.clone().with(
                "REDIS_CA_FILE",
                redis.pki.other_ca_file().display().to_string(),
            ),
        ),
        (
            "the public web roots",
            base.clone().without("REDIS_CA_FILE"),
        ),
    ] {
        let api = stack.api(&env).await;
        let h = get(&api.url("/api/health")).await;
        assert_eq!(h.status, 503, "{label}: {}", h.text);
        assert_eq!(h.json["queue"]["ok"], json!(false), "{label}: {}", h.text);
        let r = post_json(&api.url("/api/contact"), &random_ip(), &contact_body(0)).await;
        r.assert_problem(503, Some("queue_unavailable"), None);
        let why = tests::wait_until(Duration::from_secs(30), || async {
            api.stderr().contains("UnknownIssuer")
        })
        .await;
        assert!(
            why,
            "{label}: the log does not say the certificate was refused; stderr:\n{}",
            api.stderr()
        );
    }
    assert!(
        redis
            .keys(&format!("{}:*", stack.redis.prefix))
            .await
            .is_empty(),
        "nothing was written through an unverified connection"
    );
}
