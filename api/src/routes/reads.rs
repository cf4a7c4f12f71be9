//! The read API a frontend needs: `GET /api/plans` (public price list),
//! `GET /api/me` (the caller's account, plan and AI usage),
//! `GET /api/payments` and `GET /api/payments/{order_id}` (the caller's own
//! payments). Personal answers carry `Cache-Control: private, no-store`.
//! Queries live in [`entity::accounts::reads`]; the lists page with [`entity::base::page`].

use chrono::{DateTime, Utc};
use entity::{
    accounts::reads,
    base::page::{self, Cursor},
    entities::payments,
    Feature,
};
use poem::web::Data;
use poem_openapi::{
    param::{Header, Path, Query},
    payload::Json,
    types::Example,
    ApiResponse, Object, OpenApi,
};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::ApiTags;
use crate::{
    auth::{BearerAuth, Gate},
    pattern::Matching,
    problem::ApiError,
    state::AppState,
};

/// `Cache-Control` of every personal read.
pub const PRIVATE: &str = "private, no-store";
/// `Cache-Control` of the public price list (revalidate with `If-None-Match`).
pub const PLANS_CACHE: &str = "public, max-age=60";

/// One plan of the catalogue.
#[derive(Debug, Clone, Object, serde::Serialize)]
pub struct PlanItem {
    /// Plan id (`FREE`, `BASIC`, `PRO`, `ULTIMATE`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Monthly price in whole units of `currency`; 0 for FREE.
    pub price: i64,
    /// Whether `POST /api/payments` sells it (FREE is not sold).
    pub purchasable: bool,
    /// AI requests allowed per 5-minute window.
    pub ai_requests_per_5min: u32,
    /// AI tokens (input + output) per calendar month (UTC); `null` = unlimited.
    #[oai(nullable)]
    pub ai_tokens_per_month: Option<u64>,
}

/// The price list.
#[derive(Debug, Clone, Object, serde::Serialize)]
#[oai(example)]
pub struct PlanList {
    /// ISO 4217 currency of every price (`IDR`).
    pub currency: String,
    /// Every plan, FREE first, in catalogue order.
    pub plans: Vec<PlanItem>,
}

impl Example for PlanList {
    fn example() -> Self {
        PlanList {
            currency: "IDR".into(),
            plans: vec![
                PlanItem {
                    id: "FREE".into(),
                    name: "Free".into(),
                    price: 0,
                    purchasable: false,
                    ai_requests_per_5min: 5,
                    ai_tokens_per_month: Some(20_000),
                },
                PlanItem {
                    id: "PRO".into(),
                    name: "Pro".into(),
                    price: 99_000,
                    purchasable: true,
                    ai_requests_per_5min: 60,
                    ai_tokens_per_month: Some(1_000_000),
                },
            ],
        }
    }
}

/// Answers of `GET /api/plans`.
#[derive(Debug, ApiResponse)]
pub enum PlansResponse {
    /// The price list.
    #[oai(status = 200)]
    Ok(
        Json<PlanList>,
        /// Entity tag of this list; send it back in `If-None-Match`.
        #[oai(header = "ETag")]
        String,
        /// `public, max-age=60`.
        #[oai(header = "Cache-Control")]
        String,
    ),
    /// `If-None-Match` named the current `ETag`: nothing changed.
    #[oai(status = 304)]
    NotModified(
        /// The current entity tag.
        #[oai(header = "ETag")]
        String,
        /// `public, max-age=60`.
        #[oai(header = "Cache-Control")]
        String,
    ),
}

/// The caller's profile (`null` for a field never set).
#[derive(Debug, Clone, Object)]
#[oai(nullable_all)]
pub struct MeProfile {
    /// Display name.
    #[oai(nullable)]
    pub full_name: Option<String>,
    /// Object key of the avatar (`<user id>/avatar`).
    #[oai(nullable)]
    pub avatar_path: Option<String>,
    /// Public URL of the avatar.
    #[oai(nullable)]
    pub avatar_url: Option<String>,
}

