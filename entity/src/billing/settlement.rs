//! Settlement: what a recorded provider event (or a status check of the
//! provider) does to a payment and its user's subscription, exactly once.
//!
//! Everything happens in one transaction with the rows locked (`SELECT … FOR
//! UPDATE` on PostgreSQL; `BEGIN IMMEDIATE` serialises writers on SQLite):
//! the event, the payment, and (on the move into `PAID`, a late payment
//! included, or into `REFUNDED`, which takes back the period the payment
//! bought) the subscription. Per customer the subscription row is locked
//! before any payment row ([`lock_customer`]), the order the renewal loop
//! and operator grants take too: two settlements of one customer's payments
//! at once (a refund of a checkout beside a refund of the phase it carried)
//! wait for each other instead of deadlocking.
//! The state machine of [`crate::billing::payment::transition`] decides what may
//! change; a refused move marks the event settled with the reason, so it is
//! not retried forever. Settling an event twice changes nothing the second
//! time ([`Settled::AlreadySettled`]).

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QuerySelect, Set, TransactionSession, TransactionTrait,
};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::billing::events;
use crate::{
    base::db::begin_write,
    billing::grant,
    billing::mail,
    billing::payment::{self, PaymentStatus, Transition},
    billing::renewal,
    billing::renewal::settle,
    entities::{
        audit_logs, payments,
        subscriptions::{self, SubscriptionStatus},
        webhook_events,
    },
};

/// Why settlement could not run (the job retries these).
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// What one settlement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The payment moved `from` → `to`; `period_end` is set when the move
    /// into `PAID` activated or extended the subscription.
    Moved {
        /// The order.
        order_id: String,
        /// Status before.
        from: PaymentStatus,
        /// Status now.
        to: PaymentStatus,
        /// End of the subscription's paid period after a move into `PAID`.
        period_end: Option<DateTime<Utc>>,
        /// What the move did to a renewal, for `billing_renewals_total`
        /// (`paid`, `duplicate`; `None`: not a renewal's payment, or one
        /// that came too late to renew).
        renewal: Option<crate::billing::renewal::Outcome>,
    },
    /// The payment already had the reported status: nothing changed.
    Unchanged,
    /// The state machine refused the move (late or out-of-order event); the
    /// payment kept its status and the event records the reason.
    Refused(&'static str),
    /// The event had been settled before: nothing done (a repeated job).
    AlreadySettled,
    /// No event has this id (a permanent failure of the job).
    UnknownEvent,
    /// The event names an order we do not have, or a status its provider's
    /// protocol does not define: settled with that reason, nothing changed.
    Invalid(&'static str),
    /// The provider did not confirm the event's status: settled with the
    /// reason, nothing changed, an audit row written.
    Unconfirmed(String),
}

/// The payment status an event reports, from its provider, the provider's
/// status text and the payload (provider_a's `fraud_status`).
pub fn reported_status(
    provider: &str,
    provider_status: &str,
    payload: &serde_json::Value,
) -> Option<PaymentStatus> {
    match provider {
        payments::PROVIDER_A => {
            payment::provider_a_report(provider_status, payload["fraud_status"].as_str(), payload)
        }
        payments::PROVIDER_B => Some(payment::provider_b_status(provider_status)),
        _ => None,
    }
}

/// What a confirmation (the provider's status API) saw of the payment when
/// it decided that an event may be applied: the row it compared with the
/// provider's answer, read before the settlement's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The payment's status then.
    pub status: PaymentStatus,
    /// Its amount then (whole units of its currency).
    pub amount: i64,
    /// What the provider's status API says went back so far by a partial
    /// refund or chargeback (whole units, rounded up): the only figure a
    /// provider_a partial refund is recorded from, never the notice's own
    /// (its signature does not cover it).
    pub refunded: Option<i64>,
}

