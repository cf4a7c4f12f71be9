//! What a payment grants, stored on it when it settles `PAID`, and the one
//! rule for every immediate plan change (decisions.md, "Subscriptions").
//!
//! * **Same plan**: a payment for the plan in force while it is paid beyond
//!   `paid_at` extends it by one calendar month from its current end.
//! * **Another plan**: a payment for plan P while plan Q ≠ P is paid until
//!   E > `paid_at` starts a period at `paid_at` that ends one calendar month
//!   later plus the carried time. Each stored grant of Q still running
//!   (`PAID`, not carried on before, `grant_end` > `paid_at`) carries its
//!   unused time at the ratio of its value (amount less partial refunds)
//!   over its own length to P's price (the paying payment's amount, the
//!   catalogue price at checkout) over P's month from `paid_at`:
//!   `carried = value × unused / length × month_P / price_P`, in
//!   microseconds, summed, then rounded down to the second, never below
//!   zero. Time of Q with no payment behind it carries nothing. The sources
//!   are marked `carried_into` the new payment.
//! * **In its renewal grace** ([`in_grace`]: `past_due` before its grace
//!   ends, or ended and not yet told for at most the grace): a payment for
//!   any plan runs one calendar month from the old end, so the grace days
//!   are paid for whichever plan is bought, and carries nothing (the grace
//!   days have no payment behind them); past the grace it starts at
//!   `paid_at` (a payment never buys a period already over, nor more than a
//!   grace's days of the past).
//! * **Nothing paid in force** (FREE, lapsed): one calendar month from
//!   `paid_at`.
//!
//! [`plan`] computes a grant without writing (the quote uses it, so the quote
//! and the settlement are one rule); [`super::take_back`] undoes one when its
//! payment is refunded, from the stored grant alone.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sea_orm::{
    sea_query::Expr, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, QueryFilter,
    QueryOrder,
};
use uuid::Uuid;

pub use super::anchor::month_after;
use super::anchor::Anchor;
use crate::{
    base::plans::FREE,
    entities::{
        payments::{self, PaymentStatus},
        subscriptions::{self, SubscriptionStatus},
    },
};

/// What paying a plan at a given moment grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The plan paid for.
    pub plan: String,
    /// Start of the period (`paid_at`, or the current end when extending).
    pub start: DateTime<Utc>,
    /// End of the period: one calendar month after `start` plus
    /// `carried_seconds`.
    pub end: DateTime<Utc>,
    /// The paid plan replaced, when the payment changes plan.
    pub from_plan: Option<String>,
    /// That plan's period end.
    pub from_end: Option<DateTime<Utc>>,
    /// Unused time carried over, seconds (rounded down, ≥ 0).
    pub carried_seconds: i64,
    /// What the carried time was worth, whole units of the currency
    /// (rounded down).
    pub carried_value: i64,
    /// The payments whose grants were carried (their ids).
    pub sources: Vec<Uuid>,
    /// What each source's own money carried on (the unused part of its own
    /// month, in millionths of a unit, rounded down; in the order of
    /// `sources`): stored on the source (`carried_out_value`), what a refund
    /// of it follows.
    pub source_values: Vec<i64>,
    /// The billing anchor the subscription keeps after this grant: the one
    /// in force when the grant adds one anchored month, else re-anchored
    /// on the new period ([`super::anchor`]).
    pub anchor: Anchor,
}

/// The subscription as the rule reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce<'a> {
    /// The plan.
    pub plan: &'a str,
    /// End of its paid period, if any.
    pub period_end: Option<DateTime<Utc>>,
    /// In its renewal grace ([`in_grace`]): the period ended unpaid and the
    /// plan is kept until the grace ends.
    pub in_grace: bool,
    /// Its billing anchor, if stored.
    pub anchor: Option<Anchor>,
    /// A phase of another plan is scheduled after it
    /// ([`super::phase`]): any payment, even for the plan in force, is a
    /// plan change that carries the phase's value too.
    pub scheduled: bool,
}

