//! `record_ai_usage`: writes one `ai_usage` row per finished (or aborted) AI
//! request, idempotently (the row id is chosen by the api when the answer
//! ends; a second delivery of the same job inserts nothing), and settles its
//! tokens in the database's month counter in the same transaction
//! ([`entity::ai::usage::record_usage`]).

use entity::ai::usage::UsageRecord;
use serde::{Deserialize, Serialize};

use crate::jobs::context::{JobContext, JobError};

/// Payload of the `record_ai_usage` job (queue `ai_usage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAiUsage {
    /// The usage row to write (`usage.id` is the idempotency key).
    pub usage: UsageRecord,
}

/// Inserts the row unless it exists. A database error is retried; a user
/// deleted meanwhile (foreign key) is permanent.
pub async fn handle(
    job: RecordAiUsage,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    match entity::ai::usage::record_usage(&ctx.db, &job.usage).await {
        Ok(inserted) => {
            tracing::info!(
                task_id,
                attempt,
                usage_id = %job.usage.id,
                inserted,
                aborted = job.usage.aborted,
                "AI usage recorded"
            );
            Ok(())
        }
        Err(e) => {
            let msg = e.to_string();
            if msg.contains("foreign key") || msg.contains("FOREIGN KEY") {
                tracing::warn!(task_id, usage_id = %job.usage.id, "AI usage of a deleted user dropped");
                Err(JobError::Permanent(msg))
            } else {
                Err(JobError::Retry(msg))
            }
        }
    }
}
