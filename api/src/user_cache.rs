//! `UserCache`: the answers of `GET /auth/v1/user`, kept in the api process
//! and checked on every request against the user's *view generation* in Redis,
//! so a request costs one Redis round trip instead of a PostgreSQL query while
//! every change stays visible at once, in every api process.
//!
//! The protocol (one key per user, `<prefix>:uv:<user id>`, holding an opaque
//! random generation):
//! - A reader runs [`GENERATION_LUA`]: it returns the key's generation,
//!   creating a fresh random one when the key is missing. An entry cached with
//!   that same generation is answered as is; otherwise the reader loads the
//!   view from the database *after* reading the generation and caches it under
//!   that generation.
//! - A writer, after its change has committed and before it answers, deletes
//!   the key ([`UserCache::changed`]). The next reader then creates a new
//!   generation, so no entry cached before the delete matches any more; an
//!   entry cached by a reader that loaded before the commit carries a
//!   generation read before the delete, which is gone for good (generations
//!   are random, never reused).
//!
//! Nothing here compares clocks. When Redis is unreachable the reader goes to
//! the database (and caches nothing); a writer that cannot delete the key logs
//! it, and entries are also dropped after [`MAX_AGE`] of this process's
//! monotonic clock, which bounds how long such a failed delete can show a
//! stale answer. Without Redis (the embedded default) there is no cache.

use std::{
    collections::HashMap,
    sync::{PoisonError, RwLock},
    time::{Duration, Instant},
};

use redis::{aio::ConnectionManager, Script};
use uuid::Uuid;

/// Returns the generation in `KEYS[1]`, first setting it to `ARGV[1]` (with
/// a lifetime of `ARGV[2]` seconds) when the key is missing.
pub const GENERATION_LUA: &str = r"
local g = redis.call('GET', KEYS[1])
if not g then
  g = ARGV[1]
  redis.call('SET', KEYS[1], g, 'EX', ARGV[2])
end
return g
";

/// Lifetime of a generation key in Redis (seconds); an expired key only
/// costs each of the user's sessions one reload.
const GENERATION_TTL_SECS: u64 = 24 * 3600;

/// Longest an entry is answered from, whatever Redis says (see the module
/// documentation).
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// Most entries held (one per session); when full the cache starts over.
pub const MAX_ENTRIES: usize = 8192;

struct Entry<T> {
    user_id: Uuid,
    generation: String,
    value: T,
    stored: Instant,
}

/// Cached values `T` (the user's answer) per session id; see the module
/// documentation for when they are used.
pub struct UserCache<T> {
    redis: Option<ConnectionManager>,
    prefix: String,
    timeout: Duration,
    script: Script,
    entries: RwLock<HashMap<Uuid, Entry<T>>>,
}

impl<T> std::fmt::Debug for UserCache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserCache")
            .field("enabled", &self.redis.is_some())
            .finish_non_exhaustive()
    }
}

/// What [`UserCache::lookup`] found.
pub enum Lookup<T> {
    /// The cached value, still current.
    Hit(T),
    /// Not cached or outdated: load it, then [`UserCache::store`] it with this
    /// generation (`None`: Redis is unavailable, do not store).
    Miss(Option<String>),
}

impl<T: Clone> UserCache<T> {
    /// A cache validated through `redis` (keys under `prefix`), each Redis
    /// call bounded by `timeout`; with `redis = None` nothing is cached.
    pub fn new(redis: Option<ConnectionManager>, prefix: &str, timeout: Duration) -> Self {
        UserCache {
            redis,
            prefix: prefix.to_string(),
            timeout,
            script: Script::new(GENERATION_LUA),
            entries: RwLock::default(),
        }
    }

    fn key(&self, user_id: Uuid) -> String {
        format!("{}:uv:{}", self.prefix, user_id)
    }

    /// The value cached for `session_id` of `user_id` if its generation is
    /// still the user's current one.
    pub async fn lookup(&self, user_id: Uuid, session_id: Uuid) -> Lookup<T> {
        let Some(mut conn) = self.redis.clone() else {
            return Lookup::Miss(None);
        };
        let fresh = format!("{:032x}", rand::random::<u128>());
        let mut call = self.script.key(self.key(user_id));
        call.arg(&fresh).arg(GENERATION_TTL_SECS);
        let generation: String = match tokio::time::timeout(
            self.timeout,
            call.invoke_async(&mut conn),
        )
        .await
        {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "user cache: Redis failed; loading from the database");
                return Lookup::Miss(None);
            }
            Err(_) => {
                tracing::debug!("user cache: Redis timed out; loading from the database");
                return Lookup::Miss(None);
            }
        };
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        match entries.get(&session_id) {
            Some(e)
                if e.user_id == user_id
                    && e.generation == generation
                    && e.stored.elapsed() < MAX_AGE =>
            {
                Lookup::Hit(e.value.clone())
            }
            _ => Lookup::Miss(Some(generation)),
        }
    }

    /// Caches `value` for `session_id` under `generation` (from the
    /// [`Lookup::Miss`] that preceded the load).
    pub fn store(&self, user_id: Uuid, session_id: Uuid, generation: String, value: &T) {
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(&session_id) {
            entries.clear();
        }
        entries.insert(
            session_id,
            Entry {
                user_id,
                generation,
                value: value.clone(),
                stored: Instant::now(),
            },
        );
    }

    /// Records that `user_id`'s answer (account, identities, sessions) changed:
    /// call after the change committed, before answering. Drops this process's
    /// entries of the user and deletes the generation in Redis, which outdates
    /// every other process's.
    pub async fn changed(&self, user_id: Uuid) {
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, e| e.user_id != user_id);
        let Some(mut conn) = self.redis.clone() else {
            return;
        };
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.key(user_id));
        let del = cmd.query_async::<i64>(&mut conn);
        match tokio::time::timeout(self.timeout, del).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                error = %e, %user_id,
                "user cache: could not outdate the user's cached answers; other api processes may show the previous one for up to 60 s"
            ),
            Err(_) => tracing::warn!(
                %user_id,
                "user cache: Redis timed out outdating the user's cached answers; other api processes may show the previous one for up to 60 s"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_redis_nothing_is_answered_from_the_cache() {
        let c = UserCache::<u32>::new(None, "t", Duration::from_millis(100));
        let (user, session) = (Uuid::new_v4(), Uuid::new_v4());
        c.store(user, session, "g".into(), &7);
        assert!(matches!(c.lookup(user, session).await, Lookup::Miss(None)));
        c.changed(user).await;
        assert!(c.entries.read().unwrap().is_empty());
    }

    #[test]
    fn stays_bounded() {
        let c = UserCache::<u32>::new(None, "t", Duration::from_millis(100));
        let user = Uuid::new_v4();
        for i in 0..=MAX_ENTRIES {
            c.store(user, Uuid::new_v4(), "g".into(), &(i as u32));
        }
        assert!(c.entries.read().unwrap().len() <= MAX_ENTRIES);
    }
}
