//! Operator grants (decisions.md, "Operator grants"): an admin gives a
//! customer a plan until a date, at zero value, audited with the actor and
//! the reason. Plans are never set by editing rows.
//!
//! The rule, decided here for every caller ([`give`]):
//! - with no paid period running (FREE, a period that ended, a grace): the
//!   plan runs from now until `until`, set to end there
//!   (`cancel_at_period_end`): no renewal is offered, no reminder or
//!   past-due mail is sent, and at `until` the plan returns to FREE unless
//!   the customer resumes (then renewals are offered as for any plan) or
//!   pays;
//! - with a period of the same plan running: its end moves out to `until`
//!   (a comp for a paying customer); the subscription's renewal choices stay;
//! - with a period of another plan running: refused (an operator gives time,
//!   never replaces what a customer paid for);
//! - `until` must be later than the database's now (and at most
//!   [`MAX_AHEAD_DAYS`] after it), and, when extending, later than the
//!   current end.
//!
//! What an operator gives carries and prices nothing: no payment stores a
//! grant for it, so a plan change carries only the value of paid grants
//! ([`super::grant`]), and a refund takes back only what its payment
//! bought ([`super::take_back`]), leaving the given time in the period.
//! The period re-anchors on `until` ([`super::anchor`]); an open renewal,
//! priced for the old end, is voided (the loop offers the next one).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel, QuerySelect,
    Set, TransactionSession, TransactionTrait,
};
use serde_json::json;
use uuid::Uuid;

use super::anchor::Anchor;
use crate::{
    base::{audit, db::begin_write, plans::FREE},
    entities::{
        audit_logs,
        subscriptions::{self, SubscriptionStatus},
    },
};

/// How far ahead a grant may end: ten years of days.
pub const MAX_AHEAD_DAYS: i64 = 3_660;

/// What an operator gives.
#[derive(Debug, Clone)]
pub struct OperatorGrant {
    /// The customer.
    pub user_id: Uuid,
    /// A paid plan of the catalogue (the caller checks it).
    pub plan: String,
    /// When the given time ends (UTC, microseconds as stored).
    pub until: DateTime<Utc>,
    /// Why, as the operator wrote it (kept in the audit row).
    pub reason: String,
}

/// What was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The plan in force now.
    pub plan: String,
    /// The period's new end (`until`).
    pub period_end: DateTime<Utc>,
    /// Seconds given (whole seconds, for the record): from now, or from the
    /// old end when a running period was extended.
    pub seconds: i64,
    /// Whether a running period of the plan was extended.
    pub extended: bool,
}

