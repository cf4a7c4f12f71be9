//! The per-user monthly token counter: in Redis
//! (`<QUEUE_PREFIX>:ai:tokens:<user>:<YYYYMM>`, its scripts here), or in the
//! database's `ai_quota_counters` without Redis ([`rules::reserve_in_db`]).
//!
//! The counter holds the month's tokens: the `ai_usage` sum it was seeded
//! with, plus every reservation since, each settled to its real tokens when
//! its request ends. A reservation follows [`rules::grant`] in one atomic
//! step (one Lua script, or one conditional `UPDATE`), so requests running at
//! once, in any api process, never hold more than the quota between them.

use std::{sync::LazyLock, time::Duration};

use chrono::Utc;
use entity::ai as rules;
use uuid::Uuid;

use crate::{rate_limit, state::AppState};

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

/// [`rules::grant`] in Lua: tokens granted to a request with `input` tokens
/// of input bound and `want` = input + the plan's output cap, when `used` of
/// `quota` are taken (0: not one output token fits).
const GRANT_LUA: &str = r"
local function grant(used, quota, input, want)
  local left = quota - used
  if left > input then return math.min(left, want) end
  return 0
end
";

/// The AI gate (one round trip). KEYS: the rate limit's state, the month
/// counter. ARGV: the plan's requests per window, the window in
/// microseconds, its monthly tokens (-1: none), this request's input bound,
/// the input bound plus the plan's output cap. Returns the five values of
/// [`rate_limit::GCRA_LUA`]'s `gcra` (allowed, remaining, reset, retry, now)
/// plus: `-2` (rate-limited, or no quota: counter untouched), `-1` (no
/// counter yet), or `used, granted` (the counter before this request and the
/// tokens reserved for it, added to the counter; 0: refused, nothing added).
pub(super) static GATE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{}{}{}",
        rate_limit::GCRA_LUA,
        GRANT_LUA,
        r"
local a, r, reset, retry, now = gcra(KEYS[1], ARGV[1], ARGV[2])
if a == 0 or tonumber(ARGV[3]) < 0 then return {a, r, reset, retry, now, -2} end
local used = redis.call('GET', KEYS[2])
if not used then return {a, r, reset, retry, now, -1} end
used = math.max(tonumber(used), 0)
local granted = grant(used, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if granted > 0 then redis.call('INCRBY', KEYS[2], granted) end
return {a, r, reset, retry, now, used, granted}
"
    ))
});

/// Seeds an absent month counter and then reserves like [`GATE`]. KEYS: the
/// counter. ARGV: the database's sum, the counter's lifetime, the plan's
/// monthly tokens, the input bound, the input bound plus the output cap.
/// Returns `{used, granted}`.
pub(super) static SEED: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{}{}",
        GRANT_LUA,
        r"
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
local used = math.max(tonumber(redis.call('GET', KEYS[1])), 0)
local granted = grant(used, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if granted > 0 then redis.call('INCRBY', KEYS[1], granted) end
return {used, granted}
"
    ))
});

pub(super) fn counter_key(state: &AppState, user_id: Uuid, now: chrono::DateTime<Utc>) -> String {
    let base = format!("ai:tokens:{user_id}:{}", rules::month_key(now));
    if state.settings.queue_prefix.is_empty() {
        base
    } else {
        format!("{}:{base}", state.settings.queue_prefix)
    }
}

/// Adds `tokens` (negative: gives back) to the month counter of the month
/// containing `at` when it exists (an absent counter is seeded from the
/// database at the next check): in Redis, or without Redis in the database.
/// Returns whether the counter could be reached.
pub(super) async fn quota_add(
    state: &AppState,
    user_id: Uuid,
    at: chrono::DateTime<Utc>,
    tokens: i64,
) -> bool {
    let budget = state
        .settings
        .dependency_timeout
        .max(Duration::from_millis(100));
    let Some(mut conn) = state.queues.redis() else {
        let added =
            tokio::time::timeout(budget, rules::add_in_db(&state.db, user_id, at, tokens)).await;
        return match added {
            Ok(Ok(())) => true,
            other => {
                tracing::warn!(?other, "could not add to the AI quota counter");
                false
            }
        };
    };
    let key = counter_key(state, user_id, at);
    let mut inv = ADD_IF_PRESENT.key(key);
    inv.arg(tokens);
    let r = tokio::time::timeout(budget, inv.invoke_async::<i64>(&mut conn)).await;
    match r {
        Ok(Ok(n)) => n >= 0,
        _ => {
            tracing::warn!("could not add to the AI quota counter");
            false
        }
    }
}