/// Settles the recorded event `event_id` (see the module docs). `request_id`
/// goes into the audit row (the job's id); `terms` are the billing terms
/// (the zone a grant's months are counted in, [`super::anchor`]; the grace).
pub async fn settle_event<C>(
    db: &C,
    event_id: Uuid,
    terms: super::Terms,
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    settle_event_seen(db, event_id, None, terms, request_id).await
}

/// [`settle_event`] for an event its provider confirmed against the payment
/// as `seen`: when the payment, read again under its row lock, no longer has
/// that status and amount (another settlement moved it meanwhile), the
/// confirmation does not hold and the event is settled as unconfirmed
/// ([`settle_event_unconfirmed`]'s audit row, nothing changed). `None`
/// settles as [`settle_event`].
pub async fn settle_event_seen<C>(
    db: &C,
    event_id: Uuid,
    seen: Option<Seen>,
    terms: super::Terms,
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut find = webhook_events::Entity::find_by_id(event_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let Some(event) = find.one(&txn).await? else {
        return Ok(Settled::UnknownEvent);
    };
    if event.settled_at.is_some() {
        return Ok(Settled::AlreadySettled);
    }
    lock_customer(&txn, &event.order_id).await?;
    if let Some(seen) = seen {
        let mut find =
            payments::Entity::find().filter(payments::Column::OrderId.eq(event.order_id.as_str()));
        if txn.get_database_backend() == DbBackend::Postgres {
            find = find.lock_exclusive();
        }
        let now = find.one(&txn).await?.map(|p| (p.status, p.amount));
        if now != Some((seen.status, seen.amount)) {
            let reason = format!(
                "the payment changed after the status API was asked: it was {} for {}, it is {:?}",
                seen.status.as_str(),
                seen.amount,
                now.map(|(s, a)| format!("{} for {a}", s.as_str()))
            );
            let outcome = unconfirmed(&txn, event, &reason, request_id).await?;
            txn.commit().await?;
            return Ok(outcome);
        }
    }
    let reported = reported_status(&event.provider, &event.provider_status, &event.payload);
    if let Some(back) = seen.and_then(|s| s.refunded) {
        super::ledger::record_partial_refund(&txn, &event.order_id, back).await?;
    }
    let outcome = match reported {
        None => Settled::Invalid("the event reports a status its provider does not define"),
        Some(reported) => {
            apply(
                &txn,
                &event.order_id,
                reported,
                payment::reverses(&event.provider, &event.provider_status),
                "webhook",
                terms,
                request_id.clone(),
            )
            .await?
        }
    };
    let error = match &outcome {
        Settled::Refused(r) | Settled::Invalid(r) => Some(r.to_string()),
        _ => None,
    };
    let mut am = event.into_active_model();
    am.settled_at = Set(Some(Utc::now()));
    am.settlement_error = Set(error);
    am.update(&txn).await?;
    txn.commit().await?;
    Ok(outcome)
}

/// Settles the recorded event `event_id` without applying it, because its
/// provider did not confirm the status it reports (`reason` says how): the
/// event is marked settled with the reason, the payment is left as it is, and
/// an [`audit::ACTION_PAYMENT_UNCONFIRMED`] audit row records the notified status
/// and the reason. A second call changes nothing ([`Settled::AlreadySettled`]).
pub async fn settle_event_unconfirmed<C>(
    db: &C,
    event_id: Uuid,
    reason: &str,
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut find = webhook_events::Entity::find_by_id(event_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let Some(event) = find.one(&txn).await? else {
        return Ok(Settled::UnknownEvent);
    };
    if event.settled_at.is_some() {
        return Ok(Settled::AlreadySettled);
    }
    let outcome = unconfirmed(&txn, event, reason, request_id).await?;
    txn.commit().await?;
    Ok(outcome)
}

/// The audit row and the settled mark of an unconfirmed event (its row
/// locked by the caller's transaction).
async fn unconfirmed<T: ConnectionTrait>(
    txn: &T,
    event: webhook_events::Model,
    reason: &str,
    request_id: Option<String>,
) -> Result<Settled, DbErr> {
    let now = crate::base::db::now(txn).await?;
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(audit::ACTION_PAYMENT_UNCONFIRMED.to_string()),
        target_type: Set(audit::TARGET_TYPE_PAYMENT.to_string()),
        target_id: Set(event.order_id.clone()),
        old_value: Set(None),
        new_value: Set(Some(json!({
            "provider": event.provider,
            "notified_status": event.provider_status,
            "event_id": event.id,
            "reason": reason,
        }))),
        request_id: Set(request_id),
        client_request_id: Set(None),
        created_at: Set(now),
    }
    .insert(txn)
    .await?;
    let mut am = event.into_active_model();
    am.settled_at = Set(Some(Utc::now()));
    am.settlement_error = Set(Some(format!("{}{reason}", events::UNCONFIRMED)));
    am.update(txn).await?;
    Ok(Settled::Unconfirmed(reason.to_string()))
}

/// Settles what a status check of the provider reported for `order_id`
/// (reconciliation of a payment whose webhook never came): the same state
/// machine and audit trail as an event, with `source` `status_check`.
pub async fn settle_status_check<C>(
    db: &C,
    order_id: &str,
    reported: PaymentStatus,
    terms: super::Terms,
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let outcome = apply(
        &txn,
        order_id,
        reported,
        false,
        "status_check",
        terms,
        request_id,
    )
    .await?;
    txn.commit().await?;
    Ok(outcome)
}

/// Locks (PostgreSQL: `SELECT … FOR UPDATE`) the subscription of the
/// customer whose payment is `order_id`, before any of their payment rows is
/// locked: the one lock order of a customer's rows (module docs). A payment's
/// customer never changes, so reading it unlocked first is safe. Nothing to
/// lock: no such payment, no subscription, or SQLite (`BEGIN IMMEDIATE`
/// already serialises writers).
async fn lock_customer<T: ConnectionTrait>(txn: &T, order_id: &str) -> Result<(), DbErr> {
    if txn.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    let user = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(txn)
        .await?
        .map(|p| p.user_id);
    if let Some(user) = user {
        subscriptions::Entity::find_by_id(user)
            .lock_exclusive()
            .one(txn)
            .await?;
    }
    Ok(())
}

/// The core: locks the payment, applies the state machine, activates the
/// subscription on the move into `PAID` (a late payment included, audited as
/// [`audit::ACTION_LATE_PAYMENT`]), takes back the period a payment bought on its
/// move into `REFUNDED` ([`super::take_back::take_back`]), writes the audit row.
async fn apply<T: ConnectionTrait>(
    txn: &T,
    order_id: &str,
    reported: PaymentStatus,
    reversal: bool,
    source: &str,
    terms: super::Terms,
    request_id: Option<String>,
) -> Result<Settled, DbErr> {
    let postgres = txn.get_database_backend() == DbBackend::Postgres;
    lock_customer(txn, order_id).await?;
    let mut find = payments::Entity::find().filter(payments::Column::OrderId.eq(order_id));
    if postgres {
        find = find.lock_exclusive();
    }
    let Some(pay) = find.one(txn).await? else {
        return Ok(Settled::Invalid("no payment has this order id"));
    };
    // A reversal of a PAID payment (the money went back) is its refund.
    let reported = if reversal && pay.status == PaymentStatus::Paid {
        PaymentStatus::Refunded
    } else {
        reported
    };
    let (from, to) = match payment::transition(pay.status, reported) {
        Transition::Unchanged => return Ok(Settled::Unchanged),
        Transition::Refused(reason) => return Ok(Settled::Refused(reason)),
        Transition::Apply { from, to } => (from, to),
    };
    // The database's clock: paid periods are later compared with it by the
    // expiry task, whichever host runs that.
    let now = crate::base::db::now(txn).await?;
    let mut period_end = None;
    let mut granted = None;
    let mut renewal_fit = None;
    let mut renewal_outcome = None;
    let mut taken_back = None;
    if to == PaymentStatus::Paid {
        let mut find = subscriptions::Entity::find_by_id(pay.user_id);
        if postgres {
            find = find.lock_exclusive();
        }
        let sub = match find.one(txn).await? {
            // A phase due runs first: the payment finds its plan in force.
            Some(s) => Some(super::phase::switch_due(txn, s, now, terms.zone).await?),
            None => None,
        };
        let before = super::ledger::State::of(sub.as_ref());
        let g = match pay.renewal_id {
            Some(rid) => {
                let (g, fit, outcome) =
                    settle::grant(txn, &pay, rid, sub.as_ref(), now, terms, request_id.clone())
                        .await?;
                renewal_fit = Some(fit);
                renewal_outcome = outcome;
                g
            }
            None => {
                grant::plan(
                    txn,
                    pay.user_id,
                    sub.as_ref(),
                    &pay.plan,
                    pay.amount,
                    now,
                    terms,
                )
                .await?
            }
        };
        grant::store(txn, pay.id, &g).await?;
        period_end = Some(g.end);
        // The period end moves (and maybe the plan): an open renewal of the
        // old period no longer renews anything.
        renewal::void_open(txn, pay.user_id, now).await?;
        let phase = super::phase::is_phase(&g, sub.as_ref(), now);
        match sub {
            Some(s) if phase => {
                // The plan in force runs on until its end; the phase waits.
                let mut am = s.into_active_model();
                am.scheduled_plan = Set(Some(g.plan.clone()));
                am.scheduled_payment_id = Set(Some(pay.id));
                am.renewal_plan = Set(None);
                am.cancel_at_period_end = Set(false);
                am.canceled_at = Set(None);
                am.updated_at = Set(now);
                am.update(txn).await?;
            }
            Some(s) => {
                // A phase whose value this payment carried is spent.
                let phase_carried = s
                    .scheduled_payment_id
                    .is_some_and(|id| g.sources.contains(&id));
                // A plan chosen for the next renewal (`change`) is spent when
                // it is paid for, and overridden by paying for another plan.
                let keep_next = g.plan == s.plan && s.renewal_plan.as_deref() != Some(&g.plan);
                let next = if keep_next {
                    s.renewal_plan.clone()
                } else {
                    None
                };
                // A price-change notice is spent once its plan's new price is
                // paid (it is kept while another plan runs: a refund may
                // bring its plan back).
                let notice_spent = s.price_notice_plan.as_deref() == Some(g.plan.as_str())
                    && pay.plan == g.plan
                    && s.price_notice_amount.is_some_and(|a| a <= pay.amount);
                let mut am = s.into_active_model();
                if phase_carried {
                    crate::billing::phase::drop_phase(&mut am);
                }
                if notice_spent {
                    crate::billing::price::clear_notice(&mut am);
                }
                am.renewal_plan = Set(next);
                am.plan = Set(g.plan.clone());
                am.status = Set(SubscriptionStatus::Active);
                am.cancel_at_period_end = Set(false);
                am.current_period_start = Set(Some(g.start));
                am.current_period_end = Set(Some(g.end));
                am.billing_anchor_day = Set(Some(g.anchor.day_column()));
                am.billing_anchor_time = Set(Some(g.anchor.time));
                am.past_due_at = Set(None);
                am.grace_ends_at = Set(None);
                am.canceled_at = Set(None);
                am.updated_at = Set(now);
                am.update(txn).await?;
            }
            None => {
                subscriptions::ActiveModel {
                    user_id: Set(pay.user_id),
                    plan: Set(g.plan.clone()),
                    status: Set(SubscriptionStatus::Active),
                    cancel_at_period_end: Set(false),
                    current_period_start: Set(Some(g.start)),
                    current_period_end: Set(Some(g.end)),
                    canceled_at: Set(None),
                    created_at: Set(now),
                    updated_at: Set(now),
                    renewal_plan: Set(None),
                    renewal_plan_price: Set(None),
                    billing_anchor_day: Set(Some(g.anchor.day_column())),
                    billing_anchor_time: Set(Some(g.anchor.time)),
                    past_due_at: Set(None),
                    grace_ends_at: Set(None),
                    price_notice_plan: Set(None),
                    price_notice_amount: Set(None),
                    price_notice_at: Set(None),
                    scheduled_plan: Set(None),
                    scheduled_payment_id: Set(None),
                }
                .insert(txn)
                .await?;
            }
        }
        let kind = if pay.renewal_id.is_some() {
            super::ledger::Kind::Renewal
        } else {
            super::ledger::Kind::Payment
        };
        super::ledger::note(
            txn,
            pay.user_id,
            &before,
            super::ledger::Cause {
                kind,
                payment_id: Some(pay.id),
                renewal_id: pay.renewal_id,
                actor_id: None,
                value: pay.amount,
            },
            now,
        )
        .await?;
        super::ledger::issue_receipt(txn, &pay, &g, now).await?;
        granted = Some(g);
    } else if to == PaymentStatus::Refunded {
        let before = super::ledger::State::read(txn, pay.user_id).await?;
        taken_back =
            super::take_back::take_back(txn, &pay, now, terms.zone, request_id.clone()).await?;
        if taken_back.is_some() {
            renewal::void_open(txn, pay.user_id, now).await?;
        }
        let row = super::ledger::note(
            txn,
            pay.user_id,
            &before,
            super::ledger::Cause {
                kind: super::ledger::Kind::Refund,
                payment_id: Some(pay.id),
                renewal_id: None,
                actor_id: None,
                value: pay.amount,
            },
            now,
        )
        .await?;
        let taken = row.map_or(0, |r| -r.seconds);
        super::ledger::refund_on_receipt(txn, pay.id, pay.amount, taken).await?;
        // What the refund left may end the plan in force now: a phase
        // waiting behind it begins.
        let mut find = subscriptions::Entity::find_by_id(pay.user_id);
        if postgres {
            find = find.lock_exclusive();
        }
        if let Some(s) = find.one(txn).await? {
            super::phase::switch_due(txn, s, now, terms.zone).await?;
        }
    }
    let user_id = pay.user_id;
    let plan = pay.plan.clone();
    if let Some(g) = &granted {
        mail::queue_receipt(txn, &pay, now, g).await?;
    } else if to == PaymentStatus::Refunded {
        mail::queue_refund_notice(txn, &pay, now, taken_back.as_ref()).await?;
    }
    let mut am = pay.into_active_model();
    am.status = Set(to);
    if to == PaymentStatus::Paid {
        am.paid_at = Set(Some(now));
    }
    am.updated_at = Set(now);
    am.update(txn).await?;
    let action = if payment::is_late_payment(from, to) {
        audit::ACTION_LATE_PAYMENT
    } else {
        audit::ACTION_PAYMENT_SETTLE
    };
    let mut new_value = json!({
        "status": to.as_str(),
        "source": source,
        "user_id": user_id,
        "plan": plan,
        "period_end": period_end,
    });
    if let Some(t) = taken_back {
        new_value["subscription"] = t;
    }
    if let Some(fit) = renewal_fit {
        new_value["renewal"] = json!(fit.as_str());
        if let Some(g) = &granted {
            new_value["granted_plan"] = json!(g.plan);
        }
    }
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(action.to_string()),
        target_type: Set(audit::TARGET_TYPE_PAYMENT.to_string()),
        target_id: Set(order_id.to_string()),
        old_value: Set(Some(json!({ "status": from.as_str() }))),
        new_value: Set(Some(new_value)),
        request_id: Set(request_id),
        client_request_id: Set(None),
        created_at: Set(now),
    }
    .insert(txn)
    .await?;
    Ok(Settled::Moved {
        order_id: order_id.to_string(),
        from,
        to,
        period_end,
        renewal: renewal_outcome,
    })
}
