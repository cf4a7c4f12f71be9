//! `AccountCache`: the one in-process cache of accounts. It keeps what the
//! api answers about a user and drops it when PostgreSQL reports that the
//! rows behind it changed, so a request of a known, unchanged user costs no
//! database (or Redis) round trip. Per user it holds:
//! - the account and plan in force ([`entity::accounts::users::ensure_user_with_plan`]'s
//!   answer), which every session route that needs the plan reads
//!   ([`crate::state::AppState::session_with_plan`]: the AI routes and
//!   `GET /api/me`);
//! - `GET /api/me`'s profile and subscription rows ([`Details`]) and the
//!   month's recorded AI tokens;
//! - `GET /auth/v1/user`'s answer per session (the built-in provider);
//! - the built-in provider's sessions seen alive (positive entries only):
//!   a token of such a session is served from the kept plan without asking
//!   the database whether its session still exists; a session not kept
//!   (new, or from another api process) goes to the database, which answers
//!   the account and the session's existence in one query.
//!
//! The protocol:
//! - Row triggers send `NOTIFY account_changed, '<user id>'` on every change
//!   of `users`, `user_roles`, `subscriptions` (migration
//!   `m20261126_000001_notify_account_changes`), `profiles`, `auth_accounts`,
//!   `auth_identities` and the deletion of an `auth_sessions` row (a
//!   sign-out, a password change ending the other sessions, a reused refresh
//!   token, a deleted account), and
//!   `NOTIFY ai_usage_changed, '<user id>'` on every change of `ai_usage`
//!   (migration `m20261202_000050_notify_identity_and_usage`). PostgreSQL
//!   delivers a notification when (and only if) its transaction commits, to
//!   every listening session, so every writer is covered: the api, the
//!   worker's settlement, expiry, usage recording and clean-ups, an
//!   operator's `psql`.
//! - Each api process keeps one connection listening on both channels
//!   ([`listen`]). `account_changed` removes everything kept for the user;
//!   `ai_usage_changed` removes only the month's tokens (a chat records its
//!   usage after every answer; dropping the plan with it would send the
//!   user's next chat to the database). Either advances the cache's
//!   *sequence* and records it as that user's last change of that kind.
//! - A writer in this process also calls [`AccountCache::forget`] after its
//!   change committed, before answering, so the same process never answers
//!   from before its own write, whenever the notification arrives.
//! - A reader that misses takes a [`Ticket`] (the sequence) *before* its
//!   query and stores the answer only if no change of *that user* (of the
//!   kind the answer depends on) was recorded since, and the cache has not
//!   been reset since. A query that read the old row either stores before
//!   the notification arrives (which then removes it) or finds the user's
//!   change newer than its ticket (and stores nothing). Changes of other
//!   users do not void it.
//! - The record of last changes is bounded ([`MAX_ENTRIES`] users); when it
//!   is full it is reset, which voids every ticket taken before (a load
//!   then simply goes unstored).
//! - Entries are used only while the listener is connected. When its
//!   connection is lost the cache is emptied and reset; it is used again
//!   once the listener listens again. (Between the loss and the listener
//!   noticing it, normally at once since the server closes the socket, a
//!   change can go unnoticed; emptying the cache on noticing ends that.)
//!   Every kept answer is also dropped after [`MAX_AGE`] of this process's
//!   monotonic clock, which bounds a listener that is cut off without
//!   noticing.
//!
//! What a reader sees: its own process's writes at once; another process's
//! once its notification reaches this process, normally well under a
//! millisecond after the commit (the notification travels on an open
//! connection); a request that races the commit may still see the previous
//! answer, as it could without a cache. Nothing compares clocks. On SQLite
//! (the embedded default) nothing is kept.
//!
//! Why notifications rather than a per-request check in Redis (the
//! generations `GET /auth/v1/user` used before): a hit costs no I/O at all,
//! every writer is covered without calling anything (the worker's deletions
//! included), and it needs no Redis; BENCHMARKS.md has the figures.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use entity::{accounts::reads::Details, accounts::users::UserContext};
use sea_orm::{
    sqlx::postgres::{PgListener, PgPoolOptions},
    DatabaseConnection, DbBackend,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::identity::UserJson;

/// The channel of changes to a user's account, role, subscription, profile,
/// sign-in identity or sessions.
pub const CHANNEL: &str = "account_changed";

/// The channel of changes to a user's recorded AI usage.
pub const USAGE_CHANNEL: &str = "ai_usage_changed";

/// Longest a kept answer is used, whatever the listener says.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// Most users kept; when full the cache starts over.
pub const MAX_ENTRIES: usize = 16_384;

/// Most `GET /auth/v1/user` answers, and most sessions seen alive, kept per
/// user (one per session); when full, that user's start over.
pub const MAX_SESSIONS_PER_USER: usize = 32;

/// Wait before connecting the listener again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The `application_name` of the listener's connection (`pg_stat_activity`).
pub const APPLICATION_NAME: &str = "api-account-listener";

/// What a notification says changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Anything but the AI usage: everything kept for the user goes.
    Account,
    /// The recorded AI usage: only the month's tokens go.
    Usage,
}

