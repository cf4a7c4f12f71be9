//! The AI routes' request, stream-chunk and answer types (their OpenAPI
//! schemas).

use entity::ai::limits::Provider;
use poem_openapi::{payload::Json, ApiResponse, Enum, Object, Union};

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

/// A chat message in the simple shape: `content` is required (`parts`, when
/// also given, is ignored).
#[derive(Debug, Clone, Object)]
pub struct ChatMessageWithContent {
    /// Message id (AI SDK; ignored).
    pub id: Option<String>,
    /// `system`, `user` or `assistant`.
    pub role: ChatRole,
    /// The text; wins over `parts`.
    pub content: String,
    /// Ignored when `content` is given.
    pub parts: Option<Vec<UiMessagePart>>,
}

/// A chat message in the AI SDK's `UIMessage` shape: `parts` is required.
#[derive(Debug, Clone, Object)]
pub struct ChatMessageWithParts {
    /// Message id (AI SDK; ignored).
    pub id: Option<String>,
    /// `system`, `user` or `assistant`.
    pub role: ChatRole,
    /// The text (simple shape); when given it wins over `parts`.
    pub content: Option<String>,
    /// The parts; the texts of the `text` parts are joined.
    pub parts: Vec<UiMessagePart>,
}

/// A chat message: the AI SDK's `UIMessage` (`{id, role, parts}`) or the
/// simple `{role, content}` shape (`anyOf`: it needs `content` or `parts`).
/// `content` wins when both are given.
#[derive(Debug, Clone, Union)]
pub enum ChatMessageIn {
    /// `{role, content}` (`content` required).
    Content(ChatMessageWithContent),
    /// `{id, role, parts}` (`parts` required).
    Parts(ChatMessageWithParts),
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
    pub(crate) fn new(code: &str, detail: String) -> Self {
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
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        PayloadTooLarge = 413: "The messages' text exceeds `AI_MAX_INPUT_BYTES` (default 65536 bytes), or the body exceeds 64 KiB.",
        InternalServerError = 500: "Unexpected failure.",
        BadGateway = 502: "The AI provider refused the request (`upstream_auth_failed`: our key was refused; `upstream_error`: it failed) before sending any text.",
        ServiceUnavailable = 503: "Auth is off or not configured, the AI provider is not configured (`not_configured`; `detail` names the variable: `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `OPENAI_COMPATIBLE_BASE_URL`), the provider cannot be reached or did not answer in time (`upstream_unavailable`), or the database is unreachable or slow (`database_unavailable`).",
    }
);

#[cfg(test)]
mod tests {
    use poem_openapi::types::ToJSON;

    use super::*;

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
