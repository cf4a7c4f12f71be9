//! The Redis store of the per-user monthly token counter
//! (`<QUEUE_PREFIX>:ai:tokens:<user>:<YYYYMM>`, its scripts here): the fast
//! store behind [`entity::ai::quota`], which owns the reservation and falls
//! back to the database's `ai_quota_counters` when Redis cannot be used.
//!
//! The counter holds the month's tokens: the `ai_usage` sum it was seeded
//! with, plus every reservation since, each settled to its real tokens when
//! its request ends. A reservation follows [`rules::grant`] in one atomic
//! step (one Lua script, or one conditional `UPDATE`), so requests running at
//! once, in any api process, never hold more than the quota between them.

use std::{sync::LazyLock, time::Duration};

use chrono::Utc;
use entity::{
    ai::limits as rules,
    ai::quota::{Ask, FastCounter, Reserved, StoreDown},
};
use redis::aio::ConnectionManager;
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
static SEED: LazyLock<redis::Script> = LazyLock::new(|| {
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
    counter_key_in(&state.settings.queue_prefix, user_id, now)
}

fn counter_key_in(prefix: &str, user_id: Uuid, now: chrono::DateTime<Utc>) -> String {
    let base = format!("ai:tokens:{user_id}:{}", rules::month_key(now));
    if prefix.is_empty() {
        base
    } else {
        format!("{prefix}:{base}")
    }
}

/// The Redis month counters: the fast store of [`entity::ai::quota`].
pub(super) struct RedisCounter {
    conn: ConnectionManager,
    prefix: String,
    /// Bound of a seeding call (inside the reservation's own bound).
    seed_budget: Duration,
    /// Bound of a settling call.
    add_budget: Duration,
}

impl RedisCounter {
    /// The counters in the queues' Redis; `None` without Redis.
    pub(super) fn of(state: &AppState) -> Option<Self> {
        let timeout = state.settings.dependency_timeout;
        Some(RedisCounter {
            conn: state.queues.redis()?,
            prefix: state.settings.queue_prefix.clone(),
            seed_budget: (timeout / 3).max(Duration::from_millis(50)),
            add_budget: timeout.max(Duration::from_millis(100)),
        })
    }
}

impl FastCounter for RedisCounter {
    async fn seed_and_reserve(&self, ask: &Ask, sum: u64) -> Result<Reserved, StoreDown> {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut inv = SEED.key(counter_key_in(&self.prefix, ask.user_id, ask.now));
        inv.arg(clamp(sum))
            .arg(COUNTER_TTL_SECS)
            .arg(clamp(ask.limit))
            .arg(clamp(ask.input))
            .arg(clamp(ask.want()));
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.seed_budget, inv.invoke_async::<Vec<i64>>(&mut conn)).await
        {
            Ok(Ok(r)) if r.len() == 2 => Ok(Reserved {
                used: r[0].max(0) as u64,
                granted: r[1].max(0) as u64,
            }),
            Ok(Ok(r)) => Err(StoreDown(format!("unexpected seed reply {r:?}"))),
            Ok(Err(e)) => Err(StoreDown(e.to_string())),
            Err(_) => Err(StoreDown("timed out".into())),
        }
    }

    async fn add(
        &self,
        user_id: Uuid,
        at: chrono::DateTime<Utc>,
        tokens: i64,
    ) -> Result<(), StoreDown> {
        let mut inv = ADD_IF_PRESENT.key(counter_key_in(&self.prefix, user_id, at));
        inv.arg(tokens);
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.add_budget, inv.invoke_async::<i64>(&mut conn)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StoreDown(e.to_string())),
            Err(_) => Err(StoreDown("timed out".into())),
        }
    }
}