/// One kept answer and when it was stored.
struct Slot<T> {
    value: T,
    stored: Instant,
}

impl<T: Clone> Slot<T> {
    fn new(value: T) -> Self {
        Slot {
            value,
            stored: Instant::now(),
        }
    }

    fn fresh(&self) -> Option<&T> {
        (self.stored.elapsed() < MAX_AGE).then_some(&self.value)
    }
}

/// An account and its plan in force, as [`AccountCache::plan`] answers it.
pub type AccountPlan = (UserContext, String);

/// What is kept for one user.
#[derive(Default)]
struct Entry {
    /// The token's email claim it was loaded for, and the account and plan.
    plan: Option<Slot<(Option<String>, AccountPlan)>>,
    /// Profile and subscription rows.
    details: Option<Slot<Details>>,
    /// The month (its first instant) and the tokens recorded in it.
    usage: Option<Slot<(DateTime<Utc>, u64)>>,
    /// `GET /auth/v1/user` answers per session id.
    sessions: HashMap<Uuid, Slot<UserJson>>,
    /// Sessions of the built-in provider the database reported existing.
    live_sessions: HashMap<Uuid, Slot<()>>,
}

/// The sequence of a user's last change of each kind.
#[derive(Default, Clone, Copy)]
struct Changed {
    account: u64,
    usage: u64,
}

impl Changed {
    /// The last change an answer of `kind` depends on.
    fn of(self, kind: Kind) -> u64 {
        match kind {
            Kind::Account => self.account,
            // The usage is read on its own, whatever else changed.
            Kind::Usage => self.usage,
        }
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Uuid, Entry>,
    /// Advanced by every change and every reset.
    seq: u64,
    /// Each user's last changes since the last reset.
    changes: HashMap<Uuid, Changed>,
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

    /// Drops what a change of `kind` outdates for `user`.
    fn drop_kept(&mut self, user: Uuid, kind: Kind) {
        match kind {
            Kind::Account => {
                self.entries.remove(&user);
            }
            Kind::Usage => {
                if let Some(e) = self.entries.get_mut(&user) {
                    e.usage = None;
                }
            }
        }
    }

    /// Records a change of `kind` for `user`.
    fn changed(&mut self, user: Uuid, kind: Kind) {
        if self.changes.len() >= MAX_ENTRIES && !self.changes.contains_key(&user) {
            // The record of changes is full: start it over, voiding every
            // load in flight.
            self.void_tickets();
        } else {
            self.seq += 1;
            let seq = self.seq;
            let c = self.changes.entry(user).or_default();
            match kind {
                Kind::Account => c.account = seq,
                Kind::Usage => c.usage = seq,
            }
        }
        self.drop_kept(user, kind);
    }
}

/// The sequence a reader saw before its query; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(Option<u64>);

/// What is kept per user id, valid while PostgreSQL's notifications say it
/// is unchanged. Cheap to share (`Arc`).
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