/// The renewal offered for the current period (a record, not a payment:
/// the payment is made through `pay_url`).
#[derive(Debug, Clone, Object)]
pub struct MeRenewal {
    /// The plan it bills.
    pub plan: String,
    /// The amount, fixed when the renewal was created, in whole units of `currency`.
    pub amount: i64,
    /// ISO 4217 currency.
    pub currency: String,
    /// The pay link (`GET /api/payments/pay/{token}`, no session needed);
    /// `null` when the server has no `BACKEND_SERVICE_ROLE_KEY` to sign it.
    #[oai(nullable)]
    pub pay_url: Option<String>,
    /// When it is due: the current period end (RFC 3339, UTC).
    pub due_at: DateTime<Utc>,
}

/// The caller's subscription.
#[derive(Debug, Clone, Object)]
pub struct MeSubscription {
    /// The plan in force: the subscription's plan while it is active
    /// (also when it stops at period end) or in its renewal grace
    /// (`past_due`), else `FREE`.
    pub plan: String,
    /// The subscription's status: `active`, `cancel_at_period_end`,
    /// `canceled` (then `plan` is `FREE`) or `past_due` (the period ended
    /// unpaid; the plan stays in force until the grace ends); `active` for
    /// a user who never subscribed.
    pub status: String,
    /// The paid period ends then (RFC 3339, UTC); `null` on FREE.
    #[oai(nullable)]
    pub current_period_end: Option<DateTime<Utc>>,
    /// Whether it stops at the end of the paid period.
    pub cancel_at_period_end: bool,
    /// The open renewal of the current period; `null` when none is open
    /// (FREE, cancelling, not yet due, or paid).
    #[oai(nullable)]
    pub renewal: Option<MeRenewal>,
    /// The plan the next renewal bills when the customer chose another one
    /// (`POST /api/subscription {"action": "change"}`); `null`: the current
    /// plan.
    #[oai(nullable)]
    pub renewal_plan: Option<String>,
}

/// This month's AI usage against the plan's quota.
#[derive(Debug, Clone, Object)]
pub struct MeAiUsage {
    /// Tokens (input + output) recorded this calendar month (UTC).
    pub tokens_used: u64,
    /// The plan's monthly tokens; `null` = unlimited.
    #[oai(nullable)]
    pub tokens_limit: Option<u64>,
    /// Tokens left this month; `null` = unlimited.
    #[oai(nullable)]
    pub tokens_remaining: Option<u64>,
    /// AI requests allowed per 5-minute window on this plan.
    pub requests_per_5min: u32,
    /// When the monthly quota resets (first instant of next month, UTC).
    pub resets_at: DateTime<Utc>,
}

/// The caller's account.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct Me {
    /// User id (the session's `sub`).
    pub id: Uuid,
    /// Email, if known.
    #[oai(nullable)]
    pub email: Option<String>,
    /// `admin` or `member`.
    pub role: String,
    /// Profile fields.
    pub profile: MeProfile,
    /// Subscription and plan.
    pub subscription: MeSubscription,
    /// AI usage this month and the limits in force.
    pub ai_usage: MeAiUsage,
}

impl Example for Me {
    fn example() -> Self {
        let at = |s: &str| s.parse::<DateTime<Utc>>().expect("example date");
        Me {
            id: Uuid::from_u128(0x7f6c2c6e_1f0a_4c39_9d55_2a8f0f1b9a11),
            email: Some("ann@example.com".into()),
            role: "member".into(),
            profile: MeProfile {
                full_name: Some("Ann Lee".into()),
                avatar_path: Some("7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar".into()),
                avatar_url: Some(
                    "https://api.example.com/storage/v1/object/public/avatars/7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar"
                        .into(),
                ),
            },
            subscription: MeSubscription {
                plan: "PRO".into(),
                status: "active".into(),
                current_period_end: Some(at("2026-12-26T10:00:00Z")),
                cancel_at_period_end: false,
                renewal: Some(MeRenewal {
                    plan: "PRO".into(),
                    amount: 99_000,
                    currency: "IDR".into(),
                    pay_url: Some(
                        "https://api.example.com/api/payments/pay/0192f0c4d2a87c3e9f1a2b3c4d5e6f70.q1Yx8y5u0mYQ6r0d2m3D6l0J8pQ0yH1nRk2vA3wZ9cE"
                            .into(),
                    ),
                    due_at: at("2026-12-26T10:00:00Z"),
                }),
                renewal_plan: None,
            },
            ai_usage: MeAiUsage {
                tokens_used: 1_234,
                tokens_limit: Some(1_000_000),
                tokens_remaining: Some(998_766),
                requests_per_5min: 60,
                resets_at: at("2026-12-01T00:00:00Z"),
            },
        }
    }
}

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
        }
    }
}

