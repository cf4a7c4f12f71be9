//! `POST /api/admin/subscriptions/grant`: an admin gives a customer a plan
//! until a date (an operator grant: zero value, audited with the reason).
//! The rule is the model's, [`entity::billing::operator::give`].

use chrono::{DateTime, Utc};
use entity::{
    base::{plans::FREE, validate::FieldError},
    billing::operator::{self, GrantError, OperatorGrant},
};
use poem::{web::Data, Request};
use poem_openapi::{payload::Json, Object, OpenApi};
use uuid::Uuid;

use crate::routes::ApiTags;
use crate::{
    identity::bearer::BearerAuth, middleware::RequestId, payload::JsonBody, problem::ApiError,
    state::AppState,
};

/// What to give.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct GrantRequest {
    /// The customer's user id (UUID).
    pub user_id: Uuid,
    /// A paid plan of the catalogue (`BASIC`, `PRO`, `ULTIMATE` by default),
    /// for sale or not.
    #[oai(validator(min_length = 1, max_length = 32))]
    pub plan: String,
    /// When the given time ends (RFC 3339). Later than now and at most ten
    /// years ahead; when it extends a running period of the same plan,
    /// later than that period's end.
    pub until: DateTime<Utc>,
    /// Why (kept in the audit trail), 1–500 characters.
    #[oai(validator(min_length = 1, max_length = 500))]
    pub reason: String,
}

impl poem_openapi::types::Example for GrantRequest {
    fn example() -> Self {
        GrantRequest {
            user_id: Uuid::from_u128(0x7f6c2c6e_1f0a_4c39_9d55_2a8f0f1b9a11),
            plan: "PRO".into(),
            until: DateTime::parse_from_rfc3339("2031-01-31T00:00:00Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            reason: "Service credit for the outage of 3 March".into(),
        }
    }
}

/// What was given.
#[derive(Debug, Clone, Object)]
pub struct GrantResult {
    /// Always `true`.
    pub success: bool,
    /// The customer's user id.
    pub user_id: String,
    /// The plan in force now.
    pub plan: String,
    /// The period's end now (`until`).
    pub current_period_end: DateTime<Utc>,
    /// Seconds given: from now, or from the old end when a running period of
    /// the plan was extended.
    pub given_seconds: i64,
    /// Whether a running period of the plan was extended (its renewals
    /// continue after `until`); `false`: the plan runs from now until
    /// `until` and then returns to FREE unless the customer resumes or pays.
    pub extended: bool,
}

crate::problem_responses!(
    /// Errors of `POST /api/admin/subscriptions/grant`.
    GrantErrorResponse {
        BadRequest = 400: "`user_id` is not a UUID, `plan` is not a paid plan of the catalogue (`invalid_plan`), `until` is not an RFC 3339 time, not in the future or more than ten years ahead (`invalid_until`), or `reason` is empty or longer than 500 characters (`field` names it).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "Logged in, but not an admin (`forbidden`).",
        NotFound = 404: "No user has this id (`unknown_user`).",
        Conflict = 409: "A paid period of another plan runs (`plan_running`), or the running period of this plan already ends at `until` or later (`not_later`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The grant could not be saved.",
        ServiceUnavailable = 503: "Auth or admin is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Operator grants.
pub struct OperatorApi;

#[OpenApi(prefix_path = "/api")]
impl OperatorApi {
    /// Give a customer a plan until a date
    ///
    /// Admins only. With no paid period running (FREE, ended, or in its
    /// renewal grace), `plan` runs from now until `until` and is set to end
    /// there (`cancel_at_period_end`: no renewal offers or reminders; the
    /// customer may resume or pay). With a period of the same plan running,
    /// its end moves out to `until` and its renewals continue after it. A
    /// period of another plan running is never replaced: 409. The given time
    /// has no money behind it: a plan change carries nothing of it and a
    /// refund takes nothing of it. Writes the change and one `audit_logs` row
    /// (`subscription.operator_grant`: actor, old and new plan and end,
    /// seconds, reason, request id) in one transaction; an open renewal
    /// offer, priced for the old end, is voided.
    #[oai(
        path = "/admin/subscriptions/grant",
        method = "post",
        operation_id = "grantSubscription",
        tag = "ApiTags::Admin"
    )]
    async fn grant(
        &self,
        state: Data<&AppState>,
        req: &Request,
        auth: BearerAuth,
        body: JsonBody<GrantRequest>,
    ) -> Result<Json<GrantResult>, GrantErrorResponse> {
        Ok(Json(
            grant_inner(&state, &auth, body.0, RequestId::of(req)).await?,
        ))
    }
}

async fn grant_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: GrantRequest,
    (request_id, client_request_id): (Option<String>, Option<String>),
) -> Result<GrantResult, ApiError> {
    let actor = state.admin_session(auth).await?;
    let plan = state
        .plans
        .get(&body.plan)
        .filter(|p| p.id != FREE)
        .ok_or_else(|| {
            FieldError::new(
                "plan",
                "invalid_plan",
                format!("plan {:?} is not a paid plan of the catalogue", body.plan),
            )
        })?;
    let until =
        |why: &str| ApiError::Field(FieldError::new("until", "invalid_until", why.to_string()));
    let grant = OperatorGrant {
        user_id: body.user_id,
        plan: plan.id.clone(),
        until: body.until,
        reason: body.reason,
    };
    let zone = entity::billing::Terms::from_settings(&state.settings).zone;
    match state
        .bounded(operator::give(
            &state.db,
            actor.user_id,
            &grant,
            zone,
            request_id,
            client_request_id,
        ))
        .await?
    {
        Ok(given) => {
            state.accounts.forget(grant.user_id);
            Ok(GrantResult {
                success: true,
                user_id: grant.user_id.to_string(),
                plan: given.plan,
                current_period_end: given.period_end,
                given_seconds: given.seconds,
                extended: given.extended,
            })
        }
        Err(GrantError::UnknownUser) => Err(ApiError::NotFound(
            "unknown_user",
            "no user has this id".into(),
        )),
        Err(GrantError::UntilPassed) => Err(until("until must be in the future")),
        Err(GrantError::UntilTooFar) => Err(until("until must be at most ten years ahead")),
        Err(e @ GrantError::NotLater(_)) => Err(ApiError::Conflict("not_later", e.to_string())),
        Err(e @ GrantError::OtherPlanRunning { .. }) => {
            Err(ApiError::Conflict("plan_running", e.to_string()))
        }
        Err(GrantError::Db(e)) => Err(crate::routes::db_error("giving the plan", e)),
    }
}
