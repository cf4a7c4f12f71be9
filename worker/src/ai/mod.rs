//! Clients of the AI providers' streaming HTTP APIs (an I/O adapter).
//!
//! * `openai` and `openai_compatible`: Chat Completions,
//!   `POST {base}/chat/completions` with `stream: true` and
//!   `stream_options: {include_usage: true}`, the output cap as
//!   `max_completion_tokens` (OpenAI; `max_tokens` is deprecated there) or
//!   `max_tokens` (compatible servers: vLLM, llama.cpp, Ollama, LiteLLM all
//!   read it); SSE `data:` lines carry
//!   `chat.completion.chunk` objects (`choices[0].delta.content`), the last one
//!   `usage: {prompt_tokens, completion_tokens}`, then `data: [DONE]`.
//! * `anthropic`: Messages API, `POST {base}/v1/messages` with `stream: true`
//!   and the output cap as `max_tokens` (required), headers `x-api-key` and `anthropic-version: 2023-06-01`; named SSE events
//!   `message_start` (`message.usage.input_tokens`), `content_block_delta`
//!   (`delta.type = text_delta`, `delta.text`), `message_delta` (cumulative
//!   `usage.output_tokens`), `message_stop`, `ping`, `error`.
//!
//! SSE is parsed with the `eventsource-stream` crate over reqwest's body
//! chunks. Time bounds: `AI_CONNECT_TIMEOUT_MS` on connecting,
//! `AI_IDLE_TIMEOUT_MS` on the answer's headers and between two body chunks.
//! Dropping the stream drops the upstream response and with it the connection:
//! the provider sees the request cancelled.

use std::{pin::Pin, sync::Arc, time::Duration};

use entity::{
    ai::limits::{ChatMessage, Provider, Role},
    Settings,
};
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};

/// Why an AI call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AiError {
    /// The provider lacks its setting (`var` names it).
    #[error("AI provider {provider} is not configured: set {var}", provider = provider.as_str())]
    NotConfigured {
        /// The provider asked for.
        provider: Provider,
        /// The missing variable.
        var: &'static str,
    },
    /// The provider answered a non-2xx status before any content.
    #[error("the AI provider answered HTTP {status}")]
    Status {
        /// Its HTTP status.
        status: u16,
        /// Its `Retry-After` in seconds, when it sent one.
        retry_after: Option<u64>,
    },
    /// No connection could be made (refused, DNS, TLS, connect timeout).
    #[error("the AI provider could not be reached: {0}")]
    Unreachable(String),
    /// No headers, or no next chunk, within `AI_IDLE_TIMEOUT_MS`.
    #[error("the AI provider did not answer within AI_IDLE_TIMEOUT_MS")]
    Timeout,
    /// The connection broke or the stream ended before its end marker.
    #[error("the AI provider's stream broke: {0}")]
    Broken(String),
    /// The provider sent an error event or a body we cannot read.
    #[error("the AI provider reported an error: {0}")]
    Upstream(String),
}

/// Token counts reported by the provider (`None`: not reported yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input: Option<u64>,
    /// Completion tokens (cumulative).
    pub output: Option<u64>,
}

/// One decoded piece of an upstream answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AiEvent {
    /// Some answer text, in order.
    Text(String),
    /// The provider's token counts so far (later events supersede earlier).
    Usage(Usage),
}

/// A started answer: events until the provider's end marker, then the end;
/// an error item is the last item.
pub type AiStream = Pin<Box<dyn Stream<Item = Result<AiEvent, AiError>> + Send>>;

