//! Admin reads: `GET /api/admin/users` (search by email, with role and plan)
//! and `GET /api/admin/audit-logs` (filter by actor and action). Same gate
//! as the admin writes; lists page as every list ([`entity::base::page`]).

use chrono::{DateTime, Utc};
use entity::{accounts::reads, entities::audit_logs};
use poem::web::Data;
use poem_openapi::{param::Query, types::Example, Object, OpenApi};
use serde_json::Value;
use uuid::Uuid;

use crate::routes::{
    page::{page_params, ListCursor},
    ApiTags,
};
use crate::{
    identity::bearer::BearerAuth,
    pattern::{Matching, NoNul},
    problem::ApiError,
    state::AppState,
};

/// One user of the admin list.
#[derive(Debug, Clone, Object)]
pub struct AdminUser {
    /// User id.
    pub id: Uuid,
    /// Email, if known.
    #[oai(nullable)]
    pub email: Option<String>,
    /// `admin` or `member`.
    pub role: String,
    /// The plan in force (`FREE` unless an active subscription says otherwise).
    pub plan: String,
    /// The subscription's status (`active`, `cancel_at_period_end`, `canceled`,
    /// `past_due`); `null` when the user never had a subscription row.
    #[oai(nullable)]
    pub subscription_status: Option<String>,
    /// End of the paid period (RFC 3339, UTC), if any.
    #[oai(nullable)]
    pub current_period_end: Option<DateTime<Utc>>,
    /// When the account was first seen (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
}

/// A page of users, newest first.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct AdminUserPage {
    /// The users.
    pub items: Vec<AdminUser>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[oai(nullable)]
    pub next_cursor: Option<String>,
}

impl Example for AdminUserPage {
    fn example() -> Self {
        AdminUserPage {
            items: vec![AdminUser {
                id: Uuid::from_u128(0x7f6c2c6e_1f0a_4c39_9d55_2a8f0f1b9a11),
                email: Some("ann@example.com".into()),
                role: "member".into(),
                plan: "PRO".into(),
                subscription_status: Some("active".into()),
                current_period_end: Some("2026-12-26T10:00:00Z".parse().expect("example date")),
                created_at: "2026-11-01T08:30:00Z".parse().expect("example date"),
            }],
            next_cursor: Some("1764150400000000.0193b3dc56b07000a0f1e2d3c4b5a697".into()),
        }
    }
}

/// One audit-log row.
#[derive(Debug, Clone, Object)]
pub struct AuditLogItem {
    /// Row id.
    pub id: Uuid,
    /// Acting user; `null` for the system (webhooks, jobs).
    #[oai(nullable)]
    pub actor_id: Option<Uuid>,
    /// What happened, `<object>.<verb>` (`role.change`, `payment.settle`, …).
    pub action: String,
    /// Kind of object acted on (`user`, `payment`, `queue`).
    pub target_type: String,
    /// Id of the object acted on.
    pub target_id: String,
    /// State before, if relevant.
    #[oai(nullable)]
    pub old_value: Option<Value>,
    /// State after, if relevant.
    #[oai(nullable)]
    pub new_value: Option<Value>,
    /// The server's id of the request or job that did it.
    #[oai(nullable)]
    pub request_id: Option<String>,
    /// The `x-request-id` the client sent, if any.
    #[oai(nullable)]
    pub client_request_id: Option<String>,
    /// When it happened (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
}

impl From<audit_logs::Model> for AuditLogItem {
    fn from(a: audit_logs::Model) -> Self {
        AuditLogItem {
            id: a.id,
            actor_id: a.actor_id,
            action: a.action,
            target_type: a.target_type,
            target_id: a.target_id,
            old_value: a.old_value,
            new_value: a.new_value,
            request_id: a.request_id,
            client_request_id: a.client_request_id,
            created_at: a.created_at,
        }
    }
}

/// A page of audit-log rows, newest first.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct AuditLogPage {
    /// The rows.
    pub items: Vec<AuditLogItem>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[oai(nullable)]
    pub next_cursor: Option<String>,
}

impl Example for AuditLogPage {
    fn example() -> Self {
        AuditLogPage {
            items: vec![AuditLogItem {
                id: Uuid::from_u128(0x0193b3dc_56b0_7000_a0f1_e2d3c4b5a697),
                actor_id: Some(Uuid::from_u128(0x7f6c2c6e_1f0a_4c39_9d55_2a8f0f1b9a11)),
                action: "role.change".into(),
                target_type: "user".into(),
                target_id: "3b1f8a52-4c1e-4d7a-9a55-0c7e2f1d9b10".into(),
                old_value: Some(serde_json::json!({"role": "member"})),
                new_value: Some(serde_json::json!({"role": "admin"})),
                request_id: Some("01JD5X9Q6Z8K4M2N7P3R5T1V9W".into()),
                client_request_id: None,
                created_at: "2026-11-26T10:00:00Z".parse().expect("example date"),
            }],
            next_cursor: None,
        }
    }
}

