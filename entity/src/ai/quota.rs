//! The monthly AI token reservation: one mechanism (reserve, release,
//! settle) over two stores of the same month counter, so no path grants a
//! request tokens without holding them.
//!
//! * The fast store ([`FastCounter`]): the api's Redis counter, which answers
//!   the first reservation in the same round trip as the request rate limit.
//! * The database store: the `ai_quota_counters` row of the user and month,
//!   reserved with one conditional `UPDATE` ([`reserve_in_db`]). It is the
//!   only store without Redis (embedded mode, PostgreSQL alone), and the
//!   store a request falls back to when the fast store cannot be reached or
//!   seeded: the grant is then held there, never granted against a sum.
//!
//! Both follow [`grant`] atomically, and both hold the month's total: the
//! `ai_usage` sum they were seeded with, plus every reservation since, each
//! settled to its real tokens. A reservation in the fast store is settled by
//! the api when the request ends ([`settle_fast`]); one in the database is
//! carried by the usage record and settled by the worker in the transaction
//! that writes the `ai_usage` row ([`record_usage`]), which also adds every
//! request's real tokens to an existing database counter, so that counter
//! stays current while Redis serves (for the next outage).
//!
//! [`grant`]: crate::ai::limits::grant
//! [`record_usage`]: crate::ai::usage::record_usage

use std::future::Future;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ai::limits::{month_key, tokens_this_month};

/// What a request asks of the month counter on a plan with a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The caller.
    pub user_id: Uuid,
    /// The plan's monthly tokens.
    pub limit: u64,
    /// The request's [`crate::ai::limits::input_bound`].
    pub input: u64,
    /// The plan's output cap (`ai_max_output_tokens`).
    pub max_output: u32,
    /// When the request arrived: its month is the counter's.
    pub now: DateTime<Utc>,
}

impl Ask {
    /// The input bound plus the output cap: the most a grant can be.
    pub fn want(&self) -> u64 {
        self.input.saturating_add(u64::from(self.max_output))
    }
}

/// A store's answer to one reservation: the month's tokens before the
/// request and what it was granted (`0`: refused, nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// Tokens counted this month before this request (reservations included).
    pub used: u64,
    /// Tokens reserved for this request ([`crate::ai::limits::grant`]); `0` when refused.
    pub granted: u64,
}

/// Where a reservation is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Store {
    /// The fast store (Redis).
    Fast,
    /// The database's `ai_quota_counters`.
    Database,
}

/// Tokens held for one request until it ends: settled to its real tokens
/// (or released when the provider refused it) in the store that holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The store holding it.
    pub store: Store,
    /// The user whose counter holds it.
    pub user_id: Uuid,
    /// Tokens held (> 0).
    pub tokens: i64,
    /// When it was made: its month is the counter that holds it.
    pub at: DateTime<Utc>,
}

/// The outcome of [`reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Tokens counted this month before this request.
    pub used: u64,
    /// The tokens held for it; `None` when refused (not one output token fits).
    pub reservation: Option<Reservation>,
}

impl Granted {
    /// The output cap the reservation leaves after `ask`'s input bound, at
    /// most the plan's; `None` when refused.
    pub fn output_cap(&self, ask: &Ask) -> Option<u32> {
        let held = u64::try_from(self.reservation?.tokens).ok()?;
        let cap = held.checked_sub(ask.input).filter(|c| *c > 0)?;
        Some(u32::try_from(cap).map_or(ask.max_output, |c| c.min(ask.max_output)))
    }
}

/// The fast store could not be reached (or answered what cannot be used).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the AI quota counter store is unavailable: {0}")]
pub struct StoreDown(pub String);

/// What the fast store answered to the first reservation (made in the
/// api's gate round trip, together with the request rate limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastAnswer {
    /// Reserved (or refused) in the existing counter.
    Reserved(Reserved),
    /// The month has no counter yet: seed it from the database, then reserve.
    NoCounter,
    /// The store did not answer usably: reserve in the database.
    Down,
}

/// A fast store of month counters (the api's Redis).
pub trait FastCounter: Sync {
    /// Creates the absent counter of `ask`'s user and month with `sum` (the
    /// month's `ai_usage` total; a counter created meanwhile is kept), then
    /// reserves [`crate::ai::limits::grant`] tokens in it, atomically.
    fn seed_and_reserve(
        &self,
        ask: &Ask,
        sum: u64,
    ) -> impl Future<Output = Result<Reserved, StoreDown>> + Send;

