//! No job lost to a Redis blink: a job that follows a change already made
//! while answering (the avatar cleanup after a profile save, the usage row
//! after an AI answer) and cannot be queued because the api has lost Redis at
//! that moment is kept in the job outbox (PostgreSQL) and queued by the
//! worker, which sees Redis: the object is deleted, the usage row written.
//! The api reaches Redis through a [`TcpProxy`] cut at the moment of the
//! enqueue; the worker connects directly.

use std::time::Duration;

use sea_orm::sqlx::{self, PgPool};
use serde_json::{json, Value};
use tests::{
    client, hs256_token, session_claims, wait_until, EnvMap, Proc, ProxyMode, Reply, Stack,
    TcpProxy,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const SECRET: &str = "outbox-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";

fn token(user: Uuid) -> String {
    hs256_token(
        SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    )
}

/// The job outbox's rows (kind, attempts), or the error reading it.
async fn outbox_rows(pool: &PgPool) -> Result<Vec<(String, i32)>, String> {
    sqlx::query_as("SELECT kind, attempts FROM job_outbox ORDER BY created_at")
        .fetch_all(pool)
        .await
        .map_err(|e| format!("reading job_outbox: {e}"))
}

async fn save_profile(api: &Proc, tok: &str, body: &Value) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/profile"))
            .bearer_auth(tok)
            .json(body),
    )
    .await
}

/// A small PNG file (magic bytes and a header, then filler).
fn png() -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    v.extend_from_slice(&[0, 0, 0, 16, 0, 0, 0, 16, 8, 6, 0, 0, 0]);
    v.extend(std::iter::repeat_n(7u8, 2000));
    v
}

/// Uploads `user`'s avatar through the signed-upload grant.
async fn upload_avatar(api: &Proc, user: Uuid, tok: &str) {
    let bytes = png();
    let g = Reply::send(
        client()
            .post(api.url("/api/profile/avatar"))
            .bearer_auth(tok)
            .json(&json!({"fileSize": bytes.len(), "fileType": "image/png"})),
    )
    .await;
    assert_eq!(g.status, 200, "grant: {}", g.text);
    let grant = g.json["token"].as_str().expect("token");
    let url = api.url(&format!(
        "/storage/v1/object/upload/sign/avatars/{user}/avatar?token={grant}"
    ));
    let r = Reply::send(
        client()
            .put(url)
            .header("content-type", "image/png")
            .body(bytes),
    )
    .await;
    assert_eq!(r.status, 200, "upload: {}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn avatar_cleanup_cut_off_from_redis_is_kept_and_run_by_the_worker() {
    let stack = Stack::new().await;
    let proxy = TcpProxy::start(&tests::host_port(&stack.redis.url)).await;
    let worker_env = stack.session_env(SECRET, SERVICE_KEY);
    let api_env = worker_env
        .clone()
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "500");
    let api = stack.api(&api_env).await;
    let pool = stack.db.pool().await;
    let user = Uuid::new_v4();
    let tok = token(user);
    let object = stack
        .dir
        .path()
        .join("data/storage/avatars")
        .join(user.to_string())
        .join("avatar");

    // With Redis up, a removal queues its cleanup.
    upload_avatar(&api, user, &tok).await;
    let path = format!("{user}/avatar");
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = save_profile(&api, &tok, &json!({"avatar_path": ""})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        stack.redis.count("LLEN", "storage:active").await
            + stack.redis.count("ZCARD", "storage:scheduled").await,
        1,
        "the cleanup is queued"
    );
    let worker = stack.worker(&worker_env).await;
    assert!(
        wait_until(Duration::from_secs(30), || async { !object.exists() }).await,
        "the first cleanup did not run; worker stderr:\n{}",
        worker.stderr()
    );

    // Upload again, reference it, then remove it while the api cannot reach
    // Redis: the profile is saved, the cleanup kept in the outbox.
    upload_avatar(&api, user, &tok).await;
    assert!(object.exists(), "no object at {}", object.display());
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    proxy.set(ProxyMode::Refuse);
    let r = save_profile(&api, &tok, &json!({"avatar_path": ""})).await;
    assert_eq!(r.status, 200, "the save stands: {}", r.text);
    assert_eq!(r.json["profile"]["avatar_path"], Value::Null);

    // The worker (which sees Redis) queues it and the object goes.
    let gone = wait_until(Duration::from_secs(30), || async { !object.exists() }).await;
    assert!(
        gone,
        "the avatar object of the cleanup cut off from Redis is still there; outbox {:?}; api stderr:\n{}\nworker stderr:\n{}",
        outbox_rows(&pool).await,
        tests::tail(&api.stderr(), 4000),
        tests::tail(&worker.stderr(), 4000)
    );
    // Both rows are gone: the one of the queued cleanup (deleted by the
    // api after its push) and the relayed one.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            outbox_rows(&pool).await == Ok(vec![])
        })
        .await,
        "rows left in the outbox: {:?}",
        outbox_rows(&pool).await
    );
    assert!(
        api.stderr().contains("kept in the job outbox"),
        "{}",
        api.stderr()
    );
    assert!(
        worker.stderr().contains("job outbox: job queued"),
        "{}",
        worker.stderr()
    );
    proxy.on();
}

