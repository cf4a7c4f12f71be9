//! `GET /api/payments/pay/{token}`: the renewal's pay link, as it appears in
//! `GET /api/me` (`subscription.renewal.pay_url`) and in the reminder and
//! past-due mails. No session: the token, signed with the server secret
//! (`BACKEND_SERVICE_ROLE_KEY`) for one renewal ([`entity::billing::renewal::pay::pay_token`]),
//! is the credential. Rules in [`entity::billing::renewal::pay`].
//!
//! Flow: payments ready (503) → token (404 `invalid_link`) → the renewal by
//! the database's clock ([`pay::resolve`]): closed → 303 to
//! `{APP_URL}/billing?renewal=paid|void|changed`; grace over → 404
//! `link_expired`; live checkout → 303 to it; stale checkout → the provider
//! is asked (paid: settled, 303 saying paid; unpaid: `EXPIRED`, then a new
//! one); none → the user's checkout limit (5 per 15 minutes, shared with
//! `POST /api/payments`; 429) → payment row and provider checkout → 303.

use std::time::Instant;

use chrono::Duration;
use entity::{
    billing::checkout::{self, Started},
    billing::renewal::pay::{self, Begun, Closed, Link},
    billing::settlement,
    entities::{payments::PaymentStatus, users},
    Feature,
};
use poem::web::Data;
use poem_openapi::{param::Path, ApiResponse, OpenApi};
use sea_orm::EntityTrait;
use uuid::Uuid;
use worker::providers::checkout::{Checkout, CheckoutOrder};

use crate::routes::ApiTags;
use crate::{problem::ApiError, state::AppState};

/// The pay link of renewal `renewal_id`
/// (`{API_EXTERNAL_URL}/api/payments/pay/{token}`); `None` without a
/// `BACKEND_SERVICE_ROLE_KEY` to sign it.
pub fn pay_url(settings: &entity::Settings, renewal_id: Uuid) -> Option<String> {
    let secret = settings.backend_service_role_key.as_deref()?;
    Some(format!(
        "{}/api/payments/pay/{}",
        settings.api_external_url.trim_end_matches('/'),
        entity::billing::renewal::pay::pay_token(secret, renewal_id)
    ))
}

