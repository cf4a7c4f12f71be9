//! The checks before the upstream call: provider, input size, the plan's
//! requests per 5 minutes and its monthly tokens, whose reservation sets the
//! answer's output cap (one Redis round trip, or the in-process limiter and
//! the database's conditional write).

use std::time::{Duration, Instant};

use chrono::Utc;
use entity::ai::{self as rules, ChatMessage, Provider};
use uuid::Uuid;
use worker::ai::Target;

use super::{
    quota::{counter_key, COUNTER_TTL_SECS, GATE, SEED},
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
    /// Most output tokens the provider may produce (sent upstream): the
    /// plan's `ai_max_output_tokens`, lowered to what the reservation left.
    pub(super) max_output: u32,
    /// Tokens reserved in the month counter for this request while it runs
    /// (its input bound plus its output cap; 0: nothing held), and when:
    /// settled to its real tokens when it ends, given back when the provider
    /// refused it.
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
/// is the caller's plan ([`session_and_plan`]). On a plan with a monthly
/// quota the request reserves [`rules::grant`] tokens at once: its
/// [`rules::input_bound`] and its output cap; when not one output token fits,
/// 429 `quota_exceeded`.
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
    let ask = Ask {
        user_id,
        quota: plan.ai_tokens_per_month,
        input: rules::input_bound(messages),
        max_output: plan.max_output_tokens(),
        now: Utc::now(),
    };
    let gated = match state.limiter.limit_key(limit, &user_id.to_string()) {
        Some(window) => gate_redis(state, window, limit, &ask).await?,
        None => gate_local(state, limit, &ask).await?,
    };
    let (rate, now) = (gated.rate, ask.now);
    let (Some(quota), Some(q)) = (ask.quota, gated.quota) else {
        return Ok(Admitted {
            user_id,
            target,
            rate,
            max_output: ask.max_output,
            reserved: (0, now),
        });
    };
    if q.granted <= ask.input {
        let exceeded = rules::QuotaExceeded {
            used: q.used,
            limit: quota,
            plan: plan.id.clone(),
            resets_at: rules::next_month_start(now),
        };
        return Err(quota_refusal(exceeded, now, rate));
    }
    let cap =
        u32::try_from(q.granted - ask.input).map_or(ask.max_output, |c| c.min(ask.max_output));
    let held = if q.held {
        i64::try_from(q.granted).unwrap_or(i64::MAX)
    } else {
        0
    };
    Ok(Admitted {
        user_id,
        target,
        rate,
        max_output: cap,
        reserved: (held, now),
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

/// What a request asks of the month counter.
struct Ask {
    user_id: Uuid,
    /// The plan's monthly tokens (`None`: unlimited, nothing reserved).
    quota: Option<u64>,
    /// The request's [`rules::input_bound`].
    input: u64,
    /// The plan's output cap.
    max_output: u32,
    now: chrono::DateTime<Utc>,
}

impl Ask {
    /// [`rules::grant`] for `used` tokens taken (`0` without a quota).
    fn grant(&self, used: u64) -> u64 {
        self.quota
            .map_or(0, |q| rules::grant(used, q, self.input, self.max_output))
    }

    /// The input bound plus the output cap: the most a grant can be.
    fn want(&self) -> i64 {
        i64::try_from(self.input + u64::from(self.max_output)).unwrap_or(i64::MAX)
    }
}

/// The month counter's answer on a plan with a quota.
#[derive(Clone, Copy)]
struct QuotaState {
    /// Tokens counted this month before this request.
    used: u64,
    /// Tokens granted to it ([`rules::grant`]; 0: refused).
    granted: u64,
    /// Whether the grant is held in the counter (to settle when it ends);
    /// not while the counter cannot be reached.
    held: bool,
}

/// The rate limit's headers and, on a plan with a quota, the month counter's
/// answer (`None` on an unlimited plan).
struct Gated {
    rate: RateInfo,
    quota: Option<QuotaState>,
}

/// Both limits in one Redis script (one round trip, atomic): count the
/// request against the plan's requests per 5 minutes (GCRA, as
/// [`RateLimiter::check`]); when allowed and the plan has a quota, reserve
/// [`rules::grant`] tokens in the month counter. An absent counter is seeded
/// from `ai_usage` (once per user and month) by a second script. Redis failing
/// or slow: the in-process limiter and the database sum decide, and nothing
/// is held (as [`RateLimiter::check`]).
///
/// [`RateLimiter::check`]: crate::rate_limit::RateLimiter::check
async fn gate_redis(
    state: &AppState,
    window: LimitKey,
    limit: Limit,
    ask: &Ask,
) -> Result<Gated, Refusal> {
    let counter = counter_key(state, ask.user_id, ask.now);
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut conn = window.conn.clone();
    let mut inv = GATE.key(&window.key);
    inv.key(&counter)
        .arg(window.max)
        .arg(window.window_us)
        .arg(ask.quota.map_or(-1, clamp))
        .arg(clamp(ask.input))
        .arg(ask.want());
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
            return gate_fallback(state, limit, ask).await;
        }
    };
    let Some(decision) = rate_limit::decide_gcra(limit, &reply) else {
        return gate_fallback(state, limit, ask).await;
    };
    if !decision.allowed {
        return Err(ApiError::RateLimited(decision.info).into());
    }
    let rate = decision.info;
    let Some(quota) = ask.quota else {
        return Ok(Gated { rate, quota: None });
    };
    if reply[5] >= 0 {
        let granted = reply.get(6).copied().unwrap_or(0).max(0) as u64;
        let q = QuotaState {
            used: reply[5] as u64,
            granted,
            held: granted > 0,
        };
        return Ok(Gated {
            rate,
            quota: Some(q),
        });
    }
    // No counter for this month yet: seed it from the database.
    let sum = state
        .bounded_db(
            "summing AI usage",
            rules::tokens_this_month(&state.db, ask.user_id, ask.now),
        )
        .await?;
    let mut inv = SEED.key(&counter);
    inv.arg(sum)
        .arg(COUNTER_TTL_SECS)
        .arg(clamp(quota))
        .arg(clamp(ask.input))
        .arg(ask.want());
    let q = match tokio::time::timeout(budget, inv.invoke_async::<Vec<i64>>(&mut conn)).await {
        Ok(Ok(r)) if r.len() == 2 => QuotaState {
            used: r[0].max(0) as u64,
            granted: r[1].max(0) as u64,
            held: r[1] > 0,
        },
        _ => {
            tracing::warn!("could not seed the AI quota counter");
            QuotaState {
                used: sum,
                granted: ask.grant(sum),
                held: false,
            }
        }
    };
    Ok(Gated {
        rate,
        quota: Some(q),
    })
}

/// Redis did not answer the gate: the in-process limiter, and the cap from
/// the database sum (nothing held: requests in flight do not see each other
/// until Redis answers again).
async fn gate_fallback(state: &AppState, limit: Limit, ask: &Ask) -> Result<Gated, Refusal> {
    let decision = state
        .limiter
        .check_in_process(limit, &ask.user_id.to_string());
    if !decision.allowed {
        return Err(ApiError::RateLimited(decision.info).into());
    }
    let quota = match ask.quota {
        Some(_) => {
            let used = state
                .bounded_db(
                    "summing AI usage",
                    rules::tokens_this_month(&state.db, ask.user_id, ask.now),
                )
                .await?;
            Some(QuotaState {
                used,
                granted: ask.grant(used),
                held: false,
            })
        }
        None => None,
    };
    Ok(Gated {
        rate: decision.info,
        quota,
    })
}

/// Without Redis (embedded mode, or PostgreSQL alone): the in-process
/// limiter, then the reservation in the database's month counter (one
/// conditional `UPDATE`, shared by every api process on the database).
async fn gate_local(state: &AppState, limit: Limit, ask: &Ask) -> Result<Gated, Refusal> {
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let rate = state
        .limit_user("ai", ask.user_id, limit.max, limit.window, deadline)
        .await?;
    let Some(quota) = ask.quota else {
        return Ok(Gated { rate, quota: None });
    };
    let r = state
        .bounded_db(
            "reserving AI tokens",
            rules::reserve_in_db(
                &state.db,
                ask.user_id,
                ask.now,
                quota,
                ask.input,
                ask.max_output,
            ),
        )
        .await?;
    Ok(Gated {
        rate,
        quota: Some(QuotaState {
            used: r.used,
            granted: r.granted,
            held: r.granted > 0,
        }),
    })
}
