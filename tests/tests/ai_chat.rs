//! AI routes against the real api (+ worker), PostgreSQL and Redis, with the
//! model providers faked over HTTP: wiremock answers the providers' documented
//! SSE bodies (OpenAI Chat Completions chunks, Anthropic Messages events), and
//! a hand-rolled upstream streams slowly to see relaying and cancellation.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use entity::entities::{
    ai_usage,
    subscriptions::{self, SubscriptionStatus},
};
use futures::StreamExt;
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend,
    EntityTrait, QueryFilter, Set, Statement, TransactionTrait,
};
use serde_json::{json, Value};
use tests::{
    client, connect_db, free_user, hs256_token, session_claims, wait_until, EnvMap, Proc, Reply,
    Stack,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use uuid::Uuid;
use wiremock::{
    matchers::{body_partial_json, body_string_contains, header, method, path},
    Mock, MockServer, ResponseTemplate,
};

const JWT_SECRET: &str = "jwt-secret-dummy-0123456789abcdef0123456789";

/// An OpenAI Chat Completions stream as the API reference shows it
/// (`stream_options.include_usage`: a last chunk with empty `choices` and the usage).
const OPENAI_SSE: &str = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-test\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n";

/// An Anthropic Messages stream as its streaming documentation shows it.
const ANTHROPIC_SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-test\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Bonjour\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" !\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n\
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
        .with("AI_MAX_INPUT_BYTES", "2000")
}

fn token(user: Uuid) -> String {
    hs256_token(
        JWT_SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    )
}

/// The body the AI SDK's `DefaultChatTransport` sends.
fn sdk_body(text: &str) -> Value {
    json!({
        "id": "chat-1",
        "messages": [
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
        ],
        "trigger": "submit-message",
        "someAppKey": {"x": 1}
    })
}

async fn post(api: &Proc, path: &str, token: Option<&str>, body: &Value) -> Reply {
    let mut req = client().post(api.url(path)).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    Reply::send(req).await
}

/// The `data:` payloads of an SSE body, in order.
fn data_lines(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

/// The chunks of a chat answer (message id blanked), checking `[DONE]` last.
fn chunks(reply: &Reply) -> Vec<Value> {
    let lines = data_lines(&reply.text);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        reply.text
    );
    lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if v["type"] == "start" {
                assert!(v["messageId"].is_string(), "{v}");
                v["messageId"] = json!("*");
            }
            v
        })
        .collect()
}

fn expected(deltas: &[&str]) -> Vec<Value> {
    let mut v = vec![
        json!({"type": "start", "messageId": "*"}),
        json!({"type": "start-step"}),
        json!({"type": "text-start", "id": "text-0"}),
    ];
    for d in deltas {
        v.push(json!({"type": "text-delta", "id": "text-0", "delta": d}));
    }
    v.extend([
        json!({"type": "text-end", "id": "text-0"}),
        json!({"type": "finish-step"}),
        json!({"type": "finish"}),
    ]);
    v
}

async fn usage_rows(db: &DatabaseConnection, user: Uuid) -> Vec<ai_usage::Model> {
    ai_usage::Entity::find()
        .filter(ai_usage::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
}

async fn wait_usage(db: &DatabaseConnection, user: Uuid, n: usize) -> Vec<ai_usage::Model> {
    let ok = wait_until(Duration::from_secs(15), || async {
        usage_rows(db, user).await.len() >= n
    })
    .await;
    assert!(ok, "no usage row for {user}");
    usage_rows(db, user).await
}

async fn openai_mock(server: &MockServer) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-dummy"))
        .and(body_partial_json(json!({
            "model": "gpt-test",
            "stream": true,
            "stream_options": {"include_usage": true},
        })))
        .respond_with(ResponseTemplate::new(200).set_body_raw(OPENAI_SSE, "text/event-stream"))
        .mount(server)
        .await;
}

