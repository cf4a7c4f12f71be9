//! Request rate limits and their headers.
//!
//! * With Redis: a fixed window per `(limit, subject)`, counted atomically by
//!   one Lua script (`INCR` + `EXPIRE`), so every api process shares it and
//!   concurrent requests can never exceed the limit.
//! * Without Redis (embedded mode): the `governor` crate's GCRA limiter in
//!   process (burst = the limit, refilled evenly over the window).
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
    /// Shared counters in Redis, keys `<prefix>:rl:<name>:<subject>:<window index>`.
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

static CHECK_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
",
    )
});

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
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
            RateLimiter::Redis {
                conn,
                prefix,
                fallback,
            } => {
                let window = limit.window.as_secs().max(1);
                let now = now_secs();
                let index = now / window;
                let reset = (index + 1) * window;
                let key = format!("{prefix}:{}:{subject}:{index}", limit.name);
                let mut c = conn.clone();
                let mut invocation = CHECK_SCRIPT.key(key);
                invocation.arg(window + 1);
                let call = invocation.invoke_async::<u64>(&mut c);
                let count = match tokio::time::timeout_at(deadline.into(), call).await {
                    Ok(Ok(n)) => n,
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
                let max = u64::from(limit.max);
                Decision {
                    allowed: count <= max,
                    info: RateInfo {
                        limit: max,
                        remaining: max.saturating_sub(count),
                        reset,
                        retry_after: reset.saturating_sub(now).max(1),
                    },
                }
            }
            RateLimiter::Local(map) => check_local(map, limit, subject),
        }
    }
}

/// The shared-store side of one window check, for a caller that counts the
/// request in its own Redis script together with other keys (the AI routes'
/// one-round-trip gate): the same key, expiry and reset as [`RateLimiter::check`].
#[derive(Clone)]
pub struct WindowKey {
    /// Connection to the shared store.
    pub conn: ConnectionManager,
    /// `<prefix>:rl:<name>:<subject>:<window index>`.
    pub key: String,
    /// Seconds the key lives (the window plus one).
    pub ttl_secs: u64,
    /// Unix epoch seconds now (this host's clock picks only the window index).
    pub now: u64,
    /// Unix epoch seconds when this window ends.
    pub reset: u64,
}

impl WindowKey {
    /// The decision for the window's `count` after this request's `INCR`.
    pub fn decide(&self, limit: Limit, count: u64) -> Decision {
        let max = u64::from(limit.max);
        Decision {
            allowed: count <= max,
            info: RateInfo {
                limit: max,
                remaining: max.saturating_sub(count),
                reset: self.reset,
                retry_after: self.reset.saturating_sub(self.now).max(1),
            },
        }
    }
}

impl RateLimiter {
    /// The Redis key of `subject`'s current window of `limit`; `None` for the
    /// in-process limiter.
    pub fn window_key(&self, limit: Limit, subject: &str) -> Option<WindowKey> {
        let RateLimiter::Redis { conn, prefix, .. } = self else {
            return None;
        };
        let window = limit.window.as_secs().max(1);
        let now = now_secs();
        let index = now / window;
        Some(WindowKey {
            conn: conn.clone(),
            key: format!("{prefix}:{}:{subject}:{index}", limit.name),
            ttl_secs: window + 1,
            now,
            reset: (index + 1) * window,
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
