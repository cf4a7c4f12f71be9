//! Reconciliation: which `PENDING` payments the scheduler asks the provider's
//! status API about, and the claim that keeps two workers from asking about
//! the same payment twice in one round.
//!
//! A payment is due when it is still `PENDING`, was created more than
//! `PAYMENT_RECONCILE_AFTER_SECS` ago but less than
//! `PAYMENT_EXPIRE_AFTER_SECS` ago (older ones are claimed by
//! [`claim_expiring_payments`]: they too are asked about before they
//! expire), and was never checked or last checked more than
//! `PAYMENT_RECONCILE_AFTER_SECS` ago (`payments.reconciled_at`). Claiming a
//! payment stamps `reconciled_at` with a conditional `UPDATE` (the same
//! conditions in its `WHERE`), so of two concurrent claims exactly one
//! changes the row; the other sees zero rows affected and skips it.

use chrono::{DateTime, Duration, SubsecRound, Utc};
use sea_orm::{
    sea_query::{Condition, Expr},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entities::payments::{self, PaymentStatus};

/// The rows reconciliation may ask about at `now`: still `PENDING`, created
/// in `[now - expire_after, now - reconcile_after)`, `reconciled_at` NULL or
/// before `now - reconcile_after`.
fn due_condition(
    now: DateTime<Utc>,
    reconcile_after: Duration,
    expire_after: Duration,
) -> Condition {
    let checked_before = now - reconcile_after;
    Condition::all()
        .add(payments::Column::Status.eq(PaymentStatus::Pending))
        .add(payments::Column::CreatedAt.lt(checked_before))
        .add(payments::Column::CreatedAt.gte(now - expire_after))
        .add(
            Condition::any()
                .add(payments::Column::ReconciledAt.is_null())
                .add(payments::Column::ReconciledAt.lt(checked_before)),
        )
}

/// The rows the expiry task asks the provider about at `now`: still
/// `PENDING`, created before `now - expire_after`, `reconciled_at` NULL or
/// before `now - reconcile_after`.
fn expiring_condition(
    now: DateTime<Utc>,
    reconcile_after: Duration,
    expire_after: Duration,
) -> Condition {
    let checked_before = now - reconcile_after;
    Condition::all()
        .add(payments::Column::Status.eq(PaymentStatus::Pending))
        .add(payments::Column::CreatedAt.lt(now - expire_after))
        .add(
            Condition::any()
                .add(payments::Column::ReconciledAt.is_null())
                .add(payments::Column::ReconciledAt.lt(checked_before)),
        )
}

/// Claims up to `limit` payments still `PENDING` past `expire_after`
/// (`PAYMENT_EXPIRE_AFTER_SECS`), asked about at most once per
/// `reconcile_after`, oldest first, with the same conditional stamp as
/// [`claim_due_payments`]: a payment is expired only after its provider
/// answered that it is not paid, so each gets a status check first.
pub async fn claim_expiring_payments<C: ConnectionTrait>(
    db: &C,
    now: DateTime<Utc>,
    reconcile_after: Duration,
    expire_after: Duration,
    limit: u64,
) -> Result<Vec<String>, DbErr> {
    claim(
        db,
        now,
        || expiring_condition(now, reconcile_after, expire_after),
        limit,
    )
    .await
}

/// Claims up to `limit` due payments (see the module docs), oldest first, by
/// stamping their `reconciled_at` with `now`; answers the order ids this call
/// claimed. A payment claimed by a concurrent caller in the meantime is not
/// in the answer. `reconcile_after` is `PAYMENT_RECONCILE_AFTER_SECS`,
/// `expire_after` `PAYMENT_EXPIRE_AFTER_SECS`.
pub async fn claim_due_payments<C: ConnectionTrait>(
    db: &C,
    now: DateTime<Utc>,
    reconcile_after: Duration,
    expire_after: Duration,
    limit: u64,
) -> Result<Vec<String>, DbErr> {
    claim(
        db,
        now,
        || due_condition(now, reconcile_after, expire_after),
        limit,
    )
    .await
}

/// Stamps `reconciled_at` = `now` on up to `limit` rows matching
/// `condition`, each with a conditional `UPDATE`; answers the order ids this
/// call stamped.
async fn claim<C: ConnectionTrait>(
    db: &C,
    now: DateTime<Utc>,
    condition: impl Fn() -> Condition,
    limit: u64,
) -> Result<Vec<String>, DbErr> {
    let due: Vec<(Uuid, String)> = payments::Entity::find()
        .select_only()
        .column(payments::Column::Id)
        .column(payments::Column::OrderId)
        .filter(condition())
        .order_by_asc(payments::Column::CreatedAt)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    let mut claimed = Vec::with_capacity(due.len());
    // Stored as the database keeps it (microseconds), so that
    // [`release_claim`] can recognise its own stamp.
    let stamp = now.trunc_subsecs(6);
    for (id, order_id) in due {
        let res = payments::Entity::update_many()
            .col_expr(payments::Column::ReconciledAt, Expr::value(stamp))
            .filter(payments::Column::Id.eq(id))
            .filter(condition())
            .exec(db)
            .await?;
        if res.rows_affected == 1 {
            claimed.push(order_id);
        }
    }
    Ok(claimed)
}

/// Gives back a claim [`claim_due_payments`] made at `claimed_at` (the `now`
/// it was given; its job could not be queued), so
/// the next round claims the payment again instead of waiting a period.
/// Answers whether the claim was still this one's.
pub async fn release_claim<C: ConnectionTrait>(
    db: &C,
    order_id: &str,
    claimed_at: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let res = payments::Entity::update_many()
        .col_expr(
            payments::Column::ReconciledAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(payments::Column::OrderId.eq(order_id))
        .filter(payments::Column::ReconciledAt.eq(claimed_at.trunc_subsecs(6)))
        .exec(db)
        .await?;
    Ok(res.rows_affected == 1)
}