async fn anthropic_mock(server: &MockServer) {
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "sk-ant-test"))
        .and(header("anthropic-version", "2023-06-01"))
        .and(body_partial_json(
            json!({"model": "claude-test", "stream": true}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_raw(ANTHROPIC_SSE, "text/event-stream"))
        .mount(server)
        .await;
}

#[tokio::test]
async fn openai_and_anthropic_streams_become_the_ui_message_stream_and_usage_rows() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    anthropic_mock(&upstream).await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    let t = token(user);

    // OpenAI (the default provider), AI SDK body with extra keys.
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("Hi")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("x-vercel-ai-ui-message-stream"), Some("v1"));
    assert_eq!(r.header("x-accel-buffering"), Some("no"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(r.header_u64("X-RateLimit-Limit"), 10);
    assert_eq!(chunks(&r), expected(&["Hello", " there"]));
    let rows = wait_usage(&db, user, 1).await;
    let row = &rows[0];
    assert_eq!(
        (
            row.provider.as_str(),
            row.model.as_str(),
            row.route.as_str()
        ),
        ("openai", "gpt-test", "chat")
    );
    assert_eq!((row.input_tokens, row.output_tokens), (9, 2));
    assert!(!row.aborted && !row.estimated);

    // Anthropic, simple {role, content} messages with a system message.
    let body = json!({"provider": "anthropic", "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"}
    ]});
    let r = post(&api, "/api/ai/chat", Some(&t), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(chunks(&r), expected(&["Bonjour", " !"]));
    let rows = wait_usage(&db, user, 2).await;
    let row = rows.iter().find(|r| r.provider == "anthropic").unwrap();
    assert_eq!(
        (row.model.as_str(), row.input_tokens, row.output_tokens),
        ("claude-test", 25, 15)
    );
    assert!(!row.aborted && !row.estimated);
    // The system message went to Anthropic's top-level `system`.
    let sent: Vec<Value> = upstream
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/v1/messages")
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(sent[0]["system"], "Answer in French.");
    assert_eq!(
        sent[0]["messages"],
        json!([{"role": "user", "content": "Hello"}])
    );
}

#[tokio::test]
async fn generate_returns_text_and_usage_from_each_provider() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    anthropic_mock(&upstream).await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    let t = token(user);

    let r = post(&api, "/api/ai/generate", Some(&t), &json!({"prompt": "Hi"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"text": "Hello there", "usage": {"inputTokens": 9, "outputTokens": 2}})
    );
    let r = post(
        &api,
        "/api/ai/generate",
        Some(&t),
        &json!({"prompt": "Hi", "system": "French", "provider": "anthropic"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"text": "Bonjour !", "usage": {"inputTokens": 25, "outputTokens": 15}})
    );
    let rows = wait_usage(&db, user, 2).await;
    assert!(rows.iter().all(|r| r.route == "generate" && !r.aborted));
}

