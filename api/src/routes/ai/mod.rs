//! `POST /api/ai/chat` (AI SDK UI message stream v1) and `POST /api/ai/generate`.
//!
//! Order of checks, before any upstream call: session (401), body (400),
//! provider (400 unknown, 503 not configured), input size (413), the plan's
//! requests per 5 minutes (429 with `X-RateLimit-*` and `Retry-After`), the
//! plan's monthly tokens (429 with `used`, `limit`, `plan`, `resets_at`).
//!
//! The monthly counter lives in Redis (`<QUEUE_PREFIX>:ai:tokens:<user>:<YYYYMM>`),
//! or without Redis in the database (`ai_quota_counters`), seeded from
//! `SUM(input_tokens + output_tokens)` over `ai_usage` when absent. An
//! admitted request atomically reserves an upper bound of what it may use
//! (its input bound plus an output cap: what is left of the quota, at most
//! the plan's `ai_max_output_tokens`), sends the cap upstream, and settles
//! the reservation to its real tokens when its usage job is queued (a
//! request the provider refused gives it back). So concurrent requests never
//! take the month past the quota (modules `limits`, `quota`).

mod chat;
mod generate;
mod limits;
mod parse;
mod quota;
mod types;
mod usage;

use poem::{http::StatusCode, web::Data};
use poem_openapi::{payload::Json, OpenApi};
use worker::ai::AiError;

pub use types::*;

use crate::routes::ApiTags;
use crate::{
    identity::bearer::BearerAuth,
    payload::{JsonBody, RawJson},
    problem::{ApiError, Problem, RateInfo},
    state::AppState,
};

/// What stops a request before the answer.
pub(crate) enum Refusal {
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
    pub(crate) fn split(self) -> Result<(AiLimitProblem, RateInfo), AiErrorResponse> {
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
    /// goes away, stops reading for `AI_STREAM_STALL_SECS` (the answer is
    /// then cancelled), or the provider breaks off: marked aborted). A provider
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
        match chat::chat_inner(&state, &auth, &body.bytes).await {
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
        match generate::generate_inner(&state, &auth, body.0).await {
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

/// Maps a failure before any text to its answer.
pub(crate) fn refuse_upstream(e: AiError, rate: RateInfo) -> Refusal {
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