/// Where a request goes: provider, model, URL and key.
#[derive(Clone)]
pub struct Target {
    /// The provider.
    pub provider: Provider,
    /// The model name sent upstream.
    pub model: String,
    url: String,
    key: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The HTTP client and settings of the AI providers. Cheap to clone.
#[derive(Clone)]
pub struct AiClients {
    http: reqwest::Client,
    settings: Arc<Settings>,
}

impl AiClients {
    /// A client with `AI_CONNECT_TIMEOUT_MS`, no overall timeout (answers
    /// stream), no redirects and a warm connection pool per provider host.
    pub fn new(settings: Arc<Settings>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.ai_connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("subscription-backend/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(AiClients { http, settings })
    }

    /// The target of `provider`, or [`AiError::NotConfigured`] naming the
    /// missing variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
    /// `OPENAI_COMPATIBLE_BASE_URL`).
    pub fn target(&self, provider: Provider) -> Result<Target, AiError> {
        let s = &self.settings;
        let missing = |var| AiError::NotConfigured { provider, var };
        match provider {
            Provider::Openai => {
                let key = s.openai_api_key.clone().ok_or(missing("OPENAI_API_KEY"))?;
                Ok(Target {
                    provider,
                    model: s.openai_model.clone(),
                    url: format!("{}/chat/completions", s.openai_base_url),
                    key: Some(key),
                })
            }
            Provider::Anthropic => {
                let key = s
                    .anthropic_api_key
                    .clone()
                    .ok_or(missing("ANTHROPIC_API_KEY"))?;
                Ok(Target {
                    provider,
                    model: s.anthropic_model.clone(),
                    url: format!("{}/v1/messages", s.anthropic_base_url),
                    key: Some(key),
                })
            }
            Provider::OpenaiCompatible => {
                let base = s
                    .openai_compatible_base_url
                    .clone()
                    .ok_or(missing("OPENAI_COMPATIBLE_BASE_URL"))?;
                Ok(Target {
                    provider,
                    model: s.openai_compatible_model.clone(),
                    url: format!("{base}/chat/completions"),
                    key: s.openai_compatible_api_key.clone(),
                })
            }
        }
    }

    /// Sends the request and waits for the answer's status (at most
    /// `AI_IDLE_TIMEOUT_MS`). `max_output` caps the answer's tokens (sent as
    /// the provider expects it: [`request_body`]). A non-2xx status, no
    /// connection or no answer is an error here, before any content;
    /// afterwards the stream's items carry the text, the usage and possibly
    /// one final error.
    pub async fn start(
        &self,
        target: &Target,
        messages: &[ChatMessage],
        max_output: u32,
    ) -> Result<AiStream, AiError> {
        let body = request_body(target.provider, &target.model, messages, max_output);
        let req = match target.provider {
            Provider::Openai | Provider::OpenaiCompatible => {
                let mut r = self.http.post(&target.url).json(&body);
                if let Some(k) = &target.key {
                    r = r.bearer_auth(k);
                }
                r
            }
            Provider::Anthropic => self
                .http
                .post(&target.url)
                .header("x-api-key", target.key.as_deref().unwrap_or_default())
                .header("anthropic-version", "2023-06-01")
                .json(&body),
        };
        let idle = self.settings.ai_idle_timeout;
        let upstream = crate::metrics::Upstream::start("ai");
        let sent =
            tokio::time::timeout(idle, req.header("accept", "text/event-stream").send()).await;
        upstream.finish(matches!(&sent, Ok(Ok(r)) if r.status().is_success()));
        let resp = match sent {
            Err(_) => return Err(AiError::Timeout),
            Ok(Err(e)) => return Err(AiError::Unreachable(e.to_string())),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            tracing::warn!(
                provider = target.provider.as_str(),
                status = status.as_u16(),
                "AI provider refused the request"
            );
            return Err(AiError::Status {
                status: status.as_u16(),
                retry_after,
            });
        }
        Ok(decode(target.provider, body_chunks(resp, idle)))
    }

    /// A whole answer of at most `max_output` tokens: its text and the
    /// provider's usage.
    pub async fn complete(
        &self,
        target: &Target,
        messages: &[ChatMessage],
        max_output: u32,
    ) -> Result<(String, Usage), AiError> {
        let mut stream = self.start(target, messages, max_output).await?;
        let mut text = String::new();
        let mut usage = Usage::default();
        while let Some(ev) = stream.next().await {
            match ev? {
                AiEvent::Text(t) => text.push_str(&t),
                AiEvent::Usage(u) => usage = merge(usage, u),
            }
        }
        Ok((text, usage))
    }
}

/// The JSON body of a streamed request to `provider`, the answer capped at
/// `max_output` tokens: `max_completion_tokens` for OpenAI, `max_tokens` for
/// Anthropic (where system messages go to `system`) and compatible servers.
pub fn request_body(
    provider: Provider,
    model: &str,
    messages: &[ChatMessage],
    max_output: u32,
) -> Value {
    let message = |m: &ChatMessage| json!({"role": m.role.as_str(), "content": m.content});
    match provider {
        Provider::Openai | Provider::OpenaiCompatible => {
            let cap = if provider == Provider::Openai {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            json!({
                "model": model,
                "messages": messages.iter().map(message).collect::<Vec<_>>(),
                "stream": true,
                "stream_options": {"include_usage": true},
                cap: max_output,
            })
        }
        Provider::Anthropic => {
            let system: Vec<&str> = messages
                .iter()
                .filter(|m| m.role == Role::System)
                .map(|m| m.content.as_str())
                .collect();
            let mut body = json!({
                "model": model,
                "max_tokens": max_output,
                "stream": true,
                "messages": messages.iter().filter(|m| m.role != Role::System)
                    .map(message).collect::<Vec<_>>(),
            });
            if !system.is_empty() {
                body["system"] = Value::String(system.join("\n\n"));
            }
            body
        }
    }
}

/// Later counts supersede earlier ones; a count not reported keeps the old one.
pub fn merge(old: Usage, new: Usage) -> Usage {
    Usage {
        input: new.input.or(old.input),
        output: new.output.or(old.output),
    }
}

/// The body as a stream of chunks, each awaited at most `idle`.
fn body_chunks(
    resp: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = Result<bytes::Bytes, AiError>> + Send {
    futures::stream::unfold(Some(resp), move |resp| async move {
        let mut resp = resp?;
        match tokio::time::timeout(idle, resp.chunk()).await {
            Ok(Ok(Some(b))) => Some((Ok(b), Some(resp))),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(AiError::Broken(e.to_string())), None)),
            Err(_) => Some((Err(AiError::Timeout), None)),
        }
    })
}

/// SSE events → [`AiEvent`]s, ending at the provider's end marker.
fn decode(
    provider: Provider,
    chunks: impl Stream<Item = Result<bytes::Bytes, AiError>> + Send + 'static,
) -> AiStream {
    Box::pin(async_stream::stream! {
        let mut events = std::pin::pin!(chunks.eventsource());
        let mut decoder = Decoder { provider, done: false };
        loop {
            match events.next().await {
                None => {
                    if !decoder.done {
                        yield Err(AiError::Broken("the stream ended before its end marker".into()));
                    }
                    break;
                }
                Some(Err(eventsource_stream::EventStreamError::Transport(e))) => {
                    yield Err(e);
                    break;
                }
                Some(Err(e)) => {
                    yield Err(AiError::Upstream(format!("unreadable event stream: {e}")));
                    break;
                }
                Some(Ok(ev)) => {
                    match decoder.feed(&ev.data) {
                        Ok(out) => {
                            for o in out {
                                yield Ok(o);
                            }
                        }
                        Err(e) => {
                            yield Err(e);
                            break;
                        }
                    }
                    if decoder.done {
                        break;
                    }
                }
            }
        }
    })
}

/// Per-provider event decoding.
struct Decoder {
    provider: Provider,
    done: bool,
}

fn as_count(v: &Value) -> Option<u64> {
    v.as_u64()
}

impl Decoder {
    fn feed(&mut self, data: &str) -> Result<Vec<AiEvent>, AiError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(vec![]);
        }
        match self.provider {
            Provider::Openai | Provider::OpenaiCompatible => {
                if data == "[DONE]" {
                    self.done = true;
                    return Ok(vec![]);
                }
                let v: Value = serde_json::from_str(data)
                    .map_err(|e| AiError::Upstream(format!("a chunk is not JSON: {e}")))?;
                if let Some(err) = v.get("error") {
                    return Err(AiError::Upstream(
                        err["message"].as_str().unwrap_or("error event").to_string(),
                    ));
                }
                let mut out = vec![];
                if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                    if !t.is_empty() {
                        out.push(AiEvent::Text(t.to_string()));
                    }
                }
                let u = &v["usage"];
                if u.is_object() {
                    out.push(AiEvent::Usage(Usage {
                        input: as_count(&u["prompt_tokens"]),
                        output: as_count(&u["completion_tokens"]),
                    }));
                }
                Ok(out)
            }
            Provider::Anthropic => {
                let v: Value = serde_json::from_str(data)
                    .map_err(|e| AiError::Upstream(format!("an event is not JSON: {e}")))?;
                match v["type"].as_str().unwrap_or_default() {
                    "message_start" => {
                        let u = &v["message"]["usage"];
                        Ok(vec![AiEvent::Usage(Usage {
                            input: as_count(&u["input_tokens"]),
                            output: as_count(&u["output_tokens"]),
                        })])
                    }
                    "content_block_delta" if v["delta"]["type"] == "text_delta" => {
                        match v["delta"]["text"].as_str() {
                            Some(t) if !t.is_empty() => Ok(vec![AiEvent::Text(t.to_string())]),
                            _ => Ok(vec![]),
                        }
                    }
                    "message_delta" => {
                        let u = &v["usage"];
                        Ok(vec![AiEvent::Usage(Usage {
                            input: as_count(&u["input_tokens"]),
                            output: as_count(&u["output_tokens"]),
                        })])
                    }
                    "message_stop" => {
                        self.done = true;
                        Ok(vec![])
                    }
                    "error" => Err(AiError::Upstream(
                        v["error"]["message"]
                            .as_str()
                            .unwrap_or("error event")
                            .to_string(),
                    )),
                    _ => Ok(vec![]),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(provider: Provider, body: &'static str) -> Vec<Result<AiEvent, AiError>> {
        // Split the body at odd places: events must survive any chunking.
        let chunks: Vec<Result<bytes::Bytes, AiError>> = body
            .as_bytes()
            .chunks(7)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(decode(provider, futures::stream::iter(chunks)).collect())
    }

    #[test]
    fn openai_text_usage_and_done() {
        let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n";
        let out = run(Provider::Openai, body);
        assert_eq!(
            out,
            vec![
                Ok(AiEvent::Text("Hel".into())),
                Ok(AiEvent::Text("lo".into())),
                Ok(AiEvent::Usage(Usage {
                    input: Some(9),
                    output: Some(2)
                })),
            ]
        );
    }

    #[test]
    fn anthropic_events() {
        let body = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let out = run(Provider::Anthropic, body);
        assert_eq!(
            out,
            vec![
                Ok(AiEvent::Usage(Usage {
                    input: Some(25),
                    output: Some(1)
                })),
                Ok(AiEvent::Text("Hi".into())),
                Ok(AiEvent::Usage(Usage {
                    input: None,
                    output: Some(15)
                })),
            ]
        );
    }

    #[test]
    fn the_output_cap_is_named_as_each_provider_expects() {
        let msgs = [
            ChatMessage {
                role: Role::System,
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: Role::User,
                content: "Hi".into(),
            },
        ];
        let b = request_body(Provider::Openai, "m", &msgs, 77);
        assert_eq!(b["max_completion_tokens"], 77);
        assert!(b.get("max_tokens").is_none());
        let b = request_body(Provider::OpenaiCompatible, "m", &msgs, 77);
        assert_eq!(b["max_tokens"], 77);
        assert!(b.get("max_completion_tokens").is_none());
        let b = request_body(Provider::Anthropic, "m", &msgs, 77);
        assert_eq!(b["max_tokens"], 77);
        assert_eq!(b["system"], "Be brief.");
        assert_eq!(b["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_stream_without_its_end_marker_is_broken() {
        let out = run(
            Provider::Openai,
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        );
        assert!(
            matches!(out.last(), Some(Err(AiError::Broken(_)))),
            "{out:?}"
        );
    }
}