#[tokio::test]
async fn bad_input_auth_and_configuration_answers() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    let api = stack.api(&env(&stack, &upstream.uri())).await;
    let t = token(Uuid::new_v4());
    let chat = "/api/ai/chat";

    post(&api, chat, None, &sdk_body("Hi"))
        .await
        .assert_problem(401, Some("missing_token"), None);
    post(&api, "/api/ai/generate", None, &json!({"prompt": "x"}))
        .await
        .assert_problem(401, None, None);
    post(&api, chat, Some(&t), &json!({"id": "c"}))
        .await
        .assert_problem(400, Some("required"), Some("messages"));
    post(&api, chat, Some(&t), &json!({"messages": []}))
        .await
        .assert_problem(400, Some("empty"), Some("messages"));
    post(
        &api,
        chat,
        Some(&t),
        &json!({"messages": [{"role": "tool", "content": "x"}]}),
    )
    .await
    .assert_problem(400, Some("invalid_role"), Some("messages"));
    let mut body = sdk_body("Hi");
    body["provider"] = json!("gemini");
    post(&api, chat, Some(&t), &body).await.assert_problem(
        400,
        Some("unknown_provider"),
        Some("provider"),
    );
    post(&api, "/api/ai/generate", Some(&t), &json!({"system": "x"}))
        .await
        .assert_problem(400, Some("required"), Some("prompt"));
    // openai_compatible has no base URL here: 503 naming the variable.
    body["provider"] = json!("openai_compatible");
    let r = post(&api, chat, Some(&t), &body).await;
    r.assert_problem(503, Some("not_configured"), None);
    assert!(r.json["detail"]
        .as_str()
        .unwrap()
        .contains("OPENAI_COMPATIBLE_BASE_URL"));
    // Over AI_MAX_INPUT_BYTES (2000 here).
    post(&api, chat, Some(&t), &sdk_body(&"x".repeat(2001)))
        .await
        .assert_problem(413, Some("payload_too_large"), None);
    // Nothing of the refused requests reached the provider.
    assert!(upstream.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_ai_toggle_off_still_serves_the_route_with_its_checks() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    let api = stack
        .api(&env(&stack, &upstream.uri()).with("NEXT_PUBLIC_ENABLE_AI", "false"))
        .await;
    post(&api, "/api/ai/chat", None, &sdk_body("Hi"))
        .await
        .assert_problem(401, None, None);
    let r = post(
        &api,
        "/api/ai/chat",
        Some(&token(Uuid::new_v4())),
        &sdk_body("Hi"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn upstream_failures_before_the_stream_are_problems_and_a_broken_stream_ends_with_error() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    for (needle, status) in [("say401", 401), ("say429", 429), ("say500", 500)] {
        let mut resp = ResponseTemplate::new(status)
            .set_body_json(json!({"error": {"message": "nope", "type": "x"}}));
        if status == 429 {
            resp = resp.insert_header("retry-after", "7");
        }
        Mock::given(method("POST"))
            .and(body_string_contains(needle))
            .respond_with(resp)
            .mount(&upstream)
            .await;
    }
    // A stream cut off after one delta (no usage, no [DONE]).
    let cut = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hal\"}}]}\n\n";
    Mock::given(method("POST"))
        .and(body_string_contains("sayCut"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(cut, "text/event-stream"))
        .mount(&upstream)
        .await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    let t = token(user);

    post(&api, "/api/ai/chat", Some(&t), &sdk_body("say401"))
        .await
        .assert_problem(502, Some("upstream_auth_failed"), None);
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("say429")).await;
    r.assert_problem(429, Some("upstream_rate_limited"), None);
    assert_eq!(r.header_u64("Retry-After"), 7);
    post(
        &api,
        "/api/ai/generate",
        Some(&t),
        &json!({"prompt": "say500"}),
    )
    .await
    .assert_problem(502, Some("upstream_error"), None);
    // Nothing produced: no usage rows.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(usage_rows(&db, user).await.is_empty());

    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("sayCut")).await;
    assert_eq!(r.status, 200);
    let c = chunks(&r);
    assert_eq!(c[..4], expected(&["Hal"])[..4]);
    assert_eq!(c.len(), 5, "{c:?}");
    assert_eq!(c[4]["type"], "error");
    assert_eq!(c[4].as_object().unwrap().len(), 2, "{}", c[4]);
    assert!(c[4]["errorText"].is_string());
    let rows = wait_usage(&db, user, 1).await;
    assert!(rows[0].aborted && rows[0].estimated, "{rows:?}");
    // Broken off before its usage: charged FREE's output cap, not "Hal".
    assert_eq!(rows[0].output_tokens, 2048);
}

#[tokio::test]
async fn request_rate_and_monthly_quota_give_429_with_headers_and_figures() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;

    // FREE: 10 requests per 5 minutes.
    let t = token(Uuid::new_v4());
    for i in 0..10 {
        let r = post(&api, "/api/ai/generate", Some(&t), &json!({"prompt": "x"})).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        assert_eq!(r.header_u64("X-RateLimit-Remaining"), 9 - i);
    }
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("x")).await;
    r.assert_problem(429, Some("rate_limited"), None);
    assert_eq!(r.header_u64("X-RateLimit-Limit"), 10);
    assert_eq!(r.header_u64("X-RateLimit-Remaining"), 0);
    assert!(r.header_u64("Retry-After") <= 300);
    assert!(r.header_u64("X-RateLimit-Reset") > 0);

    // FREE: 20,000 tokens per month; 19,980 already used.
    let user = free_user(&db).await;
    ai_usage::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user),
        provider: Set("openai".into()),
        model: Set("gpt-test".into()),
        route: Set("chat".into()),
        input_tokens: Set(19_000),
        output_tokens: Set(980),
        aborted: Set(false),
        estimated: Set(false),
        created_at: Set(chrono::Utc::now()),
    }
    .insert(&db)
    .await
    .unwrap();
    let t = token(user);
    // Room for the input bound of "x" (1 byte + 8 + 8 = 17 tokens) and 3
    // output tokens: allowed (9 + 2 tokens), counted in Redis when it ends.
    let r = post(&api, "/api/ai/generate", Some(&t), &json!({"prompt": "x"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let over = wait_until(Duration::from_secs(10), || async {
        post(&api, "/api/ai/generate", Some(&t), &json!({"prompt": "x"}))
            .await
            .status
            == 429
    })
    .await;
    assert!(over, "the quota never ran out");
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("x")).await;
    let p = r.assert_problem(429, Some("quota_exceeded"), None);
    // Not even the input bound and one output token fit any more.
    let used = p["used"].as_u64().unwrap();
    assert!(used + 18 > 20_000 && used <= 20_000, "{p}");
    assert_eq!(p["limit"], 20_000);
    assert_eq!(p["plan"], "FREE");
    let reset: chrono::DateTime<chrono::Utc> = p["resets_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        reset,
        entity::ai::limits::next_month_start(chrono::Utc::now())
    );
    assert!(r.header_u64("Retry-After") > 0);
    // The counter agrees with ai_usage once the worker wrote the rows (a
    // usage job that failed under load is retried with backoff: wait for it
    // as long as a retry takes, not for a speed).
    let agrees = wait_until(Duration::from_secs(60), || async {
        let total: i64 = usage_rows(&db, user)
            .await
            .iter()
            .map(|r| i64::from(r.input_tokens + r.output_tokens))
            .sum();
        let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("x")).await;
        r.status == 429 && r.json["used"].as_i64() == Some(total)
    })
    .await;
    assert!(agrees, "ai_usage does not sum to the counter");
}

