//! `reconcile_payment`: asks the provider's status API about one payment
//! still `PENDING` long after checkout (its notification may never come) and
//! settles what the provider reports through the same state machine and
//! audit trail as a notification ([`entity::billing::settlement::settle_status_check`],
//! audit `source` `status_check`). Queued by the scheduler
//! ([`crate::scheduler`]) at most once per `PAYMENT_RECONCILE_AFTER_SECS` per
//! payment. It is also how a payment expires: one older than
//! `PAYMENT_EXPIRE_AFTER_SECS` (by the database's clock) becomes `EXPIRED`
//! only when the provider answers that it is not paid (still pending, or it
//! does not know the order); while the provider cannot be reached it stays
//! `PENDING`.

use entity::{
    billing::settlement,
    entities::payments::{self, PaymentStatus},
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde::{Deserialize, Serialize};

use crate::jobs::context::{JobContext, JobError};
use crate::providers::ProviderError;

/// Payload of the `reconcile_payment` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcilePayment {
    /// `payments.order_id` of the payment to check.
    pub order_id: String,
}

/// Checks and settles the payment. Done without change when the payment is
/// no longer `PENDING`, when the provider does not know the order (it stays
/// `PENDING`; the expiry task ends it later), when the provider's amount is
/// not the stored one (logged as an error), or when the answer cannot be
/// trusted (a bad `signature_key`, an undocumented shape; logged as an
/// error): the next reconciliation round asks again. Transport failures
/// (connect, timeout, HTTP 5xx or 429) and database failures are retried;
/// an unknown order id is a permanent failure (dead-lettered).
pub async fn handle(
    job: ReconcilePayment,
    task_id: &str,
    _attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let order_id = job.order_id.as_str();
    let pay = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(&ctx.db)
        .await
        .map_err(|e| JobError::Retry(format!("loading payment {order_id}: {e}")))?
        .ok_or_else(|| JobError::Permanent(format!("no payment has order id {order_id}")))?;
    if pay.status != PaymentStatus::Pending {
        tracing::info!(
            order_id,
            status = pay.status.as_str(),
            "reconcile: no longer pending"
        );
        return Ok(());
    }
    let expire_after = chrono::Duration::from_std(ctx.providers.settings().payment_expire_after)
        .unwrap_or(chrono::Duration::MAX);
    let now = entity::base::db::now(&ctx.db)
        .await
        .map_err(|e| JobError::Retry(format!("reading the database clock: {e}")))?;
    let past_expiry = pay.created_at < now - expire_after;
    let report = match ctx.providers.status(&pay.provider, order_id).await {
        Ok(Some(r)) if r.reported == PaymentStatus::Pending && past_expiry => {
            return expire(ctx, order_id, task_id, &r.provider_status).await
        }
        Ok(Some(r)) => r,
        Ok(None) if past_expiry => return expire(ctx, order_id, task_id, "unknown order").await,
        Ok(None) => {
            tracing::info!(order_id, provider = %pay.provider, "reconcile: the provider does not know the order");
            return Ok(());
        }
        Err(
            e @ (ProviderError::Connect(_) | ProviderError::Timeout | ProviderError::Transport(_)),
        ) => {
            return Err(JobError::Retry(format!(
                "status of {order_id} at {}: {e}",
                pay.provider
            )))
        }
        Err(e @ ProviderError::Status { status, .. }) if status >= 500 || status == 429 => {
            return Err(JobError::Retry(format!(
                "status of {order_id} at {}: {e}",
                pay.provider
            )))
        }
        Err(e) => {
            tracing::error!(order_id, provider = %pay.provider, error = %e, "reconcile: unusable status answer; nothing settled");
            return Ok(());
        }
    };
    if report.amount != Some(pay.amount) {
        tracing::error!(
            order_id,
            provider = %pay.provider,
            stored = pay.amount,
            reported = ?report.amount,
            "reconcile: the provider's amount differs from the stored one; nothing settled"
        );
        return Ok(());
    }
    match settlement::settle_status_check(
        &ctx.db,
        order_id,
        report.reported,
        ctx.billing_terms,
        Some(task_id.to_string()),
    )
    .await
    {
        Ok(outcome) => {
            crate::metrics::settled(&outcome);
            tracing::info!(
                order_id,
                job_id = task_id,
                provider_status = %report.provider_status,
                outcome = ?outcome,
                "reconciled"
            );
            Ok(())
        }
        Err(e) => Err(JobError::Retry(format!("settling {order_id}: {e}"))),
    }
}

/// Moves the payment to `EXPIRED` (the provider answered `answer`: not paid)
/// through the state machine; a payment settled meanwhile is left alone.
async fn expire(
    ctx: &JobContext,
    order_id: &str,
    task_id: &str,
    answer: &str,
) -> Result<(), JobError> {
    match settlement::settle_status_check(
        &ctx.db,
        order_id,
        PaymentStatus::Expired,
        ctx.billing_terms,
        Some(task_id.to_string()),
    )
    .await
    {
        Ok(outcome) => {
            tracing::info!(order_id, job_id = task_id, provider_answer = answer, outcome = ?outcome, "expired after a status check");
            Ok(())
        }
        Err(e) => Err(JobError::Retry(format!("expiring {order_id}: {e}"))),
    }
}
