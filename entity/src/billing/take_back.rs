//! What a refund or chargeback takes back (Stripe's and Lago's credit of the
//! unused part): [`take_back`] undoes, from the stored grant alone, what the
//! refunded payment granted ([`super::grant`] stores it), following carried
//! value down the chain of plan changes ([`carried_share`]); never time from
//! a later, separately paid grant.

use chrono::{DateTime, Months, Utc};
use chrono_tz::Tz;
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QuerySelect, Set,
};
use serde_json::json;
use uuid::Uuid;

use super::anchor::{month_after, Anchor};
use super::grant::micros;
use crate::{
    base::{audit, plans::FREE},
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
        subscriptions::{self, SubscriptionStatus},
    },
};

/// Where the money of `refunded`'s grant that was carried on lives now, and
/// how many seconds of that grant it bought: follows `carried_into` from
/// payment to payment (a plan change carried into a plan change, …), as
/// the carry itself priced it ([`super::grant::compute`]): within a grant
/// the time carried into it runs first, then its own month. What the
/// refunded payment carried is stored on it (`carried_out_value`, what the
/// carry valued; for grants carried before that was stored, its amount
/// less partial refunds over the unused part of its own month); in each
/// grant it was carried into, that money sits in the carried part. At each hop the part of that money
/// whose time was still unused when the next payment was paid moves on; at
/// the last grant, the money buys seconds at that grant's own rate
/// (`money × month / amount`), rounded up to the second and at most what it
/// carried. `None` when nothing is left to take back.
async fn carried_share<T: ConnectionTrait>(
    txn: &T,
    refunded: &payments::Model,
    zone: Tz,
) -> Result<Option<(payments::Model, i64)>, DbErr> {
    let (Some(mut start), Some(mut end)) = (refunded.grant_start, refunded.grant_end) else {
        return Ok(None);
    };
    // Money in millionths of a currency unit.
    let mut money = i128::from((refunded.amount - refunded.refunded_amount).max(0)) * 1_000_000;
    // The current grant's carried-in part (µs) and whether the money sits
    // there (else in its own month, at the period's end).
    let mut carried_part = i128::from(refunded.carried_seconds.unwrap_or(0).max(0)) * 1_000_000;
    let mut in_carried = false;
    let mut next = refunded.carried_into;
    let mut last = None;
    // A chain is as long as the customer's plan changes; the bound only
    // guards against a cycle in damaged data.
    for _ in 0..1_000 {
        let Some(id) = next else { break };
        let Some(into) = payments::Entity::find_by_id(id).one(txn).await? else {
            return Ok(None);
        };
        let (Some(paid_at), Some(into_end)) = (into.grant_start, into.grant_end) else {
            return Ok(None);
        };
        let length = micros(end - start);
        let unused = micros(end - start.max(paid_at));
        if length <= 0 || unused <= 0 {
            return Ok(None);
        }
        let elapsed = length - unused;
        let (part, part_unused) = if in_carried {
            (carried_part, (carried_part - elapsed).clamp(0, unused))
        } else {
            let own = length - carried_part;
            (own, unused.min(own))
        };
        match refunded.carried_out_value.filter(|_| !in_carried) {
            // What the carry stored for this source: exact, and blind to
            // partial refunds made after it (they took no time).
            Some(v) => money = i128::from(v.max(0)),
            None => {
                if part <= 0 || part_unused <= 0 {
                    return Ok(None);
                }
                money = money * part_unused / part;
            }
        }
        if money <= 0 {
            return Ok(None);
        }
        start = paid_at;
        end = into_end;
        carried_part = i128::from(into.carried_seconds.unwrap_or(0).max(0)) * 1_000_000;
        in_carried = true;
        next = into.carried_into;
        last = Some(into);
    }
    let Some(into) = last.filter(|p| p.amount > 0 && next.is_none()) else {
        return Ok(None);
    };
    // The grant's own rate, as its carry was priced: its amount over its
    // own month (its period less the carried time), or for a grant whose
    // own month was refunded, what was carried into it over its seconds.
    let carried = i128::from(into.carried_seconds.unwrap_or(0).max(0)) * 1_000_000;
    let own = micros(end - start) - carried;
    let share_us = match into.carried_value {
        Some(v) if into.status == PaymentStatus::Refunded && v > 0 => {
            money * carried / (i128::from(v) * 1_000_000)
        }
        _ if own > 0 => money * own / (i128::from(into.amount) * 1_000_000),
        _ => {
            let month = micros(month_after(start, zone) - start);
            money * month / (i128::from(into.amount) * 1_000_000)
        }
    };
    let secs = i64::try_from((share_us + 999_999) / 1_000_000).unwrap_or(i64::MAX);
    let secs = secs.min(into.carried_seconds.unwrap_or(0));
    Ok(Some((into, secs)))
}

