//! The per-user monthly token counter in Redis
//! (`<QUEUE_PREFIX>:ai:tokens:<user>:<YYYYMM>`) and its scripts.

use std::{sync::LazyLock, time::Duration};

use chrono::Utc;
use entity::ai as rules;
use uuid::Uuid;

use crate::{problem::ApiError, rate_limit, state::AppState};

/// Seconds a month counter lives (40 days: past its month, then gone).
pub(super) const COUNTER_TTL_SECS: u64 = 40 * 24 * 3600;

static ADD_IF_PRESENT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end
return -1
",
    )
});

/// The AI gate (one round trip). KEYS: the rate limit's state, the month
/// counter. ARGV: the plan's requests per window, the window in
/// microseconds, its monthly tokens (-1: none), this request's estimate.
/// Returns the five values of [`rate_limit::GCRA_LUA`]'s `gcra` (allowed,
/// remaining, reset, retry, now) plus: `-2` (rate-limited, or no quota:
/// counter untouched), `-1` (no counter yet), or `used, reserved` (the counter
/// before this request; `reserved` 1 when the estimate was added, i.e. `used`
/// < the quota).
pub(super) static GATE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{}{}",
        rate_limit::GCRA_LUA,
        r"
local a, r, reset, retry, now = gcra(KEYS[1], ARGV[1], ARGV[2])
if a == 0 or tonumber(ARGV[3]) < 0 then return {a, r, reset, retry, now, -2} end
local used = redis.call('GET', KEYS[2])
if not used then return {a, r, reset, retry, now, -1} end
used = math.max(tonumber(used), 0)
if used < tonumber(ARGV[3]) then
  redis.call('INCRBY', KEYS[2], ARGV[4])
  return {a, r, reset, retry, now, used, 1}
end
return {a, r, reset, retry, now, used, 0}
"
    ))
});

/// Seeds an absent month counter and then checks and reserves like [`GATE`].
/// KEYS: the counter. ARGV: the database's sum, the counter's lifetime, the
/// plan's monthly tokens, this request's estimate. Returns `{used, reserved}`.
pub(super) static SEED: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
local used = math.max(tonumber(redis.call('GET', KEYS[1])), 0)
if used < tonumber(ARGV[3]) then
  redis.call('INCRBY', KEYS[1], ARGV[4])
  return {used, 1}
end
return {used, 0}
",
    )
});

pub(super) fn counter_key(state: &AppState, user_id: Uuid, now: chrono::DateTime<Utc>) -> String {
    let base = format!("ai:tokens:{user_id}:{}", rules::month_key(now));
    if state.settings.queue_prefix.is_empty() {
        base
    } else {
        format!("{}:{base}", state.settings.queue_prefix)
    }
}

/// Tokens of `user_id` this month: the Redis counter, seeded from the
/// database when absent; the database sum when Redis is absent or fails.
pub(super) async fn quota_used(
    state: &AppState,
    user_id: Uuid,
    now: chrono::DateTime<Utc>,
) -> Result<u64, ApiError> {
    let from_db = || {
        state.bounded_db(
            "summing AI usage",
            rules::tokens_this_month(&state.db, user_id, now),
        )
    };
    let Some(mut conn) = state.queues.redis() else {
        return from_db().await;
    };
    let key = counter_key(state, user_id, now);
    let budget = state.settings.dependency_timeout;
    let got: Result<Result<Option<i64>, _>, _> = tokio::time::timeout(
        budget,
        redis::cmd("GET")
            .arg(&key)
            .query_async::<Option<i64>>(&mut conn),
    )
    .await;
    match got {
        Ok(Ok(Some(n))) => Ok(n.max(0) as u64),
        Ok(Ok(None)) => {
            let sum = from_db().await?;
            let seeded = tokio::time::timeout(
                budget,
                redis::cmd("SET")
                    .arg(&key)
                    .arg(sum)
                    .arg("NX")
                    .arg("EX")
                    .arg(COUNTER_TTL_SECS)
                    .query_async::<Option<String>>(&mut conn),
            )
            .await;
            if !matches!(seeded, Ok(Ok(_))) {
                tracing::warn!("could not seed the AI quota counter");
            }
            Ok(sum)
        }
        _ => {
            tracing::warn!("AI quota counter unavailable; summing ai_usage");
            from_db().await
        }
    }
}

/// Adds `tokens` (negative: gives back) to the month counter when it exists
/// (an absent counter is seeded from the database at the next check).
/// Returns whether the counter took it.
pub(super) async fn quota_add(
    state: &AppState,
    user_id: Uuid,
    at: chrono::DateTime<Utc>,
    tokens: i64,
) -> bool {
    let Some(mut conn) = state.queues.redis() else {
        return false;
    };
    let key = counter_key(state, user_id, at);
    let mut inv = ADD_IF_PRESENT.key(key);
    inv.arg(tokens);
    let r = tokio::time::timeout(
        state
            .settings
            .dependency_timeout
            .max(Duration::from_millis(100)),
        inv.invoke_async::<i64>(&mut conn),
    )
    .await;
    match r {
        Ok(Ok(n)) => n >= 0,
        _ => {
            tracing::warn!("could not add to the AI quota counter");
            false
        }
    }
}
