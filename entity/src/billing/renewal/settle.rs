//! What a payment made through a renewal's pay link does when it settles
//! `PAID` (decisions.md, "Subscriptions"; docs/billing.md, "Renewal"):
//!
//! * [`Fit::Renews`]: the renewal is open and the subscription still runs
//!   the period it renews (same period end; its plan, or the plan chosen by
//!   `change`). The payment is granted by the one rule ([`grant::plan`]):
//!   its own plan extends a month from the period end (from the old end in
//!   grace); a plan chosen by `change` paid before the period end is a
//!   phase that starts at the old end ([`crate::billing::phase`]), and in
//!   grace runs from the old end at once. The renewal becomes `paid`.
//! * [`Fit::Duplicate`]: the renewal was paid already (two checkouts of one
//!   renewal both paid). Honoured as time ([`grant::as_time`]) and audited
//!   [`audit::ACTION_RENEWAL_DUPLICATE`].
//! * [`Fit::Outdated`]: the renewal was voided, or the subscription's plan or
//!   period end moved since (an upgrade paid meanwhile). Honoured as time on
//!   the plan in force ([`grant::as_time`]): a renewal never moves the plan
//!   back. With nothing paid in force it is a late payment (a month of its
//!   plan from `paid_at`).

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel, QuerySelect,
    Set,
};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::{
    base::plans::FREE,
    billing::grant::{self, Grant},
    billing::renewal::Outcome,
    entities::{
        audit_logs, payments,
        renewals::{self, RenewalStatus},
        subscriptions::{self, SubscriptionStatus},
    },
};

/// How a renewal's payment fits the subscription when it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The renewal is open and renews the period the subscription runs.
    Renews,
    /// The renewal was paid before.
    Duplicate,
    /// The renewal was voided, or the subscription moved on since.
    Outdated,
}

impl Fit {
    /// As written in the settlement's audit row (`renewal`).
    pub fn as_str(self) -> &'static str {
        match self {
            Fit::Renews => "renews",
            Fit::Duplicate => "duplicate",
            Fit::Outdated => "outdated",
        }
    }
}

/// Decides how renewal `r` (locked) fits subscription `sub` (locked).
pub fn fit(r: Option<&renewals::Model>, sub: Option<&subscriptions::Model>) -> Fit {
    let Some(r) = r else {
        return Fit::Outdated;
    };
    match r.status {
        RenewalStatus::Paid => return Fit::Duplicate,
        RenewalStatus::Void => return Fit::Outdated,
        RenewalStatus::Open => {}
    }
    let runs = sub.is_some_and(|s| {
        s.plan != FREE
            && matches!(
                s.status,
                SubscriptionStatus::Active | SubscriptionStatus::PastDue
            )
            && s.current_period_end == Some(r.period_end)
            && (s.plan == r.plan || s.renewal_plan.as_deref() == Some(r.plan.as_str()))
    });
    if runs {
        Fit::Renews
    } else {
        Fit::Outdated
    }
}

/// The grant of `pay`, a payment of renewal `renewal_id` settling `PAID` at
/// `now` for the user whose locked subscription is `sub`, and the renewal
/// outcome to count (`paid` or `duplicate`; `None`: outdated). Locks the
/// renewal, marks it `paid` when the payment renews it, writes the
/// [`audit::ACTION_RENEWAL_DUPLICATE`] audit row for a second payment.
pub async fn grant<T: ConnectionTrait>(
    txn: &T,
    pay: &payments::Model,
    renewal_id: Uuid,
    sub: Option<&subscriptions::Model>,
    now: DateTime<Utc>,
    terms: crate::billing::Terms,
    request_id: Option<String>,
) -> Result<(Grant, Fit, Option<Outcome>), DbErr> {
    let mut find = renewals::Entity::find_by_id(renewal_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let r = find.one(txn).await?;
    let fit = fit(r.as_ref(), sub);
    let g = match fit {
        Fit::Renews => match sub
            .and_then(|s| super::super::phase::schedule(s, &pay.plan, now, terms.zone))
        {
            // The plan chosen by `change`, paid before the period end: a
            // phase from the old end.
            Some(phase) => phase,
            None => grant::plan(txn, pay.user_id, sub, &pay.plan, pay.amount, now, terms).await?,
        },
        Fit::Duplicate | Fit::Outdated => {
            grant::as_time(txn, pay.user_id, sub, &pay.plan, pay.amount, now, terms).await?
        }
    };
    let outcome = match (fit, r) {
        (Fit::Renews, Some(r)) => {
            let mut am = r.into_active_model();
            am.status = Set(RenewalStatus::Paid);
            am.next_reminder_at = Set(None);
            am.updated_at = Set(now);
            am.update(txn).await?;
            Some(Outcome::Paid)
        }
        (Fit::Duplicate, _) => {
            tracing::warn!(order_id = %pay.order_id, %renewal_id, "a renewal paid twice: honoured as time");
            audit_logs::ActiveModel {
                id: Set(Uuid::now_v7()),
                actor_id: Set(None),
                action: Set(audit::ACTION_RENEWAL_DUPLICATE.to_string()),
                target_type: Set(audit::TARGET_TYPE_PAYMENT.to_string()),
                target_id: Set(pay.order_id.clone()),
                old_value: Set(None),
                new_value: Set(Some(json!({
                    "renewal_id": renewal_id,
                    "user_id": pay.user_id,
                    "granted_plan": g.plan,
                    "period_start": g.start,
                    "period_end": g.end,
                }))),
                request_id: Set(request_id),
                client_request_id: Set(None),
                created_at: Set(now),
            }
            .insert(txn)
            .await?;
            Some(Outcome::Duplicate)
        }
        _ => None,
    };
    Ok((g, fit, outcome))
}