/// Posts `body` to `path` until the answer's `X-RateLimit-Limit` is `want`,
/// for at most 5 s, and answers the last reply. An api keeps accounts and
/// plans in memory and drops them when PostgreSQL notifies it of a change,
/// which can trail the commit of the change by a moment.
async fn post_until_limit(api: &Proc, path: &str, token: &str, body: &Value, want: u64) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = post(api, path, Some(token), body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        if r.header_u64("X-RateLimit-Limit") == want || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sets the plan and status of `user`'s subscription directly in the
/// database, as settlement, expiry or an operator would.
async fn set_subscription(
    db: &DatabaseConnection,
    user: Uuid,
    plan: &str,
    status: SubscriptionStatus,
) {
    let done = subscriptions::Entity::update_many()
        .col_expr(subscriptions::Column::Plan, Expr::value(plan))
        .col_expr(subscriptions::Column::Status, Expr::value(status))
        .filter(subscriptions::Column::UserId.eq(user))
        .exec(db)
        .await
        .expect("update the subscription");
    assert_eq!(done.rows_affected, 1);
}

/// The limits are the caller's plan in force, read with the session: a new
/// user's FREE, an active paid plan's (also in its renewal grace,
/// `past_due`), and FREE again once that plan has ended (`canceled`). Each change reaches the api at once, cached account or not.
#[tokio::test]
async fn the_callers_plan_in_force_sets_the_limits() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    let api = stack.api_with_worker(&env(&stack, &upstream.uri())).await;
    let db = connect_db(&stack).await;
    let limit_of = |r: &Reply| {
        assert_eq!(r.status, 200, "{}", r.text);
        r.header_u64("X-RateLimit-Limit")
    };

    // First sight: the account and its FREE subscription are created.
    let t = token(Uuid::new_v4());
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("x")).await;
    assert_eq!(limit_of(&r), 10, "FREE");

    let user = free_user(&db).await;
    let t = token(user);
    let chat = sdk_body("x");
    let gen = json!({"prompt": "x"});
    let r = post(&api, "/api/ai/generate", Some(&t), &gen).await;
    assert_eq!(limit_of(&r), 10, "FREE");
    let r = post(&api, "/api/ai/chat", Some(&t), &chat).await;
    assert_eq!(limit_of(&r), 10, "FREE, again (the cached account)");
    set_subscription(&db, user, "PRO", SubscriptionStatus::Active).await;
    let r = post_until_limit(&api, "/api/ai/chat", &t, &chat, 40).await;
    assert_eq!(limit_of(&r), 40, "PRO, active");
    let r = post(&api, "/api/ai/generate", Some(&t), &gen).await;
    assert_eq!(limit_of(&r), 40, "PRO, active");
    // In its renewal grace the plan keeps its limits.
    set_subscription(&db, user, "PRO", SubscriptionStatus::PastDue).await;
    let r = post(&api, "/api/ai/chat", Some(&t), &chat).await;
    assert_eq!(limit_of(&r), 40, "PRO, past due (grace): still PRO");
    set_subscription(&db, user, "PRO", SubscriptionStatus::Canceled).await;
    let r = post_until_limit(&api, "/api/ai/chat", &t, &chat, 10).await;
    assert_eq!(limit_of(&r), 10, "PRO, canceled: FREE");
    set_subscription(&db, user, "ULTIMATE", SubscriptionStatus::Active).await;
    let r = post_until_limit(&api, "/api/ai/generate", &t, &gen, 80).await;
    assert_eq!(limit_of(&r), 80, "ULTIMATE, active");
}