    /// `f` applied to what is kept for `user_id`, if the cache is live.
    fn read<R>(&self, user_id: Uuid, f: impl FnOnce(&Entry) -> Option<R>) -> Option<R> {
        let inner = self.lock();
        if !inner.live {
            return None;
        }
        f(inner.entries.get(&user_id)?)
    }

    /// Applies `f` to `user_id`'s entry unless a change of `kind` of this
    /// user (or a reset: a lost listener, a full record of changes) came in
    /// since `ticket` was taken.
    fn write(&self, ticket: Ticket, user_id: Uuid, kind: Kind, f: impl FnOnce(&mut Entry)) {
        let mut inner = self.lock();
        let Some(taken) = ticket.0 else { return };
        let changed_since = inner
            .changes
            .get(&user_id)
            .is_some_and(|c| c.of(kind) > taken);
        if !inner.live || taken < inner.floor || changed_since {
            return;
        }
        if inner.entries.len() >= MAX_ENTRIES && !inner.entries.contains_key(&user_id) {
            inner.entries.clear();
        }
        f(inner.entries.entry(user_id).or_default());
    }

    /// Taken before loading anything of a user from the database.
    pub fn ticket(&self) -> Ticket {
        let inner = self.lock();
        Ticket(inner.live.then_some(inner.seq))
    }

    /// Records that `user_id`'s rows changed through this process: call
    /// after the change committed, before answering. Drops everything kept
    /// for the user and voids that user's loads in flight, as the
    /// notification will (other processes wait for it).
    pub fn forget(&self, user_id: Uuid) {
        self.lock().changed(user_id, Kind::Account);
    }

    /// The kept account and plan of `user_id`, if it was stored for a token
    /// with the same `email` claim (another email goes to the database,
    /// which records it) and, for a token of `session` (the built-in
    /// provider's), that session was seen existing since the user's last
    /// change (a session not kept is a miss).
    pub fn plan(
        &self,
        user_id: Uuid,
        token_email: Option<&str>,
        session: Option<Uuid>,
    ) -> Option<AccountPlan> {
        self.read(user_id, |e| {
            if let Some(sid) = session {
                e.live_sessions.get(&sid)?.fresh()?;
            }
            let (email, value) = e.plan.as_ref()?.fresh()?;
            (email.as_deref() == token_email).then(|| value.clone())
        })
    }

    /// Keeps what the database answered for a token with `token_email`, and
    /// `session` as existing (the answer said so).
    pub fn put_plan(
        &self,
        ticket: Ticket,
        token_email: Option<&str>,
        session: Option<Uuid>,
        value: &AccountPlan,
    ) {
        self.write(ticket, value.0.user_id, Kind::Account, |e| {
            e.plan = Some(Slot::new((token_email.map(str::to_string), value.clone())));
            if let Some(sid) = session {
                if e.live_sessions.len() >= MAX_SESSIONS_PER_USER
                    && !e.live_sessions.contains_key(&sid)
                {
                    e.live_sessions.clear();
                }
                e.live_sessions.insert(sid, Slot::new(()));
            }
        });
    }

    /// The kept profile and subscription rows of `user_id`.
    pub fn details(&self, user_id: Uuid) -> Option<Details> {
        self.read(user_id, |e| e.details.as_ref()?.fresh().cloned())
    }

    /// Keeps `user_id`'s profile and subscription rows.
    pub fn put_details(&self, ticket: Ticket, user_id: Uuid, value: &Details) {
        self.write(ticket, user_id, Kind::Account, |e| {
            e.details = Some(Slot::new(value.clone()));
        });
    }

