//! The billing ledger and receipts (decisions.md, "Ledger and receipts";
//! Lago's wallet transactions and credit notes, in spirit).
//!
//! Every change of a subscription's plan, period end or grace writes one
//! append-only `billing_ledger` row, in the transaction that made it:
//! [`note`] reads the subscription as the change left it and writes a row
//! when it differs from the [`State`] read before, so no path can change a
//! subscription unrecorded by forgetting a field. The kinds ([`Kind`]) name
//! the cause: a payment, a renewal's payment, a refund (with a grace it
//! ended), the loop's past-due notice and lapse, a pause that extended a
//! grace, an operator's grant.
//!
//! Every payment that becomes `PAID` gets one numbered `billing_receipts`
//! row ([`issue_receipt`], mailed or not): its amount, the value carried
//! into its period, the period; refunds add what went back
//! ([`refund_on_receipt`]).

use chrono::{DateTime, Utc};
use sea_orm::{
    sea_query::{Expr, ExprTrait, OnConflict},
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Set,
};
use uuid::Uuid;

use super::grant::Grant;
use crate::{
    base::plans::FREE,
    entities::{billing_ledger, billing_receipts, payments, subscriptions},
};

/// What caused a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A checkout's payment settled `PAID`.
    Payment,
    /// A renewal's payment settled `PAID`.
    Renewal,
    /// A whole refund or chargeback took back time (or ended a grace).
    Refund,
    /// The loop recorded the past-due notice: the grace began.
    PastDue,
    /// The loop returned the plan to FREE.
    Lapse,
    /// A pause of the loop extended a running grace.
    Pause,
    /// An operator's grant.
    Operator,
    /// A scheduled phase began: the plan chosen by `change` and paid early
    /// took over at the old end ([`super::phase`]).
    Switch,
}

impl Kind {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Renewal => "renewal",
            Self::Refund => "refund",
            Self::PastDue => "past_due",
            Self::Lapse => "lapse",
            Self::Pause => "pause",
            Self::Operator => "operator",
            Self::Switch => "switch",
        }
    }
}

/// What the ledger records of a subscription: its plan, period end and
/// grace end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The plan in force (`FREE` without a subscription).
    pub plan: String,
    /// The period end.
    pub period_end: Option<DateTime<Utc>>,
    /// When the grace ends.
    pub grace_ends_at: Option<DateTime<Utc>>,
}

impl State {
    /// The state of `s` (`None`: FREE).
    pub fn of(s: Option<&subscriptions::Model>) -> Self {
        match s {
            Some(s) => Self {
                plan: s.plan.clone(),
                period_end: s.current_period_end,
                grace_ends_at: s.grace_ends_at,
            },
            None => Self {
                plan: FREE.to_string(),
                period_end: None,
                grace_ends_at: None,
            },
        }
    }

    /// The state of `user`'s subscription as `db` sees it now.
    pub async fn read<C: ConnectionTrait>(db: &C, user: Uuid) -> Result<Self, DbErr> {
        let s = subscriptions::Entity::find_by_id(user).one(db).await?;
        Ok(Self::of(s.as_ref()))
    }
}

/// The cause of a change, as the row names it.
#[derive(Debug, Clone, Copy)]
pub struct Cause {
    /// What caused it.
    pub kind: Kind,
    /// The payment (a payment, a renewal's payment, a refund).
    pub payment_id: Option<Uuid>,
    /// The renewal paid.
    pub renewal_id: Option<Uuid>,
    /// The admin (an operator's grant).
    pub actor_id: Option<Uuid>,
    /// Money moved (IDR): paid, or refunded; 0 otherwise.
    pub value: i64,
}

impl Cause {
    /// A cause of `kind` with no payment, renewal, actor or money.
    pub fn of(kind: Kind) -> Self {
        Self {
            kind,
            payment_id: None,
            renewal_id: None,
            actor_id: None,
            value: 0,
        }
    }
}