/// Whether `s` is in its renewal grace at `at`, so a payment for it
/// continues from the old end (the grace days are billed) instead of from
/// `at`: `past_due` and its grace not over ([`super::grace::grace_end`]);
/// or still `active` (not cancelling) on a paid plan whose period ended at
/// or before `at` but which the scheduler has not yet told (between two
/// ticks, or while the renewal loop is paused), for at most `grace` after
/// that end. Past either bound the payment starts at `at`: it never buys a
/// period already over, nor more than a grace's days of the past.
pub fn in_grace(s: &subscriptions::Model, at: DateTime<Utc>, grace: chrono::Duration) -> bool {
    match s.status {
        SubscriptionStatus::PastDue => {
            super::grace::grace_end(s, grace).is_some_and(|end| at < end)
        }
        SubscriptionStatus::Active => {
            s.plan != FREE
                && !s.cancel_at_period_end
                && s.current_period_end.is_some_and(|e| {
                    e <= at && e.checked_add_signed(grace).is_none_or(|until| at < until)
                })
        }
        _ => false,
    }
}

/// Whether `s` is in its grace at `paid_at` ([`in_grace`]), and the end a
/// payment then continues from: the period end, but in grace never more
/// than `grace` before `paid_at` (a past-due notice sent long after the
/// end, the loop paused or late, does not bill the days before it beyond a
/// grace; the period then re-anchors).
fn payable_end(
    s: &subscriptions::Model,
    paid_at: DateTime<Utc>,
    grace: chrono::Duration,
) -> (bool, Option<DateTime<Utc>>) {
    let in_grace = in_grace(s, paid_at, grace);
    let end = s
        .current_period_end
        .map(|e| match paid_at.checked_sub_signed(grace) {
            Some(earliest) if in_grace => e.max(earliest),
            _ => e,
        });
    (in_grace, end)
}

/// One running grant as the carry reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    /// Its payment.
    pub id: Uuid,
    /// Amount less partial refunds (whole units): what its own month is
    /// worth.
    pub value: i64,
    /// What its own month was sold for (whole units; the amount, or for a
    /// refunded grant its carried value): the rate its carried seconds were
    /// priced at. A partial refund lowers `value`, never this.
    pub price: i64,
    /// Its period.
    pub start: DateTime<Utc>,
    /// Its period's end.
    pub end: DateTime<Utc>,
    /// The seconds of its period carried in from an earlier plan (priced at
    /// its own rate when they were carried, so worth as much per second as
    /// its own month).
    pub carried_seconds: i64,
}

pub(crate) fn micros(d: chrono::Duration) -> i128 {
    d.num_microseconds().map_or(i128::MAX, i128::from)
}