/// Why a grant was refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// No subscription for this user id (HTTP 404).
    #[error("no user has this id")]
    UnknownUser,
    /// `until` is not later than the database's now (HTTP 400, field `until`).
    #[error("until is not in the future")]
    UntilPassed,
    /// `until` is more than [`MAX_AHEAD_DAYS`] days after the database's now
    /// (HTTP 400, field `until`): a typo, not a grant.
    #[error("until is more than {MAX_AHEAD_DAYS} days ahead")]
    UntilTooFar,
    /// A paid period of the same plan already runs to `until` or later
    /// (HTTP 409).
    #[error("the period already runs until {0}")]
    NotLater(DateTime<Utc>),
    /// A paid period of another plan runs (HTTP 409).
    #[error("a period of {plan} runs until {until}")]
    OtherPlanRunning {
        /// The plan in force.
        plan: String,
        /// Its end.
        until: DateTime<Utc>,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// Gives `grant` on behalf of admin `actor` (the rule in the module
/// documentation), in one transaction with its audit row
/// ([`audit::ACTION_OPERATOR_GRANT`]: old plan and end; new plan, end,
/// seconds and reason). The subscription row is locked on PostgreSQL (on
/// SQLite the transaction is `BEGIN IMMEDIATE`).
pub async fn give<C>(
    db: &C,
    actor: Uuid,
    grant: &OperatorGrant,
    zone: Tz,
    request_id: Option<String>,
    client_request_id: Option<String>,
) -> Result<Given, GrantError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let now = crate::base::db::now(&txn).await?;
    let mut find = subscriptions::Entity::find_by_id(grant.user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let sub = find.one(&txn).await?.ok_or(GrantError::UnknownUser)?;
    // A phase due begins first ([`super::phase`]).
    let sub = super::phase::switch_due(&txn, sub, now, zone).await?;
    if grant.until <= now {
        return Err(GrantError::UntilPassed);
    }
    if grant.until > now + chrono::Duration::days(MAX_AHEAD_DAYS) {
        return Err(GrantError::UntilTooFar);
    }
    let running = sub
        .current_period_end
        .filter(|end| *end > now && sub.plan != FREE);
    let (old_plan, old_end, old_status) = (sub.plan.clone(), sub.current_period_end, sub.status);
    let anchor = Anchor::of(grant.until, zone);
    let before = super::ledger::State::of(Some(&sub));
    let mut am = sub.into_active_model();
    let given = match running {
        Some(end) if old_plan != grant.plan => {
            return Err(GrantError::OtherPlanRunning {
                plan: old_plan,
                until: end,
            })
        }
        Some(end) if grant.until <= end => return Err(GrantError::NotLater(end)),
        Some(end) => Given {
            plan: old_plan.clone(),
            period_end: grant.until,
            seconds: (grant.until - end).num_seconds(),
            extended: true,
        },
        None => {
            // The plan in force, ended but not lapsed (in its grace, or
            // between two ticks): the grant continues its run from the old
            // end, so the price the customer agreed to still prices its
            // renewals ([`super::price::of_record`]). Otherwise a new run
            // begins now.
            let continues = old_plan == grant.plan && old_plan != FREE;
            let start = old_end.filter(|_| continues).unwrap_or(now);
            am.plan = Set(grant.plan.clone());
            am.status = Set(SubscriptionStatus::Active);
            am.current_period_start = Set(Some(start));
            am.cancel_at_period_end = Set(true);
            am.canceled_at = Set(Some(now));
            am.past_due_at = Set(None);
            am.grace_ends_at = Set(None);
            am.renewal_plan = Set(None);
            Given {
                plan: grant.plan.clone(),
                period_end: grant.until,
                seconds: (grant.until - now).num_seconds(),
                extended: false,
            }
        }
    };
    am.current_period_end = Set(Some(grant.until));
    am.billing_anchor_day = Set(Some(anchor.day_column()));
    am.billing_anchor_time = Set(Some(anchor.time));
    am.updated_at = Set(now);
    am.update(&txn).await?;
    super::ledger::note(
        &txn,
        grant.user_id,
        &before,
        super::ledger::Cause {
            actor_id: Some(actor),
            ..super::ledger::Cause::of(super::ledger::Kind::Operator)
        },
        now,
    )
    .await?;
    crate::billing::renewal::void_open(&txn, grant.user_id, now).await?;
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(Some(actor)),
        action: Set(audit::ACTION_OPERATOR_GRANT.to_string()),
        target_type: Set(audit::TARGET_TYPE_SUBSCRIPTION.to_string()),
        target_id: Set(grant.user_id.to_string()),
        old_value: Set(Some(json!({
            "plan": old_plan,
            "period_end": old_end,
            "status": old_status.as_str(),
        }))),
        new_value: Set(Some(json!({
            "plan": given.plan,
            "period_end": given.period_end,
            "seconds": given.seconds,
            "extended": given.extended,
            "value": 0,
            "reason": grant.reason,
        }))),
        request_id: Set(request_id),
        client_request_id: Set(client_request_id),
        created_at: Set(now),
    }
    .insert(&txn)
    .await?;
    txn.commit().await?;
    Ok(given)
}
