//! `send_email`: delivers one [`OutgoingEmail`] through the configured transport.

use entity::base::mail::OutgoingEmail;
use serde::{Deserialize, Serialize};

use crate::jobs::context::{JobContext, JobError};
use crate::mailer::SendError;

/// Payload of the `send_email` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendEmail {
    /// The mail.
    pub email: OutgoingEmail,
    /// Request id of the HTTP request that queued it, for log correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Sends the mail. Transient failures (network, timeouts, 5xx, 429) are retried;
/// a permanent rejection (other 4xx from the email API, 5xx SMTP reply) is
/// dead-lettered with the reason logged.
pub async fn handle(
    job: SendEmail,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let Some(mailer) = ctx.mailer.as_ref() else {
        // Configuration may arrive with the next deploy: keep retrying.
        return Err(JobError::Retry(
            "no email transport configured (EMAIL_PROVIDER_API_KEY or SMTP_URL)".into(),
        ));
    };
    match mailer.send(&job.email, task_id).await {
        Ok(()) => {
            tracing::info!(task_id, attempt, request_id = job.request_id.as_deref(), to = ?job.email.to, "email sent");
            Ok(())
        }
        Err(SendError::Permanent(reason)) => {
            tracing::error!(task_id, attempt, request_id = job.request_id.as_deref(), %reason, "email rejected permanently; dead-lettered");
            Err(JobError::Permanent(reason))
        }
        Err(SendError::Transient(reason)) => {
            tracing::warn!(task_id, attempt, request_id = job.request_id.as_deref(), %reason, "email send failed; will retry");
            Err(JobError::Retry(reason))
        }
    }
}
