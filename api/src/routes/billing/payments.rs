//! `POST /api/payments`: create a `PENDING` payment for a plan and start the
//! configured provider's checkout; `GET
//! /api/payments/quote`: what paying a plan now grants ([`grant::quote`], the
//! settlement's rule).
//!
//! Flow: session gate (payments toggle and provider credentials → 503, then
//! 401) → 5 requests per 15 minutes per user (429) → plan (400
//! `invalid_plan`) → `Idempotency-Key` (400) → [`checkout::begin`] → for a new
//! payment the provider call ([`worker::providers::Providers::checkout`],
//! bounded by `PROVIDER_TIMEOUT_MS`) → token/URL stored → 200; any provider
//! failure marks the payment `FAILED` and answers 502 `provider_error`. A
//! replay of an `Idempotency-Key` answers the first request's outcome again.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use entity::{
    base::validate::FieldError,
    billing::checkout::{self, Begun, CheckoutError, NewCheckout, Started},
    billing::grant,
    entities::payments::{self, PaymentStatus},
    Feature,
};
use poem::web::Data;
use poem_openapi::{
    param::{Header, Query},
    payload::Json,
    types::Example,
    ApiResponse, Object, OpenApi, Union,
};
use worker::providers::checkout::{Checkout, CheckoutOrder};

use crate::routes::ApiTags;
use crate::{
    identity::bearer::{BearerAuth, Gate},
    pattern::Matching,
    payload::JsonBody,
    problem::{ApiError, Problem, RateInfo},
    state::AppState,
};

crate::string_pattern!(
    /// One or more visible ASCII characters (`!` to `~`).
    pub VisibleAscii = r"^[\x21-\x7E]+$"
);

/// Requests allowed per user and window on `POST /api/payments`.
pub const LIMIT_PER_WINDOW: u32 = 5;
/// The window of [`LIMIT_PER_WINDOW`] (15 minutes).
pub const LIMIT_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Longest `Idempotency-Key`, in bytes.
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

/// The plan to buy.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct PaymentRequest {
    /// Plan identifier of the catalogue, 1–32 characters (`BASIC`, `PRO`,
    /// `ULTIMATE`); `FREE` cannot be bought.
    #[oai(validator(min_length = 1, max_length = 32))]
    pub plan: String,
}

impl Example for PaymentRequest {
    fn example() -> Self {
        PaymentRequest { plan: "PRO".into() }
    }
}

/// What paying a plan now grants: the period and the time carried over
/// from the plan in force (the same rule as the settlement, so the receipt
/// shows these figures when the payment settles at once; settled later, the
/// period starts later and less time is left to carry).
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct Quote {
    /// The plan.
    pub plan: String,
    /// Its price, whole units of `currency` (what the checkout charges).
    pub amount: i64,
    /// ISO 4217 currency (`IDR`).
    pub currency: String,
    /// Start of the period it grants (UTC): now, or the current period's end
    /// when the plan in force is the same plan.
    pub period_start: DateTime<Utc>,
    /// End of the period (UTC): one calendar month after `period_start`,
    /// plus `carried_seconds`.
    pub period_end: DateTime<Utc>,
    /// Unused paid time of another plan in force carried over, converted at
    /// the ratio of what that time was worth to this plan's price; seconds,
    /// rounded down, 0 when nothing carries.
    pub carried_seconds: i64,
}

impl Example for Quote {
    fn example() -> Self {
        let start = "2026-11-28T10:05:00Z".parse().expect("a time");
        Quote {
            plan: "BASIC".into(),
            amount: 49_000,
            currency: "IDR".into(),
            period_start: start,
            period_end: "2027-01-17T15:01:00Z".parse().expect("a time"),
            carried_seconds: 1_745_760,
        }
    }
}

impl Quote {
    fn of(g: &grant::Grant, amount: i64, currency: &str) -> Self {
        Quote {
            plan: g.plan.clone(),
            amount,
            currency: currency.to_string(),
            period_start: g.start,
            period_end: g.end,
            carried_seconds: g.carried_seconds,
        }
    }
}