/// The answer of a usable link.
#[derive(Debug, ApiResponse)]
pub enum PayRedirect {
    /// To the renewal's live provider checkout, or (`renewal=paid|void|changed`)
    /// to `{APP_URL}/billing` when the renewal is paid, voided, or no longer
    /// matches the subscription's plan and period end.
    #[oai(status = 303)]
    SeeOther(#[oai(header = "Location")] String),
}

crate::problem_responses!(
    /// Errors of `GET /api/payments/pay/{token}`.
    PayErrorResponse {
        NotFound = 404: "The token is not a pay link this server signed, or names no renewal (`invalid_link`); or the renewal's grace has ended (`link_expired`): buy the plan again from the billing page.",
        TooManyRequests = 429: "The user started too many checkouts (5 per 15 minutes, shared with `POST /api/payments`): wait `Retry-After` seconds.",
        InternalServerError = 500: "The payment record could not be created.",
        BadGateway = 502: "The payment provider failed or did not answer within `PROVIDER_TIMEOUT_MS` (`provider_error`); the new payment is `FAILED`. Open the link again to retry.",
        ServiceUnavailable = 503: "Payments are switched off (`feature_disabled`) or not configured (`not_configured`), the provider could not be asked about the last checkout (`provider_unavailable`), a checkout is still being started (`checkout_starting`), or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// The renewal pay link.
pub struct PayApi;

#[OpenApi(prefix_path = "/api")]
impl PayApi {
    /// Pay a renewal
    ///
    /// The link of a renewal reminder (no session needed). Redirects (303)
    /// to the renewal's live checkout, creating the payment and the
    /// provider checkout at first use; repeated clicks get the same checkout
    /// while the provider keeps it; a new one is made only after it expired
    /// unpaid. A paid, voided or outdated renewal redirects to the billing
    /// page saying so (`?renewal=paid|void|changed`). Valid until the
    /// renewal's grace ends.
    #[oai(
        path = "/payments/pay/:token",
        method = "get",
        operation_id = "payRenewal",
        tag = "ApiTags::Public"
    )]
    async fn pay(
        &self,
        state: Data<&AppState>,
        /// The signed token of the link.
        token: Path<String>,
    ) -> Result<PayRedirect, PayErrorResponse> {
        Ok(PayRedirect::SeeOther(pay_inner(&state, &token.0).await?))
    }
}

fn invalid_link() -> ApiError {
    ApiError::NotFound(
        "invalid_link",
        "this is not a valid renewal pay link".into(),
    )
}

fn closed_url(state: &AppState, why: Closed) -> String {
    format!(
        "{}/billing?renewal={}",
        state.settings.app_url.trim_end_matches('/'),
        why.as_str()
    )
}

fn span(d: std::time::Duration) -> Duration {
    Duration::from_std(d).unwrap_or(Duration::MAX)
}

async fn pay_inner(state: &AppState, token: &str) -> Result<String, ApiError> {
    state.require(Feature::Payments)?;
    let secret = state
        .settings
        .backend_service_role_key
        .as_deref()
        .ok_or_else(invalid_link)?;
    let renewal_id =
        entity::billing::renewal::pay::verify_pay_token(secret, token).ok_or_else(invalid_link)?;
    let grace = span(state.settings.renewal_grace);
    let expire_after = span(state.settings.payment_expire_after);
    let start_budget = pay::start_budget(state.settings.provider_timeout);
    // At most: a stale checkout asked about, then a new one started.
    for _ in 0..3 {
        let now = state
            .bounded_db("reading the clock", entity::base::db::now(&state.db))
            .await?;
        let link = state
            .bounded_db(
                "reading the renewal",
                pay::resolve(
                    &state.db,
                    renewal_id,
                    now,
                    grace,
                    expire_after,
                    start_budget,
                ),
            )
            .await?;
        match link {
            Link::Unknown => return Err(invalid_link()),
            Link::Closed(why) => return Ok(closed_url(state, why)),
            Link::Outlived => {
                return Err(ApiError::NotFound(
                    "link_expired",
                    "this renewal's grace has ended; buy the plan again from the billing page"
                        .into(),
                ))
            }
            Link::Live(url) => return Ok(url),
            Link::Starting(p) => return wait_for_page(state, p.id).await,
            Link::Stale(p) => {
                if let Some(url) = settle_stale(state, &p).await? {
                    return Ok(url);
                }
            }
            Link::Start(r) => {
                state
                    .limit_user(
                        "payments",
                        r.user_id,
                        crate::routes::billing::payments::LIMIT_PER_WINDOW,
                        crate::routes::billing::payments::LIMIT_WINDOW,
                        Instant::now() + state.settings.dependency_timeout,
                    )
                    .await?;
                let provider = state.settings.payment_provider.as_str();
                let begun = state
                    .bounded_db(
                        "creating the payment",
                        pay::begin(&state.db, &r, provider, &state.settings.order_id_prefix),
                    )
                    .await?;
                match begun {
                    Begun::Closed => continue,
                    Begun::Existing(p) => return wait_for_page(state, p.id).await,
                    Begun::New(p) => {
                        let task = tokio::spawn(start(state.clone(), p));
                        return task
                            .await
                            .map_err(|e| ApiError::internal(format!("checkout task: {e}")))?;
                    }
                }
            }
        }
    }
    Err(ApiError::internal(
        "the renewal kept changing under the pay link",
    ))
}

/// Asks the provider about a stale checkout `p`: paid → settled, the billing
/// page saying so; unpaid or unknown → `EXPIRED` (answers `None`: make a new
/// one). 503 `provider_unavailable` when the provider cannot be asked.
async fn settle_stale(
    state: &AppState,
    p: &entity::entities::payments::Model,
) -> Result<Option<String>, ApiError> {
    let unavailable = |e: String| {
        tracing::warn!(order_id = %p.order_id, error = %e, "pay link: could not ask the provider about the last checkout");
        ApiError::Unavailable {
            code: "provider_unavailable",
            detail:
                "the payment provider could not be asked about the last checkout; try again shortly"
                    .into(),
        }
    };
    let answer = tokio::time::timeout(
        state.settings.provider_timeout,
        state.providers.status(&p.provider, &p.order_id),
    )
    .await
    .map_err(|_| unavailable("timeout".into()))?
    .map_err(|e| unavailable(e.to_string()))?;
    let reported = match answer {
        Some(r) if r.reported == PaymentStatus::Paid && r.amount == Some(p.amount) => {
            PaymentStatus::Paid
        }
        Some(r) if r.reported == PaymentStatus::Paid => {
            return Err(unavailable("the provider's amount differs".into()))
        }
        Some(r) if r.reported != PaymentStatus::Pending => r.reported,
        _ => PaymentStatus::Expired,
    };
    state
        .bounded(settlement::settle_status_check(
            &state.db,
            &p.order_id,
            reported,
            entity::billing::Terms::from_settings(&state.settings),
            None,
        ))
        .await?
        .map_err(|e| ApiError::internal(format!("settling {}: {e}", p.order_id)))?;
    Ok((reported == PaymentStatus::Paid).then(|| closed_url(state, Closed::Paid)))
}

/// Waits (up to `PROVIDER_TIMEOUT_MS`) for the checkout another click is
/// starting to get its page.
async fn wait_for_page(state: &AppState, payment_id: Uuid) -> Result<String, ApiError> {
    let until = Instant::now() + state.settings.provider_timeout;
    loop {
        let p = state
            .bounded_db("reading the payment", pay::payment(&state.db, payment_id))
            .await?;
        match p {
            Some(p) if p.status == PaymentStatus::Pending => {
                if let Some(url) = p.payment_url.filter(|u| !u.is_empty()) {
                    return Ok(url);
                }
            }
            _ => break,
        }
        if Instant::now() >= until {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(ApiError::Unavailable {
        code: "checkout_starting",
        detail: "the checkout is still being started; open the link again shortly".into(),
    })
}

/// Starts the provider checkout of the new payment `p` (bounded by
/// `PROVIDER_TIMEOUT_MS`), stores its token and page, answers the page; on
/// failure marks the payment `FAILED` and answers 502.
async fn start(state: AppState, p: entity::entities::payments::Model) -> Result<String, ApiError> {
    let email = users::Entity::find_by_id(p.user_id)
        .one(&state.db)
        .await
        .map_err(|e| crate::routes::db_error("reading the user", e))?
        .and_then(|u| u.email);
    let order = CheckoutOrder {
        order_id: p.order_id.clone(),
        amount: p.amount,
        currency: p.currency.clone(),
        plan_id: p.plan.clone(),
        plan_name: state
            .plans
            .get(&p.plan)
            .map_or_else(|| p.plan.clone(), |plan| plan.name.clone()),
        email,
        created_at: p.created_at,
    };
    let result = match tokio::time::timeout(
        state.settings.provider_timeout,
        state.providers.checkout(&order),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(worker::providers::ProviderError::Timeout),
    };
    let page = match &result {
        Ok(Checkout::ProviderA { redirect_url, .. }) if !redirect_url.is_empty() => {
            Some(redirect_url.clone())
        }
        Ok(Checkout::ProviderB { payment_url }) => Some(payment_url.clone()),
        _ => None,
    };
    let Some(page) = page else {
        let reason = match &result {
            Err(e) => e.to_string(),
            Ok(_) => "the provider gave no payment page".into(),
        };
        tracing::warn!(order_id = %p.order_id, reason, "pay link: checkout failed");
        if let Err(e) = checkout::record_failed(&state.db, &p.order_id, &reason).await {
            tracing::error!(order_id = %p.order_id, error = %e, "could not mark the payment FAILED; the expiry job will");
        }
        return Err(ApiError::BadGateway(
            "provider_error",
            "the payment provider could not start the checkout; open the link again to retry"
                .into(),
        ));
    };
    if let Ok(Checkout::ProviderA { token, .. }) = &result {
        state
            .bounded_db(
                "storing the checkout",
                checkout::record_started(&state.db, p.id, Started::Token(token)),
            )
            .await?;
    }
    state
        .bounded_db(
            "storing the checkout",
            checkout::record_started(&state.db, p.id, Started::Url(&page)),
        )
        .await?;
    tracing::info!(order_id = %p.order_id, provider = %p.provider, "pay link: checkout started");
    Ok(page)
}