    /// The kept AI tokens of `user_id` in the month starting at `month`.
    pub fn usage(&self, user_id: Uuid, month: DateTime<Utc>) -> Option<u64> {
        self.read(user_id, |e| {
            let (kept_month, tokens) = *e.usage.as_ref()?.fresh()?;
            (kept_month == month).then_some(tokens)
        })
    }

    /// Keeps `user_id`'s AI tokens of the month starting at `month`.
    pub fn put_usage(&self, ticket: Ticket, user_id: Uuid, month: DateTime<Utc>, tokens: u64) {
        self.write(ticket, user_id, Kind::Usage, |e| {
            e.usage = Some(Slot::new((month, tokens)));
        });
    }

    /// The kept `GET /auth/v1/user` answer for `session_id` of `user_id`.
    pub fn session_user(&self, user_id: Uuid, session_id: Uuid) -> Option<UserJson> {
        self.read(user_id, |e| e.sessions.get(&session_id)?.fresh().cloned())
    }

    /// Keeps the `GET /auth/v1/user` answer for `session_id` of `user_id`.
    pub fn put_session_user(
        &self,
        ticket: Ticket,
        user_id: Uuid,
        session_id: Uuid,
        value: &UserJson,
    ) {
        self.write(ticket, user_id, Kind::Account, |e| {
            if e.sessions.len() >= MAX_SESSIONS_PER_USER && !e.sessions.contains_key(&session_id) {
                e.sessions.clear();
            }
            e.sessions.insert(session_id, Slot::new(value.clone()));
        });
    }

