//! The monthly AI quota under concurrency, against the real api (+ worker),
//! PostgreSQL and Redis: each request reserves its input bound and an output
//! cap before the upstream call, and the cap is sent upstream as each
//! provider expects it (`max_completion_tokens` for OpenAI, `max_tokens` for
//! Anthropic and compatible servers). The provider is faked over HTTP with
//! its documented SSE bodies; the fake honours the cap as a provider does
//! (it writes as many tokens as it may, never more).

use std::time::Duration;

use entity::entities::ai_usage;
use futures::StreamExt;
use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};
use serde_json::{json, Value};
use tests::{
    client, connect_db, free_user, host_port, hs256_token, session_claims, wait_until, EnvMap,
    Proc, ProxyMode, Reply, Stack, TcpProxy,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, Respond, ResponseTemplate,
};

const JWT_SECRET: &str = "jwt-secret-dummy-0123456789abcdef0123456789";

/// What the fake writes when a request names no cap (as the old api sent).
const UNCAPPED_OUTPUT: u64 = 500;

/// An OpenAI-like provider that honours `max_completion_tokens` (or
/// `max_tokens`): it answers with exactly that many output tokens (the worst
/// case), and counts the input as OpenAI's chat format does: the text's
/// tokens (at most its bytes) plus 3 per message and 3 for the reply.
struct HonoursTheCap;

impl Respond for HonoursTheCap {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let text: u64 = messages
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default().len() as u64)
            .sum();
        let input = text + 3 * messages.len() as u64 + 3;
        let output = body["max_completion_tokens"]
            .as_u64()
            .or(body["max_tokens"].as_u64())
            .unwrap_or(UNCAPPED_OUTPUT);
        let sse = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}},\"finish_reason\":\"length\"}}]}}\n\n\
data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output},\"total_tokens\":{}}}}}\n\n\
data: [DONE]\n\n",
            input + output
        );
        ResponseTemplate::new(200).set_body_raw(sse, "text/event-stream")
    }
}

/// An Anthropic Messages stream as its streaming documentation shows it.
const ANTHROPIC_SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-test\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn env(stack: &Stack, upstream: &str) -> EnvMap {
    stack
        .env()
        .with_other_features_configured()
        .with("OPENAI_BASE_URL", format!("{upstream}/v1"))
        .with("OPENAI_MODEL", "gpt-test")
        .with("ANTHROPIC_BASE_URL", upstream)
        .with("ANTHROPIC_API_KEY", "sk-ant-test")
        .with("ANTHROPIC_MODEL", "claude-test")
        .with(
            "OPENAI_COMPATIBLE_BASE_URL",
            format!("{upstream}/compat/v1"),
        )
}

fn token(user: Uuid) -> String {
    hs256_token(
        JWT_SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    )
}

async fn post(api: &Proc, path: &str, token: &str, body: &Value) -> Reply {
    Reply::send(client().post(api.url(path)).bearer_auth(token).json(body)).await
}

/// Records `tokens` of use this month for `user`, as the worker would have.
async fn seed_usage(db: &DatabaseConnection, user: Uuid, tokens: i32) {
    ai_usage::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user),
        provider: Set("openai".into()),
        model: Set("gpt-test".into()),
        route: Set("chat".into()),
        input_tokens: Set(tokens),
        output_tokens: Set(0),
        aborted: Set(false),
        estimated: Set(false),
        created_at: Set(chrono::Utc::now()),
    }
    .insert(db)
    .await
    .unwrap();
}

async fn usage_rows(db: &DatabaseConnection, user: Uuid) -> Vec<ai_usage::Model> {
    ai_usage::Entity::find()
        .filter(ai_usage::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
}

/// Fires 10 requests at once (chats and generations) for a FREE user who
/// used `used` of 20,000 tokens; answers how many were admitted and the
/// month's `ai_usage` total once every admitted one is recorded.
async fn ten_at_once(api: &Proc, db: &DatabaseConnection, used: i32) -> (usize, i64) {
    let user = free_user(db).await;
    seed_usage(db, user, used).await;
    let t = token(user);
    let replies = futures::future::join_all((0..10).map(|i| {
        let t = t.clone();
        async move {
            if i % 2 == 0 {
                post(api, "/api/ai/generate", &t, &json!({"prompt": "x"})).await
            } else {
                let body = json!({"messages": [{"role": "user", "content": "x"}]});
                post(api, "/api/ai/chat", &t, &body).await
            }
        }
    }))
    .await;
    let mut admitted = 0;
    for r in &replies {
        if r.status == 200 {
            admitted += 1;
        } else {
            r.assert_problem(429, Some("quota_exceeded"), None);
        }
    }
    let recorded = wait_until(Duration::from_secs(15), || async {
        usage_rows(db, user).await.len() > admitted
    })
    .await;
    assert!(recorded, "the admitted requests were not all recorded");
    let total = usage_rows(db, user)
        .await
        .iter()
        .map(|r| i64::from(r.input_tokens) + i64::from(r.output_tokens))
        .sum();
    (admitted, total)
}

#[tokio::test]
async fn ten_requests_at_once_never_take_the_month_past_the_quota() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(HonoursTheCap)
        .mount(&upstream)
        .await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;

    // 10 tokens left: not even one request's input bound (1 byte + 8 + 8)
    // and one output token fit.
    let (admitted, total) = ten_at_once(&api, &db, 19_990).await;
    assert!(total <= 20_000, "{admitted} admitted, {total} tokens");

    // 5,000 tokens left: the first requests get the plan's whole output cap
    // (2,048), the next what is left; the rest are refused.
    let (admitted, total) = ten_at_once(&api, &db, 15_000).await;
    assert!(admitted >= 3, "{admitted} admitted, {total} tokens");
    assert!(total <= 20_000, "{admitted} admitted, {total} tokens");
}