/// provider_a's checkout (`provider` = `provider_a`): open the provider's
/// client-side payment widget with `token`.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct ProviderACheckout {
    /// Checkout token of the provider's client-side widget.
    pub token: String,
    /// Our order id (`<prefix>-<epoch ms>-<8 upper-case alphanumerics>`).
    #[oai(rename = "orderId")]
    pub order_id: String,
    /// What paying this checkout grants, as of its creation.
    pub quote: Quote,
}

impl Example for ProviderACheckout {
    fn example() -> Self {
        ProviderACheckout {
            token: "66e4fa55-fdac-4ef9-91b5-733b97d1b862".into(),
            order_id: "ORD-1763892000000-K3Q9ZP2A".into(),
            quote: Quote::example(),
        }
    }
}

/// provider_b's checkout (`provider` = `provider_b`): redirect the user to
/// `payment_url`.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct ProviderBCheckout {
    /// The provider's hosted payment page (absolute http(s) URL).
    pub payment_url: String,
    /// Our order id (`<prefix>-<epoch ms>-<8 upper-case alphanumerics>`).
    #[oai(rename = "orderId")]
    pub order_id: String,
    /// What paying this checkout grants, as of its creation.
    pub quote: Quote,
}

impl Example for ProviderBCheckout {
    fn example() -> Self {
        ProviderBCheckout {
            payment_url: "https://sandbox.doku.com/checkout-link-v2/1a2b3c4d5e6f".into(),
            order_id: "ORD-1763892000000-K3Q9ZP2A".into(),
            quote: Quote::example(),
        }
    }
}

/// A started checkout; `provider` says which shape it is.
#[derive(Debug, Clone, Union)]
#[oai(discriminator_name = "provider", one_of)]
pub enum CheckoutAnswer {
    /// `{provider: "provider_a", token, orderId}`.
    #[oai(mapping = "provider_a")]
    ProviderA(ProviderACheckout),
    /// `{provider: "provider_b", payment_url, orderId}`.
    #[oai(mapping = "provider_b")]
    ProviderB(ProviderBCheckout),
}

/// Answers of `POST /api/payments` that carry the rate-limit headers.
#[derive(Debug, ApiResponse)]
pub enum PaymentResponse {
    /// The payment is `PENDING` and the provider's checkout started: pay with
    /// `token` (provider_a) or at `payment_url` (provider_b). A replayed
    /// `Idempotency-Key` answers the first request's body again with
    /// `Idempotent-Replayed: true`.
    #[oai(status = 200)]
    Ok(
        Json<CheckoutAnswer>,
        /// Requests allowed per window (5).
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now.
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
        /// `true` when this answer replays an earlier request with the same
        /// `Idempotency-Key` (no new payment was created).
        #[oai(header = "Idempotent-Replayed")]
        Option<String>,
    ),
    /// Rate limit exceeded (5 per 15 minutes per user): wait `Retry-After` seconds.
    #[oai(status = 429, content_type = "application/problem+json")]
    TooManyRequests(
        Json<Problem>,
        /// Requests allowed per window.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now (0).
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
        /// Seconds to wait before retrying.
        #[oai(header = "Retry-After")]
        u64,
    ),
}

