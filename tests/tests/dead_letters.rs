//! The dead-letter queue end to end: a mail the email API refuses is
//! dead-lettered, listed by `worker dead-letters`, redriven by
//! `worker dead-letters redrive` once the API accepts it again, and delivered
//! exactly once with its original idempotency key; expired dead letters are
//! purged. On PostgreSQL + Redis and on the embedded SQLite queue.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{plans_file, post_json, random_ip, EnvMap, Proc, Stack, TempDir, CONTACT_EMAIL};
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

fn idempotency_key(r: &Request) -> String {
    r.headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The email API refuses the first request (400, permanent) and accepts the rest.
async fn refusing_once() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(
            ResponseTemplate::new(400).set_body_json(
                json!({"name": "validation_error", "message": "domain not verified"}),
            ),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"})))
        .with_priority(2)
        .mount(&server)
        .await;
    server
}

/// Posts a contact message, waits for it to be dead-lettered, redrives it
/// with `worker dead-letters redrive <id>`, and checks the single delivery.
/// `run` runs a `worker` command with the deployment's environment.
async fn dead_letter_then_redrive<F, Fut>(api: &Proc, server: &MockServer, run: F)
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = (std::process::ExitStatus, String, String)>,
{
    let body =
        json!({"name": "Redrive Rita", "email": "rita@example.org", "message": "second chance"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Dead-lettered at once (a 400 is permanent), listed with its error.
    let list = || run(vec!["dead-letters".into(), "email".into()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let (status, out, err) = list().await;
        assert!(status.success(), "worker dead-letters failed: {err}");
        let listed = json_lines(&out);
        if !listed.is_empty() {
            break listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was dead-lettered; api stderr:\n{}",
            api.stderr()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(listed.len(), 1, "{listed:?}");
    let dl = &listed[0];
    assert!(
        dl["last_error"].as_str().unwrap_or("").contains("400"),
        "the last error names the 400: {dl}"
    );
    let id = dl["id"].as_str().expect("id").to_string();
    let key = dl["idempotency_key"]
        .as_str()
        .expect("idempotency_key")
        .to_string();
    assert_eq!(email_requests(server).await.len(), 1);
    assert_eq!(idempotency_key(&email_requests(server).await[0]), key);

    // Redrive it now that the API accepts it.
    let (status, out, err) = run(vec!["dead-letters".into(), "redrive".into(), id.clone()]).await;
    assert!(status.success(), "redrive failed: {err}");
    let moved = json_lines(&out);
    assert_eq!(moved.len(), 1, "{out}");
    assert_eq!(moved[0]["id"], id.as_str());

    let ok = tests::wait_until(Duration::from_secs(30), || async {
        email_requests(server).await.len() >= 2
    })
    .await;
    assert!(
        ok,
        "the redriven job was not sent; api stderr:\n{}",
        api.stderr()
    );
    // Delivered once: nothing more arrives (no retry is pending and the
    // dead-letter queue is empty).
    let (status, out, _) = list().await;
    assert!(status.success());
    assert!(json_lines(&out).is_empty(), "still dead-lettered: {out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = email_requests(server).await;
    assert_eq!(reqs.len(), 2, "one refused attempt and one delivery");
    assert_eq!(
        idempotency_key(&reqs[1]),
        key,
        "the redriven job keeps its idempotency key"
    );
    let sent: Value = reqs[1].body_json().expect("JSON body");
    assert!(
        sent["text"]
            .as_str()
            .unwrap_or("")
            .contains("second chance"),
        "{sent}"
    );

    // Redriving an id that is not a dead letter fails and says so.
    let (status, _, err) = run(vec![
        "dead-letters".into(),
        "redrive".into(),
        "01NOTADEADLETTER000000000".into(),
    ])
    .await;
    assert!(!status.success(), "redrive of an unknown id succeeded");
    assert!(err.contains("01NOTADEADLETTER000000000"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_dead_letter_is_redriven_and_delivered_once() {
    let stack = Stack::new().await;
    let server = refusing_once().await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    dead_letter_then_redrive(&api, &server, |args| {
        let env = env.clone();
        let stack = &stack;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            stack.run_worker_command(&env, &args).await
        }
    })
    .await;
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_dead_letter_is_redriven_and_delivered_once() {
    let dir = TempDir::new();
    let server = refusing_once().await;
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("EMAIL_FROM", tests::EMAIL_FROM)
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri());
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    dead_letter_then_redrive(&api, &server, |args| {
        let env = env.clone();
        let dir = dir.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p = Proc::spawn("worker", &args, &env, &dir);
            let status = p
                .wait_exit(Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("worker {args:?} did not finish: {}", p.stderr()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            (status, p.stdout(), p.stderr())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_dead_letters_are_purged() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(422).set_body_string("no"))
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("DEAD_LETTER_RETENTION_SECS", "2")
        .with("VACUUM_INTERVAL_SECS", "1");
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    let body = json!({"name": "Purge Paul", "email": "paul@example.org", "message": "gone soon"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);

    worker
        .wait_stderr("rejected permanently", Duration::from_secs(30))
        .await;
    worker
        .wait_stderr("purged expired dead letters", Duration::from_secs(30))
        .await;
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
    assert_eq!(
        stack.redis.count("HLEN", "email:data").await,
        stack.redis.count("SCARD", "email:done").await,
        "the purged job's payload (with the sender's PII) is gone"
    );
}
