//! `expire_checkout`: ends at its provider the checkout of a renewal that
//! was voided while the checkout was still `PENDING`
//! ([`entity::billing::renewal::pay::expire_checkouts`] writes the job into the job
//! outbox in the transaction that voids the renewal), then settles what the
//! provider now says about it exactly as reconciliation does
//! ([`super::reconcile`]): `EXPIRED` once the provider expired it, `PAID`
//! if the customer paid first (honoured as time on the plan in force).

use entity::entities::payments::{self, PaymentStatus};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::reconcile::ReconcilePayment;
use crate::jobs::context::{JobContext, JobError};
use crate::providers::{expire::ExpireAnswer, ProviderError};

/// Payload of the `expire_checkout` job.
pub use entity::billing::renewal::pay::ExpireCheckout;

/// Ends the checkout and settles the provider's word. Done without a call
/// when the payment is no longer `PENDING` (settled meanwhile, or it is the
/// very payment whose settlement voided the renewal). Transport failures
/// (connect, timeout, HTTP 5xx or 429) and database failures are retried;
/// an answer the call does not document is logged and the payment is left
/// to reconciliation and expiry.
pub async fn handle(
    job: ExpireCheckout,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let order_id = job.order_id.as_str();
    let Some(pay) = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(&ctx.db)
        .await
        .map_err(|e| JobError::Retry(format!("loading payment {order_id}: {e}")))?
    else {
        return Err(JobError::Permanent(format!(
            "no payment has order id {order_id}"
        )));
    };
    if pay.status != PaymentStatus::Pending {
        tracing::info!(
            order_id,
            status = pay.status.as_str(),
            "expire checkout: no longer pending"
        );
        return Ok(());
    }
    match ctx.providers.expire(&pay.provider, order_id).await {
        Ok(ExpireAnswer::Unsupported) => {
            tracing::info!(order_id, provider = %pay.provider, "expire checkout: the provider has no such call; it expires there");
            return Ok(());
        }
        Ok(answer) => {
            tracing::info!(order_id, provider = %pay.provider, answer = ?answer, "expire checkout: asked the provider to end it");
        }
        Err(
            e @ (ProviderError::Connect(_) | ProviderError::Timeout | ProviderError::Transport(_)),
        ) => return Err(JobError::Retry(format!("expiring {order_id}: {e}"))),
        Err(e @ ProviderError::Status { status, .. }) if status >= 500 || status == 429 => {
            return Err(JobError::Retry(format!("expiring {order_id}: {e}")))
        }
        Err(e) => {
            tracing::error!(order_id, provider = %pay.provider, error = %e, "expire checkout: unusable answer; left to reconciliation");
            return Ok(());
        }
    }
    super::reconcile::handle(
        ReconcilePayment {
            order_id: job.order_id.clone(),
        },
        task_id,
        attempt,
        ctx,
    )
    .await
}