crate::problem_responses!(
    /// Errors of `POST /api/payments`.
    PaymentErrorResponse {
        BadRequest = 400: "The plan is unknown or not for sale, e.g. FREE (`invalid_plan`, `field` = `plan`), `Idempotency-Key` is not 1–255 visible ASCII characters (`field` = `Idempotency-Key`), or the body is not the expected JSON.",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Conflict = 409: "A request with this `Idempotency-Key` is still waiting for the provider (`idempotency_in_progress`): retry shortly; or its payment has expired (`payment_expired`): start a new payment with another key.",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        UnprocessableEntity = 422: "This `Idempotency-Key` was used by you within 24 hours for another plan (`idempotency_key_reused`).",
        InternalServerError = 500: "The payment record could not be created.",
        BadGateway = 502: "The payment provider failed, did not answer within `PROVIDER_TIMEOUT_MS`, or answered something undocumented (`provider_error`); the payment is `FAILED`. Start a new payment to retry.",
        ServiceUnavailable = 503: "Auth or payments are switched off (`feature_disabled`) or not configured (`not_configured`: names the missing provider credentials), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

crate::problem_responses!(
    /// Errors of `GET /api/payments/quote`.
    QuoteErrorResponse {
        BadRequest = 400: "`plan` is missing, unknown or not for sale, e.g. FREE (`invalid_plan`, `field` = `plan`).",
        Unauthorized = 401: "No valid session token.",
        InternalServerError = 500: "The quote could not be computed.",
        ServiceUnavailable = 503: "Auth or payments are switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Answers of `GET /api/payments/quote`.
#[derive(Debug, ApiResponse)]
pub enum QuoteResponse {
    /// What paying `plan` now would grant.
    #[oai(status = 200)]
    Ok(Json<Quote>),
}

/// Checkout.
pub struct PaymentApi;

#[OpenApi(prefix_path = "/api")]
impl PaymentApi {
    /// What paying a plan now grants
    ///
    /// Answers the period a payment for `plan` settling now would grant and
    /// the time carried over from another plan in force: one calendar month
    /// from now plus the carried time, or, for the plan in force, one month
    /// from its current end. The settlement applies the same rule at the
    /// moment the payment is paid; the receipt mail says what it granted.
    #[oai(
        path = "/payments/quote",
        method = "get",
        operation_id = "quotePayment",
        tag = "ApiTags::User"
    )]
    async fn quote(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// Plan identifier of the catalogue (`BASIC`, `PRO`, `ULTIMATE`);
        /// required (missing: 400 `invalid_plan`); `FREE` cannot be bought.
        #[oai(validator(min_length = 1, max_length = 32))]
        plan: Query<Option<String>>,
    ) -> Result<QuoteResponse, QuoteErrorResponse> {
        Ok(QuoteResponse::Ok(Json(
            quote_inner(&state, &auth, plan.0.as_deref()).await?,
        )))
    }

    /// Start a plan payment
    ///
    /// Creates a `PENDING` payment for `plan` (its catalogue price) and starts
    /// the configured provider's checkout; the provider's notification
    /// (`/api/webhooks/*`) settles it later. Limited to 5 requests per 15
    /// minutes per user. With an `Idempotency-Key`, a repeat of the request
    /// within 24 hours answers the first outcome again (same `orderId`,
    /// `Idempotent-Replayed: true`) instead of creating a second payment; the
    /// same key for another plan is 422. The provider call is bounded by
    /// `PROVIDER_TIMEOUT_MS` and retried once only when no connection could
    /// be made.
    #[oai(
        path = "/payments",
        method = "post",
        operation_id = "createPayment",
        tag = "ApiTags::User"
    )]
    async fn create(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        req: &poem::Request,
        /// Optional client-chosen key, 1–255 visible ASCII characters, that
        /// makes retries of this request safe for 24 hours (same user, same
        /// plan: the first answer again; another plan: 422).
        #[oai(name = "Idempotency-Key", validator(min_length = 1, max_length = 255))]
        _key: Header<Option<Matching<VisibleAscii>>>,
        body: JsonBody<PaymentRequest>,
    ) -> Result<PaymentResponse, PaymentErrorResponse> {
        // The raw header: poem-openapi drops values that are not visible
        // ASCII instead of refusing them.
        let key = req.headers().get("idempotency-key").map(|v| v.as_bytes());
        match create_inner(&state, &auth, key, &body.plan).await {
            Ok((answer, rate, replayed)) => Ok(PaymentResponse::Ok(
                Json(answer),
                rate.limit,
                rate.remaining,
                rate.reset,
                replayed.then(|| "true".to_string()),
            )),
            Err(e @ ApiError::RateLimited(i)) => Ok(PaymentResponse::TooManyRequests(
                Json(e.problem()),
                i.limit,
                i.remaining,
                i.reset,
                i.retry_after,
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// The plan `plan_id` names, when it can be bought (else 400 `invalid_plan`).
fn purchasable<'a>(
    state: &'a AppState,
    plan_id: Option<&str>,
) -> Result<&'a entity::base::plans::Plan, ApiError> {
    let id = plan_id.unwrap_or_default();
    state.plans.purchasable(id).ok_or_else(|| {
        FieldError::new(
            "plan",
            "invalid_plan",
            format!("{id:?} is not a plan that can be bought"),
        )
        .into()
    })
}

async fn quote_inner(
    state: &AppState,
    auth: &BearerAuth,
    plan_id: Option<&str>,
) -> Result<Quote, ApiError> {
    let user = state
        .session(auth, Gate::Feature(Feature::Payments))
        .await?;
    let plan = purchasable(state, plan_id)?;
    let g = state
        .bounded_db(
            "computing the quote",
            grant::quote(
                &state.db,
                user.user_id,
                &plan.id,
                plan.price,
                None,
                entity::billing::Terms::from_settings(&state.settings),
            ),
        )
        .await?;
    Ok(Quote::of(&g, plan.price, &state.plans.currency))
}

/// The `Idempotency-Key` header: absent, or 1–255 visible ASCII characters.
pub fn parse_idempotency_key(raw: Option<&[u8]>) -> Result<Option<String>, FieldError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    if raw.is_empty()
        || raw.len() > IDEMPOTENCY_KEY_MAX
        || !raw.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(FieldError::new(
            "Idempotency-Key",
            "invalid_idempotency_key",
            "Idempotency-Key must be 1–255 visible ASCII characters",
        ));
    }
    Ok(Some(String::from_utf8_lossy(raw).into_owned()))
}

fn provider_failed() -> ApiError {
    ApiError::BadGateway(
        "provider_error",
        "the payment provider could not start the checkout; the payment is FAILED, start a new one"
            .into(),
    )
}

/// The quote of payment `p` as of its creation (`created_at`, the
/// database's clock): the same figures on the first answer and on a replay.
async fn quote_of(state: &AppState, p: &payments::Model) -> Result<Quote, ApiError> {
    let g = state
        .bounded_db(
            "computing the quote",
            grant::quote(
                &state.db,
                p.user_id,
                &p.plan,
                p.amount,
                Some(p.created_at),
                entity::billing::Terms::from_settings(&state.settings),
            ),
        )
        .await?;
    Ok(Quote::of(&g, p.amount, &p.currency))
}

/// The 200 body a payment with a started checkout answers (also on replay).
fn answer_of(p: &payments::Model, quote: Quote) -> Option<CheckoutAnswer> {
    match p.provider.as_str() {
        payments::PROVIDER_A => p.checkout_token.clone().map(|token| {
            CheckoutAnswer::ProviderA(ProviderACheckout {
                token,
                order_id: p.order_id.clone(),
                quote,
            })
        }),
        payments::PROVIDER_B => p.payment_url.clone().map(|payment_url| {
            CheckoutAnswer::ProviderB(ProviderBCheckout {
                payment_url,
                order_id: p.order_id.clone(),
                quote,
            })
        }),
        _ => None,
    }
}

async fn create_inner(
    state: &AppState,
    auth: &BearerAuth,
    raw_key: Option<&[u8]>,
    plan_id: &str,
) -> Result<(CheckoutAnswer, RateInfo, bool), ApiError> {
    let user = state
        .session(auth, Gate::Feature(Feature::Payments))
        .await?;
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let rate = state
        .limit_user(
            "payments",
            user.user_id,
            LIMIT_PER_WINDOW,
            LIMIT_WINDOW,
            deadline,
        )
        .await?;
    let plan = purchasable(state, Some(plan_id))?;
    let key = parse_idempotency_key(raw_key)?;
    let provider = state.settings.payment_provider.as_str();
    let new = NewCheckout {
        user_id: user.user_id,
        plan: plan.id.clone(),
        amount: plan.price,
        currency: state.plans.currency.clone(),
        provider: provider.to_string(),
        order_prefix: state.settings.order_id_prefix.clone(),
        idempotency_key: key,
    };
    let begun = match state.bounded(checkout::begin(&state.db, new)).await? {
        Ok(b) => b,
        Err(CheckoutError::KeyReused) => {
            return Err(ApiError::Unprocessable(
                "idempotency_key_reused",
                "this Idempotency-Key was used within 24 hours for another plan".into(),
            ))
        }
        Err(CheckoutError::Db(e)) => {
            return Err(crate::routes::db_error("creating the payment", e))
        }
    };
    let payment = match begun {
        Begun::Replay(p) if p.status == PaymentStatus::Expired => {
            return Err(ApiError::Conflict(
                "payment_expired",
                format!(
                    "the payment {} of this Idempotency-Key has expired; start a new payment with another key",
                    p.order_id
                ),
            ));
        }
        Begun::Replay(p) => {
            let quote = quote_of(state, &p).await?;
            return match answer_of(&p, quote) {
                Some(a) => Ok((a, rate, true)),
                None if p.status == PaymentStatus::Pending => Err(ApiError::Conflict(
                    "idempotency_in_progress",
                    "the first request with this Idempotency-Key is still waiting for the provider; retry shortly"
                        .into(),
                )),
                None => Err(provider_failed()),
            };
        }
        Begun::New(p) => p,
    };
    let order = CheckoutOrder {
        order_id: payment.order_id.clone(),
        amount: payment.amount,
        currency: payment.currency.clone(),
        plan_id: plan.id.clone(),
        plan_name: plan.name.clone(),
        email: user.email.clone(),
        created_at: payment.created_at,
    };
    // The provider call and what it leads to run in their own task: a client
    // that hangs up mid-call does not cancel them, so the payment never stays
    // PENDING without its token/URL (a replay would answer 409 until expiry).
    let quote = quote_of(state, &payment).await?;
    let task = tokio::spawn(start_checkout(state.clone(), payment, order, quote));
    let answer = task
        .await
        .map_err(|e| ApiError::internal(format!("checkout task: {e}")))??;
    tracing::info!(provider, plan = %plan.id, "checkout started");
    Ok((answer, rate, false))
}

/// Calls the provider for the new `payment` (bounded by
/// `PROVIDER_TIMEOUT_MS`), stores the token/URL, or marks the payment
/// `FAILED` and answers 502.
async fn start_checkout(
    state: AppState,
    payment: payments::Model,
    order: CheckoutOrder,
    quote: Quote,
) -> Result<CheckoutAnswer, ApiError> {
    let provider = payment.provider.as_str();
    let result = match tokio::time::timeout(
        state.settings.provider_timeout,
        state.providers.checkout(&order),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(worker::providers::ProviderError::Timeout),
    };
    let started = match result {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(order_id = %payment.order_id, provider, error = %e, "checkout failed");
            let reason = match &e {
                worker::providers::ProviderError::Status { status, .. } => {
                    format!("the provider answered HTTP {status}")
                }
                e => e.to_string(),
            };
            if let Err(db) = state
                .bounded_db(
                    "marking the payment FAILED",
                    checkout::record_failed(&state.db, &payment.order_id, &reason),
                )
                .await
            {
                tracing::error!(order_id = %payment.order_id, error = %db, "could not mark the payment FAILED; the expiry job will");
            }
            return Err(provider_failed());
        }
    };
    let (answer, stored) = match &started {
        Checkout::ProviderA { token, .. } => (
            CheckoutAnswer::ProviderA(ProviderACheckout {
                token: token.clone(),
                order_id: payment.order_id.clone(),
                quote,
            }),
            Started::Token(token),
        ),
        Checkout::ProviderB { payment_url } => (
            CheckoutAnswer::ProviderB(ProviderBCheckout {
                payment_url: payment_url.clone(),
                order_id: payment.order_id.clone(),
                quote,
            }),
            Started::Url(payment_url),
        ),
    };
    state
        .bounded_db(
            "storing the checkout",
            checkout::record_started(&state.db, payment.id, stored),
        )
        .await?;
    tracing::info!(order_id = %payment.order_id, provider, "checkout recorded");
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_visible_ascii() {
        assert_eq!(parse_idempotency_key(None).unwrap(), None);
        assert_eq!(
            parse_idempotency_key(Some(b"abc-123_X"))
                .unwrap()
                .as_deref(),
            Some("abc-123_X")
        );
        for bad in [&b""[..], b"a b", b"tab\t", &[0xc3, 0xa9], &[b'k'; 256]] {
            let e = parse_idempotency_key(Some(bad)).unwrap_err();
            assert_eq!(e.field, "Idempotency-Key");
        }
        assert!(parse_idempotency_key(Some(&[b'k'; 255])).is_ok());
    }
}