/// An OpenAI Chat Completions stream with its usage chunk.
const OPENAI_SSE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":7,\"total_tokens\":38}}\n\n\
data: [DONE]\n\n";

fn ai_env(stack: &Stack, upstream: &str) -> EnvMap {
    stack
        .env()
        .with_other_features_configured()
        .with("BACKEND_JWT_SECRET", SECRET)
        .with("OPENAI_BASE_URL", format!("{upstream}/v1"))
        .with("OPENAI_MODEL", "gpt-test")
}

#[tokio::test(flavor = "multi_thread")]
async fn ai_usage_cut_off_from_redis_is_kept_and_written_by_the_worker() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    // The provider takes 2 s to answer: Redis is cut meanwhile, after the
    // request was admitted and before its usage is queued.
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_raw(OPENAI_SSE, "text/event-stream")
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&upstream)
        .await;
    let proxy = TcpProxy::start(&tests::host_port(&stack.redis.url)).await;
    let worker_env = ai_env(&stack, &upstream.uri());
    let api_env = worker_env
        .clone()
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "500");
    let api = stack.api(&api_env).await;
    let worker = stack.worker(&worker_env).await;
    let pool = stack.db.pool().await;
    let user = Uuid::new_v4();

    let call = {
        let url = api.url("/api/ai/generate");
        let tok = token(user);
        tokio::spawn(async move {
            Reply::send(
                client()
                    .post(url)
                    .bearer_auth(tok)
                    .json(&json!({"prompt": "Hello"})),
            )
            .await
        })
    };
    let admitted = wait_until(Duration::from_secs(15), || async {
        !upstream
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    assert!(
        admitted,
        "the request never reached the provider: {}",
        api.stderr()
    );
    proxy.set(ProxyMode::Refuse);
    let r = call.await.expect("request task");
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["usage"],
        json!({"inputTokens": 31, "outputTokens": 7})
    );

    let usage = || async {
        sqlx::query_as::<_, (i32, i32, bool)>(
            "SELECT input_tokens, output_tokens, aborted FROM ai_usage WHERE user_id = $1",
        )
        .bind(user)
        .fetch_all(&pool)
        .await
        .expect("read ai_usage")
    };
    let written = wait_until(Duration::from_secs(30), || async {
        !usage().await.is_empty()
    })
    .await;
    assert!(
        written,
        "no ai_usage row after the blink; outbox {:?}; api stderr:\n{}\nworker stderr:\n{}",
        outbox_rows(&pool).await,
        tests::tail(&api.stderr(), 4000),
        tests::tail(&worker.stderr(), 4000)
    );
    assert_eq!(usage().await, vec![(31, 7, false)]);
    assert!(
        api.stderr().contains("kept in the job outbox"),
        "{}",
        api.stderr()
    );
    assert!(
        worker.stderr().contains("job outbox: job queued"),
        "{}",
        worker.stderr()
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            outbox_rows(&pool).await == Ok(vec![])
        })
        .await,
        "the relayed row was not deleted: {:?}",
        outbox_rows(&pool).await
    );
    proxy.on();
}
