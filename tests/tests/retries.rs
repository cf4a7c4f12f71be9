//! Retries of transient failures: exponential backoff with jitter from
//! `JOB_RETRY_BASE_SECS`, the original job id as `Idempotency-Key` on every
//! attempt, and dead-lettering once `JOB_RETRY_HORIZON_SECS` is spent. On the
//! embedded SQLite queue (where apalis alone retried 25 times within seconds)
//! and on Redis.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{plans_file, post_json, random_ip, EnvMap, Proc, Stack, TempDir, EMAIL_FROM};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

async fn email_requests(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording on")
}

fn keys(reqs: &[Request]) -> Vec<String> {
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

/// The `retry_in_ms` of every "retry scheduled" log line.
fn scheduled_delays(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "job failed; retry scheduled")
        .map(|v| v["retry_in_ms"].as_u64().expect("retry_in_ms"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_queue_backs_off_and_keeps_the_idempotency_key() {
    let dir = TempDir::new();
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(503).set_body_string("try later"))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"})))
        .with_priority(2)
        .mount(&server)
        .await;
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("LOG_FORMAT", "json")
        .with("EMAIL_FROM", EMAIL_FROM)
        .with("EMAIL_PROVIDER_API_KEY", "re_retry")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("JOB_RETRY_BASE_SECS", "1");
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let body = json!({"name": "Retry Rick", "email": "rick@example.org", "message": "third time"});
    post_contact(&api, &body).await;

    let ok = tests::wait_until(Duration::from_secs(30), || async {
        email_requests(&server).await.len() >= 3
    })
    .await;
    assert!(ok, "not retried to success; stderr:\n{}", api.stderr());
    let delays = scheduled_delays(&api.stderr());
    assert_eq!(delays.len(), 2, "two retries scheduled: {delays:?}");
    // Exponential with equal jitter: [base/2, base], then [base, 2·base].
    assert!((500..=1000).contains(&delays[0]), "{delays:?}");
    assert!((1000..=2000).contains(&delays[1]), "{delays:?}");
    // Nothing more after the success (no retry is left scheduled).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = email_requests(&server).await;
    assert_eq!(reqs.len(), 3, "503, 503, 200 and nothing after");
    let k = keys(&reqs);
    assert!(!k[0].is_empty(), "Idempotency-Key missing");
    assert!(
        k.iter().all(|x| x == &k[0]),
        "one key for every attempt: {k:?}"
    );
}

async fn post_contact(api: &Proc, body: &Value) {
    let r = post_json(&api.url("/api/contact"), &random_ip(), body).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_retry_horizon_dead_letters_with_the_last_error() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(503).set_body_string("provider outage"))
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_retry")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("JOB_RETRY_BASE_SECS", "1")
        .with("JOB_RETRY_HORIZON_SECS", "8");
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    let body = json!({"name": "Horizon Hana", "email": "hana@example.org", "message": "too late"});
    post_contact(&api, &body).await;

    worker
        .wait_stderr("retry horizon spent", Duration::from_secs(30))
        .await;
    let ok = tests::wait_until(Duration::from_secs(10), || async {
        stack.redis.count("SCARD", "email:dead").await == 1
    })
    .await;
    assert!(ok, "not dead-lettered; stderr:\n{}", worker.stderr());
    let (status, out, err) = stack
        .run_worker_command(&env, &["dead-letters", "email"])
        .await;
    assert!(status.success(), "{err}");
    let dl: Value = serde_json::from_str(out.lines().next().expect("one dead letter")).unwrap();
    let last = dl["last_error"].as_str().unwrap_or("");
    assert!(last.contains("retry horizon"), "{dl}");
    assert!(last.contains("503"), "the last error is kept: {dl}");

    let reqs = email_requests(&server).await;
    assert!(reqs.len() >= 2, "retried before giving up: {}", reqs.len());
    let k = keys(&reqs);
    assert!(
        k.iter().all(|x| x == &k[0]),
        "one key for every attempt: {k:?}"
    );
    assert_eq!(dl["idempotency_key"], k[0].as_str());
    assert_eq!(stack.redis.count("ZCARD", "email:scheduled").await, 0);
}
