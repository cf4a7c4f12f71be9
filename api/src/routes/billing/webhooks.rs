//! `POST /api/webhooks/provider_a` and `POST /api/webhooks/provider_b`: payment
//! notifications. Record-then-enqueue: verify the signature over the raw body
//! (401), validate the payload (400), find the payment (404), check the amount
//! (400 `amount_mismatch`), record the event under its dedupe key, queue its
//! settlement, answer. No session, no per-IP limit. A provider_a notice is
//! applied only once its settlement job has confirmed it with the provider's
//! status API (`worker::jobs::billing::settlement`).

use entity::{
    base::validate::FieldError,
    billing::events::{self, RecordError, Recorded},
    billing::webhook::{ProviderA, ProviderB, WebhookError, WebhookHeaders, WebhookVerifier},
};
use poem::{web::Data, Request};
use poem_openapi::{payload::Json, Object, OpenApi};
use worker::jobs::{Job, SettlePayment};

use crate::routes::ApiTags;
use crate::{middleware::RequestId, payload::RawJson, problem::ApiError, state::AppState};

/// The path provider_b signs as `Request-Target` of its notifications.
pub const PROVIDER_B_PATH: &str = "/api/webhooks/provider_b";

/// provider_a's HTTP notification (the Snap notification of Midtrans). The
/// signature covers `order_id`, `status_code`, `gross_amount` as sent; other
/// fields the provider adds are accepted.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct ProviderANotification {
    /// Our order id.
    pub order_id: String,
    /// HTTP-like status of the transaction (`200`, `201`, `202`, `407`).
    pub status_code: String,
    /// Amount as a decimal string (`99000.00`).
    pub gross_amount: String,
    /// Lowercase hex SHA-512(`order_id + status_code + gross_amount + server key`).
    pub signature_key: String,
    /// `capture`, `settlement`, `pending`, `deny`, `cancel`, `expire`,
    /// `failure`, `refund`, `partial_refund`, `chargeback`,
    /// `partial_chargeback`, `authorize`.
    pub transaction_status: String,
    /// `accept`, `challenge` or `deny` (card payments).
    pub fraud_status: Option<String>,
    /// Payment method, e.g. `bank_transfer`, `credit_card`, `gopay`.
    pub payment_type: Option<String>,
    /// The provider's transaction id.
    pub transaction_id: Option<String>,
    /// When the transaction happened (provider's local time text).
    pub transaction_time: Option<String>,
    /// Human-readable status message.
    pub status_message: Option<String>,
    /// ISO 4217 currency (`IDR`).
    pub currency: Option<String>,
    /// The merchant id at the provider.
    pub merchant_id: Option<String>,
    /// When the payment settled (provider's local time text).
    pub settlement_time: Option<String>,
}

impl poem_openapi::types::Example for ProviderANotification {
    fn example() -> Self {
        ProviderANotification {
            order_id: "ORD-1764500000000-K3Q9ZP2A".into(),
            status_code: "200".into(),
            gross_amount: "99000.00".into(),
            signature_key: "9f1c…(128 hex digits)".into(),
            transaction_status: "settlement".into(),
            fraud_status: Some("accept".into()),
            payment_type: Some("bank_transfer".into()),
            transaction_id: Some("2b9c1c2e-6b8a-4f0e-9a57-1c2d3e4f5a6b".into()),
            transaction_time: Some("2026-11-23 10:00:00".into()),
            status_message: Some("midtrans payment notification".into()),
            currency: Some("IDR".into()),
            merchant_id: Some("G000000000".into()),
            settlement_time: Some("2026-11-23 10:00:05".into()),
        }
    }
}

/// `order` of a provider_b notification.
#[derive(Debug, Clone, Object)]
pub struct ProviderBOrder {
    /// Our order id.
    pub invoice_number: String,
    /// Amount, a JSON number (signed as written).
    pub amount: f64,
}

/// `transaction` of a provider_b notification.
#[derive(Debug, Clone, Object)]
pub struct ProviderBTransaction {
    /// `SUCCESS`, `FAILED`, `EXPIRED`, `TIMEOUT`, `REVERSED`, `REFUND`, `REFUNDED`, …
    pub status: String,
    /// When it happened (ISO 8601).
    pub date: Option<String>,
    /// The `Request-Id` of our checkout request.
    pub original_request_id: String,
}

/// `security` of a provider_b notification.
#[derive(Debug, Clone, Object)]
pub struct ProviderBSecurity {
    /// Uppercase hex SHA-1(`client id + invoice_number + amount + status + secret key`).
    pub check_word: String,
}

/// A channel or service reference of a provider_b notification.
#[derive(Debug, Clone, Object)]
pub struct ProviderBRef {
    /// Its id, e.g. `VIRTUAL_ACCOUNT_BCA`.
    pub id: Option<String>,
}

