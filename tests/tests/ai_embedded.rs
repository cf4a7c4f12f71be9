//! AI in the embedded mode (SQLite, no Redis): the usage job goes through the
//! SQLite queue, the request limit is counted in process and the monthly quota
//! is counted in SQLite (`ai_quota_counters`, seeded from `ai_usage`), where
//! each request reserves its input bound and output cap at once.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{hs256_token, plans_file, session_claims, EnvMap, Proc, Reply, TempDir};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, Respond, ResponseTemplate,
};

const JWT_SECRET: &str = "jwt-secret-dummy-0123456789abcdef0123456789";

/// Each answer costs 15,000 tokens: the FREE quota (20,000) allows two.
const OPENAI_SSE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":14000,\"completion_tokens\":1000,\"total_tokens\":15000}}\n\n\
data: [DONE]\n\n";

#[tokio::test(flavor = "multi_thread")]
async fn quota_is_summed_from_sqlite_and_usage_goes_through_the_sqlite_queue() {
    let dir = TempDir::new();
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(OPENAI_SSE, "text/event-stream"))
        .mount(&upstream)
        .await;
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with_other_features_configured()
        .with("OPENAI_BASE_URL", format!("{}/v1", upstream.uri()));
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let user = Uuid::new_v4();
    let t = hs256_token(
        JWT_SECRET.as_bytes(),
        &session_claims(&user.to_string(), None),
    );
    let generate = || {
        Reply::send(
            tests::client()
                .post(api.url("/api/ai/generate"))
                .bearer_auth(&t)
                .json(&json!({"prompt": "x"})),
        )
    };

    let r = generate().await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["usage"],
        json!({"inputTokens": 14000, "outputTokens": 1000})
    );
    // The counter holds 15,000 (< 20,000) once the answer settled, so more are
    // allowed, and once it reaches 20,000 the quota is used up. (This fake
    // counts 14,000 input tokens for "x", far past any bound of its input, so
    // one answer can overshoot; a real provider counts at most the bound.)
    let mut oks = 1;
    let mut last = None;
    // At most 9 more: FREE allows 10 requests per 5 minutes.
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let r = generate().await;
        if r.status == 429 {
            last = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text);
        oks += 1;
    }
    let r = last.expect("the quota never ran out");
    let p = r.assert_problem(429, Some("quota_exceeded"), None);
    assert_eq!(p["limit"], 20_000);
    assert_eq!(p["plan"], "FREE");
    assert!(oks >= 2, "15,000 tokens leave room for one more answer");
    // `used` is exactly the sum of the recorded answers.
    let used = p["used"].as_u64().unwrap();
    assert!(used >= 20_000, "{p}");
    assert_eq!(used % 15_000, 0, "{p}");
    assert!(used / 15_000 <= oks, "{p}: {oks} answers");
}

/// An OpenAI-like provider that honours `max_completion_tokens`: exactly
/// that many output tokens (the worst case), 4,000 when no cap is sent; the
/// input counted as OpenAI's chat format does (bytes + 3 per message + 3).
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
        let output = body["max_completion_tokens"].as_u64().unwrap_or(4_000);
        let sse = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}},\"finish_reason\":\"length\"}}]}}\n\n\
data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output},\"total_tokens\":{}}}}}\n\n\
data: [DONE]\n\n",
            input + output
        );
        ResponseTemplate::new(200).set_body_raw(sse, "text/event-stream")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_requests_at_once_never_take_the_month_past_the_quota_on_sqlite() {
    let dir = TempDir::new();
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(HonoursTheCap)
        .mount(&upstream)
        .await;
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with_other_features_configured()
        .with("OPENAI_BASE_URL", format!("{}/v1", upstream.uri()));
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let user = Uuid::new_v4();
    let t = hs256_token(
        JWT_SECRET.as_bytes(),
        &session_claims(&user.to_string(), None),
    );
    // Make the user known first (one request), then ten at once.
    let generate = || {
        Reply::send(
            tests::client()
                .post(api.url("/api/ai/generate"))
                .bearer_auth(&t)
                .json(&json!({"prompt": "x"})),
        )
    };
    let mut replies = vec![generate().await];
    replies.extend(futures::future::join_all((0..9).map(|_| generate())).await);
    let mut total = 0;
    let mut admitted = 0;
    for r in &replies {
        if r.status == 200 {
            admitted += 1;
            total += r.json["usage"]["inputTokens"].as_u64().unwrap()
                + r.json["usage"]["outputTokens"].as_u64().unwrap();
        } else {
            r.assert_problem(429, Some("quota_exceeded"), None);
        }
    }
    // FREE: 20,000 tokens, 2,048 output tokens per request at most.
    assert!(admitted >= 9, "{admitted} admitted, {total} tokens");
    assert!(total <= 20_000, "{admitted} admitted, {total} tokens");
}
