//! `POST /api/ai/generate`: one whole answer.

use entity::ai::limits::{ChatMessage, Provider, Role};
use futures::StreamExt;
use worker::ai::{merge, AiEvent};

use super::{
    limits::{admit, session_and_plan},
    refuse_upstream,
    usage::UsageGuard,
    GenerateRequest, GenerateResult, Refusal, TokenUsage,
};
use crate::{identity::bearer::BearerAuth, problem::RateInfo, state::AppState};

pub(super) async fn generate_inner(
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
    let mut guard = UsageGuard::new(state, &admitted, "generate");
    let mut upstream = match state
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
    let (input, output, _) = guard.counts(true);
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
