//! The typed, tagged job set. Every job names the queue it runs on, so ops can
//! run workers per queue (`WORKER_QUEUES`).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

pub mod accounts;
pub mod ai;
pub mod billing;
pub mod context;
pub mod email;
pub mod identity;

pub use accounts::avatar_cleanup::DeleteAvatar;
pub use ai::usage::RecordAiUsage;
pub use billing::{reconcile::ReconcilePayment, renewal::RenewalBatch, settlement::SettlePayment};
use context::{JobContext, JobError};
pub use email::SendEmail;
use identity::auth_email;
pub use identity::auth_email::SendAuthEmail;

use crate::retry::RetryState;

/// A queue: one apalis storage (Redis key space `<QUEUE_PREFIX>:<name>:*`, or
/// SQLite `job_type`), served by its own worker loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueName {
    /// Outgoing email (`email`).
    Email,
    /// Object-store housekeeping: avatar cleanup (`storage`).
    Storage,
    /// Payment settlement of recorded provider events (`settlement`).
    Settlement,
    /// AI usage records (`ai_usage`).
    AiUsage,
}

impl QueueName {
    /// Every queue, in start order.
    pub const ALL: [QueueName; 4] = [
        QueueName::Email,
        QueueName::Storage,
        QueueName::Settlement,
        QueueName::AiUsage,
    ];

    /// The base name, before the `QUEUE_PREFIX`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueName::Email => "email",
            QueueName::Storage => "storage",
            QueueName::Settlement => "settlement",
            QueueName::AiUsage => "ai_usage",
        }
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QueueName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QueueName::ALL
            .into_iter()
            .find(|q| q.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = QueueName::ALL.iter().map(|q| q.as_str()).collect();
                format!("unknown queue {s:?}; known: {}", known.join(", "))
            })
    }
}

/// Every job the worker runs, serialised as JSON with a `type` tag
/// (`{"type":"send_email", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Job {
    /// Send one email (contact form, later notifications).
    SendEmail(SendEmail),
    /// Delete an avatar object a profile save left unreferenced.
    DeleteAvatar(DeleteAvatar),
    /// Settle one recorded payment-provider event.
    SettlePayment(SettlePayment),
    /// Ask the provider about a payment still `PENDING` and settle its answer.
    ReconcilePayment(ReconcilePayment),
    /// Write the usage row of one AI request.
    RecordAiUsage(RecordAiUsage),
    /// Render and send one identity mail (confirmation, magic link, recovery, email change).
    SendAuthEmail(SendAuthEmail),
    /// Render and send one billing mail (receipt, refund notice, reminder,
    /// past-due, lapse), once per idempotency key. Queued by the model
    /// through the job outbox ([`entity::billing::mail::queue`]).
    SendBillingMail(entity::billing::mail::BillingMailJob),
    /// Run one page of one pass of the renewal loop.
    RenewalBatch(RenewalBatch),
    /// End at its provider the checkout of a voided renewal, then settle the
    /// provider's word. Queued by the model through the job outbox
    /// ([`entity::billing::renewal::pay::expire_checkouts`]).
    ExpireCheckout(entity::billing::renewal::pay::ExpireCheckout),
}

impl Job {
    /// The queue this job runs on.
    pub fn queue(&self) -> QueueName {
        match self {
            Job::SendEmail(_) => QueueName::Email,
            Job::DeleteAvatar(_) => QueueName::Storage,
            Job::SettlePayment(_)
            | Job::ReconcilePayment(_)
            | Job::RenewalBatch(_)
            | Job::ExpireCheckout(_) => QueueName::Settlement,

            Job::RecordAiUsage(_) => QueueName::AiUsage,
            Job::SendAuthEmail(_) | Job::SendBillingMail(_) => QueueName::Email,
        }
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Job::SendEmail(_) => "send_email",
            Job::DeleteAvatar(_) => "delete_avatar",
            Job::SettlePayment(_) => "settle_payment",
            Job::ReconcilePayment(_) => "reconcile_payment",
            Job::RecordAiUsage(_) => "record_ai_usage",
            Job::SendAuthEmail(_) => "send_auth_email",
            Job::SendBillingMail(_) => entity::billing::mail::JOB_TYPE,
            Job::RenewalBatch(_) => "renewal_batch",
            Job::ExpireCheckout(_) => entity::billing::renewal::pay::EXPIRE_JOB_TYPE,
        }
    }
}

/// What a queue holds: a [`Job`] plus its retry bookkeeping. Serialised as
/// the job's own JSON with an extra `retry` object, so payloads queued before
/// retries were tracked (no `retry` key) still decode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The job.
    #[serde(flatten)]
    pub job: Job,
    /// Idempotency key, attempt number and retry delay so far; absent on
    /// payloads from older versions (the task id is then the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryState>,
}

impl Envelope {
    /// `job` queued for the first time (or redriven) with idempotency key `id`.
    pub fn first(job: Job, id: &str) -> Self {
        Envelope {
            job,
            retry: Some(RetryState::first(id)),
        }
    }

    /// The retry state, defaulting to a first attempt keyed by `task_id`.
    pub fn state(&self, task_id: &str) -> RetryState {
        self.retry
            .clone()
            .unwrap_or_else(|| RetryState::first(task_id))
    }
}

/// Runs one job attempt. `task_id` is the job's idempotency key: the id it got
/// when first queued, the same on every retry (used towards providers).
pub async fn handle(
    job: Job,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    match job {
        Job::SendEmail(j) => email::handle(j, task_id, attempt, ctx).await,
        Job::DeleteAvatar(j) => accounts::avatar_cleanup::handle(j, task_id, attempt, ctx).await,
        Job::SettlePayment(j) => billing::settlement::handle(j, task_id, attempt, ctx).await,
        Job::ReconcilePayment(j) => billing::reconcile::handle(j, task_id, attempt, ctx).await,
        Job::RecordAiUsage(j) => ai::usage::handle(j, task_id, attempt, ctx).await,
        Job::SendAuthEmail(j) => auth_email::handle(j, task_id, attempt, ctx).await,
        Job::SendBillingMail(j) => billing::mail::handle(j, task_id, attempt, ctx).await,
        Job::RenewalBatch(j) => billing::renewal::handle(j, task_id, attempt, ctx).await,
        Job::ExpireCheckout(j) => billing::expire_checkout::handle(j, task_id, attempt, ctx).await,
    }
}
