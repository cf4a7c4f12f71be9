//! What the renewal loop's passes have to do ([`crate::billing::renewal`]), found by
//! the scheduler: keyset pages of the rows due ([`due_page`]), each claimed
//! when it is queued ([`claim_page`]) so that a later tick does not queue the
//! same rows again while their batch job waits.
//!
//! A claim (`renewal_claims`: pass, row id, the database's time) hides the
//! row from its pass for a lease; a row still due once the lease is over (its
//! job was lost, or ran and left it due, as for a plan gone from the
//! catalogue) is queued again. The scheduler gives back the claims of a page
//! it could not queue ([`release_claims`]) and deletes claims past their
//! lease ([`delete_stale_claims`]).

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    sea_query::{Expr, ExprTrait as _, OnConflict, Query},
    ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use uuid::Uuid;

use crate::{
    base::plans::FREE,
    billing::renewal::{Policy, Step},
    entities::{
        renewal_claims,
        renewals::{self, RenewalStatus},
        subscriptions::{self, SubscriptionStatus},
    },
};

/// A keyset position: the row's time column and id.
pub type Key = (DateTime<Utc>, Uuid);

/// The next page of at most `limit` rows due for `step` at `now`, after
/// `after` (exclusive), in key order, leaving out rows claimed for `step` at
/// or after `claimed_since`: subscriptions by `(current_period_end, user_id)`
/// on the partial index of paid plans, or for [`Step::Remind`] open
/// renewals by `(next_reminder_at, id)`. Answers the keys; the id is what
/// [`crate::billing::renewal::run_batch`] takes.
pub async fn due_page<C: ConnectionTrait>(
    db: &C,
    step: Step,
    policy: &Policy,
    now: DateTime<Utc>,
    claimed_since: DateTime<Utc>,
    after: Option<Key>,
    limit: u64,
) -> Result<Vec<Key>, DbErr> {
    // Not claimed for this pass since `claimed_since`.
    let unclaimed = |id: Expr| {
        Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(renewal_claims::Entity)
                .and_where(renewal_claims::Column::Step.eq(step.as_str()))
                .and_where(Expr::col((renewal_claims::Entity, renewal_claims::Column::Id)).eq(id))
                .and_where(renewal_claims::Column::ClaimedAt.gte(claimed_since))
                .to_owned(),
        )
        .not()
    };
    if step == Step::Remind {
        use renewals::Column as R;
        let mut q = renewals::Entity::find()
            .select_only()
            .column(R::NextReminderAt)
            .column(R::Id)
            .filter(R::Status.eq(RenewalStatus::Open))
            .filter(R::NextReminderAt.lte(now))
            .filter(unclaimed(Expr::col((renewals::Entity, R::Id))));
        if let Some((at, id)) = after {
            q = q.filter(
                R::NextReminderAt
                    .gt(at)
                    .or(R::NextReminderAt.eq(at).and(R::Id.gt(id))),
            );
        }
        let rows: Vec<(Option<DateTime<Utc>>, Uuid)> = q
            .order_by_asc(R::NextReminderAt)
            .order_by_asc(R::Id)
            .limit(limit)
            .into_tuple()
            .all(db)
            .await?;
        return Ok(rows
            .into_iter()
            .filter_map(|(at, id)| at.map(|at| (at, id)))
            .collect());
    }
    use subscriptions::Column as S;
    let mut q = subscriptions::Entity::find()
        .select_only()
        .column(S::CurrentPeriodEnd)
        .column(S::UserId)
        .filter(S::Plan.ne(FREE))
        .filter(S::CurrentPeriodEnd.is_not_null())
        .filter(unclaimed(Expr::col((subscriptions::Entity, S::UserId))));
    q = q.filter(due_condition(step, policy, now));
    if let Some((at, id)) = after {
        q = q.filter(
            S::CurrentPeriodEnd
                .gt(at)
                .or(S::CurrentPeriodEnd.eq(at).and(S::UserId.gt(id))),
        );
    }
    let rows: Vec<(Option<DateTime<Utc>>, Uuid)> = q
        .order_by_asc(S::CurrentPeriodEnd)
        .order_by_asc(S::UserId)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(at, id)| at.map(|at| (at, id)))
        .collect())
}

