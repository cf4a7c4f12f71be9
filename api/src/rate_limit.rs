//! Request rate limits and their headers.
//!
//! The algorithm is GCRA (the generic cell rate algorithm, as in ATM's
//! ITU-T I.371 and the `governor` crate): a limit of `max` per `window` is a
//! burst of `max` refilled one request per `window / max`, so a client never
//! gets more than `max` in any `window` (no doubled burst at a window
//! boundary, as fixed windows allow).
//! * With Redis: the state per `(limit, subject)` is one key holding the
//!   theoretical arrival time, read and moved by one Lua script
//!   ([`GCRA_LUA`]) that takes the time from Redis (`TIME`, microseconds), so
//!   every api process shares the limit and one clock decides, whatever the
//!   api hosts' clocks say; concurrent requests can never exceed it.
//! * Without Redis (embedded mode): the `governor` crate's GCRA limiter in
//!   process, with the same burst and refill.
//!
//! Headers: `X-RateLimit-Limit` is `max`; `X-RateLimit-Remaining` the requests
//! allowed right now; `X-RateLimit-Reset` (Unix epoch seconds, rounded up) when
//! the whole burst is back, or on a 429 when the next request is allowed;
//! on a 429, `Retry-After` the seconds (rounded up, at least 1) until then.
//!
//! If Redis does not answer within the request's deadline, the check falls
//! back to the in-process limiter (logged): the limit then holds per api
//! process instead of across them, and never lapses during an outage (the
//! waitlist, which does not need Redis otherwise, stays limited).

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, LazyLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use governor::{
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::keyed::DefaultKeyedStateStore,
    Quota, RateLimiter as Gcra,
};
use redis::{aio::ConnectionManager, Script};

use crate::problem::RateInfo;

/// A named limit: at most `max` requests per `window` per subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Key part naming the limit, e.g. `contact`.
    pub name: &'static str,
    /// Requests allowed per window.
    pub max: u32,
    /// Window length.
    pub window: Duration,
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    /// Whether this request may proceed.
    pub allowed: bool,
    /// Header values.
    pub info: RateInfo,
}

type Local = Gcra<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

/// The limiter shared by all routes.
#[derive(Clone)]
pub enum RateLimiter {
    /// Shared state in Redis, keys `<prefix>:rl:<name>:<subject>` ([`GCRA_LUA`]).
    Redis {
        /// Connection (shared with the queue producer).
        conn: ConnectionManager,
        /// `QUEUE_PREFIX` namespace.
        prefix: String,
        /// Used while Redis does not answer.
        fallback: LocalLimits,
    },
    /// In-process limiters, one per limit.
    Local(LocalLimits),
}

/// In-process GCRA limiters, one per limit, keyed by subject.
pub type LocalLimits = Arc<std::sync::Mutex<HashMap<Limit, Arc<Local>>>>;

/// GCRA in Lua, for Redis scripts: defines `gcra(key, max, window_us)`, which
/// counts one request against the limit whose state is `key` and returns
/// `allowed` (1/0), `remaining`, `reset_us` (microseconds until the whole
/// burst is back), `retry_us` (microseconds until the next request is allowed;
/// 0 when allowed) and `now_s` (Redis's clock, Unix seconds). A refused
/// request changes nothing. The key (the theoretical arrival time, µs) expires
/// when the burst is whole again. Times come from Redis's `TIME` (scripts
/// replicate their effects, Redis ≥ 5), not from the caller. The other scripts
/// that count a request (the AI gate) prepend this to their own body.
pub const GCRA_LUA: &str = r"
local function gcra(key, max, window_us)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  max = tonumber(max)
  local period = math.max(math.floor(tonumber(window_us) / max), 1)
  local tat = tonumber(redis.call('GET', key) or 0)
  if tat < now then tat = now end
  local new_tat = tat + period
  local allow_at = new_tat - max * period
  if now < allow_at then
    return 0, 0, tat - now, allow_at - now, tonumber(t[1])
  end
  redis.call('SET', key, new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
  return 1, math.floor((now - allow_at) / period), new_tat - now, 0, tonumber(t[1])
end
";

static CHECK_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{GCRA_LUA}\nlocal a, r, reset, retry, now = gcra(KEYS[1], ARGV[1], ARGV[2])\nreturn {{a, r, reset, retry, now}}\n"
    ))
});

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The decision for a [`GCRA_LUA`] reply (a refusal is counted in
/// `rate_limit_refusals_total`) `[allowed, remaining, reset_us,
/// retry_us, now_s]` (its first five values); `None` when the reply is not
/// that shape.
pub fn decide_gcra(limit: Limit, reply: &[i64]) -> Option<Decision> {
    let [allowed, remaining, reset_us, retry_us, now_s] = *reply.get(..5)? else {
        return None;
    };
    let up = |us: i64| (us.max(0) as u64).div_ceil(1_000_000);
    let now = now_s.max(0) as u64;
    let info = if allowed == 1 {
        RateInfo {
            limit: u64::from(limit.max),
            remaining: remaining.max(0) as u64,
            reset: now + up(reset_us),
            retry_after: 0,
        }
    } else {
        refused(limit);
        let retry_after = up(retry_us).max(1);
        RateInfo {
            limit: u64::from(limit.max),
            remaining: 0,
            reset: now + retry_after,
            retry_after,
        }
    };
    Some(Decision {
        allowed: allowed == 1,
        info,
    })
}

impl RateLimiter {
    /// Redis-backed when a connection is given, else in-process.
    pub fn new(redis: Option<ConnectionManager>, prefix: &str) -> Self {
        match redis {
            Some(conn) => RateLimiter::Redis {
                conn,
                prefix: if prefix.is_empty() {
                    "rl".into()
                } else {
                    format!("{prefix}:rl")
                },
                fallback: Default::default(),
            },
            None => RateLimiter::Local(Default::default()),
        }
    }

    /// Counts one request of `subject` against `limit`. The shared store is
    /// given until `deadline`; past it (or on error) the in-process limiter
    /// decides.
    pub async fn check(
        &self,
        limit: Limit,
        subject: &str,
        deadline: std::time::Instant,
    ) -> Decision {
        match self {
            RateLimiter::Redis { fallback, .. } => {
                let Some(k) = self.limit_key(limit, subject) else {
                    return check_local(fallback, limit, subject);
                };
                let mut c = k.conn;
                let mut invocation = CHECK_SCRIPT.key(k.key);
                invocation.arg(k.max).arg(k.window_us);
                let call = invocation.invoke_async::<Vec<i64>>(&mut c);
                let reply = match tokio::time::timeout_at(deadline.into(), call).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, limit = limit.name, "rate-limit store unavailable; limiting in process");
                        return check_local(fallback, limit, subject);
                    }
                    Err(_) => {
                        tracing::warn!(
                            limit = limit.name,
                            "rate-limit store timed out; limiting in process"
                        );
                        return check_local(fallback, limit, subject);
                    }
                };
                decide_gcra(limit, &reply).unwrap_or_else(|| {
                    tracing::warn!(
                        ?reply,
                        limit = limit.name,
                        "unexpected rate-limit reply; limiting in process"
                    );
                    check_local(fallback, limit, subject)
                })
            }
            RateLimiter::Local(map) => check_local(map, limit, subject),
        }
    }
}

