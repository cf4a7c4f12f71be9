//! Cancel, resume and change: the user-driven moves of a subscription.
//!
//! Rules (decisions.md, "Subscriptions"):
//! - only an `active` paid plan, or one in its renewal grace (`past_due`),
//!   moves: cancel sets `cancel_at_period_end` and `canceled_at = now` and
//!   voids the open renewal (no reminders, no pay link; the plan returns to
//!   FREE at the period end); resume clears both (the scheduler offers a new
//!   renewal at its next tick);
//! - cancelling a subscription that is already cancelling, or resuming one that
//!   is not, succeeds without a change (idempotent) and answers the current state;
//! - on the `FREE` plan → [`SubscriptionError::FreePlan`] (HTTP 409);
//! - status `canceled` → [`SubscriptionError::NotActive`] (HTTP 409).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait,
    IntoActiveModel, QueryFilter, QuerySelect, Set, TransactionSession, TransactionTrait,
};
use serde::Serialize;
use uuid::Uuid;

use crate::{
    base::audit,
    base::db::begin_write,
    base::plans,
    base::validate::FieldError,
    entities::{
        audit_logs,
        subscriptions::{self, SubscriptionStatus},
    },
};
use serde_json::json;

/// Response `status` while the subscription runs and is not cancelling.
pub const STATUS_ACTIVE: &str = "active";
/// Response `status` while `cancel_at_period_end` is set.
pub const STATUS_CANCEL_AT_PERIOD_END: &str = "cancel_at_period_end";

/// What the user asks for in `POST /api/subscription`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionAction {
    /// `cancel`: stop at the end of the current period.
    Cancel,
    /// `resume`: undo a pending cancellation.
    Resume,
}

impl SubscriptionAction {
    /// Parses the wire value, exactly `cancel` or `resume`; anything else is a
    /// [`FieldError`] with field `action`, code `invalid_action`.
    pub fn parse(value: &str) -> Result<Self, FieldError> {
        match value {
            "cancel" => Ok(Self::Cancel),
            "resume" => Ok(Self::Resume),
            _ => Err(FieldError::new(
                "action",
                "invalid_action",
                "action must be \"cancel\" or \"resume\"",
            )),
        }
    }

    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Resume => "resume",
        }
    }

    /// The `cancel_at_period_end` value this action leads to.
    fn target_flag(self) -> bool {
        self == Self::Cancel
    }
}

impl FromStr for SubscriptionAction {
    type Err = FieldError;

    /// Same as [`SubscriptionAction::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Why a cancel or resume was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubscriptionError {
    /// The user is on the `FREE` plan: nothing to cancel or resume (HTTP 409).
    #[error("the FREE plan cannot be canceled or resumed")]
    FreePlan,
    /// The subscription's status is `canceled` (HTTP 409).
    #[error("subscription is {}, not active", .0.as_str())]
    NotActive(SubscriptionStatus),
    /// The user has no subscription row; cannot happen after
    /// [`crate::accounts::users::ensure_user`] (HTTP 409 or 500 at the caller's choice).
    #[error("no subscription")]
    NotFound,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// The subscription as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubscriptionView {
    /// Plan id, e.g. `PRO`.
    pub plan: String,
    /// [`STATUS_CANCEL_AT_PERIOD_END`] while `cancel_at_period_end` is set,
    /// otherwise the stored status: [`STATUS_ACTIVE`] (the only value after a
    /// successful [`change`]), `canceled` or `past_due`.
    pub status: &'static str,
    /// Whether the subscription stops at the end of the current period.
    pub cancel_at_period_end: bool,
    /// End of the paid period (UTC); `None` on FREE.
    pub current_period_end: Option<DateTime<Utc>>,
    /// The plan the next renewal bills when the customer chose another one
    /// ([`choose_renewal_plan`]); `None`: the current plan.
    pub renewal_plan: Option<String>,
}

impl From<&subscriptions::Model> for SubscriptionView {
    fn from(m: &subscriptions::Model) -> Self {
        Self {
            plan: m.plan.clone(),
            status: if m.cancel_at_period_end {
                STATUS_CANCEL_AT_PERIOD_END
            } else {
                m.status.as_str()
            },
            cancel_at_period_end: m.cancel_at_period_end,
            current_period_end: m.current_period_end,
            renewal_plan: m.renewal_plan.clone(),
        }
    }
}

