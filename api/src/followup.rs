//! Jobs that follow a change already made while answering (the avatar
//! cleanup after a profile save, the usage row after an AI answer). The
//! change stands, so a queue that cannot take the job is no error for the
//! client; on the Redis queue the job goes to the job outbox instead
//! ([`worker::outbox`]) and the worker queues it once Redis answers again. On
//! the embedded SQLite queue (a local file) a failed push is only logged.
//!
//! Jobs whose request must fail when they cannot be queued (contact mail,
//! settlement of a provider's notification) do not come here: those routes
//! answer 503 `queue_unavailable` and the client or provider retries.

use uuid::Uuid;
use worker::Job;

use crate::state::AppState;

/// Where a follow-up job went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followup {
    /// On the queue, with this task id.
    Queued(String),
    /// In the job outbox, row id: the worker queues it.
    Kept(Uuid),
    /// Neither the queue nor the database took it (logged).
    Lost,
}

impl AppState {
    /// Queues `job` (bounded by `DEPENDENCY_TIMEOUT_MS`); when the Redis
    /// queue fails, keeps it in the job outbox (bounded likewise). Errors are
    /// logged here.
    pub async fn queue_followup(&self, job: Job) -> Followup {
        let kind = job.kind();
        let pushed = self.queues.push(job.clone()).await;
        let e = match pushed {
            Ok(task_id) => return Followup::Queued(task_id),
            Err(e) => e,
        };
        if self.queues.kind() != "redis" {
            tracing::error!(kind, error = %e, "could not queue a follow-up job; lost");
            return Followup::Lost;
        }
        match self.bounded(worker::outbox::keep(&self.db, &job)).await {
            Ok(Ok(row)) => {
                tracing::warn!(kind, error = %e, outbox_id = %row, "could not queue a follow-up job; kept in the job outbox");
                Followup::Kept(row)
            }
            Ok(Err(db)) => {
                tracing::error!(kind, error = %e, db_error = %db, "could not queue a follow-up job nor keep it in the job outbox; lost");
                Followup::Lost
            }
            Err(_) => {
                tracing::error!(kind, error = %e, "could not queue a follow-up job; the job outbox did not answer in time; lost");
                Followup::Lost
            }
        }
    }

    /// Queues `job`, kept already in the job outbox as row `kept` in the
    /// transaction of its change: on success the row is deleted; on failure
    /// it is made due at once, so the worker queues it. When the database
    /// fails here the row stays and the worker takes it after
    /// [`entity::base::outbox::FOLLOWUP_HOLD`] (and queues the job a second time if
    /// this push had succeeded: the follow-up jobs are idempotent).
    pub async fn queue_kept_followup(&self, job: Job, kept: Uuid) -> Followup {
        let kind = job.kind();
        match self.queues.push_keyed(job, &kept.to_string()).await {
            Ok(task_id) => {
                if let Err(e) = self
                    .bounded_db(
                        "deleting a queued job from the job outbox",
                        entity::base::outbox::delete(&self.db, kept),
                    )
                    .await
                {
                    tracing::warn!(kind, outbox_id = %kept, error = %e, "follow-up job queued but still in the job outbox; it may run twice");
                }
                Followup::Queued(task_id)
            }
            Err(e) => {
                let error = e.to_string();
                if let Err(db) = self
                    .bounded_db(
                        "releasing a job in the job outbox",
                        entity::base::outbox::retry_later(
                            &self.db,
                            kept,
                            std::time::Duration::ZERO,
                            &error,
                        ),
                    )
                    .await
                {
                    tracing::warn!(kind, outbox_id = %kept, error = %db, "the job outbox row stays held; the worker takes it after the hold");
                }
                tracing::warn!(kind, error, outbox_id = %kept, "could not queue a follow-up job; kept in the job outbox");
                Followup::Kept(kept)
            }
        }
    }
}
