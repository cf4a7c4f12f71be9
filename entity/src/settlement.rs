//! Settlement: what a recorded provider event (or a status check of the
//! provider) does to a payment and its user's subscription, exactly once.
//!
//! Everything happens in one transaction with the rows locked (`SELECT … FOR
//! UPDATE` on PostgreSQL; `BEGIN IMMEDIATE` serialises writers on SQLite):
//! the event, the payment, and (on the move into `PAID`, a late payment
//! included, or into `REFUNDED`, which takes back the period the payment
//! bought) the subscription.
//! The state machine of [`crate::payment::transition`] decides what may
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

use crate::{
    billing_mail::{self, BillingMail, BillingMailKind},
    entities::{
        audit_logs, payments,
        subscriptions::{self, SubscriptionStatus},
        webhook_events,
    },
    grant,
    payment::{self, PaymentStatus, Transition},
    plans::FREE,
    renewal, renewal_settle,
    users::begin_write,
};

/// `audit_logs.target_type` of a payment.
pub const TARGET_TYPE_PAYMENT: &str = "payment";
/// `audit_logs.action` when a paid subscription lapses back to FREE.
pub const ACTION_SUBSCRIPTION_EXPIRE: &str = "subscription.expire";
/// `audit_logs.target_type` of a subscription.
pub const TARGET_TYPE_SUBSCRIPTION: &str = "subscription";
/// `audit_logs.action` when a payment already `EXPIRED` or `FAILED` is
/// reported paid (verified) and becomes `PAID`.
pub const ACTION_LATE_PAYMENT: &str = "late_payment";
/// `audit_logs.action` when a notification reports a status the provider's
/// status API does not confirm: nothing changed.
pub const ACTION_PAYMENT_UNCONFIRMED: &str = "payment.unconfirmed";
/// `audit_logs.action` when a refund or chargeback took back the period a
/// payment had bought.
pub const ACTION_SUBSCRIPTION_TAKE_BACK: &str = "subscription.take_back";

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
        renewal: Option<crate::renewal::Outcome>,
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
/// goes into the audit row (the job's id).
pub async fn settle_event<C>(
    db: &C,
    event_id: Uuid,
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    settle_event_seen(db, event_id, None, request_id).await
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
        grant::record_partial_refund(&txn, &event.order_id, back).await?;
    }
    let outcome = match reported {
        None => Settled::Invalid("the event reports a status its provider does not define"),
        Some(reported) => {
            apply(
                &txn,
                &event.order_id,
                reported,
                "webhook",
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
/// an [`ACTION_PAYMENT_UNCONFIRMED`] audit row records the notified status
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
    let now = crate::db::now(txn).await?;
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(ACTION_PAYMENT_UNCONFIRMED.to_string()),
        target_type: Set(TARGET_TYPE_PAYMENT.to_string()),
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
    am.settlement_error = Set(Some(format!("{UNCONFIRMED}{reason}")));
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
    request_id: Option<String>,
) -> Result<Settled, SettleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let outcome = apply(&txn, order_id, reported, "status_check", request_id).await?;
    txn.commit().await?;
    Ok(outcome)
}

/// The core: locks the payment, applies the state machine, activates the
/// subscription on the move into `PAID` (a late payment included, audited as
/// [`ACTION_LATE_PAYMENT`]), takes back the period a payment bought on its
/// move into `REFUNDED` ([`take_back`]), writes the audit row.
async fn apply<T: ConnectionTrait>(
    txn: &T,
    order_id: &str,
    reported: PaymentStatus,
    source: &str,
    request_id: Option<String>,
) -> Result<Settled, DbErr> {
    let postgres = txn.get_database_backend() == DbBackend::Postgres;
    let mut find = payments::Entity::find().filter(payments::Column::OrderId.eq(order_id));
    if postgres {
        find = find.lock_exclusive();
    }
    let Some(pay) = find.one(txn).await? else {
        return Ok(Settled::Invalid("no payment has this order id"));
    };
    let (from, to) = match payment::transition(pay.status, reported) {
        Transition::Unchanged => return Ok(Settled::Unchanged),
        Transition::Refused(reason) => return Ok(Settled::Refused(reason)),
        Transition::Apply { from, to } => (from, to),
    };
    // The database's clock: paid periods are later compared with it by the
    // expiry task, whichever host runs that.
    let now = crate::db::now(txn).await?;
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
        let sub = find.one(txn).await?;
        let g = match pay.renewal_id {
            Some(rid) => {
                let (g, fit, outcome) =
                    renewal_settle::grant(txn, &pay, rid, sub.as_ref(), now, request_id.clone())
                        .await?;
                renewal_fit = Some(fit);
                renewal_outcome = outcome;
                g
            }
            None => grant::plan(txn, pay.user_id, sub.as_ref(), &pay.plan, pay.amount, now).await?,
        };
        grant::store(txn, pay.id, &g).await?;
        period_end = Some(g.end);
        // The period end moves (and maybe the plan): an open renewal of the
        // old period no longer renews anything.
        renewal::void_open(txn, pay.user_id, now).await?;
        match sub {
            Some(s) => {
                // A plan chosen for the next renewal (`change`) is spent when
                // it is paid for, and overridden by paying for another plan.
                let keep_next = g.plan == s.plan && s.renewal_plan.as_deref() != Some(&g.plan);
                let next = if keep_next {
                    s.renewal_plan.clone()
                } else {
                    None
                };
                let mut am = s.into_active_model();
                am.renewal_plan = Set(next);
                am.plan = Set(g.plan.clone());
                am.status = Set(SubscriptionStatus::Active);
                am.cancel_at_period_end = Set(false);
                am.current_period_start = Set(Some(g.start));
                am.current_period_end = Set(Some(g.end));
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
                }
                .insert(txn)
                .await?;
            }
        }
        granted = Some(g);
    } else if to == PaymentStatus::Refunded {
        taken_back = grant::take_back(txn, &pay, now, request_id.clone()).await?;
        if taken_back.is_some() {
            renewal::void_open(txn, pay.user_id, now).await?;
        }
    }
    let user_id = pay.user_id;
    let plan = pay.plan.clone();
    if let Some(g) = &granted {
        receipt(txn, &pay, now, g).await?;
    } else if to == PaymentStatus::Refunded {
        refund_notice(txn, &pay, now, taken_back.as_ref()).await?;
    }
    let mut am = pay.into_active_model();
    am.status = Set(to);
    if to == PaymentStatus::Paid {
        am.paid_at = Set(Some(now));
    }
    am.updated_at = Set(now);
    am.update(txn).await?;
    let action = if payment::is_late_payment(from, to) {
        ACTION_LATE_PAYMENT
    } else {
        audit_logs::ACTION_PAYMENT_SETTLE
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
        target_type: Set(TARGET_TYPE_PAYMENT.to_string()),
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

/// Queues the receipt of `pay`, which became `PAID` at `paid_at` and
/// granted `g`, in the settlement's transaction.
async fn receipt<T: ConnectionTrait>(
    txn: &T,
    pay: &payments::Model,
    paid_at: DateTime<Utc>,
    g: &grant::Grant,
) -> Result<(), DbErr> {
    let vars = json!({
        "order_id": pay.order_id,
        "plan": pay.plan,
        "amount": pay.amount,
        "currency": pay.currency,
        "provider": pay.provider,
        "paid_at": paid_at,
        "period_start": g.start,
        "period_end": g.end,
        "from_plan": g.from_plan,
        "carried_seconds": g.carried_seconds,
    });
    billing_mail::queue(
        txn,
        BillingMail {
            kind: BillingMailKind::Receipt,
            user_id: pay.user_id,
            key: billing_mail::receipt_key(&pay.order_id),
            vars: as_map(vars),
        },
    )
    .await?;
    Ok(())
}

/// Queues the refund notice of `pay`, refunded (or charged back) at `now`;
/// `subscription` is what the take-back left (`{plan, period_end}`; `None`:
/// the subscription did not change, read as it is).
async fn refund_notice<T: ConnectionTrait>(
    txn: &T,
    pay: &payments::Model,
    now: DateTime<Utc>,
    subscription: Option<&serde_json::Value>,
) -> Result<(), DbErr> {
    let (plan, end) = match subscription {
        Some(v) => (
            v["plan"].as_str().unwrap_or(FREE).to_string(),
            v["period_end"].clone(),
        ),
        None => match subscriptions::Entity::find_by_id(pay.user_id)
            .one(txn)
            .await?
        {
            Some(s) => (s.plan, json!(s.current_period_end)),
            None => (FREE.to_string(), serde_json::Value::Null),
        },
    };
    let vars = json!({
        "order_id": pay.order_id,
        "plan": pay.plan,
        "amount": pay.amount,
        "currency": pay.currency,
        "provider": pay.provider,
        "refunded_at": now,
        "subscription_plan": plan,
        "subscription_period_end": end,
    });
    billing_mail::queue(
        txn,
        BillingMail {
            kind: BillingMailKind::RefundNotice,
            user_id: pay.user_id,
            key: billing_mail::refund_key(&pay.order_id),
            vars: as_map(vars),
        },
    )
    .await?;
    Ok(())
}

fn as_map(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// Why a verified notification was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No payment of this provider has the order id (HTTP 404).
    #[error("no {provider} payment has order id {order_id}")]
    UnknownOrder {
        /// The provider that sent it.
        provider: &'static str,
        /// The order id it names.
        order_id: String,
    },
    /// The notified amount is not the stored one (HTTP 400 `amount_mismatch`);
    /// nothing is recorded.
    #[error("notified amount {notified:?} differs from the stored {stored}")]
    AmountMismatch {
        /// The stored amount.
        stored: i64,
        /// The notified amount (`None`: it had a non-zero fraction).
        notified: Option<i64>,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// The outcome of [`record_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A first delivery: the event is stored under this id, unsettled; its
    /// settlement is to be queued.
    New(Uuid),
    /// The dedupe key is known: a repeat delivery. Nothing was written.
    Duplicate {
        /// The event recorded by the first delivery.
        event_id: Uuid,
        /// Whether it has been settled yet.
        settled: bool,
    },
}

/// Records a verified notification (record-then-enqueue): the payment must
/// exist for this provider ([`RecordError::UnknownOrder`]) and the notified
/// amount must equal the stored one ([`RecordError::AmountMismatch`]); then
/// the event is inserted under its dedupe key (unique index), or recognised as
/// a repeat ([`Recorded::Duplicate`]) — also under concurrent deliveries. A
/// provider_a notice whose key is held by an event not confirmed (yet) and
/// whose body differs is recorded as its own event (key plus body hash), at
/// most [`MAX_ALTERNATES`] of them, none once one of them is confirmed.
pub async fn record_event<C: ConnectionTrait>(
    db: &C,
    n: &crate::webhook::Notification,
) -> Result<Recorded, RecordError> {
    let recorded = record_once(db, n).await?;
    let Recorded::Duplicate { .. } = recorded else {
        return Ok(recorded);
    };
    // A provider_a notice is only a hint until the status API confirms it,
    // and its signature does not cover most of its body: an event of the
    // same key that is not (yet) confirmed must not swallow a notice with
    // another body (the genuine one behind an edited copy). Such a notice is
    // recorded under its key plus a hash of its body; the same body again is
    // a repeat.
    if n.provider != payments::PROVIDER_A {
        return Ok(recorded);
    }
    // The key's family: the first event and the bodies recorded beside it.
    let alternate = format!("{}#", n.dedupe_key);
    let family: Vec<webhook_events::Model> = webhook_events::Entity::find()
        .filter(webhook_events::Column::OrderId.eq(n.order_id.as_str()))
        .all(db)
        .await?
        .into_iter()
        .filter(|e| e.dedupe_key == n.dedupe_key || e.dedupe_key.starts_with(&alternate))
        .collect();
    let trusted = |e: &webhook_events::Model| {
        e.settled_at.is_some()
            && !e
                .settlement_error
                .as_deref()
                .is_some_and(|err| err.starts_with(UNCONFIRMED))
    };
    // A confirmed member makes every later body a repeat; so does a body
    // seen before; and at most [`MAX_ALTERNATES`] bodies are recorded beside
    // the first, so edited copies cannot buy unbounded status-API questions.
    if family.iter().any(trusted)
        || family.iter().any(|e| e.payload == n.payload)
        || family.len() > MAX_ALTERNATES
    {
        return Ok(recorded);
    }
    let mut other = n.clone();
    other.dedupe_key = format!("{}#{}", n.dedupe_key, body_hash(&n.payload));
    record_once(db, &other).await
}

/// Bodies recorded beside the first event of a provider_a dedupe key while
/// none of them is confirmed (see [`record_event`]).
const MAX_ALTERNATES: usize = 3;

/// Prefix of `webhook_events.settlement_error` for an event the provider's
/// status API did not confirm.
const UNCONFIRMED: &str = "unconfirmed: ";

/// The first 32 hex digits of the SHA-256 of `payload`'s JSON text.
fn body_hash(payload: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(payload.to_string().as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// [`record_event`] under `n.dedupe_key` exactly.
async fn record_once<C: ConnectionTrait>(
    db: &C,
    n: &crate::webhook::Notification,
) -> Result<Recorded, RecordError> {
    if db.get_database_backend() == DbBackend::Postgres {
        return record_event_postgres(db, n).await;
    }
    let pay = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(n.order_id.as_str()))
        .filter(payments::Column::Provider.eq(n.provider))
        .one(db)
        .await?
        .ok_or_else(|| RecordError::UnknownOrder {
            provider: n.provider,
            order_id: n.order_id.clone(),
        })?;
    if n.amount != Some(pay.amount) {
        return Err(RecordError::AmountMismatch {
            stored: pay.amount,
            notified: n.amount,
        });
    }
    let id = Uuid::now_v7();
    let inserted = webhook_events::Entity::insert(webhook_events::ActiveModel {
        id: Set(id),
        provider: Set(n.provider.to_string()),
        dedupe_key: Set(n.dedupe_key.clone()),
        order_id: Set(n.order_id.clone()),
        provider_status: Set(n.provider_status.clone()),
        payload: Set(n.payload.clone()),
        // The database's default (its clock), which the sweep's cut-off uses.
        received_at: sea_orm::NotSet,
        settled_at: Set(None),
        settlement_error: Set(None),
    })
    .on_conflict_do_nothing_on([webhook_events::Column::DedupeKey])
    .exec_without_returning(db)
    .await?;
    if matches!(inserted, sea_orm::TryInsertResult::Inserted(n) if n == 1) {
        return Ok(Recorded::New(id));
    }
    let first = webhook_events::Entity::find()
        .filter(webhook_events::Column::DedupeKey.eq(n.dedupe_key.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the conflicting webhook event".into()))?;
    Ok(Recorded::Duplicate {
        event_id: first.id,
        settled: first.settled_at.is_some(),
    })
}

/// [`record_event`] on PostgreSQL in one statement (one round trip on the
/// hot path of webhook ingestion): the payment lookup, the amount check and
/// the insert under the dedupe key, answering the stored amount (NULL: no
/// such payment) and the new event's id (NULL: not inserted: a mismatch or
/// a repeat). Only a repeat reads the first event afterwards.
async fn record_event_postgres<C: ConnectionTrait>(
    db: &C,
    n: &crate::webhook::Notification,
) -> Result<Recorded, RecordError> {
    use sea_orm::{Statement, Value};
    const SQL: &str = r#"
WITH p AS (
    SELECT amount FROM payments WHERE order_id = $1 AND provider = $2
), ins AS (
    INSERT INTO webhook_events
        (id, provider, dedupe_key, order_id, provider_status, payload, settled_at, settlement_error)
    SELECT $3, $2, $4, $1, $5, $6, NULL, NULL FROM p WHERE p.amount = $7
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
)
SELECT (SELECT amount FROM p) AS amount, (SELECT id FROM ins) AS inserted"#;
    let id = Uuid::now_v7();
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [
                Value::from(n.order_id.as_str()),
                Value::from(n.provider),
                Value::from(id),
                Value::from(n.dedupe_key.as_str()),
                Value::from(n.provider_status.as_str()),
                Value::from(n.payload.clone()),
                Value::from(n.amount),
            ],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the recording statement's row".into()))?;
    let stored: Option<i64> = row.try_get("", "amount")?;
    let inserted: Option<Uuid> = row.try_get("", "inserted")?;
    let Some(stored) = stored else {
        return Err(RecordError::UnknownOrder {
            provider: n.provider,
            order_id: n.order_id.clone(),
        });
    };
    if n.amount != Some(stored) {
        return Err(RecordError::AmountMismatch {
            stored,
            notified: n.amount,
        });
    }
    if let Some(id) = inserted {
        return Ok(Recorded::New(id));
    }
    let first = webhook_events::Entity::find()
        .filter(webhook_events::Column::DedupeKey.eq(n.dedupe_key.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the conflicting webhook event".into()))?;
    Ok(Recorded::Duplicate {
        event_id: first.id,
        settled: first.settled_at.is_some(),
    })
}

/// Removes an event that was recorded but whose settlement could not be
/// queued (the webhook then answers 503), so that the provider's retry is a
/// first delivery again. Only an unsettled event is removed.
pub async fn forget_unqueued_event<C: ConnectionTrait>(db: &C, id: Uuid) -> Result<bool, DbErr> {
    let res = webhook_events::Entity::delete_many()
        .filter(webhook_events::Column::Id.eq(id))
        .filter(webhook_events::Column::SettledAt.is_null())
        .exec(db)
        .await?;
    Ok(res.rows_affected == 1)
}

/// Events recorded before `received_before` and still unsettled, oldest
/// first, at most `limit`: what the settlement sweep queues again.
pub async fn unsettled_events<C: ConnectionTrait>(
    db: &C,
    received_before: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<Uuid>, DbErr> {
    use sea_orm::QueryOrder;
    webhook_events::Entity::find()
        .select_only()
        .column(webhook_events::Column::Id)
        .filter(webhook_events::Column::SettledAt.is_null())
        .filter(webhook_events::Column::ReceivedAt.lt(received_before))
        .order_by_asc(webhook_events::Column::ReceivedAt)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}
