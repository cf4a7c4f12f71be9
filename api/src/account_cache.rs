//! `AccountCache`: the caller's stored account and plan in force
//! ([`entity::users::ensure_user_with_plan`]'s answer), kept in the api
//! process and invalidated by PostgreSQL notifications, so a session route
//! that needs the plan (the AI routes) costs no database round trip while
//! the account is unchanged.
//!
//! The protocol:
//! - Migration `m20261126_000001_notify_account_changes` installs row
//!   triggers on `users`, `user_roles` and `subscriptions`: every insert,
//!   update or delete sends `NOTIFY account_changed, '<user id>'`. PostgreSQL
//!   delivers a notification when (and only if) its transaction commits, to
//!   every listening session, so every writer is covered: the api, the
//!   worker's settlement and expiry, an operator's `psql`.
//! - Each api process keeps one connection listening on that channel
//!   ([`listen`]). A notification removes the user's entry, advances the
//!   cache's *sequence* and records it as that user's last change.
//! - A reader that misses takes a [`Ticket`] (the sequence) *before* its
//!   query and stores the answer only if no change of *that user* was
//!   recorded since (and the cache has not been reset since). A query that
//!   read the old row either stores before the notification arrives (which
//!   then removes it) or finds the user's change newer than its ticket (and
//!   stores nothing). Changes of other users do not void it.
//! - The record of last changes is bounded ([`MAX_ENTRIES`] users); when it
//!   is full it is reset, which voids every ticket taken before (a load
//!   then simply goes unstored).
//! - Entries are used only while the listener is connected. When its
//!   connection is lost the cache is emptied and reset; it is
//!   used again once the listener listens again. (Between the loss and the
//!   listener noticing it, normally at once since the server closes the
//!   socket, a change can go unnoticed; emptying the cache on noticing ends
//!   that.) An entry is also dropped
//!   after [`MAX_AGE`] of this process's monotonic clock, which bounds a
//!   listener that is cut off without noticing.
//!
//! What a reader sees: a change is visible once its notification reaches
//! this process, normally well under a millisecond after the commit (the
//! notification travels on an open connection); a request that races the
//! commit may still see the previous account, as it could without a cache.
//! Nothing compares clocks. On SQLite (the embedded default) nothing is
//! cached.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use entity::users::UserContext;
use sea_orm::{
    sqlx::postgres::{PgListener, PgPoolOptions},
    DatabaseConnection, DbBackend,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The notification channel of the triggers.
pub const CHANNEL: &str = "account_changed";

/// Longest an entry is used, whatever the listener says.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// Most entries held (one per user); when full the cache starts over.
pub const MAX_ENTRIES: usize = 16_384;

/// Wait before connecting the listener again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The `application_name` of the listener's connection (`pg_stat_activity`).
pub const APPLICATION_NAME: &str = "api-account-listener";

struct Entry {
    token_email: Option<String>,
    value: (UserContext, String),
    stored: Instant,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Uuid, Entry>,
    /// Advanced by every notification and every reset.
    seq: u64,
    /// The `seq` of each user's last notification since the last reset.
    changes: HashMap<Uuid, u64>,
    /// The `seq` of the last reset: tickets older than this store nothing.
    floor: u64,
    live: bool,
}

impl Inner {
    /// Voids every ticket taken so far and forgets the recorded changes;
    /// entries stay.
    fn void_tickets(&mut self) {
        self.seq += 1;
        self.floor = self.seq;
        self.changes.clear();
    }

    /// Forgets everything: entries, recorded changes and every ticket taken
    /// so far.
    fn reset(&mut self) {
        self.void_tickets();
        self.entries.clear();
    }
}

/// The sequence a reader saw before its query; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(Option<u64>);

/// Accounts and plans per user id, valid while PostgreSQL's notifications
/// say they are unchanged. Cheap to share (`Arc`).
#[derive(Default)]
pub struct AccountCache {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for AccountCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("AccountCache")
            .field("live", &inner.live)
            .field("entries", &inner.entries.len())
            .finish()
    }
}

