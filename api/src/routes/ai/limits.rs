//! The checks before the upstream call: provider, input size, the plan's
//! requests per 5 minutes and its monthly tokens, whose reservation
//! ([`quota::reserve`]) sets the answer's output cap: one Redis round trip
//! for both when Redis answers; otherwise the in-process limiter and the
//! database's conditional write.

use std::time::{Duration, Instant};

use chrono::Utc;
use entity::{
    ai::limits::{self as rules, ChatMessage, Provider},
    ai::quota::{self, Ask, FastAnswer, Reservation, Reserved},
};
use uuid::Uuid;
use worker::ai::Target;

use super::{
    quota::{counter_key, RedisCounter, GATE},
    AiLimitProblem, Refusal,
};
use crate::{
    identity::bearer::{BearerAuth, Gate},
    problem::{ApiError, RateInfo},
    rate_limit::{self, Limit, LimitKey},
    state::AppState,
};

/// What the checks leave for the upstream call.
pub(super) struct Admitted {
    pub(super) user_id: Uuid,
    pub(super) target: Target,
    pub(super) rate: RateInfo,
    /// The request's [`rules::input_bound`].
    pub(super) input_bound: u64,
    /// Most output tokens the provider may produce (sent upstream): the
    /// plan's `ai_max_output_tokens`, lowered to what the reservation left.
    pub(super) max_output: u32,
    /// The tokens held for this request while it runs (its input bound plus
    /// its output cap; `None` on a plan without quota): settled to its real
    /// tokens when it ends, given back when the provider refused it.
    pub(super) reservation: Option<Reservation>,
}

/// The caller's session and the id of its plan, read together in one query.
/// (Reading the plan in parallel with the session was tried: 29 of 500
/// simultaneous chats then waited past the pool's acquire deadline, see
/// BENCHMARKS.md.)
pub(super) async fn session_and_plan(
    state: &AppState,
    auth: &BearerAuth,
) -> Result<(entity::accounts::users::UserContext, String), ApiError> {
    state.session_with_plan(auth, Gate::Auth).await
}

/// Provider, size, configuration and both limits, in that order; `plan_id`
/// is the caller's plan ([`session_and_plan`]). On a plan with a monthly
/// quota the request reserves [`rules::grant`] tokens at once
/// ([`quota::reserve`]): its [`rules::input_bound`] and its output cap;
/// when not one output token fits, 429 `quota_exceeded`.
pub(super) async fn admit(
    state: &AppState,
    user_id: Uuid,
    plan_id: &str,
    provider: Option<&str>,
    messages: &[ChatMessage],
) -> Result<Admitted, Refusal> {
    let name = provider.unwrap_or(&state.settings.ai_default_provider);
    let provider = Provider::parse(name).ok_or_else(|| {
        ApiError::Field(entity::base::validate::FieldError::new(
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
        .or_else(|| state.plans.get(entity::base::plans::FREE))
        .ok_or_else(|| ApiError::internal("the plan catalogue has no FREE plan"))?;
    let limit = Limit {
        name: "ai",
        max: plan.ai_requests_per_5min,
        window: Duration::from_secs(300),
    };
    let input = rules::input_bound(messages);
    let ask = plan.ai_tokens_per_month.map(|limit| Ask {
        user_id,
        limit,
        input,
        max_output: plan.max_output_tokens(),
        now: Utc::now(),
    });
    let (rate, first) = match state.limiter.limit_key(limit, &user_id.to_string()) {
        Some(window) => {
            let (rate, first) = gate_redis(state, window, limit, user_id, ask.as_ref()).await?;
            (rate, Some(first))
        }
        None => {
            let deadline = Instant::now() + state.settings.dependency_timeout;
            let rate = state
                .limit_user("ai", user_id, limit.max, limit.window, deadline)
                .await?;
            (rate, None)
        }
    };
    let Some(ask) = ask else {
        return Ok(Admitted {
            user_id,
            target,
            rate,
            input_bound: input,
            max_output: plan.max_output_tokens(),
            reservation: None,
        });
    };
    let fast = RedisCounter::of(state);
    let granted = state
        .bounded_db(
            "reserving AI tokens",
            quota::reserve(&state.db, fast.as_ref().zip(first), &ask),
        )
        .await?;
    let Some(max_output) = granted.output_cap(&ask) else {
        let exceeded = rules::QuotaExceeded {
            used: granted.used,
            limit: ask.limit,
            plan: plan.id.clone(),
            resets_at: rules::next_month_start(ask.now),
        };
        return Err(quota_refusal(exceeded, ask.now, rate));
    };
    Ok(Admitted {
        user_id,
        target,
        rate,
        input_bound: input,
        max_output,
        reservation: granted.reservation,
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

/// The request rate limit and the first reservation in one Redis script
/// (one round trip, atomic): count the request against the plan's requests
/// per 5 minutes (GCRA, as [`RateLimiter::check`]); when allowed and `ask`
/// is given (a plan with a quota), reserve [`rules::grant`] tokens in the
/// month counter. Answers the rate limit's headers and what the counter
/// said, for [`quota::reserve`] (which seeds an absent counter, and
/// reserves in the database when Redis did not answer). Redis failing or
/// slow: the in-process limiter decides the rate (as
/// [`RateLimiter::check`]).
///
/// [`RateLimiter::check`]: crate::rate_limit::RateLimiter::check
async fn gate_redis(
    state: &AppState,
    window: LimitKey,
    limit: Limit,
    user_id: Uuid,
    ask: Option<&Ask>,
) -> Result<(RateInfo, FastAnswer), Refusal> {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut conn = window.conn.clone();
    let mut inv = GATE.key(&window.key);
    inv.key(counter_key(
        state,
        user_id,
        ask.map_or_else(Utc::now, |a| a.now),
    ))
    .arg(window.max)
    .arg(window.window_us)
    .arg(ask.map_or(-1, |a| clamp(a.limit)))
    .arg(ask.map_or(0, |a| clamp(a.input)))
    .arg(ask.map_or(0, |a| clamp(a.want())));
    let budget = state.settings.dependency_timeout;
    let got = tokio::time::timeout(budget, inv.invoke_async::<Vec<i64>>(&mut conn)).await;
    let decision = match &got {
        Ok(Ok(r)) if r.len() >= 6 => rate_limit::decide_gcra(limit, r),
        _ => None,
    };
    let Some(decision) = decision else {
        match got {
            Ok(Ok(r)) => tracing::warn!(?r, "unexpected AI gate reply; limiting in process"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "AI gate store unavailable; limiting in process")
            }
            Err(_) => tracing::warn!("AI gate store timed out; limiting in process"),
        }
        let decision = state.limiter.check_in_process(limit, &user_id.to_string());
        if !decision.allowed {
            return Err(ApiError::RateLimited(decision.info).into());
        }
        return Ok((decision.info, FastAnswer::Down));
    };
    if !decision.allowed {
        return Err(ApiError::RateLimited(decision.info).into());
    }
    let reply = got.ok().and_then(Result::ok).unwrap_or_default();
    let answer = match reply[5] {
        used if used >= 0 => FastAnswer::Reserved(Reserved {
            used: used as u64,
            granted: reply.get(6).copied().unwrap_or(0).max(0) as u64,
        }),
        -1 => FastAnswer::NoCounter,
        _ => FastAnswer::Down,
    };
    Ok((decision.info, answer))
}