/// Applies `action` to the subscription of `user_id` and returns its new state.
///
/// Concurrency: one transaction that starts with a conditional `UPDATE … WHERE
/// plan <> 'FREE' AND status = 'active' AND cancel_at_period_end = <opposite>`
/// and then reads the row back (`FOR UPDATE` on PostgreSQL; on SQLite the
/// transaction is `BEGIN IMMEDIATE`). Concurrent cancels and resumes are
/// therefore serialised on the row and none is lost: the last one wins and
/// each answers the state it left.
///
/// A move that changed something writes one `audit_logs` row
/// (`subscription.cancel` / `subscription.resume`, actor = the user, with
/// `request`'s ids); an idempotent repeat writes none.
///
/// Errors: [`SubscriptionError::FreePlan`], [`SubscriptionError::NotActive`],
/// [`SubscriptionError::NotFound`], [`SubscriptionError::Db`]. An idempotent
/// repeat is a success, not an error.
pub async fn change<C>(
    db: &C,
    user_id: Uuid,
    action: SubscriptionAction,
    request: RequestIds,
) -> Result<SubscriptionView, SubscriptionError>
where
    C: ConnectionTrait + TransactionTrait,
{
    use subscriptions::Column;

    let target = action.target_flag();

    let txn = begin_write(db).await?;
    // The database's clock, as every other time of the subscription.
    let now = crate::base::db::now(&txn).await?;
    let canceled_at = target.then_some(now);
    let updated = subscriptions::Entity::update_many()
        .col_expr(Column::CancelAtPeriodEnd, Expr::value(target))
        .col_expr(Column::CanceledAt, Expr::value(canceled_at))
        .col_expr(Column::UpdatedAt, Expr::value(now))
        .filter(Column::UserId.eq(user_id))
        .filter(Column::Plan.ne(plans::FREE))
        .filter(Column::Status.is_in([SubscriptionStatus::Active, SubscriptionStatus::PastDue]))
        .filter(Column::CancelAtPeriodEnd.eq(!target))
        .exec(&txn)
        .await?
        .rows_affected;

    let mut select = subscriptions::Entity::find_by_id(user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        select = select.lock_exclusive();
    }
    let row = select.one(&txn).await?.ok_or(SubscriptionError::NotFound)?;

    // Whether this call moved the flag (an idempotent repeat did not).
    let moved = updated > 0
        || (row.plan != plans::FREE
            && matches!(
                row.status,
                SubscriptionStatus::Active | SubscriptionStatus::PastDue
            )
            && row.cancel_at_period_end != target);
    let row = if updated > 0 {
        row
    } else if row.plan == plans::FREE {
        return Err(SubscriptionError::FreePlan);
    } else if !matches!(
        row.status,
        SubscriptionStatus::Active | SubscriptionStatus::PastDue
    ) {
        return Err(SubscriptionError::NotActive(row.status));
    } else if row.cancel_at_period_end == target {
        // Idempotent repeat: nothing to write.
        row
    } else {
        // The row moved between the UPDATE and the locked read (PostgreSQL,
        // read committed); it is locked now, so apply the move here.
        let mut am = row.into_active_model();
        am.cancel_at_period_end = Set(target);
        am.canceled_at = Set(canceled_at);
        am.updated_at = Set(now);
        am.update(&txn).await?
    };
    if target {
        crate::billing::renewal::void_open(&txn, user_id, now).await?;
    }
    if moved {
        let action = match action {
            SubscriptionAction::Cancel => audit::ACTION_SUBSCRIPTION_CANCEL,
            SubscriptionAction::Resume => audit::ACTION_SUBSCRIPTION_RESUME,
        };
        audit_row(
            &txn,
            user_id,
            action,
            json!({ "cancel_at_period_end": !target }),
            json!({ "cancel_at_period_end": target, "plan": row.plan, "period_end": row.current_period_end }),
            &request,
            now,
        )
        .await?;
    }
    txn.commit().await?;
    Ok(SubscriptionView::from(&row))
}

/// The request ids an audit row keeps: the server's own and the client's.
#[derive(Debug, Clone, Default)]
pub struct RequestIds {
    /// The server's request id.
    pub request_id: Option<String>,
    /// The client's `x-request-id`, when it sent one.
    pub client_request_id: Option<String>,
}