/// The account a chat needs is kept in the api while PostgreSQL reports it
/// unchanged: with the `users` table locked, a known caller still chats and
/// a caller the api has not seen gets 503. When the api's listening
/// connection is cut, nothing cached is trusted until it listens again, and
/// changes made meanwhile are seen.
#[tokio::test]
async fn the_cached_account_spares_the_database_and_is_dropped_when_its_listener_is_cut() {
    let stack = Stack::new().await;
    let upstream = MockServer::start().await;
    openai_mock(&upstream).await;
    let env = env(&stack, &upstream.uri()).with("DEPENDENCY_TIMEOUT_MS", "500");
    let api = stack.api_with_worker(&env).await;
    let db = connect_db(&stack).await;
    let (known, unseen) = (free_user(&db).await, free_user(&db).await);
    let chat = sdk_body("x");
    // The first chat completes the account (its role row); the second, once
    // the notifications of those writes have reached the api (one arriving
    // while the api loads an account keeps it from caching that load), is
    // the load that stays cached.
    for _ in 0..2 {
        let r = post(&api, "/api/ai/chat", Some(&token(known)), &chat).await;
        assert_eq!(r.status, 200, "{}", r.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Lock `users` against reads for as long as the transaction is open.
    let locker = connect_db(&stack).await;
    let txn = locker.begin().await.expect("begin");
    txn.execute_unprepared("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock users");
    let r = post(&api, "/api/ai/chat", Some(&token(known)), &chat).await;
    assert_eq!(
        r.status,
        200,
        "a known caller needs no query: {}; api stderr:\n{}",
        r.text,
        api.stderr()
    );
    let r = post(&api, "/api/ai/chat", Some(&token(unseen)), &chat).await;
    assert_eq!(
        r.status, 503,
        "an unseen caller waits for the lock: {}",
        r.text
    );
    txn.rollback().await.expect("unlock");

    // Cut the api's listening connection, then change the plan: the change
    // is seen although no notification reached the api.
    let listeners = || async {
        db.query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'api-account-listener' \
             AND datname = current_database()",
        ))
        .await
        .expect("pg_stat_activity")
        .len()
    };
    assert_eq!(listeners().await, 1, "the api listens on one connection");
    db.execute_unprepared(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'api-account-listener' AND datname = current_database()",
    )
    .await
    .expect("terminate the listener");
    set_subscription(&db, known, "PRO", SubscriptionStatus::Active).await;
    let r = post_until_limit(&api, "/api/ai/chat", &token(known), &chat, 40).await;
    assert_eq!(
        r.header_u64("X-RateLimit-Limit"),
        40,
        "PRO, seen after the cut"
    );

    // It listens again, and what it caches afterwards follows changes again.
    assert!(
        wait_until(Duration::from_secs(10), || async { listeners().await == 1 }).await,
        "the api listens again"
    );
    let r = post(&api, "/api/ai/chat", Some(&token(known)), &chat).await;
    assert_eq!(r.header_u64("X-RateLimit-Limit"), 40);
    set_subscription(&db, known, "ULTIMATE", SubscriptionStatus::Active).await;
    let r = post_until_limit(&api, "/api/ai/chat", &token(known), &chat, 80).await;
    assert_eq!(
        r.header_u64("X-RateLimit-Limit"),
        80,
        "ULTIMATE, after the reconnect"
    );
}

