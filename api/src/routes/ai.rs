//! `POST /api/ai/chat` (AI SDK UI message stream v1) and `POST /api/ai/generate`.
//!
//! Order of checks, before any upstream call: session (401), body (400),
//! provider (400 unknown, 503 not configured), input size (413), the plan's
//! requests per 5 minutes (429 with `X-RateLimit-*` and `Retry-After`), the
//! plan's monthly tokens (429 with `used`, `limit`, `plan`, `resets_at`).
//!
//! The monthly counter lives in Redis (`<QUEUE_PREFIX>:ai:tokens:<user>:<YYYYMM>`),
//! seeded from `SUM(input_tokens + output_tokens)` over `ai_usage` when absent.
//! An admitted request adds its estimated input tokens at once (in flight) and
//! the difference to its real tokens when its usage job is queued (a request
//! the provider refused gives its reservation back); without Redis (embedded
//! mode) the sum is read from the database on each request. Concurrent
//! requests can overshoot the quota by at most the output of those in flight.

use std::{
    sync::LazyLock,
    time::{Duration, Instant},
};

use chrono::Utc;
use entity::ai::{self as rules, ChatMessage, Provider, Role, UsageRecord};
use futures::StreamExt;
use poem::{http::StatusCode, web::Data};
use poem_openapi::{payload::Json, types::ToJSON, ApiResponse, Enum, Object, OpenApi, Union};
use serde_json::Value;
use uuid::Uuid;
use worker::{
    ai::{merge, AiError, AiEvent, AiStream, Target, Usage},
    jobs::RecordAiUsage,
    Job,
};

use super::ApiTags;
use crate::{
    auth::{BearerAuth, Gate},
    payload::{JsonBody, RawJson},
    problem::{ApiError, Problem, RateInfo},
    rate_limit::{self, Limit, LimitKey},
    state::AppState,
};

// ---------------------------------------------------------------- requests

/// One part of an AI SDK `UIMessage`. Only `text` parts are sent to the
/// model; other parts (`step-start`, `reasoning`, `file`, …) are ignored.
#[derive(Debug, Clone, Object)]
pub struct UiMessagePart {
    /// Part kind, e.g. `text`.
    #[oai(rename = "type")]
    pub type_: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// An AI provider, as the `provider` field names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "snake_case")]
pub enum AiProvider {
    /// OpenAI Chat Completions (`OPENAI_API_KEY`).
    Openai,
    /// Anthropic Messages API (`ANTHROPIC_API_KEY`).
    Anthropic,
    /// Any server speaking Chat Completions (`OPENAI_COMPATIBLE_BASE_URL`).
    OpenaiCompatible,
}

impl From<AiProvider> for Provider {
    fn from(p: AiProvider) -> Self {
        match p {
            AiProvider::Openai => Provider::Openai,
            AiProvider::Anthropic => Provider::Anthropic,
            AiProvider::OpenaiCompatible => Provider::OpenaiCompatible,
        }
    }
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "lowercase")]
pub enum ChatRole {
    /// Instructions.
    System,
    /// The person chatting.
    User,
    /// The model.
    Assistant,
}

/// A chat message: the AI SDK's `UIMessage` (`{id, role, parts}`) or the
/// simple `{role, content}` shape. `content` wins when both are given.
#[derive(Debug, Clone, Object)]
pub struct ChatMessageIn {
    /// Message id (AI SDK; ignored).
    pub id: Option<String>,
    /// `system`, `user` or `assistant`.
    pub role: ChatRole,
    /// The text (simple shape).
    pub content: Option<String>,
    /// The parts (AI SDK shape); the texts of the `text` parts are joined.
    pub parts: Option<Vec<UiMessagePart>>,
}

/// The chat request: what the AI SDK's `DefaultChatTransport` sends (`id`,
/// `messages`, `trigger`, `messageId`; other keys are ignored), plus the
/// optional `provider`.
#[derive(Debug, Clone, Object)]
pub struct ChatRequest {
    /// AI provider: `openai`, `anthropic` or `openai_compatible`; default
    /// `AI_DEFAULT_PROVIDER`. Another value is 400 `unknown_provider`.
    pub provider: Option<AiProvider>,
    /// The conversation, oldest first; at least one message with text
    /// (`content`, or `text` parts).
    #[oai(validator(min_items = 1))]
    pub messages: Vec<ChatMessageIn>,
    /// Chat id (AI SDK; ignored).
    pub id: Option<String>,
    /// `submit-message` or `regenerate-message` (AI SDK; ignored).
    pub trigger: Option<String>,
    /// Id of the message to regenerate (AI SDK; ignored).
    #[oai(rename = "messageId")]
    pub message_id: Option<String>,
}

/// A one-shot generation request.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields)]
pub struct GenerateRequest {
    /// The prompt (at least 1 character).
    #[oai(validator(min_length = 1))]
    pub prompt: String,
    /// Optional system instructions.
    pub system: Option<String>,
    /// AI provider: `openai`, `anthropic` or `openai_compatible`; default
    /// `AI_DEFAULT_PROVIDER`.
    pub provider: Option<AiProvider>,
}

/// Token counts of one answer.
#[derive(Debug, Clone, Object)]
pub struct TokenUsage {
    /// Prompt tokens (the provider's count, else an estimate).
    #[oai(rename = "inputTokens")]
    pub input_tokens: i32,
    /// Answer tokens (the provider's count, else an estimate).
    #[oai(rename = "outputTokens")]
    pub output_tokens: i32,
}