/// The rule (module docs) without the database: what paying `amount` for
/// `plan` at `paid_at` grants when `in_force` is the subscription and
/// `running` the stored grants of its plan still running; months are
/// counted in `zone` (`BILLING_TIME_ZONE`).
pub fn compute(
    in_force: InForce<'_>,
    running: &[Running],
    plan: &str,
    amount: i64,
    paid_at: DateTime<Utc>,
    zone: Tz,
) -> Grant {
    // The anchor an added month keeps: the stored one when the current end
    // lies on it, else (a subscription stored before anchors) the one its
    // current end lies on.
    let kept = |end: DateTime<Utc>| {
        in_force
            .anchor
            .filter(|a| a.holds(end, zone))
            .unwrap_or_else(|| Anchor::of(end, zone))
    };
    // In its renewal grace, a payment for any plan starts at the old end:
    // the grace days are paid for, not given on top, whichever plan is
    // bought (nothing is carried: the grace days have no payment behind
    // them). Never into a period already over (the renewal loop was paused
    // past a whole month): that payment starts at `paid_at`, as after a
    // lapse.
    if let (true, Some(old_end)) = (
        in_force.in_grace && in_force.plan != FREE && plan != FREE,
        in_force
            .period_end
            .filter(|e| kept(*e).next_end(*e, zone) > paid_at),
    ) {
        let changes = in_force.plan != plan;
        let anchor = kept(old_end);
        return Grant {
            plan: plan.to_string(),
            start: old_end,
            end: anchor.next_end(old_end, zone),
            from_plan: changes.then(|| in_force.plan.to_string()),
            from_end: changes.then_some(old_end),
            carried_seconds: 0,
            carried_value: 0,
            sources: vec![],
            source_values: vec![],
            anchor,
        };
    }
    let paid_until = in_force
        .period_end
        .filter(|end| in_force.plan != FREE && *end > paid_at);
    let Some(old_end) = paid_until else {
        return Grant {
            plan: plan.to_string(),
            start: paid_at,
            end: month_after(paid_at, zone),
            from_plan: None,
            from_end: None,
            carried_seconds: 0,
            carried_value: 0,
            sources: vec![],
            source_values: vec![],
            anchor: Anchor::of(paid_at, zone),
        };
    };
    if in_force.plan == plan && !in_force.scheduled {
        let anchor = kept(old_end);
        return Grant {
            plan: plan.to_string(),
            start: old_end,
            end: anchor.next_end(old_end, zone),
            from_plan: None,
            from_end: None,
            carried_seconds: 0,
            carried_value: 0,
            sources: vec![],
            source_values: vec![],
            anchor,
        };
    }
    let month = micros(month_after(paid_at, zone) - paid_at);
    let mut carried_us: i128 = 0;
    let mut value: i128 = 0;
    let mut sources = Vec::new();
    let mut source_values = Vec::new();
    for g in running {
        // A grant's own month is worth its value; the time carried into it
        // was priced at the rate it was sold at (`price` over its own
        // month), and runs first. So a partial refund, which lowers `value`,
        // lowers what its own seconds are worth and never the carried ones
        // (the grant's value is its amount less partial refunds plus what
        // was carried into it). Without a partial refund every second is
        // worth the same (nothing is diluted by a later change).
        let carried = i128::from(g.carried_seconds.max(0)) * 1_000_000;
        let length = micros(g.end - g.start) - carried;
        let unused = micros(g.end - g.start.max(paid_at));
        if length <= 0 || unused <= 0 || g.price.max(g.value) <= 0 {
            continue;
        }
        let elapsed = micros(g.end - g.start) - unused;
        let unused_carried = (carried - elapsed).clamp(0, unused);
        // Value × µs over the own month: the carried seconds at the sold
        // rate, the own ones at the value's.
        let worth = i128::from(g.price.max(g.value)) * unused_carried
            + i128::from(g.value) * (unused - unused_carried);
        sources.push(g.id);
        // What it carries of its own money (its own month's unused part):
        // what a refund of it follows; its carried part belongs to its own
        // sources, whose refunds follow it here.
        let own_worth = i128::from(g.value) * (unused - unused_carried);
        source_values.push(i64::try_from(own_worth * 1_000_000 / length).unwrap_or(i64::MAX));
        value += worth / length;
        if amount > 0 {
            carried_us += worth * month / (length * i128::from(amount));
        }
    }
    let carried_seconds = i64::try_from(carried_us / 1_000_000)
        .unwrap_or(i64::MAX)
        .max(0);
    let end = month_after(paid_at, zone) + chrono::Duration::seconds(carried_seconds);
    // Re-anchored on the new period: on `paid_at` when nothing was carried
    // (its month keeps `paid_at`'s day), else on the end the carry reaches.
    let anchor = if carried_seconds == 0 {
        Anchor::of(paid_at, zone)
    } else {
        Anchor::of(end, zone)
    };
    Grant {
        plan: plan.to_string(),
        start: paid_at,
        end,
        from_plan: Some(in_force.plan.to_string()),
        from_end: Some(old_end),
        carried_seconds,
        carried_value: i64::try_from(value).unwrap_or(i64::MAX).max(0),
        sources,
        source_values,
        anchor,
    }
}

/// The stored grants of `user`'s plan `plan` still running at `at`: `PAID`,
/// not carried on, ending after `at`; and the carried part of a refunded
/// one (its own month was taken back, [`super::take_back`]), worth what was
/// carried into it.
async fn running<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    plan: &str,
    at: DateTime<Utc>,
) -> Result<Vec<Running>, DbErr> {
    let rows = payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .filter(
            Condition::any()
                .add(payments::Column::Status.eq(PaymentStatus::Paid))
                .add(
                    Condition::all()
                        .add(payments::Column::Status.eq(PaymentStatus::Refunded))
                        .add(payments::Column::CarriedSeconds.gt(0)),
                ),
        )
        .filter(payments::Column::GrantPlan.eq(plan))
        .filter(payments::Column::CarriedInto.is_null())
        .filter(payments::Column::GrantEnd.gt(at))
        .all(db)
        .await?;
    Ok(rows.into_iter().filter_map(as_running).collect())
}

