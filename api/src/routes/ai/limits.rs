//! The checks before the upstream call: provider, input size, the plan's
//! requests per 5 minutes and its monthly tokens (one Redis round trip, or
//! the in-process limiter and the database).

use std::time::{Duration, Instant};

use chrono::Utc;
use entity::ai::{self as rules, ChatMessage, Provider};
use uuid::Uuid;
use worker::ai::Target;

use super::{
    quota::{counter_key, quota_add, quota_used, COUNTER_TTL_SECS, GATE, SEED},
    AiLimitProblem, Refusal,
};
use crate::{
    auth::{BearerAuth, Gate},
    problem::{ApiError, RateInfo},
    rate_limit::{self, Limit, LimitKey},
    state::AppState,
};

/// What the checks leave for the upstream call.
pub(super) struct Admitted {
    pub(super) user_id: Uuid,
    pub(super) target: Target,
    pub(super) rate: RateInfo,
    /// Tokens reserved in the month counter for this request while it runs
    /// (its estimated input), and when: settled when it ends.
    pub(super) reserved: (i64, chrono::DateTime<Utc>),
}

/// The caller's session and the id of its plan, read together in one query.
/// (Reading the plan in parallel with the session was tried: 29 of 500
/// simultaneous chats then waited past the pool's acquire deadline, see
/// BENCHMARKS.md.)
pub(super) async fn session_and_plan(
    state: &AppState,
    auth: &BearerAuth,
) -> Result<(entity::users::UserContext, String), ApiError> {
    state.session_with_plan(auth, Gate::Auth).await
}

/// Provider, size, configuration and both limits, in that order; `plan_id`
/// is the caller's plan ([`session_and_plan`]).
pub(super) async fn admit(
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