/// A generated text.
#[derive(Debug, Clone, Object)]
pub struct GenerateResult {
    /// The model's answer.
    pub text: String,
    /// Token counts.
    pub usage: TokenUsage,
}

// ---------------------------------------------------------------- stream chunks

/// `{"type":"start","messageId":…}`: the assistant message begins.
#[derive(Debug, Clone, Object)]
pub struct StartChunk {
    /// Id of the assistant message.
    #[oai(rename = "messageId")]
    pub message_id: String,
}

/// `{"type":"start-step"}`.
#[derive(Debug, Clone, Object)]
pub struct StartStepChunk {}

/// `{"type":"text-start","id":…}`: a text part begins.
#[derive(Debug, Clone, Object)]
pub struct TextStartChunk {
    /// Text part id.
    pub id: String,
}

/// `{"type":"text-delta","id":…,"delta":…}`: more text of the part.
#[derive(Debug, Clone, Object)]
pub struct TextDeltaChunk {
    /// Text part id.
    pub id: String,
    /// The next piece of text.
    pub delta: String,
}

/// `{"type":"text-end","id":…}`: the text part is complete.
#[derive(Debug, Clone, Object)]
pub struct TextEndChunk {
    /// Text part id.
    pub id: String,
}

/// `{"type":"finish-step"}`.
#[derive(Debug, Clone, Object)]
pub struct FinishStepChunk {}

/// `{"type":"finish"}`: the assistant message is complete.
#[derive(Debug, Clone, Object)]
pub struct FinishChunk {}

/// `{"type":"error","errorText":…}`: the answer broke off; the stream ends.
#[derive(Debug, Clone, Object)]
pub struct ErrorChunk {
    /// What went wrong, for humans.
    #[oai(rename = "errorText")]
    pub error_text: String,
}

/// One chunk of the AI SDK UI message stream v1, sent as `data: <json>\n\n`.
/// A normal answer is `start`, `start-step`, `text-start`, `text-delta`…,
/// `text-end`, `finish-step`, `finish`; a broken one ends with `error`. The
/// stream then ends with `data: [DONE]` (the `null` item of this schema).
#[derive(Debug, Clone, Union)]
#[oai(discriminator_name = "type")]
pub enum UiChunk {
    /// `start`
    #[oai(mapping = "start")]
    Start(StartChunk),
    /// `start-step`
    #[oai(mapping = "start-step")]
    StartStep(StartStepChunk),
    /// `text-start`
    #[oai(mapping = "text-start")]
    TextStart(TextStartChunk),
    /// `text-delta`
    #[oai(mapping = "text-delta")]
    TextDelta(TextDeltaChunk),
    /// `text-end`
    #[oai(mapping = "text-end")]
    TextEnd(TextEndChunk),
    /// `finish-step`
    #[oai(mapping = "finish-step")]
    FinishStep(FinishStepChunk),
    /// `finish`
    #[oai(mapping = "finish")]
    Finish(FinishChunk),
    /// `error`
    #[oai(mapping = "error")]
    Error(ErrorChunk),
}

// ---------------------------------------------------------------- answers

/// Problem details of an AI 429: the request-rate limit (`rate_limited`),
/// the monthly token quota (`quota_exceeded`, with `used`, `limit`, `plan`,
/// `resets_at`) or the provider's own limit (`upstream_rate_limited`).
#[derive(Debug, Clone, Object)]
pub struct AiLimitProblem {
    /// `/problems/<code>`.
    #[oai(rename = "type")]
    pub type_: String,
    /// `Too Many Requests`.
    pub title: String,
    /// 429.
    pub status: u16,
    /// What went wrong, for humans.
    pub detail: String,
    /// `rate_limited`, `quota_exceeded` or `upstream_rate_limited`.
    pub code: String,
    /// Same text as `detail`.
    pub error: String,
    /// Tokens used this calendar month (UTC), `quota_exceeded` only.
    #[oai(skip_serializing_if_is_none)]
    pub used: Option<u64>,
    /// The plan's monthly tokens, `quota_exceeded` only.
    #[oai(skip_serializing_if_is_none)]
    pub limit: Option<u64>,
    /// The caller's plan, `quota_exceeded` only.
    #[oai(skip_serializing_if_is_none)]
    pub plan: Option<String>,
    /// When the quota resets (RFC 3339, the next month's first instant UTC),
    /// `quota_exceeded` only.
    #[oai(skip_serializing_if_is_none)]
    pub resets_at: Option<String>,
}

impl AiLimitProblem {
    fn new(code: &str, detail: String) -> Self {
        AiLimitProblem {
            type_: format!("/problems/{code}"),
            title: "Too Many Requests".into(),
            status: 429,
            error: detail.clone(),
            detail,
            code: code.into(),
            used: None,
            limit: None,
            plan: None,
            resets_at: None,
        }
    }
}

/// The chunk stream of a chat answer (`None` = `data: [DONE]`).
pub type ChunkStream = crate::sse::SseStream<Option<UiChunk>>;

