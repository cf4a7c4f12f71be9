//! `POST /api/subscription`: cancel, resume or change the caller's subscription.

use entity::{
    base::validate::FieldError,
    billing::subscription::{self, SubscriptionAction, SubscriptionError},
    Feature,
};
use poem::{web::Data, Request};
use poem_openapi::{payload::Json, Enum, Object, OpenApi};

use crate::routes::ApiTags;
use crate::{
    identity::bearer::{BearerAuth, Gate},
    middleware::RequestId,
    payload::JsonBody,
    problem::ApiError,
    state::AppState,
};

/// What to do with the subscription: `cancel` (stop at the end of the paid
/// period), `resume` (undo a cancel) or `change` (bill another plan at the
/// next renewal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "lowercase")]
pub enum Action {
    /// Stop at the end of the paid period.
    Cancel,
    /// Undo a cancel.
    Resume,
    /// Bill `plan` at the next renewal.
    Change,
}

/// What to do with the subscription.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct SubscriptionRequest {
    /// `cancel` (stop at the end of the paid period), `resume` (undo a
    /// cancel) or `change` (the next renewal bills `plan`).
    pub action: Action,
    /// With `change` only, and required there: a plan the catalogue sells
    /// (the current plan undoes an earlier change).
    #[oai(validator(min_length = 1, max_length = 32))]
    pub plan: Option<String>,
}

impl poem_openapi::types::Example for SubscriptionRequest {
    fn example() -> Self {
        SubscriptionRequest {
            action: Action::Cancel,
            plan: None,
        }
    }
}

/// The subscription after the change.
#[derive(Debug, Clone, Object)]
pub struct SubscriptionResult {
    /// Always `true`.
    pub success: bool,
    /// `cancel_at_period_end` while cancelling (after cancel), else the
    /// subscription's status: `active` (after resume), or `past_due` in its
    /// renewal grace.
    pub status: String,
    /// The plan the next renewal bills when `change` chose another one than
    /// the current plan; `null`: the current plan.
    #[oai(nullable)]
    pub renewal_plan: Option<String>,
}

crate::problem_responses!(
    /// Errors of `POST /api/subscription`.
    SubscriptionErrorResponse {
        BadRequest = 400: "`action` is missing or not `cancel`/`resume`/`change` (`field` = `action`); `plan` missing with `change`, given with another action, or not for sale (`invalid_plan`, `field` = `plan`); or the body is not the expected JSON.",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Conflict = 409: "Nothing to cancel, resume or change: the FREE plan (`free_plan`) or a subscription that is not active (`not_active`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The change could not be saved.",
        ServiceUnavailable = 503: "Auth or billing is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Subscription management.
pub struct SubscriptionApi;

#[OpenApi(prefix_path = "/api")]
impl SubscriptionApi {
    /// Cancel, resume or change the subscription
    ///
    /// `cancel` keeps the plan until the end of the paid period
    /// (`cancel_at_period_end`) and voids the open renewal; `resume` undoes
    /// that. `change` with `plan` makes the next renewal bill that plan
    /// (`renewal_plan`; the current plan undoes it): the plan in force and
    /// its period do not change now; the open renewal is replaced by one for
    /// the new plan. Paid before the period end, it is a scheduled phase:
    /// the new plan runs from the old end for the month paid
    /// (`GET /api/me`'s `subscription.scheduled_change`); paid in grace, from
    /// the old end at once (see "Plan changes" in docs/billing.md). While a
    /// phase is scheduled, `change` chooses the plan after it.
    /// Repeating the same action is harmless. The FREE plan has nothing to
    /// cancel or change: 409. A move that changed something writes one
    /// `audit_logs` row (`subscription.cancel`, `subscription.resume` or
    /// `subscription.change`; actor = the caller, with the request ids).
    #[oai(
        path = "/subscription",
        method = "post",
        operation_id = "changeSubscription",
        tag = "ApiTags::User"
    )]
    async fn change(
        &self,
        state: Data<&AppState>,
        req: &Request,
        auth: BearerAuth,
        body: JsonBody<SubscriptionRequest>,
    ) -> Result<Json<SubscriptionResult>, SubscriptionErrorResponse> {
        Ok(Json(
            change_inner(&state, &auth, &body, RequestId::of(req)).await?,
        ))
    }
}

/// The move `body` asks for, checked against the catalogue in force.
fn parse(state: &AppState, body: &SubscriptionRequest) -> Result<Move, ApiError> {
    let no_plan = || {
        ApiError::Field(FieldError::new(
            "plan",
            "invalid_plan",
            "plan goes with action \"change\" only",
        ))
    };
    match (body.action, body.plan.as_deref()) {
        (Action::Cancel, None) => Ok(Move::Flag(SubscriptionAction::Cancel)),
        (Action::Resume, None) => Ok(Move::Flag(SubscriptionAction::Resume)),
        (Action::Cancel | Action::Resume, Some(_)) => Err(no_plan()),
        (Action::Change, None) => Err(ApiError::Field(FieldError::new(
            "plan",
            "invalid_plan",
            "action \"change\" needs the plan the next renewal bills",
        ))),
        (Action::Change, Some(p)) => match state.plans.purchasable(p) {
            Some(plan) => Ok(Move::Change(plan.id.clone())),
            None => Err(ApiError::Field(FieldError::new(
                "plan",
                "invalid_plan",
                format!("plan {p:?} is not for sale"),
            ))),
        },
    }
}

/// A parsed request.
enum Move {
    /// Cancel or resume.
    Flag(SubscriptionAction),
    /// The plan the next renewal bills.
    Change(String),
}

async fn change_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: &SubscriptionRequest,
    (request_id, client_request_id): (Option<String>, Option<String>),
) -> Result<SubscriptionResult, ApiError> {
    let user = state.session(auth, Gate::Feature(Feature::Billing)).await?;
    let ids = subscription::RequestIds {
        request_id,
        client_request_id,
    };
    let outcome = match parse(state, body)? {
        Move::Flag(action) => {
            state
                .bounded(subscription::change(&state.db, user.user_id, action, ids))
                .await?
        }
        Move::Change(plan) => {
            let policy = entity::billing::renewal::Policy::from_settings(&state.settings);
            state
                .bounded(subscription::choose_renewal_plan(
                    &state.db,
                    user.user_id,
                    &plan,
                    &policy,
                    &state.plans,
                    ids,
                ))
                .await?
        }
    };
    match outcome {
        Ok(view) => {
            state.accounts.forget(user.user_id);
            Ok(SubscriptionResult {
                success: true,
                status: view.status.to_string(),
                renewal_plan: view.renewal_plan,
            })
        }
        Err(SubscriptionError::FreePlan) => Err(ApiError::Conflict(
            "free_plan",
            "the FREE plan has nothing to cancel or resume".into(),
        )),
        Err(e @ SubscriptionError::NotActive(_)) => {
            Err(ApiError::Conflict("not_active", e.to_string()))
        }
        Err(SubscriptionError::NotFound) => Err(ApiError::Conflict(
            "no_subscription",
            "no subscription".into(),
        )),
        Err(SubscriptionError::Db(e)) => {
            Err(crate::routes::db_error("changing the subscription", e))
        }
    }
}