/// A provider that streams OpenAI chunks on demand: one delta, then waits
/// for `release` before the rest; records whether the api hung up early.
struct SlowUpstream {
    url: String,
    release: Arc<tokio::sync::Notify>,
    hung_up: Arc<AtomicBool>,
    hung_up_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl SlowUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let release = Arc::new(tokio::sync::Notify::new());
        let hung_up = Arc::new(AtomicBool::new(false));
        let hung_up_at = Arc::new(std::sync::Mutex::new(None));
        let (rel, hu, hua) = (release.clone(), hung_up.clone(), hung_up_at.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (rel, hu, hua) = (rel.clone(), hu.clone(), hua.clone());
                tokio::spawn(async move {
                    // Read the request head and its body.
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
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
                                .map(|v| v.trim().parse().unwrap())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break;
                            }
                        }
                    }
                    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                    let first = chunk(
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n",
                    );
                    if sock
                        .write_all(format!("{head}{first}").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    // Wait for the release, or notice the api hanging up.
                    tokio::select! {
                        _ = rel.notified() => {
                            let rest = chunk("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" last\"}}]}\n\n")
                                + &chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n")
                                + &chunk("data: [DONE]\n\n")
                                + "0\r\n\r\n";
                            let _ = sock.write_all(rest.as_bytes()).await;
                            let _ = sock.read(&mut tmp).await;
                        }
                        n = sock.read(&mut tmp) => {
                            if matches!(n, Ok(0) | Err(_)) {
                                *hua.lock().unwrap() = Some(Instant::now());
                                hu.store(true, Ordering::SeqCst);
                            }
                        }
                    }
                });
            }
        });
        SlowUpstream {
            url,
            release,
            hung_up,
            hung_up_at,
        }
    }
}

/// Reads the answer until `needle` has arrived; returns what came so far.
async fn read_until<B: AsRef<[u8]> + std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
    needle: &str,
) -> String {
    let mut got = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !got.contains(needle) {
        let next = tokio::time::timeout_at(deadline.into(), stream.next())
            .await
            .unwrap_or_else(|_| panic!("{needle:?} did not arrive; got {got:?}"));
        match next {
            Some(Ok(b)) => got.push_str(&String::from_utf8_lossy(b.as_ref())),
            other => panic!("stream ended before {needle:?}: {other:?}; got {got:?}"),
        }
    }
    got
}