/// Answers of `POST /api/ai/chat`.
#[derive(ApiResponse)]
pub enum ChatResponse {
    /// The AI SDK UI message stream v1 (`text/event-stream`): one `data:
    /// <chunk JSON>` event per chunk, relayed as the provider produces text,
    /// then `data: [DONE]`. Headers `x-vercel-ai-ui-message-stream: v1`,
    /// `cache-control: no-cache`, `x-accel-buffering: no`.
    #[oai(status = 200)]
    Ok(
        ChunkStream,
        /// Always `v1`.
        #[oai(header = "x-vercel-ai-ui-message-stream")]
        String,
        /// Requests allowed per 5 minutes on the caller's plan.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now.
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
    ),
    /// Too many requests in 5 minutes (`rate_limited`), the monthly token
    /// quota is used up (`quota_exceeded`, with `used`, `limit`, `plan`,
    /// `resets_at`), or the provider limited us (`upstream_rate_limited`).
    #[oai(status = 429, content_type = "application/problem+json")]
    TooManyRequests(
        Json<AiLimitProblem>,
        /// Requests allowed per 5 minutes on the caller's plan.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now.
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
        /// Seconds to wait before retrying.
        #[oai(header = "Retry-After")]
        u64,
    ),
}

/// Answers of `POST /api/ai/generate`.
#[derive(ApiResponse)]
pub enum GenerateResponse {
    /// The answer and its token counts.
    #[oai(status = 200)]
    Ok(
        Json<GenerateResult>,
        /// Requests allowed per 5 minutes on the caller's plan.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now.
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
    ),
    /// Too many requests in 5 minutes (`rate_limited`), the monthly token
    /// quota is used up (`quota_exceeded`), or the provider limited us
    /// (`upstream_rate_limited`).
    #[oai(status = 429, content_type = "application/problem+json")]
    TooManyRequests(
        Json<AiLimitProblem>,
        /// Requests allowed per 5 minutes on the caller's plan.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now.
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
        /// Seconds to wait before retrying.
        #[oai(header = "Retry-After")]
        u64,
    ),
}

crate::problem_responses!(
    /// Errors of the AI routes.
    AiErrorResponse {
        BadRequest = 400: "`messages` (chat) or `prompt` (generate) is missing or empty, a message has no text or a role other than `system`/`user`/`assistant`, `provider` is unknown (`unknown_provider`), or the body is not JSON; `field` names the field.",
        Unauthorized = 401: "No valid session token.",
        PayloadTooLarge = 413: "The messages' text exceeds `AI_MAX_INPUT_BYTES` (default 65536 bytes), or the body exceeds 64 KiB.",
        InternalServerError = 500: "Unexpected failure.",
        BadGateway = 502: "The AI provider refused the request (`upstream_auth_failed`: our key was refused; `upstream_error`: it failed) before sending any text.",
        ServiceUnavailable = 503: "Auth is off or not configured, the AI provider is not configured (`not_configured`; `detail` names the variable: `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `OPENAI_COMPATIBLE_BASE_URL`), the provider cannot be reached or did not answer in time (`upstream_unavailable`), or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// What stops a request before the answer.
enum Refusal {
    Api(ApiError),
    Gateway(&'static str, String),
    Limit(Box<AiLimitProblem>, RateInfo),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Refusal::Api(e)
    }
}

impl Refusal {
    /// The 429 answer when this is one, else the error answer (the handlers'
    /// own error type, as large as theirs).
    #[allow(clippy::result_large_err)]
    fn split(self) -> Result<(AiLimitProblem, RateInfo), AiErrorResponse> {
        match self {
            Refusal::Limit(p, r) => Ok((*p, r)),
            Refusal::Api(ApiError::RateLimited(r)) => Ok((
                AiLimitProblem::new(
                    "rate_limited",
                    format!(
                        "rate limit exceeded: {} AI requests per 5 minutes on your plan; retry in {} s",
                        r.limit, r.retry_after
                    ),
                ),
                r,
            )),
            Refusal::Api(e) => Err(e.into()),
            Refusal::Gateway(code, detail) => Err(AiErrorResponse::BadGateway(Json(Problem::new(
                StatusCode::BAD_GATEWAY,
                code,
                detail,
                None,
            )))),
        }
    }
}

// ---------------------------------------------------------------- routes

/// AI chat and generation.
pub struct AiApi;

#[OpenApi(prefix_path = "/api")]
impl AiApi {
    /// Chat (streamed)
    ///
    /// Streams the model's answer as the AI SDK UI message stream v1, so
    /// `useChat` with its default transport reads it directly. Accepts the
    /// AI SDK request body and the simple `{role, content}` messages. Usage
    /// is recorded by the worker when the answer ends (also when the client
    /// goes away or the provider breaks off: marked aborted). A provider
    /// failure before any text is a problem answer (502/503/429); after it,
    /// an `error` chunk ends the stream. The AI toggle
    /// (`NEXT_PUBLIC_ENABLE_AI`) only hides AI surfaces: this route still
    /// enforces auth, provider configuration and limits.
    #[oai(
        path = "/ai/chat",
        method = "post",
        operation_id = "aiChat",
        tag = "ApiTags::Ai"
    )]
    async fn chat(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        body: RawJson<ChatRequest>,
    ) -> Result<ChatResponse, AiErrorResponse> {
        match chat_inner(&state, &auth, &body.bytes).await {
            Ok((stream, rate)) => Ok(ChatResponse::Ok(
                stream,
                "v1".into(),
                rate.limit,
                rate.remaining,
                rate.reset,
            )),
            Err(r) => {
                let (p, i) = r.split()?;
                Ok(ChatResponse::TooManyRequests(
                    Json(p),
                    i.limit,
                    i.remaining,
                    i.reset,
                    i.retry_after,
                ))
            }
        }
    }

    /// Generate text (one shot)
    ///
    /// Sends `prompt` (and `system`, when given) to the provider and answers
    /// the whole text with its token counts. Same limits as chat.
    #[oai(
        path = "/ai/generate",
        method = "post",
        operation_id = "aiGenerate",
        tag = "ApiTags::Ai"
    )]
    async fn generate(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        body: JsonBody<GenerateRequest>,
    ) -> Result<GenerateResponse, AiErrorResponse> {
        match generate_inner(&state, &auth, body.0).await {
            Ok((result, rate)) => Ok(GenerateResponse::Ok(
                Json(result),
                rate.limit,
                rate.remaining,
                rate.reset,
            )),
            Err(r) => {
                let (p, i) = r.split()?;
                Ok(GenerateResponse::TooManyRequests(
                    Json(p),
                    i.limit,
                    i.remaining,
                    i.reset,
                    i.retry_after,
                ))
            }
        }
    }
}

