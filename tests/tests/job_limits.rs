//! Limits of one job attempt on a real worker: a handler that panics
//! dead-letters its job and the worker goes on (no crash, no restart loop);
//! an attempt past `JOB_TIMEOUT_SECS` is abandoned and retried by the
//! project's retry schedule under the same idempotency key.
//!
//! The panic is provoked through `WORKER_TEST_PANIC_MARKER`, a tests-only
//! setting production never sets: a `send_email` job whose subject contains it
//! panics in the worker.

use std::{collections::HashMap, time::Duration};

use entity::base::mail::OutgoingEmail;
use redis::AsyncCommands;
use serde_json::{json, Value};
use tests::{wait_until, Stack, EMAIL_FROM};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};
use worker::{
    jobs::{Job, SendEmail},
    Queues,
};

async fn producer(stack: &Stack) -> Queues {
    let source: HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    Queues::connect(&settings).await.expect("queue")
}

async fn push_mail(queues: &Queues, subject: &str) -> String {
    let email = OutgoingEmail {
        from: EMAIL_FROM.into(),
        to: vec!["inbox@example.com".into()],
        reply_to: None,
        subject: subject.into(),
        text: "job limits test".into(),
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

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"}))
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.expect("recording on")
}

fn idempotency_keys(reqs: &[Request]) -> Vec<String> {
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

fn subjects(reqs: &[Request]) -> Vec<String> {
    reqs.iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).expect("JSON body")["subject"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_handler_dead_letters_its_job_and_the_worker_goes_on() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ok())
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_limits")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("WORKER_QUEUES", "email")
        .with("WORKER_TEST_PANIC_MARKER", "boom-marker");
    let mut worker = stack.worker(&env).await;
    let queues = producer(&stack).await;

    let doomed = push_mail(&queues, "please boom-marker now").await;
    let dead = wait_until(Duration::from_secs(30), || async {
        let mut c = stack.redis.conn().await;
        c.sismember(stack.redis.key("email:dead"), &doomed)
            .await
            .unwrap_or(false)
    })
    .await;
    assert!(
        dead,
        "the panicking job is no dead letter; stderr:\n{}",
        worker.stderr()
    );
    let mut c = stack.redis.conn().await;
    let meta: HashMap<String, String> = c
        .hgetall(stack.redis.key(&format!("email:meta:{doomed}")))
        .await
        .expect("HGETALL");
    let result = meta.get("result").cloned().unwrap_or_default();
    assert!(
        result.contains("panicked"),
        "the panic is the recorded error: {meta:?}"
    );

    // The same worker process keeps serving the queue.
    let fine = push_mail(&queues, "an ordinary mail").await;
    let delivered = wait_until(Duration::from_secs(30), || async {
        let mut c = stack.redis.conn().await;
        c.sismember(stack.redis.key("email:done"), &fine)
            .await
            .unwrap_or(false)
    })
    .await;
    assert!(
        delivered,
        "not delivered after the panic; stderr:\n{}",
        worker.stderr()
    );
    assert!(
        worker.is_running(),
        "the worker died; stderr:\n{}",
        worker.stderr()
    );
    let err = worker.stderr();
    assert!(err.contains("job handler panicked; dead-lettered"), "{err}");
    assert!(!err.contains("worker failed; restarting"), "{err}");
    assert!(!err.contains("worker task ended abnormally"), "{err}");
    assert_eq!(
        subjects(&requests(&server).await),
        vec!["an ordinary mail".to_string()],
        "the panicking job never reached the email API"
    );
    assert_eq!(
        stack.redis.count("ZCARD", "email:scheduled").await,
        0,
        "not retried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_past_its_time_limit_is_retried_under_the_same_key() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    // The first attempt hangs past JOB_TIMEOUT_SECS (but within the email
    // client's own EMAIL_TIMEOUT_SECS); the next one is answered at once.
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ok().set_delay(Duration::from_secs(20)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ok())
        .with_priority(2)
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_limits")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("WORKER_QUEUES", "email")
        .with("EMAIL_TIMEOUT_SECS", "60")
        .with("JOB_TIMEOUT_SECS", "1")
        .with("JOB_RETRY_BASE_SECS", "1");
    let worker = stack.worker(&env).await;
    let queues = producer(&stack).await;

    let first = push_mail(&queues, "slow to send").await;
    let retried = wait_until(Duration::from_secs(30), || async {
        requests(&server).await.len() >= 2 && stack.redis.count("SCARD", "email:done").await >= 2
    })
    .await;
    assert!(
        retried,
        "not retried after the time limit; stderr:\n{}",
        worker.stderr()
    );
    let reqs = requests(&server).await;
    assert_eq!(reqs.len(), 2, "one cut attempt, one delivery");
    let keys = idempotency_keys(&reqs);
    assert_eq!(
        keys,
        vec![first.clone(), first.clone()],
        "one idempotency key, the job's id"
    );
    let err = worker.stderr();
    assert!(err.contains("job attempt timed out"), "{err}");
    let retry_lines: Vec<Value> = err
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "job failed; retry scheduled")
        .collect();
    assert_eq!(retry_lines.len(), 1, "{err}");
    assert!(
        retry_lines[0]["error"]
            .as_str()
            .unwrap_or("")
            .contains("JOB_TIMEOUT_SECS"),
        "{}",
        retry_lines[0]
    );
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
}