    /// Adds `tokens` (negative: gives back) to the counter of `user_id` for
    /// the month containing `at`, when it exists (an absent one is seeded at
    /// the next reservation).
    fn add(
        &self,
        user_id: Uuid,
        at: DateTime<Utc>,
        tokens: i64,
    ) -> impl Future<Output = Result<(), StoreDown>> + Send;
}

/// Reserves tokens for `ask`: in the fast store when there is one (`fast`:
/// the store and its first answer; an absent counter is seeded from the
/// database's sum), else, or when the fast store cannot be reached or
/// seeded, in the database ([`reserve_in_db`]). Every grant is held in the
/// store that made it. Errors: the database failed.
pub async fn reserve<C, F>(
    db: &C,
    fast: Option<(&F, FastAnswer)>,
    ask: &Ask,
) -> Result<Granted, DbErr>
where
    C: ConnectionTrait,
    F: FastCounter,
{
    if let Some((store, answer)) = fast {
        let reserved = match answer {
            FastAnswer::Reserved(r) => Some(r),
            FastAnswer::NoCounter => {
                let sum = tokens_this_month(db, ask.user_id, ask.now).await?;
                match store.seed_and_reserve(ask, sum).await {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not seed the AI quota counter; reserving in the database");
                        None
                    }
                }
            }
            FastAnswer::Down => None,
        };
        if let Some(r) = reserved {
            return Ok(granted(Store::Fast, r, ask));
        }
    }
    let r = reserve_in_db(db, ask).await?;
    Ok(granted(Store::Database, r, ask))
}

fn granted(store: Store, r: Reserved, ask: &Ask) -> Granted {
    let tokens = i64::try_from(r.granted).unwrap_or(i64::MAX);
    Granted {
        used: r.used,
        reservation: (tokens > 0).then_some(Reservation {
            store,
            user_id: ask.user_id,
            tokens,
            at: ask.now,
        }),
    }
}

/// Gives a whole reservation back (the provider refused the request before
/// any text: nothing to record), in the store that holds it.
pub async fn release<C, F>(db: &C, fast: Option<&F>, r: Reservation) -> Result<(), StoreDown>
where
    C: ConnectionTrait,
    F: FastCounter,
{
    match (r.store, fast) {
        (Store::Fast, Some(f)) => f.add(r.user_id, r.at, -r.tokens).await,
        (Store::Fast, None) => Err(StoreDown("no fast store to release into".into())),
        (Store::Database, _) => add_in_db(db, r.user_id, r.at, -r.tokens)
            .await
            .map_err(|e| StoreDown(e.to_string())),
    }
}

/// Settles what the fast store holds for a request of `user_id` that ended
/// at `ended` having used `tokens` (its usage record queued): a fast
/// reservation becomes the real tokens; without a reservation (a plan
/// without quota) the real tokens are added to an existing counter. A
/// database reservation is left to [`settle_in_db`], which the usage
/// record's transaction runs.
pub async fn settle_fast<F: FastCounter>(
    fast: &F,
    user_id: Uuid,
    reservation: Option<Reservation>,
    tokens: i64,
    ended: DateTime<Utc>,
) -> Result<(), StoreDown> {
    match reservation {
        Some(r) if r.store == Store::Fast => fast.add(r.user_id, r.at, tokens - r.tokens).await,
        Some(_) => Ok(()),
        None => fast.add(user_id, ended, tokens).await,
    }
}

/// The database side of a recorded request's usage (inside the transaction
/// that wrote its `ai_usage` row, so once per record): `tokens` real tokens
/// replace its database reservation, or (held elsewhere, or none) are added
/// to the user's counter of that month when it exists.
pub async fn settle_in_db<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    reservation: Option<Reservation>,
    tokens: i64,
    ended: DateTime<Utc>,
) -> Result<(), DbErr> {
    match reservation {
        Some(r) if r.store == Store::Database => {
            add_in_db(db, r.user_id, r.at, tokens - r.tokens).await
        }
        Some(r) => add_in_db(db, r.user_id, r.at, tokens).await,
        None => add_in_db(db, user_id, ended, tokens).await,
    }
}

/// `$n` placeholders for PostgreSQL, `?n` for SQLite.
fn sql_for<C: ConnectionTrait>(db: &C, sql: &str) -> sea_orm::Statement {
    let backend = db.get_database_backend();
    let sql = match backend {
        sea_orm::DbBackend::Sqlite => sql.replace('$', "?"),
        _ => sql.to_string(),
    };
    sea_orm::Statement::from_string(backend, sql)
}