/// A stored grant as the carry reads it (`None` without a stored period).
fn as_running(p: payments::Model) -> Option<Running> {
    let refunded = p.status == PaymentStatus::Refunded;
    Some(Running {
        id: p.id,
        value: if refunded {
            p.carried_value.unwrap_or(0)
        } else {
            p.amount - p.refunded_amount
        },
        price: if refunded {
            p.carried_value.unwrap_or(0)
        } else {
            p.amount
        },
        start: p.grant_start?,
        end: p.grant_end?,
        // A refunded grant spans its carried part only, every second of it
        // worth what was carried.
        carried_seconds: if refunded {
            0
        } else {
            p.carried_seconds.unwrap_or(0)
        },
    })
}

/// What paying `amount` for `plan` at `paid_at` grants `user` whose
/// subscription is `sub` (`None`: FREE): [`compute`] over the stored grants.
/// Read-only; the quote and the settlement both call it.
pub async fn plan<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    sub: Option<&subscriptions::Model>,
    plan: &str,
    amount: i64,
    paid_at: DateTime<Utc>,
    terms: super::Terms,
) -> Result<Grant, DbErr> {
    let zone = terms.zone;
    let in_force = sub.map_or(
        InForce {
            plan: FREE,
            period_end: None,
            in_grace: false,
            anchor: None,
            scheduled: false,
        },
        |s| {
            let (in_grace, period_end) = payable_end(s, paid_at, terms.grace);
            InForce {
                plan: &s.plan,
                period_end,
                in_grace,
                anchor: super::anchor::of_subscription(s),
                scheduled: s.scheduled_payment_id.is_some(),
            }
        },
    );
    let carries = in_force.plan != FREE
        && (in_force.plan != plan || in_force.scheduled)
        && in_force.period_end.is_some_and(|e| e > paid_at);
    let grants = if carries {
        let mut grants = running(db, user, in_force.plan, paid_at).await?;
        // The phase scheduled after it: its whole grant is still to come,
        // also when the period end moved past its stored slot (an
        // operator's grant): it would begin at that end, keeping its length.
        if let Some((phase_plan, id)) =
            sub.and_then(|s| s.scheduled_plan.as_deref().zip(s.scheduled_payment_id))
        {
            let phase = payments::Entity::find_by_id(id)
                .filter(payments::Column::Status.eq(PaymentStatus::Paid))
                .filter(payments::Column::GrantPlan.eq(phase_plan))
                .filter(payments::Column::CarriedInto.is_null())
                .one(db)
                .await?;
            if let Some(g) = phase.and_then(as_running) {
                let start = g.start.max(paid_at);
                grants.push(Running {
                    start,
                    end: start + (g.end - g.start),
                    ..g
                });
            }
        }
        grants
    } else {
        vec![]
    };
    Ok(compute(in_force, &grants, plan, amount, paid_at, zone))
}

