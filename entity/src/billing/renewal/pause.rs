//! Pauses of the renewal loop, as data: while payments are switched off or
//! not ready ([`super::paused`]) nobody can pay, so a pause must not eat the
//! grace a customer was given to pay in. The scheduler notes each tick
//! whether the loop is paused ([`note`]): the first paused tick opens a pause
//! (`renewal_pauses`, the database's time); the first tick after closes it
//! and, in the same transaction, moves every running grace
//! (`grace_ends_at` still after the pause began) later by the time the pause
//! lasted. Closing is a conditional write on the open pause, so two ticks
//! that both see it end extend once.
//!
//! A `past_due` row stored before grace times were (no `grace_ends_at`) is
//! not extended.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    sea_query::{Expr, OnConflict},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Set, TransactionSession,
    TransactionTrait,
};
use uuid::Uuid;

use crate::{
    base::db::begin_write,
    entities::{
        renewal_pauses,
        subscriptions::{self, SubscriptionStatus},
    },
};

/// What noting a tick changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noted {
    /// Nothing: the loop's state is the one recorded.
    Unchanged,
    /// A pause began at this tick.
    Opened,
    /// The pause ended after `lasted`; `extended` graces were moved later by it.
    Closed {
        /// How long the pause lasted (database time).
        lasted: Duration,
        /// How many `past_due` subscriptions had their grace extended.
        extended: u64,
    },
}

/// Records whether the loop is `paused` at `now` (the database's time):
/// opens a pause, or closes the open one and extends the running graces by
/// its length. Idempotent per state: a second paused tick changes nothing.
pub async fn note<C>(db: &C, paused: bool, now: DateTime<Utc>) -> Result<Noted, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    if paused {
        let opened = renewal_pauses::Entity::insert(renewal_pauses::ActiveModel {
            id: Set(Uuid::new_v4()),
            started_at: Set(now),
            ended_at: Set(None),
            open: Set(Some(true)),
        })
        .on_conflict(
            OnConflict::column(renewal_pauses::Column::Open)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
        return Ok(if opened > 0 {
            Noted::Opened
        } else {
            Noted::Unchanged
        });
    }
    let Some(open) = renewal_pauses::Entity::find()
        .filter(renewal_pauses::Column::Open.eq(true))
        .one(db)
        .await?
    else {
        return Ok(Noted::Unchanged);
    };
    let txn = begin_write(db).await?;
    let closed = renewal_pauses::Entity::update_many()
        .col_expr(renewal_pauses::Column::EndedAt, Expr::value(now))
        .col_expr(
            renewal_pauses::Column::Open,
            Expr::value(Option::<bool>::None),
        )
        .filter(renewal_pauses::Column::Id.eq(open.id))
        .filter(renewal_pauses::Column::Open.eq(true))
        .exec(&txn)
        .await?;
    if closed.rows_affected == 0 {
        // Another tick closed it.
        txn.rollback().await?;
        return Ok(Noted::Unchanged);
    }
    let lasted = (now - open.started_at).max(Duration::zero());
    let running = subscriptions::Entity::find()
        .filter(subscriptions::Column::Status.eq(SubscriptionStatus::PastDue))
        .filter(subscriptions::Column::GraceEndsAt.gt(open.started_at))
        .all(&txn)
        .await?;
    let mut extended = 0;
    for s in running {
        let Some(end) = s.grace_ends_at else { continue };
        let moved = end.checked_add_signed(lasted).unwrap_or(end);
        let before = crate::billing::ledger::State::of(Some(&s));
        extended += subscriptions::Entity::update_many()
            .col_expr(subscriptions::Column::GraceEndsAt, Expr::value(moved))
            .col_expr(subscriptions::Column::UpdatedAt, Expr::value(now))
            .filter(subscriptions::Column::UserId.eq(s.user_id))
            .filter(subscriptions::Column::Status.eq(SubscriptionStatus::PastDue))
            .exec(&txn)
            .await?
            .rows_affected;
        crate::billing::ledger::note(
            &txn,
            s.user_id,
            &before,
            crate::billing::ledger::Cause::of(crate::billing::ledger::Kind::Pause),
            now,
        )
        .await?;
    }
    txn.commit().await?;
    Ok(Noted::Closed { lasted, extended })
}