    /// A notification on `channel`: `payload` is the user id whose rows
    /// changed (anything else empties the cache).
    fn notified(&self, channel: &str, payload: &str) {
        let kind = if channel == USAGE_CHANNEL {
            Kind::Usage
        } else {
            Kind::Account
        };
        let mut inner = self.lock();
        match Uuid::parse_str(payload.trim()) {
            Ok(id) => inner.changed(id, kind),
            Err(_) => {
                tracing::warn!(
                    channel,
                    payload,
                    "account cache: unexpected notification; emptied"
                );
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

/// Keeps a connection listening on [`CHANNEL`] and [`USAGE_CHANNEL`] and
/// applies what arrives; reconnects after [`RECONNECT_AFTER`] when the
/// connection fails.
async fn listen(cache: &AccountCache, pool: sea_orm::sqlx::PgPool) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                // Reconnect by hand, so that a lost connection is noticed
                // (`Ok(None)`) before anything is used again.
                listener.eager_reconnect(false);
                match listener.listen_all([CHANNEL, USAGE_CHANNEL]).await {
                    Ok(()) => {
                        cache.go_live();
                        tracing::debug!("account cache: listening");
                        loop {
                            match listener.try_recv().await {
                                Ok(Some(n)) => cache.notified(n.channel(), n.payload()),
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

    fn changed(c: &AccountCache, id: Uuid) {
        c.notified(CHANNEL, &id.to_string());
    }

    #[test]
    fn nothing_is_cached_until_the_listener_listens() {
        let c = AccountCache::default();
        let id = Uuid::new_v4();
        let t = c.ticket();
        c.put_plan(t, None, None, &account(id, None, "FREE"));
        assert_eq!(c.plan(id, None, None), None);
        c.go_live();
        c.put_plan(t, None, None, &account(id, None, "FREE"));
        assert_eq!(
            c.plan(id, None, None),
            None,
            "a ticket from before going live"
        );
        c.put_plan(c.ticket(), None, None, &account(id, None, "FREE"));
        assert_eq!(c.plan(id, None, None), Some(account(id, None, "FREE")));
    }

    #[test]
    fn a_notification_removes_the_user_and_voids_loads_in_flight() {
        let c = live();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        c.put_plan(c.ticket(), None, None, &account(a, None, "PRO"));
        c.put_plan(c.ticket(), None, None, &account(b, None, "FREE"));
        let in_flight = c.ticket();
        changed(&c, a);
        assert_eq!(c.plan(a, None, None), None);
        assert_eq!(
            c.plan(b, None, None),
            Some(account(b, None, "FREE")),
            "others stay"
        );
        // A load that read before the change must not be stored.
        c.put_plan(in_flight, None, None, &account(a, None, "PRO"));
        assert_eq!(c.plan(a, None, None), None);
        // A load of another user, in flight at the same time, is.
        let other = Uuid::new_v4();
        c.put_plan(in_flight, None, None, &account(other, None, "FREE"));
        assert_eq!(
            c.plan(other, None, None),
            Some(account(other, None, "FREE")),
            "another user's change does not void it"
        );
        c.put_plan(c.ticket(), None, None, &account(a, None, "FREE"));
        assert_eq!(c.plan(a, None, None), Some(account(a, None, "FREE")));
        // A payload that is not a user id empties everything.
        c.notified(CHANNEL, "?");
        assert_eq!(c.plan(b, None, None), None);
    }

    #[test]
    fn a_write_of_this_process_acts_as_its_notification() {
        let c = live();
        let id = Uuid::new_v4();
        c.put_plan(c.ticket(), None, None, &account(id, None, "FREE"));
        let in_flight = c.ticket();
        c.forget(id);
        assert_eq!(c.plan(id, None, None), None);
        c.put_plan(in_flight, None, None, &account(id, None, "FREE"));
        assert_eq!(c.plan(id, None, None), None, "a load from before the write");
    }

    #[test]
    fn a_usage_change_drops_only_the_usage() {
        let c = live();
        let id = Uuid::new_v4();
        let month = entity::ai::limits::month_start(Utc::now());
        let details = Details::default();
        c.put_plan(c.ticket(), None, None, &account(id, None, "PRO"));
        c.put_details(c.ticket(), id, &details);
        c.put_usage(c.ticket(), id, month, 10);
        assert_eq!(c.usage(id, month), Some(10));
        assert_eq!(
            c.usage(id, month - chrono::Duration::days(40)),
            None,
            "another month"
        );
        let in_flight = c.ticket();
        c.notified(USAGE_CHANNEL, &id.to_string());
        assert_eq!(c.usage(id, month), None);
        assert!(c.plan(id, None, None).is_some(), "the plan stays");
        assert_eq!(c.details(id), Some(details.clone()));
        // A usage load from before the change is not kept; an account load is.
        c.put_usage(in_flight, id, month, 10);
        assert_eq!(c.usage(id, month), None);
        c.put_details(in_flight, id, &details);
        assert_eq!(c.details(id), Some(details));
        c.put_usage(c.ticket(), id, month, 25);
        assert_eq!(c.usage(id, month), Some(25));
        // An account change drops everything, the usage included.
        changed(&c, id);
        assert_eq!(c.usage(id, month), None);
        assert_eq!(c.details(id), None);
    }

    #[test]
    fn a_lost_listener_empties_the_cache_and_stops_its_use() {
        let c = live();
        let id = Uuid::new_v4();
        c.put_plan(c.ticket(), None, None, &account(id, None, "PRO"));
        let in_flight = c.ticket();
        c.go_dark();
        assert_eq!(c.plan(id, None, None), None);
        c.put_plan(c.ticket(), None, None, &account(id, None, "PRO"));
        c.go_live();
        c.put_plan(in_flight, None, None, &account(id, None, "PRO"));
        assert_eq!(c.plan(id, None, None), None, "nothing from before the loss");
    }

    #[test]
    fn a_session_is_served_only_once_seen_alive_and_until_a_change() {
        let c = live();
        let id = Uuid::new_v4();
        let (seen, other) = (Uuid::new_v4(), Uuid::new_v4());
        c.put_plan(c.ticket(), None, Some(seen), &account(id, None, "PRO"));
        assert_eq!(c.plan(id, None, Some(seen)), Some(account(id, None, "PRO")));
        assert_eq!(
            c.plan(id, None, Some(other)),
            None,
            "a session not seen (new, or of another process) asks the database"
        );
        assert!(c.plan(id, None, None).is_some(), "another issuer's token");
        c.put_plan(c.ticket(), None, Some(other), &account(id, None, "PRO"));
        assert!(c.plan(id, None, Some(seen)).is_some(), "both kept");
        assert!(c.plan(id, None, Some(other)).is_some());
        // A session row deleted (its notification): every session of the
        // user goes, and a load that read before the deletion is not kept.
        let in_flight = c.ticket();
        changed(&c, id);
        assert_eq!(c.plan(id, None, Some(seen)), None);
        c.put_plan(in_flight, None, Some(seen), &account(id, None, "PRO"));
        assert_eq!(c.plan(id, None, Some(seen)), None, "a load from before");
        // Kept sessions per user are bounded.
        for _ in 0..MAX_SESSIONS_PER_USER {
            c.put_plan(
                c.ticket(),
                None,
                Some(Uuid::new_v4()),
                &account(id, None, "PRO"),
            );
        }
        c.put_plan(c.ticket(), None, Some(seen), &account(id, None, "PRO"));
        assert_eq!(c.lock().entries[&id].live_sessions.len(), 1);
        assert!(c.plan(id, None, Some(seen)).is_some());
    }

    #[test]
    fn another_token_email_is_a_miss() {
        let c = live();
        let id = Uuid::new_v4();
        c.put_plan(
            c.ticket(),
            Some("a@example.com"),
            None,
            &account(id, Some("a@example.com"), "FREE"),
        );
        assert!(c.plan(id, Some("a@example.com"), None).is_some());
        assert_eq!(c.plan(id, Some("b@example.com"), None), None);
        assert_eq!(c.plan(id, None, None), None);
        // A token without the claim: keyed by its absence, whatever was stored.
        c.put_plan(
            c.ticket(),
            None,
            None,
            &account(id, Some("stored@example.com"), "FREE"),
        );
        assert_eq!(
            c.plan(id, None, None),
            Some(account(id, Some("stored@example.com"), "FREE"))
        );
    }

    #[test]
    fn a_full_record_of_changes_starts_over_and_voids_loads_in_flight() {
        let c = live();
        let kept = Uuid::new_v4();
        c.put_plan(c.ticket(), None, None, &account(kept, None, "PRO"));
        let in_flight = c.ticket();
        for _ in 0..MAX_ENTRIES {
            changed(&c, Uuid::new_v4());
        }
        assert_eq!(c.lock().changes.len(), MAX_ENTRIES);
        let changed_user = Uuid::new_v4();
        c.put_plan(c.ticket(), None, None, &account(changed_user, None, "PRO"));
        changed(&c, changed_user);
        assert!(c.lock().changes.is_empty(), "the record starts over");
        assert_eq!(
            c.plan(changed_user, None, None),
            None,
            "the changed user is dropped"
        );
        assert!(c.plan(kept, None, None).is_some(), "unchanged users stay");
        // Which users changed before the reset is forgotten: every load in
        // flight goes unstored, whoever it is for.
        let fresh = Uuid::new_v4();
        c.put_plan(in_flight, None, None, &account(fresh, None, "FREE"));
        assert_eq!(c.plan(fresh, None, None), None);
        c.put_plan(c.ticket(), None, None, &account(fresh, None, "FREE"));
        assert!(c.plan(fresh, None, None).is_some());
    }

    #[test]
    fn a_full_cache_starts_over() {
        let c = live();
        for _ in 0..MAX_ENTRIES {
            c.put_plan(
                c.ticket(),
                None,
                None,
                &account(Uuid::new_v4(), None, "FREE"),
            );
        }
        let id = Uuid::new_v4();
        c.put_plan(c.ticket(), None, None, &account(id, None, "FREE"));
        assert_eq!(c.lock().entries.len(), 1);
        assert!(c.plan(id, None, None).is_some());
    }
}