fn stmt<C: ConnectionTrait>(db: &C, sql: &str, values: Vec<sea_orm::Value>) -> sea_orm::Statement {
    let s = sql_for(db, sql);
    sea_orm::Statement::from_sql_and_values(s.db_backend, s.sql, values)
}

/// Reserves [`crate::ai::limits::grant`] tokens for `ask` in the database's month
/// counter (`ai_quota_counters`, one row per user and `YYYYMM`). One
/// conditional `UPDATE … RETURNING`: the row lock (PostgreSQL) or the single
/// writer (SQLite) makes concurrent requests, from any api process, see each
/// other's reservations. A missing row is seeded from the month's `ai_usage`
/// sum first.
pub async fn reserve_in_db<C: ConnectionTrait>(db: &C, ask: &Ask) -> Result<Reserved, DbErr> {
    let (user_id, now) = (ask.user_id, ask.now);
    let month = month_key(now);
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let want = clamp(ask.want());
    let (limit, need) = (clamp(ask.limit), clamp(ask.input.saturating_add(1)));
    let update = "UPDATE ai_quota_counters \
        SET tokens = CASE WHEN tokens + $3 <= $4 THEN tokens + $3 ELSE $4 END, \
            granted = CASE WHEN tokens + $3 <= $4 THEN $3 ELSE $4 - tokens END \
        WHERE user_id = $1 AND month = $2 AND tokens + $5 <= $4 \
        RETURNING tokens, granted";
    for _ in 0..2 {
        let values = vec![
            user_id.into(),
            month.clone().into(),
            want.into(),
            limit.into(),
            need.into(),
        ];
        if let Some(row) = db.query_one_raw(stmt(db, update, values)).await? {
            let tokens: i64 = row.try_get_by_index(0)?;
            let granted: i64 = row.try_get_by_index(1)?;
            return Ok(Reserved {
                used: (tokens - granted).max(0) as u64,
                granted: granted.max(0) as u64,
            });
        }
        let select = "SELECT tokens FROM ai_quota_counters WHERE user_id = $1 AND month = $2";
        let values = vec![user_id.into(), month.clone().into()];
        if let Some(row) = db.query_one_raw(stmt(db, select, values)).await? {
            let tokens: i64 = row.try_get_by_index(0)?;
            return Ok(Reserved {
                used: tokens.max(0) as u64,
                granted: 0,
            });
        }
        let sum = clamp(tokens_this_month(db, user_id, now).await?);
        let seed = "INSERT INTO ai_quota_counters (user_id, month, tokens, granted) \
            VALUES ($1, $2, $3, 0) ON CONFLICT (user_id, month) DO NOTHING";
        let values = vec![user_id.into(), month.clone().into(), sum.into()];
        db.execute_raw(stmt(db, seed, values)).await?;
    }
    Err(DbErr::Custom(
        "the AI quota counter vanished while being seeded".into(),
    ))
}

/// Adds `tokens` (negative: gives back) to the database's month counter of
/// `user_id` for the month containing `at`, when it exists (an absent
/// counter is seeded from `ai_usage` at the next reservation).
pub async fn add_in_db<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    at: DateTime<Utc>,
    tokens: i64,
) -> Result<(), DbErr> {
    if tokens == 0 {
        return Ok(());
    }
    let sql = "UPDATE ai_quota_counters SET tokens = tokens + $3 WHERE user_id = $1 AND month = $2";
    let values = vec![user_id.into(), month_key(at).into(), tokens.into()];
    db.execute_raw(stmt(db, sql, values)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(input: u64) -> Ask {
        Ask {
            user_id: Uuid::nil(),
            limit: 20_000,
            input,
            max_output: 2048,
            now: "2026-11-23T10:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn the_output_cap_is_what_the_reservation_leaves_after_the_input() {
        let a = ask(17);
        let g = granted(
            Store::Database,
            Reserved {
                used: 0,
                granted: 2065,
            },
            &a,
        );
        assert_eq!(g.output_cap(&a), Some(2048));
        let g = granted(
            Store::Fast,
            Reserved {
                used: 19_900,
                granted: 100,
            },
            &a,
        );
        assert_eq!(g.output_cap(&a), Some(83));
        let g = granted(
            Store::Fast,
            Reserved {
                used: 19_990,
                granted: 0,
            },
            &a,
        );
        assert_eq!((g.reservation, g.output_cap(&a)), (None, None));
    }
}