/// Writes the ledger row of `user`'s change from `before` to the
/// subscription's state now (read on `db`, the change's transaction), at
/// `now` (the database's time); nothing when nothing the ledger records
/// changed. Answers the row written.
pub async fn note<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    before: &State,
    cause: Cause,
    now: DateTime<Utc>,
) -> Result<Option<billing_ledger::Model>, DbErr> {
    let after = State::read(db, user).await?;
    if after == *before {
        return Ok(None);
    }
    let seconds = match (before.period_end, after.period_end) {
        (Some(from), Some(to)) => (to - from).num_seconds(),
        _ => 0,
    };
    let row = billing_ledger::ActiveModel {
        id: Set(Uuid::now_v7()),
        user_id: Set(user),
        kind: Set(cause.kind.as_str().to_string()),
        payment_id: Set(cause.payment_id),
        renewal_id: Set(cause.renewal_id),
        actor_id: Set(cause.actor_id),
        plan_from: Set(before.plan.clone()),
        plan_to: Set(after.plan),
        end_from: Set(before.period_end),
        end_to: Set(after.period_end),
        grace_from: Set(before.grace_ends_at),
        grace_to: Set(after.grace_ends_at),
        seconds: Set(seconds),
        value: Set(cause.value),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(Some(row))
}

/// Issues the receipt of `pay`, which just became `PAID` and bought
/// `grant` (once: a second call for the same payment changes nothing), and
/// answers its number.
pub async fn issue_receipt<C: ConnectionTrait>(
    db: &C,
    pay: &payments::Model,
    grant: &Grant,
    now: DateTime<Utc>,
) -> Result<i64, DbErr> {
    billing_receipts::Entity::insert(billing_receipts::ActiveModel {
        payment_id: Set(pay.id),
        user_id: Set(pay.user_id),
        plan: Set(grant.plan.clone()),
        amount: Set(pay.amount),
        carried_in_value: Set(grant.carried_value),
        period_start: Set(Some(grant.start)),
        period_end: Set(Some(grant.end)),
        refunded_amount: Set(pay.refunded_amount),
        taken_back_seconds: Set(0),
        created_at: Set(now),
        ..Default::default()
    })
    .on_conflict(
        OnConflict::column(billing_receipts::Column::PaymentId)
            .do_nothing()
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    receipt_number(db, pay.id)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("the receipt of payment {}", pay.id)))
}

/// The receipt number of payment `payment_id`, if it has one.
pub async fn receipt_number<C: ConnectionTrait>(
    db: &C,
    payment_id: Uuid,
) -> Result<Option<i64>, DbErr> {
    Ok(billing_receipts::Entity::find()
        .filter(billing_receipts::Column::PaymentId.eq(payment_id))
        .one(db)
        .await?
        .map(|r| r.number))
}

/// Records on payment `payment_id`'s receipt that `refunded` (IDR) went back
/// so far (it only grows) and, for a whole refund, the seconds it took back
/// from the period.
pub async fn refund_on_receipt<C: ConnectionTrait>(
    db: &C,
    payment_id: Uuid,
    refunded: i64,
    taken_back_seconds: i64,
) -> Result<(), DbErr> {
    billing_receipts::Entity::update_many()
        .col_expr(
            billing_receipts::Column::RefundedAmount,
            Expr::value(refunded),
        )
        .col_expr(
            billing_receipts::Column::TakenBackSeconds,
            Expr::col(billing_receipts::Column::TakenBackSeconds)
                .add(Ord::max(taken_back_seconds, 0)),
        )
        .filter(billing_receipts::Column::PaymentId.eq(payment_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Records that partial refunds or chargebacks of `order_id` gave back
/// `back` whole units so far (it only grows): the grant's value, and so what
/// its unused time carries into a plan change, is the amount less it
/// ([`super::grant`]); its receipt states it too.
pub async fn record_partial_refund<C: ConnectionTrait>(
    db: &C,
    order_id: &str,
    back: i64,
) -> Result<(), DbErr> {
    payments::Entity::update_many()
        .col_expr(payments::Column::RefundedAmount, Expr::value(back))
        .filter(payments::Column::OrderId.eq(order_id))
        .filter(payments::Column::RefundedAmount.lt(back))
        .exec(db)
        .await?;
    if let Some(p) = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await?
    {
        refund_on_receipt(db, p.id, p.refunded_amount, 0).await?;
    }
    Ok(())
}