/// When a paid subscription is due for `step` (not [`Step::Remind`]) at `now`.
fn due_condition(step: Step, policy: &Policy, now: DateTime<Utc>) -> Condition {
    use subscriptions::Column as S;
    match step {
        Step::Create => Condition::all()
            .add(S::Status.is_in([SubscriptionStatus::Active, SubscriptionStatus::PastDue]))
            .add(S::CancelAtPeriodEnd.eq(false))
            // A paid phase follows: nothing to offer until it begins.
            .add(S::ScheduledPlan.is_null())
            .add(S::CurrentPeriodEnd.lte(now + policy.lead()))
            .add(in_grace_or_active(policy, now))
            .add(
                Expr::exists(
                    Query::select()
                        .expr(Expr::val(1))
                        .from(renewals::Entity)
                        .and_where(
                            Expr::col((renewals::Entity, renewals::Column::UserId))
                                .equals((subscriptions::Entity, S::UserId)),
                        )
                        .and_where(
                            Expr::col((renewals::Entity, renewals::Column::PeriodEnd))
                                .equals((subscriptions::Entity, S::CurrentPeriodEnd)),
                        )
                        .and_where(
                            Expr::col((renewals::Entity, renewals::Column::Status))
                                .eq(RenewalStatus::Open.as_str()),
                        )
                        .to_owned(),
                )
                .not(),
            ),
        Step::PastDue => Condition::all()
            .add(S::Status.eq(SubscriptionStatus::Active))
            .add(S::CancelAtPeriodEnd.eq(false))
            .add(S::CurrentPeriodEnd.lt(now)),
        Step::Lapse => {
            let cancelling = S::CancelAtPeriodEnd
                .eq(true)
                .and(S::CurrentPeriodEnd.lt(now));
            // A paid phase due to begin (owing nothing, also while paused):
            // the batch begins it ([`super::run_batch`]).
            let phase_due = S::ScheduledPlan
                .is_not_null()
                .and(S::CurrentPeriodEnd.lt(now));
            if policy.paused {
                return Condition::any().add(cancelling).add(phase_due);
            }
            Condition::any().add(cancelling).add(phase_due).add(
                Condition::all()
                    .add(S::Status.eq(SubscriptionStatus::PastDue))
                    .add(
                        Condition::any().add(S::GraceEndsAt.lte(now)).add(
                            Condition::all()
                                .add(S::GraceEndsAt.is_null())
                                .add(S::CurrentPeriodEnd.lt(before(now, policy.grace))),
                        ),
                    ),
            )
        }
        Step::Remind => unreachable!("renewals, not subscriptions"),
    }
}

/// An `active` subscription, or a `past_due` one whose grace has not ended
/// ([`super::grace_end`] in SQL).
fn in_grace_or_active(policy: &Policy, now: DateTime<Utc>) -> Condition {
    use subscriptions::Column as S;
    Condition::any()
        .add(S::Status.eq(SubscriptionStatus::Active))
        .add(S::GraceEndsAt.gt(now))
        .add(
            Condition::all()
                .add(S::GraceEndsAt.is_null())
                .add(S::CurrentPeriodEnd.gte(before(now, policy.grace))),
        )
}

/// `t − d`, or the earliest time when that is before it.
fn before(t: DateTime<Utc>, d: chrono::Duration) -> DateTime<Utc> {
    t.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// [`due_page`] of rows not claimed for `step` within `lease` of `now`, each
/// claimed for `step` at `now` before it is answered (a claim past its lease
/// is taken over). The caller queues the page, or gives the claims back with
/// [`release_claims`].
pub async fn claim_page<C: ConnectionTrait>(
    db: &C,
    step: Step,
    policy: &Policy,
    now: DateTime<Utc>,
    lease: Duration,
    after: Option<Key>,
    limit: u64,
) -> Result<Vec<Key>, DbErr> {
    let page = due_page(db, step, policy, now, now - lease, after, limit).await?;
    if page.is_empty() {
        return Ok(page);
    }
    let rows = page.iter().map(|(_, id)| renewal_claims::ActiveModel {
        step: Set(step.as_str().to_string()),
        id: Set(*id),
        claimed_at: Set(now),
    });
    renewal_claims::Entity::insert_many(rows)
        .on_conflict(
            OnConflict::columns([renewal_claims::Column::Step, renewal_claims::Column::Id])
                .update_column(renewal_claims::Column::ClaimedAt)
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    Ok(page)
}

/// Gives back the claims for `step` on `ids` (their page could not be
/// queued), so the next tick queues them again.
pub async fn release_claims<C: ConnectionTrait>(
    db: &C,
    step: Step,
    ids: &[Uuid],
) -> Result<u64, DbErr> {
    Ok(renewal_claims::Entity::delete_many()
        .filter(renewal_claims::Column::Step.eq(step.as_str()))
        .filter(renewal_claims::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?
        .rows_affected)
}

/// Deletes the claims made before `before` (their lease is over: they hide
/// nothing any more); answers how many.
pub async fn delete_stale_claims<C: ConnectionTrait>(
    db: &C,
    before: DateTime<Utc>,
) -> Result<u64, DbErr> {
    Ok(renewal_claims::Entity::delete_many()
        .filter(renewal_claims::Column::ClaimedAt.lt(before))
        .exec(db)
        .await?
        .rows_affected)
}