crate::private_ok!(
    /// 200 of `GET /api/admin/users`.
    AdminUserPageOk, AdminUserPage, "A page of users, newest first."
);
crate::private_ok!(
    /// 200 of `GET /api/admin/audit-logs`.
    AuditLogPageOk, AuditLogPage, "A page of audit-log rows, newest first."
);

crate::problem_responses!(
    /// Errors of the admin lists.
    AdminListErrorResponse {
        BadRequest = 400: "`cursor` is not a `next_cursor` of this list, `limit` is not 1–100, or `actor` is not a UUID (`field` names it).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "Logged in, but not an admin (`forbidden`).",
        InternalServerError = 500: "The list could not be read.",
        ServiceUnavailable = 503: "Auth or admin is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Admin reads.
pub struct AdminReadApi;

#[OpenApi(prefix_path = "/api")]
impl AdminReadApi {
    /// List users
    ///
    /// Admins only. Newest first, `limit` (default 20, at most 100) at a
    /// time; `query` keeps the users whose email contains it (ignoring case).
    /// Each with role and plan in force.
    #[oai(
        path = "/admin/users",
        method = "get",
        operation_id = "listUsers",
        tag = "ApiTags::Admin"
    )]
    async fn users(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// Part of an email (ignoring case); no NUL.
        query: Query<Option<Matching<NoNul>>>,
        /// `next_cursor` of the previous page; absent or empty: the first
        /// page.
        cursor: Query<Option<Matching<ListCursor>>>,
        /// Page size, 1–100 (default 20).
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))]
        limit: Query<Option<u64>>,
    ) -> Result<AdminUserPageOk, AdminListErrorResponse> {
        Ok(AdminUserPageOk::private(
            users_inner(
                &state,
                &auth,
                query.0.as_deref(),
                cursor.0.as_deref(),
                limit.0,
            )
            .await?,
        ))
    }

    /// List audit logs
    ///
    /// Admins only. Newest first, `limit` (default 20, at most 100) at a
    /// time, optionally of one `actor` (user id) and one `action`.
    #[oai(
        path = "/admin/audit-logs",
        method = "get",
        operation_id = "listAuditLogs",
        tag = "ApiTags::Admin"
    )]
    async fn audit_logs(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        /// The acting user's id (UUID).
        actor: Query<Option<Uuid>>,
        /// The action, e.g. `role.change`.
        action: Query<Option<String>>,
        /// `next_cursor` of the previous page; absent or empty: the first
        /// page.
        cursor: Query<Option<Matching<ListCursor>>>,
        /// Page size, 1–100 (default 20).
        #[oai(validator(minimum(value = "1"), maximum(value = "100")))]
        limit: Query<Option<u64>>,
    ) -> Result<AuditLogPageOk, AdminListErrorResponse> {
        Ok(AuditLogPageOk::private(
            audit_inner(
                &state,
                &auth,
                actor.0,
                action.0.as_deref(),
                cursor.0.as_deref(),
                limit.0,
            )
            .await?,
        ))
    }
}

async fn admin(state: &AppState, auth: &BearerAuth) -> Result<(), ApiError> {
    state.admin_session(auth).await.map(|_| ())
}

async fn users_inner(
    state: &AppState,
    auth: &BearerAuth,
    query: Option<&str>,
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<AdminUserPage, ApiError> {
    admin(state, auth).await?;
    let (cursor, limit) = page_params(cursor, limit)?;
    if let Some(q) = query {
        entity::base::validate::no_nul("query", q)?;
    }
    let page = state
        .bounded_db(
            "listing users",
            reads::users(&state.db, query, cursor, limit),
        )
        .await?;
    Ok(AdminUserPage {
        next_cursor: page.next.map(|c| c.encode()),
        items: page
            .items
            .into_iter()
            .map(|row| AdminUser {
                id: row.user.id,
                email: row.user.email,
                role: row.role.as_str().to_string(),
                plan: row.plan,
                subscription_status: row.subscription.as_ref().map(|s| {
                    entity::billing::subscription::SubscriptionView::from(s)
                        .status
                        .to_string()
                }),
                current_period_end: row.subscription.and_then(|s| s.current_period_end),
                created_at: row.user.created_at,
            })
            .collect(),
    })
}

async fn audit_inner(
    state: &AppState,
    auth: &BearerAuth,
    actor: Option<Uuid>,
    action: Option<&str>,
    cursor: Option<&str>,
    limit: Option<u64>,
) -> Result<AuditLogPage, ApiError> {
    admin(state, auth).await?;
    let (cursor, limit) = page_params(cursor, limit)?;
    if let Some(a) = action {
        entity::base::validate::no_nul("action", a)?;
    }
    let page = state
        .bounded_db(
            "listing audit logs",
            entity::ops::audit_log::audit_logs(&state.db, actor, action, cursor, limit),
        )
        .await?;
    Ok(AuditLogPage {
        next_cursor: page.next.map(|c| c.encode()),
        items: page.items.into_iter().map(AuditLogItem::from).collect(),
    })
}