/// The shared-store side of one check, for a caller that counts the request
/// in its own Redis script together with other keys (the AI routes'
/// one-round-trip gate, which prepends [`GCRA_LUA`]): the same key and
/// arguments as [`RateLimiter::check`]; [`decide_gcra`] reads the reply.
#[derive(Clone)]
pub struct LimitKey {
    /// Connection to the shared store.
    pub conn: ConnectionManager,
    /// `<prefix>:rl:<name>:<subject>`.
    pub key: String,
    /// `gcra`'s `max`.
    pub max: u32,
    /// `gcra`'s `window_us`.
    pub window_us: u64,
}

/// A limit's window in microseconds (at least 1).
fn window_us(limit: Limit) -> u64 {
    u64::try_from(limit.window.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl RateLimiter {
    /// The Redis key of `subject`'s state for `limit`; `None` for the
    /// in-process limiter.
    pub fn limit_key(&self, limit: Limit, subject: &str) -> Option<LimitKey> {
        let RateLimiter::Redis { conn, prefix, .. } = self else {
            return None;
        };
        Some(LimitKey {
            conn: conn.clone(),
            key: format!("{prefix}:{}:{subject}", limit.name),
            max: limit.max.max(1),
            window_us: window_us(limit),
        })
    }

    /// One request of `subject` against the in-process limiter (the Redis
    /// limiter's fallback while Redis does not answer).
    pub fn check_in_process(&self, limit: Limit, subject: &str) -> Decision {
        match self {
            RateLimiter::Redis { fallback, .. } => check_local(fallback, limit, subject),
            RateLimiter::Local(map) => check_local(map, limit, subject),
        }
    }
}

/// Counts a refusal by `limit` (`rate_limit_refusals_total{limit}`): every
/// decision that refuses, shared or in process, passes here.
fn refused(limit: Limit) {
    if worker::metrics::enabled() {
        metrics::counter!(worker::metrics::RATE_LIMITED, "limit" => limit.name).increment(1);
    }
}

/// One request of `subject` against the in-process limiter of `limit`.
fn check_local(map: &LocalLimits, limit: Limit, subject: &str) -> Decision {
    let limiter = {
        let mut m = map.lock().expect("rate-limit map poisoned");
        m.entry(limit)
            .or_insert_with(|| {
                let max = NonZeroU32::new(limit.max).unwrap_or(NonZeroU32::MIN);
                let period = limit.window / limit.max.max(1);
                let quota = Quota::with_period(period.max(Duration::from_nanos(1)))
                    .expect("non-zero period")
                    .allow_burst(max);
                Arc::new(Gcra::keyed(quota).with_middleware::<StateInformationMiddleware>())
            })
            .clone()
    };
    if limiter.len() > 100_000 {
        limiter.retain_recent();
    }
    let max = u64::from(limit.max);
    let now = now_secs();
    match limiter.check_key(&subject.to_string()) {
        Ok(snapshot) => {
            let remaining = u64::from(snapshot.remaining_burst_capacity());
            // Full again after the used part of the burst has refilled.
            let per = limit.window.as_secs_f64() / max as f64;
            let reset = now + ((max - remaining) as f64 * per).ceil() as u64;
            Decision {
                allowed: true,
                info: RateInfo {
                    limit: max,
                    remaining,
                    reset,
                    retry_after: 0,
                },
            }
        }
        Err(not_until) => {
            refused(limit);
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            let retry_after = wait.as_secs().max(1);
            Decision {
                allowed: false,
                info: RateInfo {
                    limit: max,
                    remaining: 0,
                    reset: now + retry_after,
                    retry_after,
                },
            }
        }
    }
}
