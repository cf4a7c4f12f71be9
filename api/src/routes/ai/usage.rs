//! Usage of an admitted request: queued once for the worker when the answer
//! ends (or is dropped), and its reservation settled in the month counter.

use chrono::Utc;
use entity::ai::{self as rules, Provider, UsageRecord};
use uuid::Uuid;
use worker::{ai::Usage, jobs::RecordAiUsage, Job};

use super::{limits::Admitted, quota::quota_add};
use crate::state::AppState;

/// Queues the usage job exactly once per admitted request: at the end of the
/// answer, or when dropped before (client gone: aborted).
pub(super) struct UsageGuard {
    state: Option<AppState>,
    user_id: Uuid,
    provider: Provider,
    model: String,
    route: &'static str,
    input_bytes: usize,
    pub(super) output_bytes: usize,
    pub(super) usage: Usage,
    reserved: (i64, chrono::DateTime<Utc>),
}

impl UsageGuard {
    pub(super) fn new(
        state: &AppState,
        a: &Admitted,
        input_bytes: usize,
        route: &'static str,
    ) -> Self {
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
    pub(super) fn disarm(&mut self) {
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
    pub(super) fn counts(&self) -> (i32, i32, bool) {
        let clamp = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
        let input = self.usage.input.map(clamp);
        let output = self.usage.output.map(clamp);
        (
            input.unwrap_or_else(|| rules::estimate_tokens(self.input_bytes)),
            output.unwrap_or_else(|| rules::estimate_tokens(self.output_bytes)),
            input.is_none() || output.is_none(),
        )
    }

    pub(super) fn finish(&mut self, aborted: bool) {
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