impl AccountCache {
    /// A cache for `db`: on PostgreSQL, with its listener spawned (stopped by
    /// `shutdown`); on any other backend, a cache that never holds anything.
    pub fn start(db: &DatabaseConnection, shutdown: &CancellationToken) -> Arc<Self> {
        let cache = Arc::new(AccountCache::default());
        if db.get_database_backend() == DbBackend::Postgres {
            let options = db
                .get_postgres_connection_pool()
                .connect_options()
                .as_ref()
                .clone()
                .application_name(APPLICATION_NAME);
            // A pool of its own: the listener holds its connection for good,
            // which must not take one from the requests' pool.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy_with(options);
            let (c, stop) = (cache.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = listen(&c, pool) => {}
                    () = stop.cancelled() => {}
                }
                c.go_dark();
            });
        }
        cache
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached account of `user_id`, if the cache is live, the entry is
    /// younger than [`MAX_AGE`] and it was stored for a token with the same
    /// `email` claim (another email goes to the database, which records it).
    pub fn get(&self, user_id: Uuid, token_email: Option<&str>) -> Option<(UserContext, String)> {
        let inner = self.lock();
        if !inner.live {
            return None;
        }
        let e = inner.entries.get(&user_id)?;
        (e.stored.elapsed() < MAX_AGE && e.token_email.as_deref() == token_email)
            .then(|| e.value.clone())
    }

    /// Taken before loading an account from the database.
    pub fn ticket(&self) -> Ticket {
        let inner = self.lock();
        Ticket(inner.live.then_some(inner.seq))
    }

    /// Stores what the database answered for a token with `token_email`,
    /// unless a notification about this user (or a reset: a lost listener, a
    /// full record of changes) came in since `ticket` was taken.
    pub fn put(&self, ticket: Ticket, token_email: Option<&str>, value: &(UserContext, String)) {
        let mut inner = self.lock();
        let Some(taken) = ticket.0 else { return };
        let user = value.0.user_id;
        let changed_since = inner.changes.get(&user).is_some_and(|&c| c > taken);
        if !inner.live || taken < inner.floor || changed_since {
            return;
        }
        if inner.entries.len() >= MAX_ENTRIES {
            inner.entries.clear();
        }
        inner.entries.insert(
            user,
            Entry {
                token_email: token_email.map(str::to_string),
                value: value.clone(),
                stored: Instant::now(),
            },
        );
    }

    /// A notification: `payload` is the user id whose rows changed (anything
    /// else empties the cache).
    fn changed(&self, payload: &str) {
        let mut inner = self.lock();
        match Uuid::parse_str(payload.trim()) {
            Ok(id) if inner.changes.len() < MAX_ENTRIES || inner.changes.contains_key(&id) => {
                inner.seq += 1;
                let seq = inner.seq;
                inner.changes.insert(id, seq);
                inner.entries.remove(&id);
            }
            Ok(id) => {
                // The record of changes is full: start it over, voiding
                // every load in flight, and drop the user's entry.
                inner.void_tickets();
                inner.entries.remove(&id);
            }
            Err(_) => {
                tracing::warn!(payload, "account cache: unexpected notification; emptied");
                inner.reset();
            }
        }
    }

    /// The listener listens (again): entries may be stored and used.
    fn go_live(&self) {
        let mut inner = self.lock();
        inner.reset();
        inner.live = true;
    }

    /// The listener lost (or never had) its connection: notifications may
    /// have been missed, so nothing cached so far is trusted.
    fn go_dark(&self) {
        let mut inner = self.lock();
        inner.reset();
        inner.live = false;
    }
}

