//! `change` at period end, paid early: a stored future phase (decisions.md,
//! "Subscriptions"; Stripe's subscription schedule; docs/billing.md, "Plan
//! changes").
//!
//! * **Scheduled** ([`schedule`]): a renewal of the plan P chosen by
//!   `change` that settles `PAID` while the plan in force Q still runs
//!   (its period end `E` after `paid_at`, not in grace) buys one anchored
//!   month of P from `E`. Its payment stores that grant; the subscription
//!   keeps Q until `E` and records the phase (`scheduled_plan`,
//!   `scheduled_payment_id`). Paid in grace (after `E`), it runs from the
//!   old end at once, as any payment in grace.
//! * **Switched** ([`switch_due`]): once the period end has passed (or no
//!   paid time of Q is left, after a refund), P runs from the old end for
//!   the phase's stored length, and the payment's grant is stored where it
//!   now lies (an end moved meanwhile by a refund or an outdated payment
//!   moves the phase with it: its length is what was paid for). With no
//!   paid time of Q left, it runs in its own slot (from its stored start,
//!   or from now when that is still to come): a phase given back after its
//!   slot began runs only what is left of the slot, and nothing once it is
//!   over. Every path
//!   that reads a subscription's end under its lock applies it first (the
//!   renewal loop's passes, a settlement, an operator's grant), so a
//!   period that ends with a phase is never told past due nor lapsed. One
//!   ledger row (`switch`) per switch; idempotent.
//! * **Carried** ([`super::grant`]): a checkout of any plan meanwhile
//!   carries the phase's whole value with Q's unused time.
//! * **Voided** ([`super::take_back`]): a refund of its payment before it
//!   starts drops the phase and takes no time.
//! * **Run on** ([`super::take_back`]): a refund that gives back the phase's
//!   own plan leaves no change to wait for: its month runs on from the
//!   restored end at once, and the phase is dropped.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait,
    IntoActiveModel, QueryFilter, Set,
};

use super::anchor::{self, Anchor};
use super::grant::Grant;
use crate::{
    base::plans::FREE,
    entities::{
        payments,
        subscriptions::{self, SubscriptionStatus},
    },
};

/// The grant of a renewal of `plan` paid at `paid_at` when it is a phase
/// of `sub`: `plan` is not the plan in force, which still runs (its end
/// after `paid_at`, not past due). `None`: not a phase (the payment is
/// granted by the one rule, [`super::grant::plan`]).
pub fn schedule(
    sub: &subscriptions::Model,
    plan: &str,
    paid_at: DateTime<Utc>,
    zone: Tz,
) -> Option<Grant> {
    let end = sub.current_period_end.filter(|e| *e > paid_at)?;
    if sub.plan == FREE
        || sub.plan == plan
        || sub.status != SubscriptionStatus::Active
        || sub.scheduled_plan.is_some()
    {
        return None;
    }
    let anchor = anchor::of_subscription(sub)
        .filter(|a| a.holds(end, zone))
        .unwrap_or_else(|| Anchor::of(end, zone));
    Some(Grant {
        plan: plan.to_string(),
        start: end,
        end: anchor.next_end(end, zone),
        from_plan: Some(sub.plan.clone()),
        from_end: Some(end),
        carried_seconds: 0,
        carried_value: 0,
        sources: vec![],
        source_values: vec![],
        anchor,
    })
}

/// Whether `g`, granted to `sub` at `paid_at`, is a phase ([`schedule`]'s):
/// of another plan, starting later.
pub fn is_phase(g: &Grant, sub: Option<&subscriptions::Model>, paid_at: DateTime<Utc>) -> bool {
    sub.is_some_and(|s| s.plan != g.plan) && g.start > paid_at
}

/// Applies the phase of `sub` (locked by the caller) when it is due at
/// `now`: the period end passed, or no paid time is left. Answers the
/// subscription as it now is (unchanged when nothing was due). Writes the
/// `switch` ledger row.
pub async fn switch_due<C: ConnectionTrait>(
    txn: &C,
    sub: subscriptions::Model,
    now: DateTime<Utc>,
    zone: Tz,
) -> Result<subscriptions::Model, DbErr> {
    let (Some(plan), Some(payment_id)) = (sub.scheduled_plan.clone(), sub.scheduled_payment_id)
    else {
        return Ok(sub);
    };
    let ends = sub
        .current_period_end
        .filter(|_| sub.plan != FREE)
        .filter(|e| *e > now);
    if ends.is_some() {
        return Ok(sub);
    }
    let pay = payments::Entity::find_by_id(payment_id).one(txn).await?;
    let length = pay
        .as_ref()
        .filter(|p| p.status == payments::PaymentStatus::Paid && p.carried_into.is_none())
        .and_then(|p| Some(p.grant_end? - p.grant_start?))
        .filter(|d| *d > chrono::Duration::zero());
    let before = super::ledger::State::of(Some(&sub));
    let user_id = sub.user_id;
    // After the paid time of the plan in force, wherever that ended; with
    // none left (a refund took it), in the phase's own slot, or now when
    // that slot is still to come: a phase whose slot has passed meanwhile
    // (given back by the refund of a checkout that had carried it) runs
    // only what is left of it.
    let start = match sub.current_period_end.filter(|_| sub.plan != FREE) {
        Some(end) => end,
        None => pay
            .as_ref()
            .and_then(|p| p.grant_start)
            .map_or(now, |slot| slot.min(now)),
    };
    let mut am = sub.clone().into_active_model();
    drop_phase(&mut am);
    am.updated_at = Set(now);
    let Some(length) = length else {
        // Its payment was refunded or carried on meanwhile: nothing to run.
        return am.update(txn).await;
    };
    let end = start + length;
    if end <= now {
        // Its slot is over: nothing of it is left to run.
        return am.update(txn).await;
    }
    let anchor = anchor::of_subscription(&sub)
        .filter(|a| a.holds(end, zone))
        .unwrap_or_else(|| Anchor::of(end, zone));
    payments::Entity::update_many()
        .col_expr(payments::Column::GrantStart, Expr::value(Some(start)))
        .col_expr(payments::Column::GrantEnd, Expr::value(Some(end)))
        .filter(payments::Column::Id.eq(payment_id))
        .exec(txn)
        .await?;
    am.plan = Set(plan);
    am.status = Set(SubscriptionStatus::Active);
    am.current_period_start = Set(Some(start));
    am.current_period_end = Set(Some(end));
    am.billing_anchor_day = Set(Some(anchor.day_column()));
    am.billing_anchor_time = Set(Some(anchor.time));
    am.past_due_at = Set(None);
    am.grace_ends_at = Set(None);
    let sub = am.update(txn).await?;
    super::ledger::note(
        txn,
        user_id,
        &before,
        super::ledger::Cause {
            payment_id: Some(payment_id),
            ..super::ledger::Cause::of(super::ledger::Kind::Switch)
        },
        now,
    )
    .await?;
    Ok(sub)
}

/// Clears the phase recorded on `am` (begun, voided or carried on).
pub fn drop_phase(am: &mut subscriptions::ActiveModel) {
    am.scheduled_plan = Set(None);
    am.scheduled_payment_id = Set(None);
}