/// The parsed chat body: provider name (if any) and the messages. Every
/// documented field is checked for its type (a present field must have it;
/// `null` is not a string); unknown keys are ignored.
fn parse_chat(bytes: &[u8]) -> Result<(Option<String>, Vec<ChatMessage>), ApiError> {
    use entity::validate::FieldError;
    let bad = |field: &'static str, code: &'static str, msg: String| -> ApiError {
        FieldError::new(field, code, msg).into()
    };
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    };
    for field in ["id", "trigger", "messageId"] {
        if map.get(field).is_some_and(|v| !v.is_string()) {
            let name = match field {
                "id" => "id",
                "trigger" => "trigger",
                _ => "messageId",
            };
            return Err(bad(
                name,
                "invalid_type",
                format!("{name} must be a string"),
            ));
        }
    }
    let provider = match map.get("provider") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(bad(
                "provider",
                "invalid_type",
                "provider must be a string".into(),
            ))
        }
    };
    let list = match map.get("messages") {
        None | Some(Value::Null) => {
            return Err(bad("messages", "required", "messages is required".into()))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(bad(
                "messages",
                "empty",
                "messages must hold at least one message".into(),
            ))
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(bad(
                "messages",
                "invalid_type",
                "messages must be an array".into(),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let invalid = |what: &str| bad("messages", "invalid_type", format!("messages[{i}]{what}"));
        let Value::Object(m) = m else {
            return Err(invalid(" must be an object"));
        };
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .and_then(Role::parse)
            .ok_or_else(|| {
                bad(
                    "messages",
                    "invalid_role",
                    format!("messages[{i}].role must be system, user or assistant"),
                )
            })?;
        if m.get("id").is_some_and(|v| !v.is_string()) {
            return Err(invalid(".id must be a string"));
        }
        let content = match m.get("content") {
            None => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(_) => return Err(invalid(".content must be a string")),
        };
        let parts = match m.get("parts") {
            None => None,
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let Value::Object(p) = p else {
                        return Err(invalid(&format!(".parts[{j}] must be an object")));
                    };
                    let Some(kind) = p.get("type").and_then(Value::as_str) else {
                        return Err(invalid(&format!(".parts[{j}].type must be a string")));
                    };
                    match p.get("text") {
                        None => {}
                        Some(Value::String(t)) if kind == "text" => text.push_str(t),
                        Some(Value::String(_)) => {}
                        Some(_) => {
                            return Err(invalid(&format!(".parts[{j}].text must be a string")))
                        }
                    }
                }
                Some(text)
            }
            Some(_) => return Err(invalid(".parts must be an array")),
        };
        let Some(content) = content.or(parts) else {
            return Err(bad(
                "messages",
                "required",
                format!("messages[{i}] needs content (a string) or parts (an array)"),
            ));
        };
        if !content.is_empty() {
            out.push(ChatMessage { role, content });
        }
    }
    if out.is_empty() {
        return Err(bad("messages", "empty", "no message holds any text".into()));
    }
    Ok((provider, out))
}

/// What the checks leave for the upstream call.
struct Admitted {
    user_id: Uuid,
    target: Target,
    rate: RateInfo,
    /// Tokens reserved in the month counter for this request while it runs
    /// (its estimated input), and when: settled when it ends.
    reserved: (i64, chrono::DateTime<Utc>),
}

/// The caller's session and the id of its plan, read together in one query.
/// (Reading the plan in parallel with the session was tried: 29 of 500
/// simultaneous chats then waited past the pool's acquire deadline, see
/// BENCHMARKS.md.)
async fn session_and_plan(
    state: &AppState,
    auth: &BearerAuth,
) -> Result<(entity::users::UserContext, String), ApiError> {
    state.session_with_plan(auth, Gate::Auth).await
}

