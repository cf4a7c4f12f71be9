//! Usage of an admitted request: queued once for the worker when the answer
//! ends (or is dropped), and its reservation settled in the month counter.

use chrono::Utc;
use entity::{
    ai::limits::{self as rules, Provider},
    ai::quota::{self, Reservation},
    ai::usage::UsageRecord,
};
use uuid::Uuid;
use worker::{ai::Usage, jobs::RecordAiUsage, Job};

use super::{limits::Admitted, quota::RedisCounter};
use crate::state::AppState;

/// Queues the usage job exactly once per admitted request: at the end of the
/// answer, or when dropped before (client gone: aborted).
pub(super) struct UsageGuard {
    state: Option<AppState>,
    user_id: Uuid,
    provider: Provider,
    model: String,
    route: &'static str,
    input_bound: u64,
    output_cap: u32,
    pub(super) output_bytes: usize,
    pub(super) usage: Usage,
    reservation: Option<Reservation>,
}

impl UsageGuard {
    pub(super) fn new(state: &AppState, a: &Admitted, route: &'static str) -> Self {
        UsageGuard {
            state: Some(state.clone()),
            user_id: a.user_id,
            provider: a.target.provider,
            model: a.target.model.clone(),
            route,
            input_bound: a.input_bound,
            output_cap: a.max_output,
            output_bytes: 0,
            usage: Usage::default(),
            reservation: a.reservation,
        }
    }

    /// Nothing was produced (the provider refused before any text): no
    /// record, and the reservation is given back.
    pub(super) fn disarm(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if let Some(r) = self.reservation {
            tokio::spawn(async move {
                let fast = RedisCounter::of(&state);
                if let Err(e) = quota::release(&state.db, fast.as_ref(), r).await {
                    tracing::warn!(error = %e, "could not give back an AI reservation");
                }
            });
        }
    }

    /// Input and output tokens charged ([`rules::charge`]: the provider's
    /// counts, a missing one at the reservation's bound) and whether one is
    /// ours; `complete`: the answer ended normally.
    pub(super) fn counts(&self, complete: bool) -> (i32, i32, bool) {
        rules::charge(
            (self.usage.input, self.usage.output),
            self.input_bound,
            self.output_cap,
            self.output_bytes,
            complete,
        )
    }

    pub(super) fn finish(&mut self, aborted: bool) {
        let Some(state) = self.state.take() else {
            return;
        };
        let (input_tokens, output_tokens, estimated) = self.counts(!aborted);
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
            reservation: self.reservation,
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(usage_id = %usage.id, "no runtime to queue AI usage; lost");
            return;
        };
        rt.spawn(async move {
            let tokens = i64::from(usage.input_tokens) + i64::from(usage.output_tokens);
            let (user_id, id, at, held) = (usage.user_id, usage.id, usage.at, usage.reservation);
            let job = Job::RecordAiUsage(RecordAiUsage { usage });
            // A failed push keeps the job in the job outbox (crate::followup);
            // a reservation in the database is settled with the record.
            let outcome = state.queue_followup(job).await;
            tracing::info!(usage_id = %id, aborted, ?outcome, "AI usage");
            if let Some(fast) = RedisCounter::of(&state) {
                if let Err(e) = quota::settle_fast(&fast, user_id, held, tokens, at).await {
                    tracing::warn!(error = %e, "could not settle the AI quota counter");
                }
            }
        });
    }
}

impl Drop for UsageGuard {
    fn drop(&mut self) {
        self.finish(true);
    }
}
