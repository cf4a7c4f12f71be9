//! `settle_payment`: applies one recorded provider event to its payment and
//! the user's subscription ([`entity::billing::settlement::settle_event`]): one
//! transaction, rows locked, the payment state machine deciding.
//!
//! A provider_a notification is only a hint: its signature covers
//! `order_id`, `status_code` and `gross_amount` but not `transaction_status`,
//! so a validly signed `pending` notice (`status_code` 201) edited to
//! `settlement` would otherwise pay. Before a provider_a event changes a
//! payment, the job asks the provider's status API ("Get Transaction
//! Status", as Midtrans recommends for every notification) and settles the
//! event only when the answer (its own `signature_key` verified) reports the
//! same payment status for the same amount; a PAID report also needs
//! `status_code` 200 in the notice. Otherwise the event is settled as
//! unconfirmed with an audit row ([`settlement::settle_event_unconfirmed`])
//! and nothing changes. The confirmation compares the provider's answer with
//! the payment as read before the settlement's transaction; settlement reads
//! it again under its row lock and settles the event as unconfirmed when it
//! changed meanwhile ([`settlement::settle_event_seen`]). A `partial_refund`
//! or `partial_chargeback` notice is always confirmed, even when the payment
//! stays PAID: it settles only when the status API states the same refunded
//! total (the notice's figure is not covered by its signature). An event
//! settled as unconfirmed gives its dedupe key back, so the genuine notice
//! that follows it is not taken for a duplicate. While the status
//! API cannot be reached (or answers what cannot be used) the job is
//! retried. provider_b's notifications are signed over the whole body (the
//! required `Signature` header) and are settled as they are.

use entity::{
    billing::payment::{self, Transition},
    billing::settlement::{self, Settled},
    entities::{
        payments::{self, PaymentStatus, PROVIDER_A},
        webhook_events,
    },
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::jobs::context::{JobContext, JobError};

/// Payload of the `settle_payment` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlePayment {
    /// `webhook_events.id` of the recorded event.
    pub event_id: Uuid,
    /// Request id of the webhook delivery that recorded it, for log correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// What the provider's confirmation decided for an event.
enum Confirmation {
    /// Settle the event as reported; with the payment as the confirmation
    /// saw it, which must still hold under the settlement's row lock.
    Settle(Option<settlement::Seen>),
    /// Do not apply it: the reason.
    Unconfirmed(String),
}

/// Settles the event. Idempotent: an event settled before is a no-op, so a
/// redelivered or re-swept job changes nothing. An event the state machine
/// refuses (late, out of order) or that names no payment is settled with the
/// reason and not retried; a provider_a event is confirmed first (see the
/// module docs). An unknown event id is a permanent failure (dead-lettered);
/// database failures and an unreachable status API are retried.
pub async fn handle(
    job: SettlePayment,
    task_id: &str,
    _attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let audit_id = job.request_id.clone().or_else(|| Some(task_id.to_string()));
    let outcome = match confirm(&job, ctx).await? {
        Confirmation::Settle(seen) => {
            settlement::settle_event_seen(&ctx.db, job.event_id, seen, ctx.billing_terms, audit_id)
                .await
        }
        Confirmation::Unconfirmed(reason) => {
            tracing::warn!(event_id = %job.event_id, %reason, "notification not confirmed by the provider; nothing changed");
            settlement::settle_event_unconfirmed(&ctx.db, job.event_id, &reason, audit_id).await
        }
    };
    match outcome {
        Ok(Settled::UnknownEvent) => Err(JobError::Permanent(format!(
            "no webhook event {}",
            job.event_id
        ))),
        Ok(outcome) => {
            crate::metrics::settled(&outcome);
            tracing::info!(event_id = %job.event_id, job_id = task_id, outcome = ?outcome, "settled");
            Ok(())
        }
        Err(e) => Err(JobError::Retry(format!("settling {}: {e}", job.event_id))),
    }
}

/// Decides whether the event may be settled as reported (see the module docs).
async fn confirm(job: &SettlePayment, ctx: &JobContext) -> Result<Confirmation, JobError> {
    let retry = |what: &str, e: &dyn std::fmt::Display| {
        JobError::Retry(format!("{what} for event {}: {e}", job.event_id))
    };
    let Some(event) = webhook_events::Entity::find_by_id(job.event_id)
        .one(&ctx.db)
        .await
        .map_err(|e| retry("loading the event", &e))?
    else {
        // settle_event answers UnknownEvent.
        return Ok(Confirmation::Settle(None));
    };
    if event.settled_at.is_some() || event.provider != PROVIDER_A {
        return Ok(Confirmation::Settle(None));
    }
    let Some(reported) =
        settlement::reported_status(&event.provider, &event.provider_status, &event.payload)
    else {
        return Ok(Confirmation::Settle(None));
    };
    let Some(pay) = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(event.order_id.as_str()))
        .one(&ctx.db)
        .await
        .map_err(|e| retry("loading the payment", &e))?
    else {
        return Ok(Confirmation::Settle(None));
    };
    // A reversal of a PAID payment is its refund: asked like one.
    let reported = payment::effective(
        &event.provider,
        &event.provider_status,
        pay.status,
        reported,
    );
    // What this decision rests on: settlement re-reads the payment under its
    // lock and settles as unconfirmed when it is no longer this.
    let seen = settlement::Seen {
        status: pay.status,
        amount: pay.amount,
        refunded: None,
    };
    // A partial refund or chargeback changes what a payment is worth even
    // when its status stays PAID, and the figure is not signed: always ask.
    let notice_refund = payment::provider_a_partial_refund(&event.provider_status, &event.payload);
    let partial = notice_refund.is_some();
    // Repeats and refused moves change nothing: no need to ask.
    if !partial
        && !matches!(
            payment::transition(pay.status, reported),
            Transition::Apply { .. }
        )
    {
        return Ok(Confirmation::Settle(Some(seen)));
    }
    let status_code = event.payload["status_code"].as_str().unwrap_or_default();
    if reported == PaymentStatus::Paid && status_code != "200" {
        return Ok(Confirmation::Unconfirmed(format!(
            "a paid status needs status_code 200, the notice has {status_code:?}"
        )));
    }
    match ctx.providers.status(PROVIDER_A, &event.order_id).await {
        // A partial refund settles only when the API states the same total.
        Ok(Some(r))
            if payment::effective(PROVIDER_A, &r.provider_status, pay.status, r.reported) == reported
                && r.amount == Some(pay.amount)
                && (!partial || r.refunded == notice_refund) =>
        {
            Ok(Confirmation::Settle(Some(settlement::Seen {
                refunded: r.refunded,
                ..seen
            })))
        }
        Ok(Some(r)) => Ok(Confirmation::Unconfirmed(format!(
            "the status API reports {} ({}) for amount {:?} refunded {:?}, the notice {} for {} refunded {:?}",
            r.provider_status,
            r.reported.as_str(),
            r.amount,
            r.refunded,
            event.provider_status,
            pay.amount,
            notice_refund
        ))),
        Ok(None) => Ok(Confirmation::Unconfirmed(
            "the status API does not know the order".into(),
        )),
        Err(e) => Err(retry("asking the provider's status API", &e)),
    }
}