/// Keeps a connection listening on [`CHANNEL`] and applies what arrives;
/// reconnects after [`RECONNECT_AFTER`] when the connection fails.
async fn listen(cache: &AccountCache, pool: sea_orm::sqlx::PgPool) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                // Reconnect by hand, so that a lost connection is noticed
                // (`Ok(None)`) before anything is used again.
                listener.eager_reconnect(false);
                match listener.listen(CHANNEL).await {
                    Ok(()) => {
                        cache.go_live();
                        tracing::debug!("account cache: listening");
                        loop {
                            match listener.try_recv().await {
                                Ok(Some(n)) => cache.changed(n.payload()),
                                Ok(None) => {
                                    tracing::warn!("account cache: listener connection lost");
                                    break;
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "account cache: listener failed");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "account cache: LISTEN failed"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "account cache: cannot connect its listener"),
        }
        cache.go_dark();
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

#[cfg(test)]
mod tests {
    use entity::entities::user_roles::Role;

    use super::*;

    fn account(id: Uuid, email: Option<&str>, plan: &str) -> (UserContext, String) {
        (
            UserContext {
                user_id: id,
                email: email.map(str::to_string),
                role: Role::Member,
            },
            plan.to_string(),
        )
    }

    fn live() -> AccountCache {
        let c = AccountCache::default();
        c.go_live();
        c
    }

    #[test]
    fn nothing_is_cached_until_the_listener_listens() {
        let c = AccountCache::default();
        let id = Uuid::new_v4();
        let t = c.ticket();
        c.put(t, None, &account(id, None, "FREE"));
        assert_eq!(c.get(id, None), None);
        c.go_live();
        c.put(t, None, &account(id, None, "FREE"));
        assert_eq!(c.get(id, None), None, "a ticket from before going live");
        c.put(c.ticket(), None, &account(id, None, "FREE"));
        assert_eq!(c.get(id, None), Some(account(id, None, "FREE")));
    }

    #[test]
    fn a_notification_removes_the_user_and_voids_loads_in_flight() {
        let c = live();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        c.put(c.ticket(), None, &account(a, None, "PRO"));
        c.put(c.ticket(), None, &account(b, None, "FREE"));
        let in_flight = c.ticket();
        c.changed(&a.to_string());
        assert_eq!(c.get(a, None), None);
        assert_eq!(
            c.get(b, None),
            Some(account(b, None, "FREE")),
            "others stay"
        );
        // A load that read before the change must not be stored.
        c.put(in_flight, None, &account(a, None, "PRO"));
        assert_eq!(c.get(a, None), None);
        // A load of another user, in flight at the same time, is.
        let other = Uuid::new_v4();
        c.put(in_flight, None, &account(other, None, "FREE"));
        assert_eq!(
            c.get(other, None),
            Some(account(other, None, "FREE")),
            "another user's change does not void it"
        );
        c.put(c.ticket(), None, &account(a, None, "FREE"));
        assert_eq!(c.get(a, None), Some(account(a, None, "FREE")));
        // A payload that is not a user id empties everything.
        c.changed("?");
        assert_eq!(c.get(b, None), None);
    }

    #[test]
    fn a_lost_listener_empties_the_cache_and_stops_its_use() {
        let c = live();
        let id = Uuid::new_v4();
        c.put(c.ticket(), None, &account(id, None, "PRO"));
        let in_flight = c.ticket();
        c.go_dark();
        assert_eq!(c.get(id, None), None);
        c.put(c.ticket(), None, &account(id, None, "PRO"));
        c.go_live();
        c.put(in_flight, None, &account(id, None, "PRO"));
        assert_eq!(c.get(id, None), None, "nothing from before the loss");
    }

    #[test]
    fn another_token_email_is_a_miss() {
        let c = live();
        let id = Uuid::new_v4();
        c.put(
            c.ticket(),
            Some("a@example.com"),
            &account(id, Some("a@example.com"), "FREE"),
        );
        assert!(c.get(id, Some("a@example.com")).is_some());
        assert_eq!(c.get(id, Some("b@example.com")), None);
        assert_eq!(c.get(id, None), None);
        // A token without the claim: keyed by its absence, whatever was stored.
        c.put(
            c.ticket(),
            None,
            &account(id, Some("stored@example.com"), "FREE"),
        );
        assert_eq!(
            c.get(id, None),
            Some(account(id, Some("stored@example.com"), "FREE"))
        );
    }

    #[test]
    fn a_full_record_of_changes_starts_over_and_voids_loads_in_flight() {
        let c = live();
        let kept = Uuid::new_v4();
        c.put(c.ticket(), None, &account(kept, None, "PRO"));
        let in_flight = c.ticket();
        for _ in 0..MAX_ENTRIES {
            c.changed(&Uuid::new_v4().to_string());
        }
        assert_eq!(c.lock().changes.len(), MAX_ENTRIES);
        let changed = Uuid::new_v4();
        c.put(c.ticket(), None, &account(changed, None, "PRO"));
        c.changed(&changed.to_string());
        assert!(c.lock().changes.is_empty(), "the record starts over");
        assert_eq!(c.get(changed, None), None, "the changed user is dropped");
        assert!(c.get(kept, None).is_some(), "unchanged users stay");
        // Which users changed before the reset is forgotten: every load in
        // flight goes unstored, whoever it is for.
        let fresh = Uuid::new_v4();
        c.put(in_flight, None, &account(fresh, None, "FREE"));
        assert_eq!(c.get(fresh, None), None);
        c.put(c.ticket(), None, &account(fresh, None, "FREE"));
        assert!(c.get(fresh, None).is_some());
    }

    #[test]
    fn a_full_cache_starts_over() {
        let c = live();
        for _ in 0..MAX_ENTRIES {
            c.put(c.ticket(), None, &account(Uuid::new_v4(), None, "FREE"));
        }
        let id = Uuid::new_v4();
        c.put(c.ticket(), None, &account(id, None, "FREE"));
        assert_eq!(c.lock().entries.len(), 1);
        assert!(c.get(id, None).is_some());
    }
}