#[tokio::test]
async fn deltas_are_relayed_as_they_come_and_a_client_hanging_up_cancels_upstream() {
    let stack = Stack::new().await;
    let slow = SlowUpstream::start().await;
    let api = stack.api_with_worker(&env(&stack, &slow.url)).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    let t = token(user);

    // 1. The first delta reaches the client while the provider holds the rest.
    let resp = client()
        .post(api.url("/api/ai/chat"))
        .bearer_auth(&t)
        .json(&sdk_body("Hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", api.stderr());
    let mut s = resp.bytes_stream();
    let got = read_until(&mut s, "\"delta\":\"first\"").await;
    assert!(!got.contains("last"));
    slow.release.notify_one();
    let got = got + &read_until(&mut s, "[DONE]").await;
    assert!(got.contains("\"delta\":\" last\""), "{got}");
    let rows = wait_usage(&db, user, 1).await;
    assert_eq!(
        (rows[0].input_tokens, rows[0].output_tokens, rows[0].aborted),
        (3, 2, false)
    );

    // 2. The client hangs up after the first delta: the api drops the upstream
    //    request (at once; the deadline is generous for a loaded machine, and
    //    far below the 60-s idle timeout, the only other thing that would end
    //    it) and records an aborted, estimated row, charged what the request
    //    reserved (the provider's usage never came).
    let resp = client()
        .post(api.url("/api/ai/chat"))
        .bearer_auth(&t)
        .json(&sdk_body("Hi"))
        .send()
        .await
        .unwrap();
    let mut s = resp.bytes_stream();
    read_until(&mut s, "\"delta\":\"first\"").await;
    let gone = Instant::now();
    drop(s);
    let cancelled = wait_until(Duration::from_secs(20), || async {
        slow.hung_up.load(Ordering::SeqCst)
    })
    .await;
    assert!(
        cancelled,
        "the upstream request was not cancelled within 20 s"
    );
    let at = slow.hung_up_at.lock().unwrap().unwrap();
    assert!(at.duration_since(gone) < Duration::from_secs(20));
    let rows = wait_usage(&db, user, 2).await;
    let aborted = rows.iter().find(|r| r.aborted).expect("an aborted row");
    assert!(aborted.estimated);
    // "Hi": 2 bytes + 8 per message + 8 per request; FREE's output cap.
    assert_eq!((aborted.input_tokens, aborted.output_tokens), (18, 2048));
}

/// `AI_MAX_OPEN_STREAMS` bounds the AI answers one api process keeps open:
/// with two chats streaming, a third is answered 503 `overloaded` at once;
/// once they end, chats are served again.
#[tokio::test]
async fn past_ai_max_open_streams_a_new_chat_is_overloaded() {
    let stack = Stack::new().await;
    let slow = SlowUpstream::start().await;
    let env = env(&stack, &slow.url).with("AI_MAX_OPEN_STREAMS", "2");
    let api = stack.api_with_worker(&env).await;
    let t = token(Uuid::new_v4());
    let mut open = Vec::new();
    for _ in 0..2 {
        let resp = client()
            .post(api.url("/api/ai/chat"))
            .bearer_auth(&t)
            .json(&sdk_body("Hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", api.stderr());
        let mut s = resp.bytes_stream();
        read_until(&mut s, "\"delta\":\"first\"").await;
        open.push(s);
    }
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("Hi")).await;
    r.assert_problem(503, Some("overloaded"), None);
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    let r = post(&api, "/api/ai/generate", Some(&t), &json!({"prompt": "Hi"})).await;
    r.assert_problem(503, Some("overloaded"), None);

    // The two clients hang up: their slots come back.
    drop(open);
    let served = wait_until(Duration::from_secs(10), || async {
        let resp = client()
            .post(api.url("/api/ai/chat"))
            .bearer_auth(&t)
            .json(&sdk_body("Hi"))
            .send()
            .await
            .unwrap();
        resp.status() == 200
    })
    .await;
    assert!(served, "no chat was served after the open ones ended");
}

#[tokio::test]
async fn a_request_in_flight_counts_against_the_quota_until_it_settles() {
    let stack = Stack::new().await;
    let slow = SlowUpstream::start().await;
    let api = stack.api_with_worker(&env(&stack, &slow.url)).await;
    let db = connect_db(&stack).await;
    // FREE: 20,000 tokens; 19,900 used.
    let user = free_user(&db).await;
    ai_usage::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user),
        provider: Set("openai".into()),
        model: Set("gpt-test".into()),
        route: Set("chat".into()),
        input_tokens: Set(19_900),
        output_tokens: Set(0),
        aborted: Set(false),
        estimated: Set(false),
        created_at: Set(chrono::Utc::now()),
    }
    .insert(&db)
    .await
    .unwrap();
    let t = token(user);

    // 40 bytes of input (bound: 40 + 8 + 8 = 56 tokens) and an output cap of
    // the 44 tokens left: all 100 are reserved while the answer streams.
    let resp = client()
        .post(api.url("/api/ai/chat"))
        .bearer_auth(&t)
        .json(&sdk_body(&"x".repeat(40)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut s = resp.bytes_stream();
    read_until(&mut s, "\"delta\":\"first\"").await;
    let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body("x")).await;
    let p = r.assert_problem(429, Some("quota_exceeded"), None);
    assert_eq!(p["used"], 20_000, "{p}");

    // Once it ends, the counter holds its real tokens (3 + 2): 19,905. (A
    // 200-byte question cannot fit in the 95 left, so it shows the counter.)
    slow.release.notify_one();
    read_until(&mut s, "[DONE]").await;
    let settled = wait_until(Duration::from_secs(10), || async {
        let r = post(&api, "/api/ai/chat", Some(&t), &sdk_body(&"y".repeat(200))).await;
        r.status == 429 && r.json["used"] == 19_905
    })
    .await;
    assert!(
        settled,
        "the reservation was not settled to the real tokens"
    );
    let rows = wait_usage(&db, user, 2).await;
    let total: i32 = rows.iter().map(|r| r.input_tokens + r.output_tokens).sum();
    assert_eq!(total, 19_905);
}