/// Writes the audit row of the user's own move of their subscription.
async fn audit_row<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    action: &str,
    old: serde_json::Value,
    new: serde_json::Value,
    request: &RequestIds,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(Some(user_id)),
        action: Set(action.to_string()),
        target_type: Set(audit::TARGET_TYPE_SUBSCRIPTION.to_string()),
        target_id: Set(user_id.to_string()),
        old_value: Set(Some(old)),
        new_value: Set(Some(new)),
        request_id: Set(request.request_id.clone()),
        client_request_id: Set(request.client_request_id.clone()),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// Chooses `plan_id` as the plan the next renewal of `user_id` bills
/// (`POST /api/subscription {"action": "change", "plan"}`, Stripe's change
/// "at period end"): the subscription's `renewal_plan` (`None` when
/// `plan_id` is its current plan). The plan in force and its period do not
/// change now. When the choice changes, the open renewal (priced for the old
/// plan) is voided and a new one is offered at once when one is due
/// ([`crate::billing::renewal::offer`]); a cancelling subscription keeps its choice
/// and is offered it after `resume`. The caller checks that the catalogue
/// sells `plan_id`.
///
/// Errors: [`SubscriptionError::FreePlan`] (nothing paid to renew),
/// [`SubscriptionError::NotActive`], [`SubscriptionError::NotFound`],
/// [`SubscriptionError::Db`].
pub async fn choose_renewal_plan<C>(
    db: &C,
    user_id: Uuid,
    plan_id: &str,
    policy: &crate::billing::renewal::Policy,
    catalogue: &plans::Catalogue,
    request: RequestIds,
) -> Result<SubscriptionView, SubscriptionError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut select = subscriptions::Entity::find_by_id(user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        select = select.lock_exclusive();
    }
    let row = select.one(&txn).await?.ok_or(SubscriptionError::NotFound)?;
    if row.plan == plans::FREE {
        return Err(SubscriptionError::FreePlan);
    }
    if !matches!(
        row.status,
        SubscriptionStatus::Active | SubscriptionStatus::PastDue
    ) {
        return Err(SubscriptionError::NotActive(row.status));
    }
    // While a phase is scheduled, the next renewal follows it.
    let current = row.scheduled_plan.as_deref().unwrap_or(&row.plan);
    let next = (plan_id != current).then(|| plan_id.to_string());
    if row.renewal_plan == next {
        return Ok(SubscriptionView::from(&row));
    }
    let now = crate::base::db::now(&txn).await?;
    let old = json!({ "renewal_plan": row.renewal_plan, "plan": row.plan });
    // The price it is chosen at: its price of record until it is paid
    // ([`crate::billing::price`]).
    let chosen_at = next
        .as_deref()
        .and_then(|p| catalogue.get(p))
        .map(|p| p.price);
    // A notice of a rise of that plan told before the choice is
    // withdrawn: the customer chose it at the price shown now, and a later
    // rise is announced anew (a notice told before a cut would otherwise
    // bill more than the price chosen at, untold since).
    let withdraw = next.is_some() && row.price_notice_plan == next;
    let mut am = row.into_active_model();
    if withdraw {
        crate::billing::price::clear_notice(&mut am);
    }
    am.renewal_plan = Set(next);
    am.renewal_plan_price = Set(chosen_at);
    am.updated_at = Set(now);
    let row = am.update(&txn).await?;
    audit_row(
        &txn,
        user_id,
        audit::ACTION_SUBSCRIPTION_CHANGE,
        old,
        json!({ "renewal_plan": row.renewal_plan, "plan": row.plan }),
        &request,
        now,
    )
    .await?;
    crate::billing::renewal::void_open(&txn, user_id, now).await?;
    crate::billing::renewal::offer(&txn, policy, catalogue, now, user_id).await?;
    txn.commit().await?;
    Ok(SubscriptionView::from(&row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions() {
        assert_eq!(
            SubscriptionAction::parse("cancel").unwrap(),
            SubscriptionAction::Cancel
        );
        assert_eq!(
            "resume".parse::<SubscriptionAction>().unwrap(),
            SubscriptionAction::Resume
        );
        for bad in ["", "Cancel", "pause", " cancel"] {
            let e = SubscriptionAction::parse(bad).unwrap_err();
            assert_eq!((e.field, e.code), ("action", "invalid_action"));
        }
    }
}
