//! `POST /api/ai/chat`: the upstream answer relayed as the AI SDK UI message
//! stream v1.

use futures::StreamExt;
use poem_openapi::types::ToJSON;
use worker::ai::{merge, AiEvent, AiStream};

use super::{
    limits::{admit, session_and_plan},
    parse::parse_chat,
    refuse_upstream,
    usage::UsageGuard,
    ChunkStream, ErrorChunk, FinishChunk, FinishStepChunk, Refusal, StartChunk, StartStepChunk,
    TextDeltaChunk, TextEndChunk, TextStartChunk, UiChunk,
};
use crate::{identity::bearer::BearerAuth, problem::RateInfo, state::AppState};

pub(super) async fn chat_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: &[u8],
) -> Result<(ChunkStream, RateInfo), Refusal> {
    let (user, plan) = session_and_plan(state, auth).await?;
    let (provider, messages) = parse_chat(body)?;
    let admitted = admit(state, user.user_id, &plan, provider.as_deref(), &messages).await?;
    let mut guard = UsageGuard::new(state, &admitted, "chat");
    let upstream = match state
        .ai
        .start(&admitted.target, &messages, admitted.max_output)
        .await
    {
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
