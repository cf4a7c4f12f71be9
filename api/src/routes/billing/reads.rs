//! `GET /api/payments` and `GET /api/payments/{order_id}`: the caller's own
//! payments, newest first. Answers carry `Cache-Control: private, no-store`.
//! Queries live in [`entity::billing::reads`].

use chrono::{DateTime, Utc};
use entity::{billing::reads::WithReceipt, entities::billing_receipts, Feature};
use poem::web::Data;
use poem_openapi::{
    param::{Path, Query},
    types::Example,
    Object, OpenApi,
};

use crate::{
    identity::bearer::{BearerAuth, Gate},
    pattern::Matching,
    problem::ApiError,
    routes::{
        page::{page_params, ListCursor},
        ApiTags,
    },
    state::AppState,
};

/// One payment of the caller.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct PaymentItem {
    /// Our order id (`<prefix>-<epoch ms>-<8 upper-case alphanumerics>`).
    pub order_id: String,
    /// Plan bought.
    pub plan: String,
    /// Amount in whole units of `currency`.
    pub amount: i64,
    /// ISO 4217 currency.
    pub currency: String,
    /// `provider_a` or `provider_b`.
    pub provider: String,
    /// `PENDING`, `PAID`, `FAILED`, `EXPIRED`, `CANCELED` or `REFUNDED`.
    pub status: String,
    /// The provider's hosted payment page, if it gave one.
    #[oai(nullable)]
    pub payment_url: Option<String>,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// When it was settled as paid; `null` until then.
    #[oai(nullable)]
    pub paid_at: Option<DateTime<Utc>>,
    /// Its receipt, once it was paid (every payment ever paid has one,
    /// refunded or not); `null` before.
    #[oai(nullable)]
    pub receipt: Option<Receipt>,
}

/// A paid payment's receipt: its number and money figures (whole units of
/// the payment's currency).
#[derive(Debug, Clone, Object)]
pub struct Receipt {
    /// The receipt's number: ascending in the order payments were paid,
    /// never reused.
    pub number: i64,
    /// The plan its time went to.
    pub plan: String,
    /// The amount paid.
    pub amount: i64,
    /// The value of the unused time carried into its period from the plan
    /// it replaced (0 when none).
    pub carried_in_value: i64,
    /// The period it bought (RFC 3339, UTC).
    #[oai(nullable)]
    pub period_start: Option<DateTime<Utc>>,
    /// Its end.
    #[oai(nullable)]
    pub period_end: Option<DateTime<Utc>>,
    /// What refunds or chargebacks gave back so far.
    pub refunded_amount: i64,
    /// Seconds a whole refund took back from the period (0 when none).
    pub taken_back_seconds: i64,
}

impl From<billing_receipts::Model> for Receipt {
    fn from(r: billing_receipts::Model) -> Self {
        Receipt {
            number: r.number,
            plan: r.plan,
            amount: r.amount,
            carried_in_value: r.carried_in_value,
            period_start: r.period_start,
            period_end: r.period_end,
            refunded_amount: r.refunded_amount,
            taken_back_seconds: r.taken_back_seconds,
        }
    }
}

impl Example for PaymentItem {
    fn example() -> Self {
        PaymentItem {
            order_id: "ORD-1763892000000-K3Q9ZP2A".into(),
            plan: "PRO".into(),
            amount: 99_000,
            currency: "IDR".into(),
            provider: "provider_a".into(),
            status: "PAID".into(),
            payment_url: None,
            created_at: "2026-11-26T10:00:00Z".parse().expect("example date"),
            paid_at: Some("2026-11-26T10:02:13Z".parse().expect("example date")),
            receipt: Some(Receipt {
                number: 1042,
                plan: "PRO".into(),
                amount: 99_000,
                carried_in_value: 0,
                period_start: Some("2026-11-26T10:02:13Z".parse().expect("example date")),
                period_end: Some("2026-12-26T10:02:13Z".parse().expect("example date")),
                refunded_amount: 0,
                taken_back_seconds: 0,
            }),
        }
    }
}

impl From<WithReceipt> for PaymentItem {
    fn from((p, receipt): WithReceipt) -> Self {
        PaymentItem {
            order_id: p.order_id,
            plan: p.plan,
            amount: p.amount,
            currency: p.currency,
            provider: p.provider,
            status: p.status.as_str().to_string(),
            payment_url: p.payment_url,
            created_at: p.created_at,
            paid_at: p.paid_at,
            receipt: receipt.map(Receipt::from),
        }
    }
}

