//! `GET /api/me`: the caller's account, plan and AI usage, with
//! `Cache-Control: private, no-store`. Queries live in
//! [`entity::accounts::reads`].

use chrono::{DateTime, Utc};
use entity::accounts::reads;
use poem::web::Data;
use poem_openapi::{types::Example, Object, OpenApi};
use uuid::Uuid;

use crate::{
    identity::bearer::{BearerAuth, Gate},
    problem::ApiError,
    routes::ApiTags,
    state::AppState,
};

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
    /// A rise of the plan's price the customer was told of by the
    /// `price_change` mail; `null`: none pending. The open renewal's
    /// `amount` is what the next payment bills.
    #[oai(nullable)]
    pub price_change: Option<MePriceChange>,
    /// A plan chosen by `change` and paid early, which takes over at the
    /// period end; `null`: none scheduled.
    #[oai(nullable)]
    pub scheduled_change: Option<MeScheduledChange>,
}

/// A paid change of plan waiting for the period end.
#[derive(Debug, Clone, Object)]
pub struct MeScheduledChange {
    /// The plan that takes over.
    pub plan: String,
    /// When it does: the current period end (RFC 3339, UTC); it then runs
    /// for the month paid.
    pub starts_at: DateTime<Utc>,
}

/// A price rise of the plan in force, announced by mail: renewals created
/// after `applies_after` bill `amount`, earlier ones the price of record.
#[derive(Debug, Clone, Object)]
pub struct MePriceChange {
    /// The plan whose price rises.
    pub plan: String,
    /// The new price (whole units of `currency`).
    pub amount: i64,
    /// ISO 4217 currency.
    pub currency: String,
    /// When the customer was told (RFC 3339, UTC).
    pub noticed_at: DateTime<Utc>,
    /// Renewals created from then on bill the new price
    /// (`noticed_at` plus `PRICE_CHANGE_NOTICE_DAYS`).
    pub applies_after: DateTime<Utc>,
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
                price_change: Some(MePriceChange {
                    plan: "PRO".into(),
                    amount: 129_000,
                    currency: "IDR".into(),
                    noticed_at: at("2026-12-19T10:00:00Z"),
                    applies_after: at("2027-01-18T10:00:00Z"),
                }),
                scheduled_change: None,
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

crate::private_ok!(
    /// 200 of `GET /api/me`.
    MeOk, Me, "The caller's account."
);
crate::problem_responses!(
    /// Errors of `GET /api/me`.
    MeErrorResponse {
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        InternalServerError = 500: "The account could not be read.",
        ServiceUnavailable = 503: "Auth is switched off (`feature_disabled`) or server-side writes are not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// The caller's account.
pub struct MeApi;

#[OpenApi(prefix_path = "/api")]
impl MeApi {
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
                    pay_url: crate::routes::billing::pay::pay_url(&state.settings, r.id),
                    due_at: r.period_end,
                }),
                renewal_plan: s.renewal_plan.clone(),
                price_change: entity::billing::price::Notice::of(s)
                    .filter(|n| n.plan == s.plan && s.plan != entity::base::plans::FREE)
                    .map(|n| MePriceChange {
                        plan: n.plan.to_string(),
                        amount: n.amount,
                        currency: state.plans.currency.clone(),
                        noticed_at: n.at,
                        applies_after: n.at
                            + chrono::Duration::from_std(state.settings.price_change_notice)
                                .unwrap_or(chrono::Duration::MAX),
                    }),
                scheduled_change: s
                    .scheduled_plan
                    .clone()
                    .zip(s.current_period_end)
                    .map(|(plan, starts_at)| MeScheduledChange { plan, starts_at }),
            }
        }
        _ => MeSubscription {
            plan: plan_id.clone(),
            status: "active".into(),
            current_period_end: None,
            cancel_at_period_end: false,
            renewal: None,
            renewal_plan: None,
            price_change: None,
            scheduled_change: None,
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
/// `now`, from [`crate::identity::account_cache`] where it keeps them, else from the
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