/// Provider, size, configuration and both limits, in that order; `plan_id`
/// is the caller's plan ([`session_and_plan`]).
async fn admit(
    state: &AppState,
    user_id: Uuid,
    plan_id: &str,
    provider: Option<&str>,
    messages: &[ChatMessage],
) -> Result<Admitted, Refusal> {
    let name = provider.unwrap_or(&state.settings.ai_default_provider);
    let provider = Provider::parse(name).ok_or_else(|| {
        ApiError::Field(entity::validate::FieldError::new(
            "provider",
            "unknown_provider",
            format!("unknown provider {name:?}: use openai, anthropic or openai_compatible"),
        ))
    })?;
    let bytes = rules::input_bytes(messages);
    if bytes > state.settings.ai_max_input_bytes {
        return Err(ApiError::TooLarge(format!(
            "the input is {bytes} bytes; at most {} (AI_MAX_INPUT_BYTES) are accepted",
            state.settings.ai_max_input_bytes
        ))
        .into());
    }
    let target = state
        .ai
        .target(provider)
        .map_err(|e| ApiError::Unavailable {
            code: "not_configured",
            detail: e.to_string(),
        })?;
    let plan = state
        .plans
        .get(plan_id)
        .or_else(|| state.plans.get(entity::plans::FREE))
        .ok_or_else(|| ApiError::internal("the plan catalogue has no FREE plan"))?;
    let limit = Limit {
        name: "ai",
        max: plan.ai_requests_per_5min,
        window: Duration::from_secs(300),
    };
    // Count the request as in flight: its estimated input now, the
    // difference to its real tokens when it ends.
    let estimate = i64::from(rules::estimate_tokens(bytes));
    let now = Utc::now();
    let (rate, used, reserved) = match state.limiter.limit_key(limit, &user_id.to_string()) {
        Some(window) => {
            gate_redis(
                state,
                window,
                limit,
                user_id,
                plan.ai_tokens_per_month,
                estimate,
                now,
            )
            .await?
        }
        None => {
            gate_local(
                state,
                limit,
                user_id,
                plan.ai_tokens_per_month,
                estimate,
                now,
            )
            .await?
        }
    };
    if let (Some(limit), Some(used)) = (plan.ai_tokens_per_month, used) {
        if let Err(q) = rules::check_quota(&plan.id, Some(limit), used, now) {
            return Err(quota_refusal(q, now, rate));
        }
    }
    Ok(Admitted {
        user_id,
        target,
        rate,
        reserved: (if reserved { estimate } else { 0 }, now),
    })
}

/// The 429 `quota_exceeded` answer.
fn quota_refusal(q: rules::QuotaExceeded, now: chrono::DateTime<Utc>, rate: RateInfo) -> Refusal {
    let mut p = AiLimitProblem::new(
        "quota_exceeded",
        format!(
            "monthly AI quota used up: {} of {} tokens on plan {}; resets at {}",
            q.used,
            q.limit,
            q.plan,
            q.resets_at.to_rfc3339()
        ),
    );
    let retry = (q.resets_at - now).num_seconds().max(1) as u64;
    p.used = Some(q.used);
    p.limit = Some(q.limit);
    p.plan = Some(q.plan);
    p.resets_at = Some(
        q.resets_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    );
    Refusal::Limit(
        Box::new(p),
        RateInfo {
            retry_after: retry,
            ..rate
        },
    )
}

/// The rate limit's headers, the month's tokens used (`None`: no quota on the plan,
/// or not checked) and whether this request's estimate was reserved.
type Gated = (RateInfo, Option<u64>, bool);

/// Both limits in one Redis script (one round trip, atomic): count the
/// request against the plan's requests per 5 minutes (GCRA, as
/// [`RateLimiter::check`]); when allowed and the plan has a quota,
/// read the month counter and, while under the quota, reserve the estimate.
/// An absent counter is seeded from `ai_usage` (once per user and month) by a
/// second script. Redis failing or slow: the in-process limiter and the
/// database sum decide, and nothing is reserved (as [`RateLimiter::check`]).
async fn gate_redis(
    state: &AppState,
    window: LimitKey,
    limit: Limit,
    user_id: Uuid,
    quota: Option<u64>,
    estimate: i64,
    now: chrono::DateTime<Utc>,
) -> Result<Gated, Refusal> {
    let counter = counter_key(state, user_id, now);
    let mut conn = window.conn.clone();
    let mut inv = GATE.key(&window.key);
    inv.key(&counter)
        .arg(window.max)
        .arg(window.window_us)
        .arg(quota.map_or(-1, |q| i64::try_from(q).unwrap_or(i64::MAX)))
        .arg(estimate);
    let budget = state.settings.dependency_timeout;
    let got = tokio::time::timeout(budget, inv.invoke_async::<Vec<i64>>(&mut conn)).await;
    let reply = match got {
        Ok(Ok(r)) if r.len() >= 6 => r,
        other => {
            match other {
                Ok(Ok(r)) => tracing::warn!(?r, "unexpected AI gate reply; limiting in process"),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "AI gate store unavailable; limiting in process")
                }
                Err(_) => tracing::warn!("AI gate store timed out; limiting in process"),
            }
            return gate_fallback(state, limit, user_id, quota, now).await;
        }
    };
    let Some(decision) = rate_limit::decide_gcra(limit, &reply) else {
        return gate_fallback(state, limit, user_id, quota, now).await;
    };
    if !decision.allowed {
        return Err(ApiError::RateLimited(decision.info).into());
    }
    let rate = decision.info;
    let Some(quota) = quota else {
        return Ok((rate, None, false));
    };
    if reply[5] >= 0 {
        let reserved = reply.get(6).copied() == Some(1);
        return Ok((rate, Some(reply[5] as u64), reserved));
    }
    // No counter for this month yet: seed it from the database.
    let sum = state
        .bounded_db(
            "summing AI usage",
            rules::tokens_this_month(&state.db, user_id, now),
        )
        .await?;
    let mut inv = SEED.key(&counter);
    inv.arg(sum)
        .arg(COUNTER_TTL_SECS)
        .arg(i64::try_from(quota).unwrap_or(i64::MAX))
        .arg(estimate);
    match tokio::time::timeout(budget, inv.invoke_async::<Vec<i64>>(&mut conn)).await {
        Ok(Ok(r)) if r.len() == 2 => Ok((rate, Some(r[0].max(0) as u64), r[1] == 1)),
        _ => {
            tracing::warn!("could not seed the AI quota counter");
            Ok((rate, Some(sum), false))
        }
    }
}