/// A page of the caller's payments, newest first.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct PaymentPage {
    /// The payments.
    pub items: Vec<PaymentItem>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[oai(nullable)]
    pub next_cursor: Option<String>,
}

impl Example for PaymentPage {
    fn example() -> Self {
        PaymentPage {
            items: vec![PaymentItem::example()],
            next_cursor: None,
        }
    }
}

crate::private_ok!(
    /// 200 of `GET /api/payments`.
    PaymentPageOk, PaymentPage, "A page of the caller's payments, newest first."
);
crate::private_ok!(
    /// 200 of `GET /api/payments/{order_id}`.
    PaymentOk, PaymentItem, "The payment."
);

crate::problem_responses!(
    /// Errors of `GET /api/payments`.
    PaymentListErrorResponse {
        BadRequest = 400: "`cursor` is not a `next_cursor` of this list or `limit` is not 1–100 (`field` names it).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        InternalServerError = 500: "The payments could not be read.",
        ServiceUnavailable = 503: "Auth or payments is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

crate::problem_responses!(
    /// Errors of `GET /api/payments/{order_id}`.
    PaymentErrorResponse {
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        NotFound = 404: "No payment of the caller has this order id (`unknown_order`); another user's order is 404 too.",
        InternalServerError = 500: "The payment could not be read.",
        ServiceUnavailable = 503: "Auth or payments is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// The caller's payments.
pub struct PaymentReadApi;

#[OpenApi(prefix_path = "/api")]
impl PaymentReadApi {
    /// The caller's payments
    ///
    /// Newest first, `limit` (default 20, at most 100) at a time;
    /// `next_cursor` continues, `null` on the last page.
    #[oai(
        path = "/payments",
        method = "get",
        operation_id = "listPayments",
        tag = "ApiTags::User"
    )]
    async fn payments(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// `next_cursor` of the previous page; absent or empty: the first
        /// page.
        cursor: Query<Option<Matching<ListCursor>>>,
        /// Page size, 1–100 (default 20).
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))]
        limit: Query<Option<u64>>,
    ) -> Result<PaymentPageOk, PaymentListErrorResponse> {
        Ok(PaymentPageOk::private(
            payments_inner(&state, &auth, cursor.0.as_deref(), limit.0).await?,
        ))
    }

    /// One payment of the caller
    ///
    /// What the billing return page polls until `status` is final. Another
    /// user's order is 404, as an unknown one.
    #[oai(
        path = "/payments/:order_id",
        method = "get",
        operation_id = "getPayment",
        tag = "ApiTags::User"
    )]
    async fn payment(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// The order id (`orderId` of `POST /api/payments`).
        order_id: Path<String>,
    ) -> Result<PaymentOk, PaymentErrorResponse> {
        Ok(PaymentOk::private(
            payment_inner(&state, &auth, &order_id.0).await?,
        ))
    }
}

async fn payments_inner(
    state: &AppState,
    auth: &BearerAuth,
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<PaymentPage, ApiError> {
    let user = state
        .session(auth, Gate::Feature(Feature::Payments))
        .await?;
    let (cursor, limit) = page_params(cursor, limit)?;
    let page = state
        .bounded_db(
            "reading the payments",
            entity::billing::reads::payments_of(&state.db, user.user_id, cursor, limit),
        )
        .await?;
    Ok(PaymentPage {
        next_cursor: page.next.map(|c| c.encode()),
        items: page.items.into_iter().map(PaymentItem::from).collect(),
    })
}

async fn payment_inner(
    state: &AppState,
    auth: &BearerAuth,
    order_id: &str,
) -> Result<PaymentItem, ApiError> {
    let user = state
        .session(auth, Gate::Feature(Feature::Payments))
        .await?;
    state
        .bounded_db(
            "reading the payment",
            entity::billing::reads::payment_of(&state.db, user.user_id, order_id),
        )
        .await?
        .map(PaymentItem::from)
        .ok_or_else(|| {
            ApiError::NotFound(
                "unknown_order",
                "no payment of yours has this order id".into(),
            )
        })
}