/// provider_b's notification (the Checkout notification of DOKU), sent with
/// the `Client-Id`, `Request-Id`, `Request-Timestamp` and `Signature`
/// headers: the signature (HMAC-SHA256 over those, this path and the body's
/// SHA-256) is required and must verify, and so must `security.check_word`.
/// Other fields are accepted.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct ProviderBNotification {
    /// The order.
    pub order: ProviderBOrder,
    /// The transaction.
    pub transaction: ProviderBTransaction,
    /// The signature of the body.
    pub security: ProviderBSecurity,
    /// The payment channel.
    pub channel: Option<ProviderBRef>,
    /// The service.
    pub service: Option<ProviderBRef>,
    /// The acquirer.
    pub acquirer: Option<ProviderBRef>,
}

impl poem_openapi::types::Example for ProviderBNotification {
    fn example() -> Self {
        let r = |id: &str| {
            Some(ProviderBRef {
                id: Some(id.into()),
            })
        };
        ProviderBNotification {
            order: ProviderBOrder {
                invoice_number: "ORD-1764500000000-K3Q9ZP2A".into(),
                amount: 99_000.0,
            },
            transaction: ProviderBTransaction {
                status: "SUCCESS".into(),
                date: Some("2026-11-23T10:00:05Z".into()),
                original_request_id: "5e7d4c43-2f0a-4c8e-9b1a-0d6f3b2a1c9e".into(),
            },
            security: ProviderBSecurity {
                check_word: "A7F12C…(40 upper-case hex digits)".into(),
            },
            channel: r("VIRTUAL_ACCOUNT_BCA"),
            service: r("VIRTUAL_ACCOUNT"),
            acquirer: r("BCA"),
        }
    }
}

/// `{received: true}`, with `duplicate: true` on a repeat delivery.
#[derive(Debug, Clone, Object)]
pub struct WebhookAck {
    /// Always `true`.
    pub received: bool,
    /// `true` when this notification was recorded before (nothing changed now).
    #[oai(skip_serializing_if_is_none)]
    pub duplicate: Option<bool>,
}

crate::problem_responses!(
    /// Errors of the webhook routes.
    WebhookErrorResponse {
        BadRequest = 400: "The body is not a JSON object, a field is not what the protocol defines (`invalid_payload`, `field` names it), or the notified amount differs from the stored one (`amount_mismatch`; nothing changes).",
        Unauthorized = 401: "The signature (provider_a `signature_key`; provider_b the `Signature` header, with `Client-Id`, `Request-Id` and `Request-Timestamp`, and `security.check_word`) is missing or does not verify (`invalid_signature`).",
        NotFound = 404: "No payment of this provider has the order id (`unknown_order`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The event could not be recorded.",
        ServiceUnavailable = 503: "The provider's credentials are not configured (`not_configured`), or the database or the queue is unavailable (`database_unavailable` / `queue_unavailable`): nothing is recorded, so the provider's retry is a first delivery.",
    }
);

/// Payment-provider callbacks.
pub struct WebhookApi;

#[OpenApi(prefix_path = "/api")]
impl WebhookApi {
    /// provider_a payment notification
    ///
    /// Verifies `signature_key`, records the notification once (dedupe key
    /// `order_id:transaction_status:status_code:payment_type:fraud_status`,
    /// plus `:<total refunded or charged back, in hundredths>` when the
    /// notice states one) and queues its settlement, which applies it only
    /// once the provider's status API confirms it (a PAID status only with
    /// `status_code` 200; a partial refund only when the API states the same
    /// total); a repeat answers `duplicate: true`. While the event holding a
    /// key is not confirmed, a notice of that key with another body is
    /// recorded beside it (at most three), so an edited copy cannot make the
    /// genuine notice a repeat. Register `{APP_URL}/api/webhooks/provider_a`
    /// as the notification URL.
    #[oai(
        path = "/webhooks/provider_a",
        method = "post",
        operation_id = "providerAWebhook",
        tag = "ApiTags::Webhooks"
    )]
    async fn provider_a(
        &self,
        state: Data<&AppState>,
        req: &Request,
        body: RawJson<ProviderANotification>,
    ) -> Result<Json<WebhookAck>, WebhookErrorResponse> {
        let verifier = ProviderA::from_settings(&state.settings)
            .ok_or_else(|| not_configured("PROVIDER_A_SERVER_KEY"))?;
        Ok(Json(receive(&state, req, &verifier, &body.bytes).await?))
    }

    /// provider_b payment notification
    ///
    /// Verifies the required `Signature` header and `security.check_word`,
    /// records the notification once (dedupe key
    /// `invoice_number:original_request_id:status:channel.id`) and queues its
    /// settlement; a repeat answers `duplicate: true`. Register
    /// `{APP_URL}/api/webhooks/provider_b` as the notification URL.
    #[oai(
        path = "/webhooks/provider_b",
        method = "post",
        operation_id = "providerBWebhook",
        tag = "ApiTags::Webhooks"
    )]
    async fn provider_b(
        &self,
        state: Data<&AppState>,
        req: &Request,
        body: RawJson<ProviderBNotification>,
    ) -> Result<Json<WebhookAck>, WebhookErrorResponse> {
        let verifier = ProviderB::from_settings(&state.settings, PROVIDER_B_PATH)
            .ok_or_else(|| not_configured("PROVIDER_B_CLIENT_ID, PROVIDER_B_SECRET_KEY"))?;
        Ok(Json(receive(&state, req, &verifier, &body.bytes).await?))
    }
}