/// Moves the stored grants of `plan` of `user` that start at or after
/// `after` (the later ones, stacked after a grant that lost `by`) back by
/// `by`, so each still spans the time its money buys; `except` is that
/// grant.
async fn shift_later<T: ConnectionTrait>(
    txn: &T,
    user: Uuid,
    plan: &str,
    except: Uuid,
    after: DateTime<Utc>,
    by: chrono::Duration,
) -> Result<(), DbErr> {
    if by <= chrono::Duration::zero() {
        return Ok(());
    }
    let later = payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .filter(payments::Column::GrantPlan.eq(plan))
        .filter(payments::Column::Id.ne(except))
        .filter(payments::Column::CarriedInto.is_null())
        .filter(payments::Column::GrantStart.gte(after))
        .all(txn)
        .await?;
    for p in later {
        payments::Entity::update_many()
            .col_expr(
                payments::Column::GrantStart,
                Expr::value(p.grant_start.map(|t| t - by)),
            )
            .col_expr(
                payments::Column::GrantEnd,
                Expr::value(p.grant_end.map(|t| t - by)),
            )
            .filter(payments::Column::Id.eq(p.id))
            .exec(txn)
            .await?;
    }
    Ok(())
}

/// Takes back what the payment `refunded` (still `PAID` here; any other
/// status granted nothing, so nothing is taken back) granted,
/// under the subscription's row lock, from its stored grant:
///
/// * a grant carried on into a later plan change (or a chain of them, each
///   carried into the next) gives back what it carried: while the last
///   grant of the chain is of the plan in force and still running,
///   refunded since or not, its end (and that payment's stored grant) moves
///   back by the refunded grant's share of the carried time, rounded up to
///   the second ([`carried_share`]), at most what is left of that grant, so
///   a refund never leaves the time its money bought running elsewhere and
///   never takes time from a later, separately paid grant;
/// * a grant already over, or not of the plan in force, is left alone;
/// * a grant that changed plan and is still the last one of its plan (no
///   later payment extended it) returns the carried value where it came
///   from: the replaced plan comes back, until the end of its source grants
///   still `PAID` (at most its old period end), and they run again; when no
///   source is still paid for, nothing comes back; a scheduled phase of the
///   plan that comes back runs on from its end at once (no change of plan
///   is left to wait for);
/// * otherwise the subscription's end moves back by what is still to come
///   of the payment's own month (`grant_end − grant_start −
///   carried_seconds`; the carried time runs first, so what has run of the
///   grant is spent), the grant keeps its carried part, and later grants
///   of the plan move back with it;
/// * a period that then ends by `now` falls back to FREE at once;
/// * in its grace (`past_due`, the period over), a whole refund of the
///   payment whose grant ends the period ends the grace: FREE at once.
///
/// A payment paid before grants were stored moves the end of its plan back
/// by one calendar month. Writes an [`audit::ACTION_SUBSCRIPTION_TAKE_BACK`] audit
/// row; answers the subscription's new plan and period end (`None`: nothing
/// changed).
pub async fn take_back<T: ConnectionTrait>(
    txn: &T,
    refunded: &payments::Model,
    now: DateTime<Utc>,
    zone: Tz,
    request_id: Option<String>,
) -> Result<Option<serde_json::Value>, DbErr> {
    // A payment that never became PAID (a refund notice for a checkout
    // still pending) granted nothing.
    if refunded.status != PaymentStatus::Paid {
        return Ok(None);
    }
    let postgres = txn.get_database_backend() == DbBackend::Postgres;
    let mut find = subscriptions::Entity::find_by_id(refunded.user_id);
    if postgres {
        find = find.lock_exclusive();
    }
    let Some(sub) = find.one(txn).await? else {
        return Ok(None);
    };
    // The payment of a phase not yet begun: the phase is dropped, no time
    // is taken ([`super::phase`]).
    if sub.scheduled_payment_id == Some(refunded.id) {
        let mut am = sub.into_active_model();
        crate::billing::phase::drop_phase(&mut am);
        am.updated_at = Set(now);
        am.update(txn).await?;
        return Ok(None);
    }
    // In its grace (the period ended unpaid, the plan kept): a whole refund
    // of the payment whose grant ends the period ends the grace, FREE at
    // once (decisions.md, "Refunds take only what still runs").
    let ends_grace = sub.status == SubscriptionStatus::PastDue
        && sub.current_period_end.is_some_and(|e| e <= now)
        && refunded.grant_end.is_some()
        && refunded.grant_end == sub.current_period_end;
    let end = match sub.current_period_end.filter(|e| *e > now) {
        Some(end) => end,
        None if ends_grace => now,
        None => return Ok(None),
    };
    let (plan, start, new_end, restore) = if ends_grace {
        (FREE.to_string(), None, now, false)
    } else {
        match (
            refunded.grant_plan.as_deref(),
            refunded.grant_start,
            refunded.grant_end,
        ) {
            (Some(_), Some(_), Some(_)) if refunded.carried_into.is_some() => {
                let Some((into, secs)) = carried_share(txn, refunded, zone).await? else {
                    return Ok(None);
                };
                if into.grant_plan.as_deref() != Some(sub.plan.as_str()) || secs <= 0 {
                    return Ok(None);
                }
                // Only what still runs of the grant it carried into: once that
                // grant is over, its carried time is spent, and a later,
                // separately paid grant of the same plan keeps all its time.
                // In whole seconds, a started second counted.
                let Some(left) = into.grant_end.filter(|e| *e > now).map(|e| {
                    let d = e - now;
                    d.num_seconds() + i64::from(d > chrono::Duration::seconds(d.num_seconds()))
                }) else {
                    return Ok(None);
                };
                let secs = secs.min(left);
                if secs <= 0 {
                    return Ok(None);
                }
                let back = chrono::Duration::seconds(secs);
                let carried = into.carried_seconds.unwrap_or(0);
                // What the carried time is worth shrinks with it.
                let worth = into.carried_value.map(|v| {
                    let left =
                        i128::from(v) * i128::from(carried - secs) / i128::from(carried.max(1));
                    i64::try_from(left).unwrap_or(0).max(0)
                });
                payments::Entity::update_many()
                    .col_expr(
                        payments::Column::CarriedSeconds,
                        Expr::value(carried - secs),
                    )
                    .col_expr(payments::Column::CarriedValue, Expr::value(worth))
                    .col_expr(
                        payments::Column::GrantEnd,
                        Expr::value(into.grant_end.map(|e| e - back)),
                    )
                    .filter(payments::Column::Id.eq(into.id))
                    .exec(txn)
                    .await?;
                if let (Some(plan), Some(into_end)) = (into.grant_plan.as_deref(), into.grant_end) {
                    shift_later(txn, refunded.user_id, plan, into.id, into_end, back).await?;
                }
                (
                    sub.plan.clone(),
                    sub.current_period_start,
                    end - back,
                    false,
                )
            }
            (Some(gplan), Some(gstart), Some(gend)) => {
                if gend <= now || gplan != sub.plan {
                    return Ok(None);
                }
                let carried = refunded.carried_seconds.unwrap_or(0);
                let own = (gend - gstart) - chrono::Duration::seconds(carried);
                let later = payments::Entity::find()
                    .filter(payments::Column::UserId.eq(refunded.user_id))
                    .filter(payments::Column::Status.eq(PaymentStatus::Paid))
                    .filter(payments::Column::GrantPlan.eq(gplan))
                    .filter(payments::Column::CarriedInto.is_null())
                    .filter(payments::Column::Id.ne(refunded.id))
                    .filter(payments::Column::GrantStart.gte(gend))
                    .count(txn)
                    .await?;
                // The replaced plan comes back only as far as grants still paid
                // for carry it: its sources' months stacked again from the first
                // one's start, those refunded meanwhile left out (they took
                // their time back), so a refunded source's month never runs
                // again on a later source's end.
                let sources_end = if later == 0 && refunded.grant_from_plan.is_some() {
                    // A phase it carried is scheduled again, not run as the
                    // replaced plan's time.
                    let sources: Vec<_> = payments::Entity::find()
                        .filter(payments::Column::CarriedInto.eq(refunded.id))
                        .all(txn)
                        .await?
                        .into_iter()
                        .filter(|p| p.grant_plan == refunded.grant_from_plan)
                        .collect();
                    let first = sources.iter().filter_map(|p| p.grant_start).min();
                    let paid: chrono::Duration = sources
                        .iter()
                        .filter(|p| p.status == PaymentStatus::Paid)
                        .filter_map(|p| {
                            let own = p.grant_end? - p.grant_start?;
                            Some(own - chrono::Duration::seconds(p.carried_seconds.unwrap_or(0)))
                        })
                        .sum();
                    first
                        .filter(|_| paid > chrono::Duration::zero())
                        .map(|f| f + paid)
                } else {
                    None
                };
                match (
                    &refunded.grant_from_plan,
                    refunded.grant_from_end,
                    sources_end,
                ) {
                    (Some(from), Some(from_end), Some(paid_end)) => {
                        (from.clone(), None, from_end.min(paid_end), true)
                    }
                    _ => {
                        // Only what is still to come of its own month: the time
                        // carried into it runs first, then its own month; what
                        // of that has run is spent. Its grant keeps the carried
                        // part (still worth what was carried, see
                        // `grant::running`), and the later grants of the plan
                        // move back by what was removed.
                        let left = gend - gstart.max(now);
                        let removed = own.min(left).max(chrono::Duration::zero());
                        payments::Entity::update_many()
                            .col_expr(
                                payments::Column::GrantEnd,
                                Expr::value(Some(gend - removed)),
                            )
                            .filter(payments::Column::Id.eq(refunded.id))
                            .exec(txn)
                            .await?;
                        shift_later(txn, refunded.user_id, gplan, refunded.id, gend, removed)
                            .await?;
                        (
                            sub.plan.clone(),
                            sub.current_period_start,
                            end - removed,
                            false,
                        )
                    }
                }
            }
            _ if refunded.plan == sub.plan => {
                let back = end.checked_sub_months(Months::new(1)).unwrap_or(end);
                (sub.plan.clone(), sub.current_period_start, back, false)
            }
            _ => return Ok(None),
        }
    };
    let mut phase_again = None;
    if restore {
        // The sources still paid run again, their own months stacked from
        // the first one's start (as `sources_end` counted them); what they
        // had carried in from earlier plans is not revived (its money may
        // have been refunded down the chain since).
        let (mut sources, phases): (Vec<_>, Vec<_>) = payments::Entity::find()
            .filter(payments::Column::CarriedInto.eq(refunded.id))
            .all(txn)
            .await?
            .into_iter()
            .partition(|p| p.grant_plan == refunded.grant_from_plan);
        // A phase it carried waits again behind the plan restored (the
        // switch places it at that plan's end).
        phase_again = phases
            .into_iter()
            .find(|p| p.status == PaymentStatus::Paid)
            .and_then(|p| Some((p.grant_plan?, p.id)));
        payments::Entity::update_many()
            .col_expr(payments::Column::CarriedInto, Expr::value(None::<Uuid>))
            .filter(payments::Column::CarriedInto.eq(refunded.id))
            .filter(
                payments::Column::GrantPlan
                    .ne(refunded.grant_from_plan.clone().unwrap_or_default()),
            )
            .exec(txn)
            .await?;
        sources.sort_by_key(|p| p.grant_start);
        let mut cursor = sources.iter().filter_map(|p| p.grant_start).min();
        for p in &sources {
            let (Some(at), Some(s), Some(e)) = (cursor, p.grant_start, p.grant_end) else {
                continue;
            };
            let mut update = payments::Entity::update_many()
                .col_expr(payments::Column::CarriedInto, Expr::value(None::<Uuid>))
                .filter(payments::Column::Id.eq(p.id));
            if p.status == PaymentStatus::Paid {
                let own = (e - s) - chrono::Duration::seconds(p.carried_seconds.unwrap_or(0));
                update = update
                    .col_expr(payments::Column::GrantStart, Expr::value(Some(at)))
                    .col_expr(payments::Column::GrantEnd, Expr::value(Some(at + own)))
                    .col_expr(payments::Column::CarriedSeconds, Expr::value(Some(0_i64)))
                    .col_expr(payments::Column::CarriedValue, Expr::value(Some(0_i64)));
                cursor = Some(at + own);
            }
            update.exec(txn).await?;
        }
        // Its carried value went back to them: it carries nothing now, and
        // its grant spans its own month only (what it was sold at, should a
        // later payment be priced from it).
        let carried = chrono::Duration::seconds(refunded.carried_seconds.unwrap_or(0).max(0));
        payments::Entity::update_many()
            .col_expr(payments::Column::CarriedSeconds, Expr::value(Some(0_i64)))
            .col_expr(payments::Column::CarriedValue, Expr::value(Some(0_i64)))
            .col_expr(
                payments::Column::GrantEnd,
                Expr::value(refunded.grant_end.map(|e| e - carried)),
            )
            .filter(payments::Column::Id.eq(refunded.id))
            .exec(txn)
            .await?;
    }
    let old = json!({
        "plan": sub.plan,
        "status": sub.status.as_str(),
        "period_end": sub.current_period_end,
    });
    let source_start = if restore {
        payments::Entity::find()
            .filter(payments::Column::UserId.eq(refunded.user_id))
            .filter(payments::Column::Status.eq(PaymentStatus::Paid))
            .filter(payments::Column::GrantPlan.eq(plan.as_str()))
            .filter(payments::Column::CarriedInto.is_null())
            .filter(payments::Column::GrantEnd.gt(now))
            .all(txn)
            .await?
            .into_iter()
            .filter_map(|p| p.grant_start)
            .min()
    } else {
        start
    };
    // A phase of the plan that comes back is no change of plan any more: it
    // runs on from the restored end at once, as a renewal of the plan in
    // force, for the length it was paid for (as the switch would run it),
    // and the phase is dropped; the offer pass then offers the next one.
    let mut new_end = new_end;
    let mut folded = false;
    if restore && new_end > now && plan != FREE && sub.scheduled_plan.as_deref() == Some(&plan) {
        if let Some(id) = sub.scheduled_payment_id {
            let length = payments::Entity::find_by_id(id)
                .one(txn)
                .await?
                .filter(|p| p.status == PaymentStatus::Paid && p.carried_into.is_none())
                .and_then(|p| Some(p.grant_end? - p.grant_start?))
                .filter(|d| *d > chrono::Duration::zero());
            if let Some(length) = length {
                payments::Entity::update_many()
                    .col_expr(payments::Column::GrantStart, Expr::value(Some(new_end)))
                    .col_expr(
                        payments::Column::GrantEnd,
                        Expr::value(Some(new_end + length)),
                    )
                    .filter(payments::Column::Id.eq(id))
                    .exec(txn)
                    .await?;
                new_end += length;
            }
        }
        folded = true;
    }
    // Removing a whole anchored month keeps the anchor; any other end
    // re-anchors on it.
    let anchor = super::anchor::of_subscription(&sub)
        .filter(|a| a.holds(new_end, zone))
        .unwrap_or_else(|| Anchor::of(new_end, zone));
    let mut am = sub.into_active_model();
    if folded {
        super::phase::drop_phase(&mut am);
    }
    if let Some((phase_plan, id)) = phase_again {
        am.scheduled_plan = Set(Some(phase_plan));
        am.scheduled_payment_id = Set(Some(id));
    }
    let new = if new_end > now && plan != FREE {
        am.plan = Set(plan.clone());
        am.current_period_start = Set(Some(source_start.unwrap_or(now).min(new_end)));
        am.current_period_end = Set(Some(new_end));
        am.billing_anchor_day = Set(Some(anchor.day_column()));
        am.billing_anchor_time = Set(Some(anchor.time));
        json!({ "plan": plan, "period_end": new_end })
    } else {
        am.plan = Set(FREE.to_string());
        am.status = Set(SubscriptionStatus::Active);
        am.cancel_at_period_end = Set(false);
        am.current_period_start = Set(None);
        am.current_period_end = Set(None);
        am.billing_anchor_day = Set(None);
        am.billing_anchor_time = Set(None);
        am.past_due_at = Set(None);
        am.grace_ends_at = Set(None);
        // The run is over, as at a lapse: a later run of the plan is priced
        // by its own payments and told of rises anew.
        super::price::clear_notice(&mut am);
        json!({ "plan": FREE, "period_end": null })
    };
    am.updated_at = Set(now);
    am.update(txn).await?;
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(audit::ACTION_SUBSCRIPTION_TAKE_BACK.to_string()),
        target_type: Set(audit::TARGET_TYPE_SUBSCRIPTION.to_string()),
        target_id: Set(refunded.user_id.to_string()),
        old_value: Set(Some(old)),
        new_value: Set(Some(json!({
            "plan": new["plan"],
            "period_end": new["period_end"],
            "refunded_order_id": refunded.order_id,
            "returned_to": if restore { json!(plan) } else { serde_json::Value::Null },
        }))),
        request_id: Set(request_id),
        client_request_id: Set(None),
        created_at: Set(now),
    }
    .insert(txn)
    .await?;
    Ok(Some(new))
}