impl From<payments::Model> for PaymentItem {
    fn from(p: payments::Model) -> Self {
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

/// Declares a 200 answer with `Cache-Control: private, no-store`.
#[macro_export]
macro_rules! private_ok {
    ($(#[$meta:meta])* $name:ident, $payload:ty, $desc:literal) => {
        $(#[$meta])*
        #[derive(Debug, poem_openapi::ApiResponse)]
        pub enum $name {
            #[doc = $desc]
            #[oai(status = 200)]
            Ok(
                poem_openapi::payload::Json<$payload>,
                /// `private, no-store`: personal data, never cached by a shared cache.
                #[oai(header = "Cache-Control")]
                String,
            ),
        }

        impl $name {
            /// The answer with `Cache-Control: private, no-store`.
            pub fn private(body: $payload) -> Self {
                $name::Ok(poem_openapi::payload::Json(body), $crate::routes::reads::PRIVATE.to_string())
            }
        }
    };
}

private_ok!(
    /// 200 of `GET /api/me`.
    MeOk, Me, "The caller's account."
);
private_ok!(
    /// 200 of `GET /api/payments`.
    PaymentPageOk, PaymentPage, "A page of the caller's payments, newest first."
);
private_ok!(
    /// 200 of `GET /api/payments/{order_id}`.
    PaymentOk, PaymentItem, "The payment."
);

crate::problem_responses!(
    /// Errors of `GET /api/me`.
    MeErrorResponse {
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        InternalServerError = 500: "The account could not be read.",
        ServiceUnavailable = 503: "Auth is switched off (`feature_disabled`) or server-side writes are not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
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

/// The caller's reads.
pub struct ReadApi;

#[OpenApi(prefix_path = "/api")]
impl ReadApi {
    /// The price list
    ///
    /// Public. The plan catalogue for a pricing page, with an `ETag`; a
    /// request with `If-None-Match` naming it gets 304 without a body.
    #[oai(
        path = "/plans",
        method = "get",
        operation_id = "listPlans",
        tag = "ApiTags::Public"
    )]
    async fn plans(
        &self,
        state: Data<&AppState>,
        /// An `ETag` of an earlier answer (or several, comma-separated).
        #[oai(name = "If-None-Match")]
        if_none_match: Header<Option<String>>,
    ) -> PlansResponse {
        let (list, etag) = plan_list(&state);
        if if_none_match
            .0
            .as_deref()
            .is_some_and(|h| etag_matches(h, &etag))
        {
            PlansResponse::NotModified(etag, PLANS_CACHE.into())
        } else {
            PlansResponse::Ok(Json(list), etag, PLANS_CACHE.into())
        }
    }

    /// The caller's account
    ///
    /// Id, email, role, profile, subscription (plan in force, status, period
    /// end, cancel at period end) and this month's AI usage against the
    /// plan's quota, with the limits in force.
    #[oai(
        path = "/me",
        method = "get",
        operation_id = "getMe",
        tag = "ApiTags::User"
    )]
    async fn me(&self, state: Data<&AppState>, auth: BearerAuth) -> Result<MeOk, MeErrorResponse> {
        Ok(MeOk::private(me_inner(&state, &auth).await?))
    }

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

/// The price list and its entity tag (a hash of its JSON).
fn plan_list(state: &AppState) -> (PlanList, String) {
    let list = PlanList {
        currency: state.plans.currency.clone(),
        plans: state
            .plans
            .plans
            .iter()
            .map(|p| PlanItem {
                id: p.id.clone(),
                name: p.name.clone(),
                price: p.price,
                purchasable: p.purchasable,
                ai_requests_per_5min: p.ai_requests_per_5min,
                ai_tokens_per_month: p.ai_tokens_per_month,
            })
            .collect(),
    };
    let json = serde_json::to_vec(&list).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let etag = format!("\"{}\"", hex(&digest[..16]));
    (list, etag)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `If-None-Match` (weak comparison, RFC 9110 §13.1.2): `*` or any listed
/// tag equal to `etag`, `W/` ignored.
fn etag_matches(header: &str, etag: &str) -> bool {
    header.split(',').map(str::trim).any(|t| {
        t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag.strip_prefix("W/").unwrap_or(etag)
    })
}

async fn me_inner(state: &AppState, auth: &BearerAuth) -> Result<Me, ApiError> {
    // The plan in force comes with the session (the same subscription row
    // the details show, kept and dropped with them).
    let (user, plan_id) = state.session_with_plan(auth, Gate::ServerWrites).await?;
    let now = Utc::now();
    let (details, used) = account_of(state, user.user_id, now).await?;
    let plan = state
        .plans
        .get(&plan_id)
        .or_else(|| state.plans.get(entity::base::plans::FREE))
        .ok_or_else(|| ApiError::internal("the plan catalogue has no FREE plan"))?;
    let profile = profile_view(details.profile);
    let subscription = match &details.subscription {
        Some(s) => {
            let view = entity::billing::subscription::SubscriptionView::from(s);
            MeSubscription {
                plan: plan_id.clone(),
                status: view.status.to_string(),
                current_period_end: s.current_period_end,
                cancel_at_period_end: s.cancel_at_period_end,
                renewal: details.renewal.as_ref().map(|r| MeRenewal {
                    plan: r.plan.clone(),
                    amount: r.amount,
                    currency: r.currency.clone(),
                    pay_url: super::pay::pay_url(&state.settings, r.id),
                    due_at: r.period_end,
                }),
                renewal_plan: s.renewal_plan.clone(),
            }
        }
        _ => MeSubscription {
            plan: plan_id.clone(),
            status: "active".into(),
            current_period_end: None,
            cancel_at_period_end: false,
            renewal: None,
            renewal_plan: None,
        },
    };
    Ok(Me {
        id: user.user_id,
        email: user.email,
        role: user.role.as_str().to_string(),
        profile,
        subscription,
        ai_usage: MeAiUsage {
            tokens_used: used,
            tokens_limit: plan.ai_tokens_per_month,
            tokens_remaining: plan.ai_tokens_per_month.map(|l| l.saturating_sub(used)),
            requests_per_5min: plan.ai_requests_per_5min,
            resets_at: entity::ai::limits::next_month_start(now),
        },
    })
}

/// `user_id`'s profile and subscription rows and AI tokens of the month of
/// `now`, from [`crate::account_cache`] where it keeps them, else from the
/// database (then kept).
async fn account_of(
    state: &AppState,
    user_id: Uuid,
    now: DateTime<Utc>,
) -> Result<(reads::Details, u64), ApiError> {
    let cache = &state.accounts;
    let month = entity::ai::limits::month_start(now);
    let details = match cache.details(user_id) {
        Some(d) => d,
        None => {
            let ticket = cache.ticket();
            let d = state
                .bounded_db("reading the account", reads::details(&state.db, user_id))
                .await?;
            cache.put_details(ticket, user_id, &d);
            d
        }
    };
    let used = match cache.usage(user_id, month) {
        Some(u) => u,
        None => {
            let ticket = cache.ticket();
            let u = state
                .bounded_db(
                    "reading the AI usage",
                    entity::ai::limits::tokens_this_month(&state.db, user_id, now),
                )
                .await?;
            cache.put_usage(ticket, user_id, month, u);
            u
        }
    };
    Ok((details, used))
}

fn profile_view(p: Option<entity::entities::profiles::Model>) -> MeProfile {
    match p {
        Some(p) => MeProfile {
            full_name: p.full_name,
            avatar_path: p.avatar_path,
            avatar_url: p.avatar_url,
        },
        None => MeProfile {
            full_name: None,
            avatar_path: None,
            avatar_url: None,
        },
    }
}

/// The `cursor` of the read API's lists: [`page::CURSOR_PATTERN`] in the
/// schema, so a cursor the schema admits is a position (or empty: the first
/// page); another is 400 naming `cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListCursor;

impl crate::pattern::Pattern for ListCursor {
    const PATTERN: &'static str = page::CURSOR_PATTERN;
    fn regex() -> &'static regex::Regex {
        static RE: std::sync::LazyLock<&'static regex::Regex> = std::sync::LazyLock::new(|| {
            crate::pattern::compiled(page::CURSOR_PATTERN).expect("the cursor pattern compiles")
        });
        *RE
    }
}

/// Parses the `cursor` and `limit` of a list (400 naming the one at fault);
/// an empty cursor is the first page.
pub fn page_params(
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<(Option<Cursor>, u64), ApiError> {
    let cursor = cursor.map(Cursor::decode).transpose()?.flatten();
    Ok((cursor, page::limit(limit)?))
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

/// The read API as one OpenAPI object ([`ReadApi`] and
/// [`super::admin_reads::AdminReadApi`]): poem-openapi's tuples of APIs stop
/// at 16 members.
pub struct ReadApis;

type ReadPair = (ReadApi, super::admin_reads::AdminReadApi);

impl OpenApi for ReadApis {
    fn meta() -> Vec<poem_openapi::registry::MetaApi> {
        ReadPair::meta()
    }

    fn register(registry: &mut poem_openapi::registry::Registry) {
        ReadPair::register(registry);
    }

    fn add_routes(
        self,
        route_table: &mut std::collections::HashMap<
            String,
            std::collections::HashMap<poem::http::Method, poem::endpoint::BoxEndpoint<'static>>,
        >,
    ) {
        (ReadApi, super::admin_reads::AdminReadApi).add_routes(route_table);
    }
}

/// A set of APIs whose document lists each path once: poem-openapi writes
/// one `paths` entry per API object, so a path served by two objects
/// (`POST /api/payments` and `GET /api/payments`) would keep only the last
/// one's operations. The routes themselves are merged by poem-openapi.
pub struct MergePaths<T>(pub T);

impl<T: OpenApi> OpenApi for MergePaths<T> {
    fn meta() -> Vec<poem_openapi::registry::MetaApi> {
        let mut metas = T::meta();
        let mut first: std::collections::HashMap<String, (usize, usize)> = Default::default();
        let mut moved = Vec::new();
        for (a, api) in metas.iter_mut().enumerate() {
            let mut kept = Vec::new();
            for path in std::mem::take(&mut api.paths) {
                match first.get(&path.path) {
                    Some(&at) => moved.push((at, path.operations)),
                    None => {
                        first.insert(path.path.clone(), (a, kept.len()));
                        kept.push(path);
                    }
                }
            }
            api.paths = kept;
        }
        for ((a, p), operations) in moved {
            metas[a].paths[p].operations.extend(operations);
        }
        metas
    }

    fn register(registry: &mut poem_openapi::registry::Registry) {
        T::register(registry);
    }

    fn add_routes(
        self,
        route_table: &mut std::collections::HashMap<
            String,
            std::collections::HashMap<poem::http::Method, poem::endpoint::BoxEndpoint<'static>>,
        >,
    ) {
        self.0.add_routes(route_table);
    }
}

#[cfg(test)]
mod tests {
    use super::etag_matches;

    #[test]
    fn if_none_match() {
        let e = "\"abc\"";
        assert!(etag_matches("\"abc\"", e));
        assert!(etag_matches("W/\"abc\"", e));
        assert!(etag_matches("\"x\", \"abc\"", e));
        assert!(etag_matches("*", e));
        assert!(!etag_matches("\"abcd\"", e));
        assert!(!etag_matches("abc", e));
    }
}