fn not_configured(vars: &str) -> ApiError {
    ApiError::Unavailable {
        code: "not_configured",
        detail: format!("this provider's notifications cannot be verified: set {vars}"),
    }
}

/// The work of both routes (see the module docs).
async fn receive(
    state: &AppState,
    req: &Request,
    verifier: &dyn WebhookVerifier,
    body: &[u8],
) -> Result<WebhookAck, ApiError> {
    let h = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let headers = WebhookHeaders {
        client_id: h("client-id"),
        request_id: h("request-id"),
        request_timestamp: h("request-timestamp"),
        signature: h("signature"),
    };
    let notification = verifier.verify(body, &headers).map_err(|e| match e {
        WebhookError::Signature(why) => {
            tracing::warn!(
                provider = verifier.provider(),
                why,
                "webhook signature refused"
            );
            ApiError::Unauthorized("invalid_signature", format!("invalid signature: {why}"))
        }
        WebhookError::Payload { field, detail } => {
            ApiError::Field(FieldError::new(field, "invalid_payload", detail))
        }
    })?;
    // Record-then-enqueue runs in its own task: a provider that hangs up
    // mid-request (dropping this future) must not leave an event recorded
    // but never queued (which only the sweep would settle, while the
    // provider's retry is answered `duplicate`).
    let request_id = req.extensions().get::<RequestId>().map(|r| r.0.clone());
    let task_state = state.clone();
    tokio::spawn(async move { record_and_queue(&task_state, notification, request_id).await })
        .await
        .map_err(|e| ApiError::internal(format!("the webhook task failed: {e}")))?
}

/// Records a verified notification and queues its settlement (see the module
/// docs): the answer of both routes from the lookup on.
async fn record_and_queue(
    state: &AppState,
    notification: entity::billing::webhook::Notification,
    request_id: Option<String>,
) -> Result<WebhookAck, ApiError> {
    let recorded = state
        .bounded(events::record_event(&state.db, &notification))
        .await?;
    let id = match recorded {
        Ok(Recorded::New(id)) => id,
        Ok(Recorded::Duplicate { event_id, settled }) => {
            tracing::info!(%event_id, settled, "duplicate webhook delivery");
            return Ok(WebhookAck {
                received: true,
                duplicate: Some(true),
            });
        }
        Err(RecordError::UnknownOrder { order_id, .. }) => {
            return Err(ApiError::NotFound(
                "unknown_order",
                format!("no payment has order id {order_id}"),
            ))
        }
        Err(e @ RecordError::AmountMismatch { .. }) => {
            tracing::warn!(order_id = %notification.order_id, error = %e, "webhook amount mismatch");
            return Err(ApiError::Invalid("amount_mismatch", e.to_string()));
        }
        Err(RecordError::Db(e)) => {
            return Err(crate::routes::db_error("recording the webhook event", e))
        }
    };
    let job = Job::SettlePayment(SettlePayment {
        event_id: id,
        request_id,
    });
    if let Err(e) = state
        .queues
        .push_within(job, state.settings.dependency_timeout)
        .await
    {
        // Undo the record so the provider's retry is a first delivery; if even
        // that fails, the settlement sweep settles the event later.
        tracing::error!(event_id = %id, error = %e, "could not queue the settlement");
        let forgot = state
            .bounded(events::forget_unqueued_event(&state.db, id))
            .await;
        if !matches!(forgot, Ok(Ok(true))) {
            tracing::error!(event_id = %id, "event kept unqueued; the sweep will settle it");
        }
        return Err(ApiError::Unavailable {
            code: "queue_unavailable",
            detail: "the notification could not be queued; retry later".into(),
        });
    }
    tracing::info!(event_id = %id, order_id = %notification.order_id, status = %notification.provider_status, "webhook recorded");
    Ok(WebhookAck {
        received: true,
        duplicate: None,
    })
}