#[tokio::test]
async fn the_output_cap_is_sent_as_each_provider_expects() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    for p in ["/v1/chat/completions", "/compat/v1/chat/completions"] {
        Mock::given(method("POST"))
            .and(path(p))
            .respond_with(HonoursTheCap)
            .mount(&upstream)
            .await;
    }
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(ANTHROPIC_SSE, "text/event-stream"))
        .mount(&upstream)
        .await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;
    let bodies = |p: &'static str| {
        let upstream = &upstream;
        async move {
            upstream
                .received_requests()
                .await
                .unwrap_or_default()
                .iter()
                .filter(|r| r.url.path() == p)
                .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
                .collect::<Vec<_>>()
        }
    };

    // A new FREE user: the plan's cap (config/plans.toml: 2,048).
    let t = token(Uuid::new_v4());
    for provider in ["openai", "anthropic", "openai_compatible"] {
        let r = post(
            &api,
            "/api/ai/generate",
            &t,
            &json!({"prompt": "Hi", "provider": provider}),
        )
        .await;
        assert_eq!(r.status, 200, "{provider}: {}", r.text);
    }
    let openai = bodies("/v1/chat/completions").await;
    assert_eq!(openai.len(), 1);
    assert_eq!(openai[0]["max_completion_tokens"], 2048, "{}", openai[0]);
    assert!(openai[0].get("max_tokens").is_none(), "{}", openai[0]);
    let anthropic = bodies("/v1/messages").await;
    assert_eq!(anthropic[0]["max_tokens"], 2048, "{}", anthropic[0]);
    let compatible = bodies("/compat/v1/chat/completions").await;
    assert_eq!(compatible[0]["max_tokens"], 2048, "{}", compatible[0]);
    assert!(
        compatible[0].get("max_completion_tokens").is_none(),
        "{}",
        compatible[0]
    );

    // 100 tokens left: the cap is what the input bound leaves (100 - 17).
    let user = free_user(&db).await;
    seed_usage(&db, user, 19_900).await;
    let r = post(
        &api,
        "/api/ai/chat",
        &token(user),
        &json!({"messages": [{"role": "user", "content": "x"}], "provider": "openai"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let openai = bodies("/v1/chat/completions").await;
    assert_eq!(openai.len(), 2);
    assert_eq!(openai[1]["max_completion_tokens"], 83, "{}", openai[1]);
}

/// Without Redis the reservation is a conditional write in PostgreSQL: two
/// api processes on one database, five requests at each at once, hold the
/// quota between them.
#[tokio::test]
async fn two_api_processes_without_redis_hold_the_quota_in_the_database() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(HonoursTheCap)
        .mount(&upstream)
        .await;
    let mut apis = Vec::new();
    for i in 0..2 {
        let data = stack.dir.path().join(format!("data-{i}"));
        let env = env(&stack, &upstream.uri())
            .without("REDIS_URL")
            .with("DATA_DIR", data.display().to_string());
        apis.push(stack.api_with_worker(&env).await);
    }
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    seed_usage(&db, user, 15_000).await;
    let t = token(user);
    let replies = futures::future::join_all((0..10).map(|i| {
        let (api, t) = (&apis[i % 2], t.clone());
        async move { post(api, "/api/ai/generate", &t, &json!({"prompt": "x"})).await }
    }))
    .await;
    let mut admitted = 0;
    let mut total = 15_000;
    for r in &replies {
        if r.status == 200 {
            admitted += 1;
            total += r.json["usage"]["inputTokens"].as_u64().unwrap()
                + r.json["usage"]["outputTokens"].as_u64().unwrap();
        } else {
            r.assert_problem(429, Some("quota_exceeded"), None);
        }
    }
    assert!(admitted >= 3, "{admitted} admitted, {total} tokens");
    assert!(total <= 20_000, "{admitted} admitted, {total} tokens");
}

/// An OpenAI-like provider that streams one delta and then holds the answer
/// (its usage, which OpenAI sends only in the last chunk, never comes) until
/// the api hangs up.
async fn first_chunk_then_hold() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 8192];
                loop {
                    let n = sock.read(&mut tmp).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let data =
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{data}\r\n",
                    data.len()
                );
                if sock.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                // Until the api hangs up.
                while matches!(sock.read(&mut tmp).await, Ok(n) if n > 0) {}
            });
        }
    });
    url
}