/// What `amount` paid for `plan` through a renewal that no longer renews the
/// subscription (paid before, voided, or the plan or period end moved since)
/// grants: time on the plan in force, never a move back to `plan`.
///
/// * The plan in force is `plan`, or nothing paid is in force: [`plan`]
///   (a month from the period end, from the old end in grace; a late
///   payment: a month from `paid_at`).
/// * Another paid plan Q is in force (paid beyond `paid_at`, or in its
///   grace): the period end moves on by the time `amount` buys of Q at the
///   price Q was sold at in its latest stored grant that still spans its own
///   month, a paid one first (that payment's amount over its own month,
///   carried time excluded; paid or refunded since, and
///   never net of partial refunds, which change what a customer paid, not
///   what Q costs), rounded down to the second. With no stored grant of Q
///   at all (a plan an operator set, or a subscription older than stored
///   grants), at the amount stored on Q's latest renewal of this user over
///   its own month; with neither, nothing prices Q: no time is added (the
///   grant is empty and logged as an error, for an operator to refund),
///   never a month of Q for another plan's price.
pub async fn as_time<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    sub: Option<&subscriptions::Model>,
    plan_id: &str,
    amount: i64,
    paid_at: DateTime<Utc>,
    terms: super::Terms,
) -> Result<Grant, DbErr> {
    let zone = terms.zone;
    let other = sub.and_then(|s| {
        let (grace, end) = payable_end(s, paid_at, terms.grace);
        let end = end.filter(|e| grace || *e > paid_at)?;
        (s.plan != FREE && s.plan != plan_id).then_some((s, end))
    });
    let Some((s, end)) = other else {
        return plan(db, user, sub, plan_id, amount, paid_at, terms).await;
    };
    // The latest grant of Q that still spans its own month: a paid one
    // first; a refund may have cut a grant to its carried part (no own
    // month left to price from).
    let mut grants = payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .filter(payments::Column::Status.is_in([PaymentStatus::Paid, PaymentStatus::Refunded]))
        .filter(payments::Column::GrantPlan.eq(s.plan.as_str()))
        .order_by_desc(payments::Column::GrantEnd)
        .order_by_desc(payments::Column::GrantStart)
        .order_by_desc(payments::Column::Id)
        .all(db)
        .await?;
    grants.sort_by_key(|p| p.status != PaymentStatus::Paid);
    let bought = grants.iter().find_map(|p| {
        let carried = chrono::Duration::seconds(p.carried_seconds.unwrap_or(0).max(0));
        // The month it was sold as: a paid grant's own month as stored; a
        // refunded one's take-back cut its span to what ran, so its own
        // month is counted again from where it began (after its carried
        // time, which runs first).
        let own = if p.status == PaymentStatus::Refunded {
            let from = p.grant_start? + carried;
            micros(month_after(from, zone) - from)
        } else {
            micros(p.grant_end? - p.grant_start? - carried)
        };
        let price = i128::from(p.amount);
        (own > 0 && price > 0).then(|| i128::from(amount.max(0)) * own / price)
    });
    let bought = match bought {
        Some(us) => Some(us),
        None => renewal_rate(db, user, &s.plan, amount, zone).await?,
    };
    let new_end = match bought {
        Some(us) => {
            end + chrono::Duration::seconds(i64::try_from(us / 1_000_000).unwrap_or(i64::MAX))
        }
        None => {
            tracing::error!(%user, plan = %s.plan, amount, "an outdated renewal payment: no stored price of the plan in force, no time granted");
            end
        }
    };
    // Time that is not a whole anchored month re-anchors on the new end.
    let anchor = super::anchor::of_subscription(s)
        .filter(|a| new_end == end && a.holds(end, zone))
        .unwrap_or_else(|| Anchor::of(new_end, zone));
    Ok(Grant {
        plan: s.plan.clone(),
        start: end,
        end: new_end,
        from_plan: None,
        from_end: None,
        carried_seconds: 0,
        carried_value: 0,
        sources: vec![],
        source_values: vec![],
        anchor,
    })
}

/// The microseconds of `plan` that `amount` buys at the amount stored on
/// `user`'s latest renewal of `plan` over that renewal's own month; `None`
/// when no renewal of `plan` with a positive amount is stored.
async fn renewal_rate<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    plan: &str,
    amount: i64,
    zone: Tz,
) -> Result<Option<i128>, DbErr> {
    use crate::entities::renewals;
    let latest = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .filter(renewals::Column::Plan.eq(plan))
        .filter(renewals::Column::Amount.gt(0))
        .order_by_desc(renewals::Column::CreatedAt)
        .one(db)
        .await?;
    Ok(latest.map(|r| {
        let month = micros(month_after(r.period_end, zone) - r.period_end);
        i128::from(amount.max(0)) * month / i128::from(r.amount)
    }))
}

/// What paying `amount` for `plan` would grant `user` at `at` (`None`: now
/// by the database's clock), read from the subscription and the stored
/// grants as they are: the quote of `GET /api/payments/quote` and of a new
/// checkout. The settlement applies the same rule ([`plan`]) at `paid_at`.
pub async fn quote<C: ConnectionTrait>(
    db: &C,
    user: Uuid,
    plan_id: &str,
    amount: i64,
    at: Option<DateTime<Utc>>,
    terms: super::Terms,
) -> Result<Grant, DbErr> {
    let at = match at {
        Some(t) => t,
        None => crate::base::db::now(db).await?,
    };
    let sub = subscriptions::Entity::find_by_id(user).one(db).await?;
    plan(db, user, sub.as_ref(), plan_id, amount, at, terms).await
}

