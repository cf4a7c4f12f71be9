//! `send_billing_mail`: renders one billing mail (receipt, refund notice,
//! reminder, past-due, lapse) with the templates of
//! [`crate::mailer::billing`] and sends it through the configured transport,
//! once per idempotency key.
//!
//! The model queued it through the job outbox with a key claimed in
//! `billing_mails` ([`entity::billing::mail::queue`]). A job whose key is
//! already marked sent is dropped, and the key is marked sent once the
//! transport accepted the mail: a re-run of the job (a duplicate delivery,
//! a relay that pushed twice) sends nothing. The key is also the transport's
//! idempotency key (the email API's `Idempotency-Key`, the outbox file
//! name), which covers the gap between a send and its mark.

use entity::billing::mail::{self, BillingMailJob};

use crate::jobs::{
    context::{JobContext, JobError},
    email::{self, SendEmail},
};

/// Renders and sends the mail (retry and dead-letter rules of `send_email`;
/// a mail its templates cannot render is dead-lettered, a missing sender is
/// retried until `EMAIL_FROM` is configured).
pub async fn handle(
    job: BillingMailJob,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let sent = mail::was_sent(&ctx.db, &job.key)
        .await
        .map_err(|e| JobError::Retry(format!("database: {e}")))?;
    if sent {
        tracing::info!(task_id, key = %job.key, "billing mail already sent; dropped");
        return Ok(());
    }
    if !ctx.billing.has_sender() {
        return Err(JobError::Retry("no sender: EMAIL_FROM is not set".into()));
    }
    let mail = ctx
        .billing
        .build(&job)
        .map_err(|e| JobError::Permanent(e.to_string()))?;
    email::handle(
        SendEmail {
            email: mail,
            request_id: None,
        },
        &job.key,
        attempt,
        ctx,
    )
    .await?;
    if let Err(e) = mail::mark_sent(&ctx.db, &job.key).await {
        // Sent, but not recorded: a re-run would send again under the same
        // transport key; say so rather than failing a delivered mail.
        tracing::warn!(task_id, key = %job.key, error = %e, "billing mail sent but not marked sent");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use entity::billing::mail::{outbox_row, BillingMailJob, BillingMailKind};

    use crate::Job;

    #[test]
    fn the_models_outbox_row_decodes_as_this_job() {
        let job = BillingMailJob {
            kind: BillingMailKind::Receipt,
            key: "receipt:ORD-1-ABCDEFGH".into(),
            user_id: uuid::Uuid::nil(),
            to: "ann@example.com".into(),
            vars: serde_json::Map::new(),
        };
        let row = outbox_row(&job);
        let decoded: Job = serde_json::from_str(&row.job).expect("the worker reads the row");
        assert_eq!(decoded, Job::SendBillingMail(job.clone()));
        let ours: serde_json::Value =
            serde_json::from_str(&crate::outbox::to_row(&decoded).job).unwrap();
        let theirs: serde_json::Value = serde_json::from_str(&row.job).unwrap();
        assert_eq!(ours, theirs, "the same JSON both ways");
    }
}