/// A client that hangs up after the first delta leaves the provider's usage
/// unsent: the request is charged the most it reserved (its input bound and
/// its output cap), not an estimate of what reached the client. On FREE
/// (20,000 tokens), 5,000-byte questions reserve 5,016 + 2,048 tokens each:
/// three such aborted chats use the month up, and the fourth is refused.
#[tokio::test(flavor = "multi_thread")]
async fn aborted_streams_are_charged_what_they_reserved() {
    let stack = Stack::new().await;
    let upstream = first_chunk_then_hold().await;
    let api = stack.api_with_worker(&env(&stack, &upstream)).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let t = token(user);
    let mut admitted = 0;
    for i in 0..10 {
        // 5,000 random bytes of text (random base64-like noise, as the
        // reproduction sent).
        let text: String = (0..157).map(|_| tests::rand_hex(32)).collect::<String>()[..5000].into();
        let body = json!({"messages": [{"role": "user", "content": text}]});
        let resp = client()
            .post(api.url("/api/ai/chat"))
            .bearer_auth(&t)
            .json(&body)
            .send()
            .await
            .unwrap();
        if resp.status() != 200 {
            let status = resp.status();
            let p: Value = resp.json().await.unwrap();
            assert_eq!(
                (status.as_u16(), &p["code"]),
                (429, &json!("quota_exceeded")),
                "{p}"
            );
            assert_eq!(p["used"], 20_000, "request {i}: {p}");
            continue;
        }
        admitted += 1;
        let mut s = resp.bytes_stream();
        let mut got = String::new();
        while !got.contains("\"delta\":\"first\"") {
            let chunk = tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("the first delta did not arrive")
                .expect("the answer ended before its first delta")
                .unwrap();
            got.push_str(&String::from_utf8_lossy(&chunk));
        }
        drop(s);
        // The aborted request is recorded before the next one is sent.
        let recorded = wait_until(Duration::from_secs(15), || async {
            usage_rows(&db, user).await.len() == admitted
        })
        .await;
        assert!(recorded, "request {i} was not recorded");
    }
    let rows = usage_rows(&db, user).await;
    assert!(rows.iter().all(|r| r.aborted && r.estimated), "{rows:?}");
    let total: i64 = rows
        .iter()
        .map(|r| i64::from(r.input_tokens) + i64::from(r.output_tokens))
        .sum();
    assert_eq!((admitted, total), (3, 20_000), "{rows:?}");
}

/// With Redis unreachable for the api, the month counter's reservation moves
/// to the database (the conditional write the embedded mode uses): ten
/// requests at once still hold the quota between them, instead of each
/// being granted against the month's recorded sum.
#[tokio::test(flavor = "multi_thread")]
async fn with_redis_unreachable_parallel_requests_hold_the_quota_in_the_database() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(HonoursTheCap)
        .mount(&upstream)
        .await;
    let proxy = TcpProxy::start(&host_port(&stack.redis.url)).await;
    let env = env(&stack, &upstream.uri())
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "1000");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    seed_usage(&db, user, 15_000).await;
    let t = token(user);
    proxy.set(ProxyMode::Refuse);

    let replies = futures::future::join_all((0..10).map(|_| {
        let t = t.clone();
        let api = &api;
        async move { post(api, "/api/ai/generate", &t, &json!({"prompt": "x"})).await }
    }))
    .await;
    let mut admitted = 0;
    let mut total = 15_000;
    for r in &replies {
        if r.status == 200 {
            admitted += 1;
            total += r.json["usage"]["inputTokens"].as_u64().unwrap()
                + r.json["usage"]["outputTokens"].as_u64().unwrap();
        } else {
            r.assert_problem(429, Some("quota_exceeded"), None);
        }
    }
    assert!(admitted >= 2, "{admitted} admitted, {total} tokens");
    assert!(total <= 20_000, "{admitted} admitted, {total} tokens");
}