/// Redis did not answer the gate: the in-process limiter, the database sum.
async fn gate_fallback(
    state: &AppState,
    limit: Limit,
    user_id: Uuid,
    quota: Option<u64>,
    now: chrono::DateTime<Utc>,
) -> Result<Gated, Refusal> {
    let decision = state.limiter.check_in_process(limit, &user_id.to_string());
    if !decision.allowed {
        return Err(ApiError::RateLimited(decision.info).into());
    }
    let used = match quota {
        Some(_) => Some(
            state
                .bounded_db(
                    "summing AI usage",
                    rules::tokens_this_month(&state.db, user_id, now),
                )
                .await?,
        ),
        None => None,
    };
    Ok((decision.info, used, false))
}

/// Without Redis (embedded mode): the in-process limiter, then the month's
/// sum from the database on each request (nothing to reserve).
async fn gate_local(
    state: &AppState,
    limit: Limit,
    user_id: Uuid,
    quota: Option<u64>,
    estimate: i64,
    now: chrono::DateTime<Utc>,
) -> Result<Gated, Refusal> {
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let rate = state
        .limit_user("ai", user_id, limit.max, limit.window, deadline)
        .await?;
    let Some(quota) = quota else {
        return Ok((rate, None, false));
    };
    let used = quota_used(state, user_id, now).await?;
    let reserved = used < quota && quota_add(state, user_id, now, estimate).await;
    Ok((rate, Some(used), reserved))
}

/// Maps a failure before any text to its answer.
fn refuse_upstream(e: AiError, rate: RateInfo) -> Refusal {
    tracing::warn!(error = %e, "AI provider failed before the answer");
    match e {
        AiError::NotConfigured { .. } => Refusal::Api(ApiError::Unavailable {
            code: "not_configured",
            detail: e.to_string(),
        }),
        AiError::Status {
            status: 429,
            retry_after,
        } => Refusal::Limit(
            Box::new(AiLimitProblem::new(
                "upstream_rate_limited",
                "the AI provider is limiting our requests; try again shortly".into(),
            )),
            RateInfo {
                retry_after: retry_after.unwrap_or(30).max(1),
                ..rate
            },
        ),
        AiError::Status {
            status: 401 | 403, ..
        } => Refusal::Gateway(
            "upstream_auth_failed",
            "the AI provider refused this server's credentials".into(),
        ),
        AiError::Status { status, .. } => Refusal::Gateway(
            "upstream_error",
            format!("the AI provider failed (HTTP {status}); try again shortly"),
        ),
        AiError::Unreachable(_) | AiError::Timeout => Refusal::Api(ApiError::Unavailable {
            code: "upstream_unavailable",
            detail:
                "the AI provider cannot be reached or did not answer in time; try again shortly"
                    .into(),
        }),
        AiError::Broken(_) | AiError::Upstream(_) => Refusal::Gateway(
            "upstream_error",
            "the AI provider failed before answering; try again shortly".into(),
        ),
    }
}

async fn chat_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: &[u8],
) -> Result<(ChunkStream, RateInfo), Refusal> {
    let (user, plan) = session_and_plan(state, auth).await?;
    let (provider, messages) = parse_chat(body)?;
    let admitted = admit(state, user.user_id, &plan, provider.as_deref(), &messages).await?;
    let mut guard = UsageGuard::new(state, &admitted, rules::input_bytes(&messages), "chat");
    let upstream = match state.ai.start(&admitted.target, &messages).await {
        Ok(s) => s,
        Err(e) => {
            guard.disarm();
            return Err(refuse_upstream(e, admitted.rate));
        }
    };
    let stream = relay(upstream, guard).boxed();
    let events = ChunkStream::new(stream, |chunk| match chunk {
        Some(c) => c.to_json_string(),
        None => "[DONE]".into(),
    });
    Ok((events, admitted.rate))
}

/// Upstream events → UI message stream chunks.
fn relay(
    mut upstream: AiStream,
    mut guard: UsageGuard,
) -> impl futures::Stream<Item = Option<UiChunk>> + Send + 'static {
    async_stream::stream! {
        let text_id = "text-0".to_string();
        yield Some(UiChunk::Start(StartChunk { message_id: format!("msg-{}", ulid::Ulid::new().to_string().to_lowercase()) }));
        yield Some(UiChunk::StartStep(StartStepChunk {}));
        yield Some(UiChunk::TextStart(TextStartChunk { id: text_id.clone() }));
        let mut failure = None;
        while let Some(ev) = upstream.next().await {
            match ev {
                Ok(AiEvent::Text(t)) => {
                    guard.output_bytes += t.len();
                    yield Some(UiChunk::TextDelta(TextDeltaChunk { id: text_id.clone(), delta: t }));
                }
                Ok(AiEvent::Usage(u)) => guard.usage = merge(guard.usage, u),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(upstream);
        match failure {
            None => {
                guard.finish(false);
                yield Some(UiChunk::TextEnd(TextEndChunk { id: text_id }));
                yield Some(UiChunk::FinishStep(FinishStepChunk {}));
                yield Some(UiChunk::Finish(FinishChunk {}));
            }
            Some(e) => {
                tracing::warn!(error = %e, "AI provider broke off the answer");
                guard.finish(true);
                yield Some(UiChunk::Error(ErrorChunk {
                    error_text: "the AI provider broke off the answer; try again".into(),
                }));
            }
        }
        yield None;
    }
}

async fn generate_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: GenerateRequest,
) -> Result<(GenerateResult, RateInfo), Refusal> {
    let (user, plan) = session_and_plan(state, auth).await?;
    let mut messages = Vec::with_capacity(2);
    if let Some(system) = body.system.filter(|s| !s.is_empty()) {
        messages.push(ChatMessage {
            role: Role::System,
            content: system,
        });
    }
    messages.push(ChatMessage {
        role: Role::User,
        content: body.prompt,
    });
    let provider = body.provider.map(|p| Provider::from(p).as_str());
    let admitted = admit(state, user.user_id, &plan, provider, &messages).await?;
    let mut guard = UsageGuard::new(state, &admitted, rules::input_bytes(&messages), "generate");
    let mut upstream = match state.ai.start(&admitted.target, &messages).await {
        Ok(s) => s,
        Err(e) => {
            guard.disarm();
            return Err(refuse_upstream(e, admitted.rate));
        }
    };
    let mut text = String::new();
    while let Some(ev) = upstream.next().await {
        match ev {
            Ok(AiEvent::Text(t)) => {
                guard.output_bytes += t.len();
                text.push_str(&t);
            }
            Ok(AiEvent::Usage(u)) => guard.usage = merge(guard.usage, u),
            Err(e) => {
                guard.finish(true);
                return Err(refuse_upstream(e, admitted.rate));
            }
        }
    }
    let (input, output, _) = guard.counts();
    guard.finish(false);
    Ok((
        GenerateResult {
            text,
            usage: TokenUsage {
                input_tokens: input,
                output_tokens: output,
            },
        },
        admitted.rate,
    ))
}

