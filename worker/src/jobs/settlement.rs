//! `settle_payment`: applies one recorded provider event to its payment and
//! the user's subscription ([`entity::settlement::settle_event`]): one
//! transaction, rows locked, the payment state machine deciding.

use entity::settlement::{self, Settled};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{JobContext, JobError};

/// Payload of the `settle_payment` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlePayment {
    /// `webhook_events.id` of the recorded event.
    pub event_id: Uuid,
    /// Request id of the webhook delivery that recorded it, for log correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Settles the event. Idempotent: an event settled before is a no-op, so a
/// redelivered or re-swept job changes nothing. An event the state machine
/// refuses (late, out of order) or that names no payment is settled with the
/// reason and not retried. An unknown event id is a permanent failure
/// (dead-lettered); database failures are retried.
pub async fn handle(
    job: SettlePayment,
    task_id: &str,
    _attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let audit_id = job.request_id.clone().or_else(|| Some(task_id.to_string()));
    match settlement::settle_event(&ctx.db, job.event_id, audit_id).await {
        Ok(Settled::UnknownEvent) => Err(JobError::Permanent(format!(
            "no webhook event {}",
            job.event_id
        ))),
        Ok(outcome) => {
            tracing::info!(event_id = %job.event_id, job_id = task_id, outcome = ?outcome, "settled");
            Ok(())
        }
        Err(e) => Err(JobError::Retry(format!("settling {}: {e}", job.event_id))),
    }
}