/// Stores `grant` on payment `payment_id` and marks its sources carried
/// into it (in the settlement's transaction).
pub async fn store<C: ConnectionTrait>(
    db: &C,
    payment_id: Uuid,
    grant: &Grant,
) -> Result<(), DbErr> {
    payments::Entity::update_many()
        .col_expr(payments::Column::GrantPlan, Expr::value(grant.plan.clone()))
        .col_expr(payments::Column::GrantStart, Expr::value(grant.start))
        .col_expr(payments::Column::GrantEnd, Expr::value(grant.end))
        .col_expr(
            payments::Column::GrantFromPlan,
            Expr::value(grant.from_plan.clone()),
        )
        .col_expr(payments::Column::GrantFromEnd, Expr::value(grant.from_end))
        .col_expr(
            payments::Column::CarriedSeconds,
            Expr::value(grant.carried_seconds),
        )
        .col_expr(
            payments::Column::CarriedValue,
            Expr::value(grant.carried_value),
        )
        .filter(payments::Column::Id.eq(payment_id))
        .exec(db)
        .await?;
    for (i, source) in grant.sources.iter().enumerate() {
        payments::Entity::update_many()
            .col_expr(payments::Column::CarriedInto, Expr::value(payment_id))
            .col_expr(
                payments::Column::CarriedOutValue,
                Expr::value(grant.source_values.get(i).copied()),
            )
            .filter(payments::Column::Id.eq(*source))
            .exec(db)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::UTC;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn time_carried_in_is_worth_as_much_as_the_grants_own_month_when_it_carries_on() {
        // BASIC 49,000 for its own 30-day month plus 40 days carried in from
        // PRO (priced at BASIC's rate when carried): 70 days, all unused,
        // worth 49,000 × 70 / 30. PRO (99,000) bought at once (its month:
        // 1 December – 1 January, 31 days) carries that value whole.
        let paid_at = t("2026-12-01T00:00:00Z");
        let basic = Running {
            id: Uuid::nil(),
            value: 49_000,
            price: 49_000,
            start: paid_at,
            end: paid_at + chrono::Duration::days(70),
            carried_seconds: 40 * 86_400,
        };
        let g = compute(
            InForce {
                plan: "BASIC",
                period_end: Some(basic.end),
                in_grace: false,
                anchor: None,
                scheduled: false,
            },
            &[basic],
            "PRO",
            99_000,
            paid_at,
            UTC,
        );
        let worth = 49_000 * 70 / 30;
        assert_eq!(g.carried_value, worth);
        let want = i128::from(49_000) * 70 * 86_400 * 1_000_000 * (31 * 86_400)
            / (30 * 86_400 * 99_000)
            / 1_000_000;
        assert_eq!(i128::from(g.carried_seconds), want);
    }

    #[test]
    fn a_partial_refund_lowers_the_own_month_never_the_time_carried_in() {
        // The BASIC grant above, half its 49,000 refunded: its 40 carried
        // days (they run first) keep BASIC's sold rate, its own 30 days are
        // worth 24,500. Ten days in, 30 carried and 30 own days are unused:
        // 49,000 × 30/30 + 24,500 × 30/30 = 73,500.
        let start = t("2026-12-01T00:00:00Z");
        let paid_at = start + chrono::Duration::days(10);
        let basic = Running {
            id: Uuid::nil(),
            value: 24_500,
            price: 49_000,
            start,
            end: start + chrono::Duration::days(70),
            carried_seconds: 40 * 86_400,
        };
        let in_force = InForce {
            plan: "BASIC",
            period_end: Some(basic.end),
            in_grace: false,
            anchor: None,
            scheduled: false,
        };
        let g = compute(in_force, &[basic], "PRO", 99_000, paid_at, UTC);
        assert_eq!(g.carried_value, 73_500);
        // Past the carried days only the own month is left, at its value.
        let later = start + chrono::Duration::days(55);
        let g = compute(in_force, &[basic], "PRO", 99_000, later, UTC);
        assert_eq!(g.carried_value, 24_500 / 2);
    }

    #[test]
    fn pro_to_basic_with_ten_days_left_carries_what_they_are_worth() {
        // PRO 99,000 for 1–31 December (30 days); BASIC 49,000 bought on
        // the 21st: 10 days of PRO are worth 33,000, which buy
        // 33,000 / 49,000 of BASIC's month (21 Dec – 21 Jan, 31 days).
        let paid_at = t("2026-12-21T00:00:00Z");
        let pro = Running {
            id: Uuid::nil(),
            value: 99_000,
            price: 99_000,
            start: t("2026-12-01T00:00:00Z"),
            end: t("2026-12-31T00:00:00Z"),
            carried_seconds: 0,
        };
        let g = compute(
            InForce {
                plan: "PRO",
                period_end: Some(pro.end),
                in_grace: false,
                anchor: None,
                scheduled: false,
            },
            &[pro],
            "BASIC",
            49_000,
            paid_at,
            UTC,
        );
        let month = 31 * 86_400_i64;
        assert_eq!(g.carried_seconds, 33_000 * month / 49_000);
        assert_eq!(g.carried_value, 33_000);
        assert_eq!(g.start, paid_at);
        assert_eq!(
            g.end,
            t("2027-01-21T00:00:00Z") + chrono::Duration::seconds(g.carried_seconds)
        );
        assert_eq!(g.from_plan.as_deref(), Some("PRO"));
        assert_eq!(g.sources, vec![Uuid::nil()]);
    }

    #[test]
    fn same_plan_extends_and_nothing_paid_starts_now() {
        let paid_at = t("2026-01-31T10:00:00Z");
        let free = compute(
            InForce {
                plan: FREE,
                period_end: None,
                in_grace: false,
                anchor: None,
                scheduled: false,
            },
            &[],
            "PRO",
            99_000,
            paid_at,
            UTC,
        );
        assert_eq!((free.start, free.end), (paid_at, t("2026-02-28T10:00:00Z")));
        let running = InForce {
            plan: "PRO",
            period_end: Some(t("2026-02-15T00:00:00Z")),
            in_grace: false,
            anchor: None,
            scheduled: false,
        };
        let same = compute(running, &[], "PRO", 99_000, paid_at, UTC);
        assert_eq!(
            (same.start, same.end),
            (t("2026-02-15T00:00:00Z"), t("2026-03-15T00:00:00Z"))
        );
        let lapsed = InForce {
            plan: "PRO",
            period_end: Some(t("2026-01-01T00:00:00Z")),
            in_grace: false,
            anchor: None,
            scheduled: false,
        };
        assert_eq!(
            compute(lapsed, &[], "BASIC", 49_000, paid_at, UTC).start,
            paid_at
        );
        // Another plan with no payment behind the period carries nothing.
        let gift = compute(running, &[], "BASIC", 49_000, paid_at, UTC);
        assert_eq!(gift.carried_seconds, 0);
        assert_eq!(gift.end, t("2026-02-28T10:00:00Z"));
        assert_eq!(gift.from_plan.as_deref(), Some("PRO"));
    }

    #[test]
    fn paid_in_grace_extends_from_the_old_end() {
        let end = t("2026-02-15T00:00:00Z");
        let paid_at = t("2026-02-17T00:00:00Z");
        let grace = InForce {
            plan: "PRO",
            period_end: Some(end),
            in_grace: true,
            anchor: None,
            scheduled: false,
        };
        let g = compute(grace, &[], "PRO", 99_000, paid_at, UTC);
        assert_eq!((g.start, g.end), (end, t("2026-03-15T00:00:00Z")));
        // Another plan paid in grace: from the old end too (the grace days
        // are billed whichever plan is bought), nothing carried (they have
        // no payment behind them).
        let other = compute(grace, &[], "BASIC", 49_000, paid_at, UTC);
        assert_eq!(
            (other.start, other.end, other.carried_seconds),
            (end, t("2026-03-15T00:00:00Z"), 0)
        );
        assert_eq!(other.from_plan.as_deref(), Some("PRO"));
        // A month already over by the payment: from `paid_at`, any plan.
        let late = t("2026-03-20T00:00:00Z");
        for plan in ["PRO", "BASIC"] {
            let g = compute(grace, &[], plan, 49_000, late, UTC);
            assert_eq!((g.start, g.end), (late, t("2026-04-20T00:00:00Z")));
        }
    }

    #[test]
    fn a_grant_not_yet_started_carries_whole_and_refunds_lower_the_value() {
        let paid_at = t("2026-03-01T00:00:00Z");
        let later = Running {
            id: Uuid::nil(),
            value: 49_000,
            price: 49_000,
            start: t("2026-03-10T00:00:00Z"),
            end: t("2026-04-10T00:00:00Z"),
            carried_seconds: 0,
        };
        let g = compute(
            InForce {
                plan: "BASIC",
                period_end: Some(later.end),
                in_grace: false,
                anchor: None,
                scheduled: false,
            },
            &[later],
            "PRO",
            49_000,
            paid_at,
            UTC,
        );
        assert_eq!(
            g.carried_seconds,
            31 * 86_400,
            "same price: the whole month"
        );
        let half = Running {
            value: 24_500,
            ..later
        };
        let g = compute(
            InForce {
                plan: "BASIC",
                period_end: Some(later.end),
                in_grace: false,
                anchor: None,
                scheduled: false,
            },
            &[half],
            "PRO",
            49_000,
            paid_at,
            UTC,
        );
        assert_eq!(g.carried_seconds, 31 * 86_400 / 2);
    }

    /// Renewals of the same plan keep the anchor: from a 31 January start
    /// the ends run 28 February, 31 March, 30 April (in the billing zone);
    /// a plan change with a carry re-anchors on its end; grace keeps it.
    #[test]
    fn renewals_keep_the_anchor_day_and_a_carry_re_anchors() {
        use chrono_tz::Asia::Jakarta;
        let at = |s: &str| {
            Jakarta
                .from_local_datetime(&s.parse::<chrono::NaiveDateTime>().unwrap())
                .unwrap()
                .with_timezone(&Utc)
        };
        use chrono::TimeZone;
        let nothing = InForce {
            plan: FREE,
            period_end: None,
            in_grace: false,
            anchor: None,
            scheduled: false,
        };
        let first = compute(
            nothing,
            &[],
            "PRO",
            99_000,
            at("2027-01-31T09:00:00"),
            Jakarta,
        );
        assert_eq!(first.end, at("2027-02-28T09:00:00"));
        assert_eq!(first.anchor.day, 31);
        let mut g = first;
        let mut ends = vec![];
        for paid in [
            "2027-02-20T00:00:00",
            "2027-03-20T00:00:00",
            "2027-04-20T00:00:00",
        ] {
            let in_force = InForce {
                plan: "PRO",
                period_end: Some(g.end),
                in_grace: false,
                anchor: Some(g.anchor),
                scheduled: false,
            };
            g = compute(in_force, &[], "PRO", 99_000, at(paid), Jakarta);
            ends.push(g.end);
        }
        assert_eq!(
            ends,
            [
                at("2027-03-31T09:00:00"),
                at("2027-04-30T09:00:00"),
                at("2027-05-31T09:00:00")
            ]
        );
        // Paid in grace: the anchored month from the old end.
        let grace = InForce {
            plan: "PRO",
            period_end: Some(at("2027-02-28T09:00:00")),
            in_grace: true,
            anchor: Some(g.anchor),
            scheduled: false,
        };
        let late = compute(
            grace,
            &[],
            "PRO",
            99_000,
            at("2027-03-02T00:00:00"),
            Jakarta,
        );
        assert_eq!(late.end, at("2027-03-31T09:00:00"));
        // Without a stored anchor (a subscription from before anchors), its
        // end is the anchor: 28 February gives 28 March.
        let legacy = compute(
            InForce {
                anchor: None,
                ..grace
            },
            &[],
            "PRO",
            99_000,
            at("2027-03-02T00:00:00"),
            Jakarta,
        );
        assert_eq!(legacy.end, at("2027-03-28T09:00:00"));
        // A plan change carrying unused time re-anchors on its end.
        let pro = Running {
            id: Uuid::nil(),
            value: 99_000,
            price: 99_000,
            start: at("2027-03-31T09:00:00"),
            end: at("2027-04-30T09:00:00"),
            carried_seconds: 0,
        };
        let change = compute(
            InForce {
                plan: "PRO",
                period_end: Some(pro.end),
                in_grace: false,
                anchor: Some(g.anchor),
                scheduled: false,
            },
            &[pro],
            "BASIC",
            49_000,
            at("2027-04-15T12:00:00"),
            Jakarta,
        );
        assert!(change.carried_seconds > 0);
        assert_eq!(
            change.anchor,
            super::super::anchor::Anchor::of(change.end, Jakarta)
        );
    }
}