// ---------------------------------------------------------------- usage

/// Queues the usage job exactly once per admitted request: at the end of the
/// answer, or when dropped before (client gone: aborted).
struct UsageGuard {
    state: Option<AppState>,
    user_id: Uuid,
    provider: Provider,
    model: String,
    route: &'static str,
    input_bytes: usize,
    output_bytes: usize,
    usage: Usage,
    reserved: (i64, chrono::DateTime<Utc>),
}

impl UsageGuard {
    fn new(state: &AppState, a: &Admitted, input_bytes: usize, route: &'static str) -> Self {
        UsageGuard {
            state: Some(state.clone()),
            user_id: a.user_id,
            provider: a.target.provider,
            model: a.target.model.clone(),
            route,
            input_bytes,
            output_bytes: 0,
            usage: Usage::default(),
            reserved: a.reserved,
        }
    }

    /// Nothing was produced (the provider refused before any text): no
    /// record, and the reservation is given back.
    fn disarm(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        let (reserved, at) = self.reserved;
        if reserved > 0 {
            let user_id = self.user_id;
            tokio::spawn(async move {
                quota_add(&state, user_id, at, -reserved).await;
            });
        }
    }

    /// Input and output tokens (the provider's, else estimated) and whether
    /// one is an estimate.
    fn counts(&self) -> (i32, i32, bool) {
        let clamp = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
        let input = self.usage.input.map(clamp);
        let output = self.usage.output.map(clamp);
        (
            input.unwrap_or_else(|| rules::estimate_tokens(self.input_bytes)),
            output.unwrap_or_else(|| rules::estimate_tokens(self.output_bytes)),
            input.is_none() || output.is_none(),
        )
    }

    fn finish(&mut self, aborted: bool) {
        let Some(state) = self.state.take() else {
            return;
        };
        let (input_tokens, output_tokens, estimated) = self.counts();
        let usage = UsageRecord {
            id: Uuid::new_v4(),
            user_id: self.user_id,
            provider: self.provider.as_str().into(),
            model: self.model.clone(),
            route: self.route.into(),
            input_tokens,
            output_tokens,
            aborted,
            estimated,
            at: Utc::now(),
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(usage_id = %usage.id, "no runtime to queue AI usage; lost");
            return;
        };
        let (reserved, reserved_at) = self.reserved;
        rt.spawn(async move {
            let tokens = i64::from(usage.input_tokens) + i64::from(usage.output_tokens);
            let (user_id, id) = (usage.user_id, usage.id);
            let at = if reserved > 0 { reserved_at } else { usage.at };
            let job = Job::RecordAiUsage(RecordAiUsage { usage });
            // A failed push keeps the job in the job outbox (crate::followup).
            let outcome = state.queue_followup(job).await;
            tracing::info!(usage_id = %id, aborted, ?outcome, "AI usage");
            quota_add(&state, user_id, at, tokens - reserved).await;
        });
    }
}

impl Drop for UsageGuard {
    fn drop(&mut self) {
        self.finish(true);
    }
}

// ---------------------------------------------------------------- quota counter

/// Seconds a month counter lives (40 days: past its month, then gone).
const COUNTER_TTL_SECS: u64 = 40 * 24 * 3600;

static ADD_IF_PRESENT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end
return -1
",
    )
});

/// The AI gate (one round trip). KEYS: the rate limit's state, the month
/// counter. ARGV: the plan's requests per window, the window in
/// microseconds, its monthly tokens (-1: none), this request's estimate.
/// Returns the five values of [`rate_limit::GCRA_LUA`]'s `gcra` (allowed,
/// remaining, reset, retry, now) plus: `-2` (rate-limited, or no quota:
/// counter untouched), `-1` (no counter yet), or `used, reserved` (the counter
/// before this request; `reserved` 1 when the estimate was added, i.e. `used`
/// < the quota).
static GATE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{}{}",
        rate_limit::GCRA_LUA,
        r"
local a, r, reset, retry, now = gcra(KEYS[1], ARGV[1], ARGV[2])
if a == 0 or tonumber(ARGV[3]) < 0 then return {a, r, reset, retry, now, -2} end
local used = redis.call('GET', KEYS[2])
if not used then return {a, r, reset, retry, now, -1} end
used = math.max(tonumber(used), 0)
if used < tonumber(ARGV[3]) then
  redis.call('INCRBY', KEYS[2], ARGV[4])
  return {a, r, reset, retry, now, used, 1}
end
return {a, r, reset, retry, now, used, 0}
"
    ))
});

/// Seeds an absent month counter and then checks and reserves like [`GATE`].
/// KEYS: the counter. ARGV: the database's sum, the counter's lifetime, the
/// plan's monthly tokens, this request's estimate. Returns `{used, reserved}`.
static SEED: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
local used = math.max(tonumber(redis.call('GET', KEYS[1])), 0)
if used < tonumber(ARGV[3]) then
  redis.call('INCRBY', KEYS[1], ARGV[4])
  return {used, 1}
end
return {used, 0}
",
    )
});

fn counter_key(state: &AppState, user_id: Uuid, now: chrono::DateTime<Utc>) -> String {
    let base = format!("ai:tokens:{user_id}:{}", rules::month_key(now));
    if state.settings.queue_prefix.is_empty() {
        base
    } else {
        format!("{}:{base}", state.settings.queue_prefix)
    }
}

/// Tokens of `user_id` this month: the Redis counter, seeded from the
/// database when absent; the database sum when Redis is absent or fails.
async fn quota_used(
    state: &AppState,
    user_id: Uuid,
    now: chrono::DateTime<Utc>,
) -> Result<u64, ApiError> {
    let from_db = || {
        state.bounded_db(
            "summing AI usage",
            rules::tokens_this_month(&state.db, user_id, now),
        )
    };
    let Some(mut conn) = state.queues.redis() else {
        return from_db().await;
    };
    let key = counter_key(state, user_id, now);
    let budget = state.settings.dependency_timeout;
    let got: Result<Result<Option<i64>, _>, _> = tokio::time::timeout(
        budget,
        redis::cmd("GET")
            .arg(&key)
            .query_async::<Option<i64>>(&mut conn),
    )
    .await;
    match got {
        Ok(Ok(Some(n))) => Ok(n.max(0) as u64),
        Ok(Ok(None)) => {
            let sum = from_db().await?;
            let seeded = tokio::time::timeout(
                budget,
                redis::cmd("SET")
                    .arg(&key)
                    .arg(sum)
                    .arg("NX")
                    .arg("EX")
                    .arg(COUNTER_TTL_SECS)
                    .query_async::<Option<String>>(&mut conn),
            )
            .await;
            if !matches!(seeded, Ok(Ok(_))) {
                tracing::warn!("could not seed the AI quota counter");
            }
            Ok(sum)
        }
        _ => {
            tracing::warn!("AI quota counter unavailable; summing ai_usage");
            from_db().await
        }
    }
}

/// Adds `tokens` (negative: gives back) to the month counter when it exists
/// (an absent counter is seeded from the database at the next check).
/// Returns whether the counter took it.
async fn quota_add(
    state: &AppState,
    user_id: Uuid,
    at: chrono::DateTime<Utc>,
    tokens: i64,
) -> bool {
    let Some(mut conn) = state.queues.redis() else {
        return false;
    };
    let key = counter_key(state, user_id, at);
    let mut inv = ADD_IF_PRESENT.key(key);
    inv.arg(tokens);
    let r = tokio::time::timeout(
        state
            .settings
            .dependency_timeout
            .max(Duration::from_millis(100)),
        inv.invoke_async::<i64>(&mut conn),
    )
    .await;
    match r {
        Ok(Ok(n)) => n >= 0,
        _ => {
            tracing::warn!("could not add to the AI quota counter");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ui_messages_and_simple_messages() {
        let body = br#"{"id":"c1","trigger":"submit-message","extra":1,
            "messages":[{"id":"m1","role":"system","parts":[{"type":"text","text":"Be brief."}]},
                        {"id":"m2","role":"user","parts":[{"type":"step-start"},{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
                        {"role":"assistant","content":"Hello"}]}"#;
        let (p, m) = parse_chat(body).unwrap();
        assert_eq!(p, None);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].content, "Hi there");
        assert_eq!(m[2].role, Role::Assistant);
    }

    #[test]
    fn refuses_missing_empty_and_bad_roles() {
        for body in [
            &br#"{}"#[..],
            br#"{"messages":[]}"#,
            br#"{"messages":[{"role":"tool","content":"x"}]}"#,
            br#"{"messages":[{"role":"user"}]}"#,
            br#"[1]"#,
            br#"{"messages":[{"role":"user","parts":["x"]}]}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"messageId":null}"#,
            br#"{"messages":[{"role":"user","content":1}]}"#,
        ] {
            assert!(
                parse_chat(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn chunks_serialise_with_exactly_their_fields() {
        let j = |c: UiChunk| c.to_json().unwrap();
        assert_eq!(
            j(UiChunk::TextDelta(TextDeltaChunk {
                id: "t".into(),
                delta: "d".into()
            })),
            serde_json::json!({"type":"text-delta","id":"t","delta":"d"})
        );
        assert_eq!(
            j(UiChunk::StartStep(StartStepChunk {})),
            serde_json::json!({"type":"start-step"})
        );
        assert_eq!(
            j(UiChunk::Error(ErrorChunk {
                error_text: "x".into()
            })),
            serde_json::json!({"type":"error","errorText":"x"})
        );
    }
}
