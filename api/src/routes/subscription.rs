//! `POST /api/subscription`: cancel or resume the caller's subscription.

use entity::{
    subscription::{self, SubscriptionAction, SubscriptionError},
    Feature,
};
use poem::web::Data;
use poem_openapi::{payload::Json, Enum, Object, OpenApi};

use super::ApiTags;
use crate::{
    auth::{BearerAuth, Gate},
    payload::JsonBody,
    problem::ApiError,
    state::AppState,
};

/// What to do with the subscription: `cancel` (stop at the end of the paid
/// period) or `resume` (undo a cancel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "lowercase")]
pub enum Action {
    /// Stop at the end of the paid period.
    Cancel,
    /// Undo a cancel.
    Resume,
}

impl From<Action> for SubscriptionAction {
    fn from(a: Action) -> Self {
        match a {
            Action::Cancel => SubscriptionAction::Cancel,
            Action::Resume => SubscriptionAction::Resume,
        }
    }
}

/// What to do with the subscription.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct SubscriptionRequest {
    /// `cancel` (stop at the end of the paid period) or `resume` (undo a cancel).
    pub action: Action,
}

impl poem_openapi::types::Example for SubscriptionRequest {
    fn example() -> Self {
        SubscriptionRequest {
            action: Action::Cancel,
        }
    }
}

/// The subscription after the change.
#[derive(Debug, Clone, Object)]
pub struct SubscriptionResult {
    /// Always `true`.
    pub success: bool,
    /// `cancel_at_period_end` after cancel, `active` after resume.
    pub status: String,
}

crate::problem_responses!(
    /// Errors of `POST /api/subscription`.
    SubscriptionErrorResponse {
        BadRequest = 400: "`action` is missing or not `cancel`/`resume` (`field` = `action`), or the body is not the expected JSON.",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Conflict = 409: "Nothing to cancel or resume: the FREE plan (`free_plan`) or a subscription that is not active (`not_active`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The change could not be saved.",
        ServiceUnavailable = 503: "Auth or billing is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Subscription management.
pub struct SubscriptionApi;

#[OpenApi(prefix_path = "/api")]
impl SubscriptionApi {
    /// Cancel or resume the subscription
    ///
    /// `cancel` keeps the plan until the end of the paid period
    /// (`cancel_at_period_end`); `resume` undoes that. Repeating the same
    /// action is harmless. The FREE plan has nothing to cancel: 409.
    #[oai(
        path = "/subscription",
        method = "post",
        operation_id = "changeSubscription",
        tag = "ApiTags::User"
    )]
    async fn change(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        body: JsonBody<SubscriptionRequest>,
    ) -> Result<Json<SubscriptionResult>, SubscriptionErrorResponse> {
        Ok(Json(change_inner(&state, &auth, body.action.into()).await?))
    }
}

async fn change_inner(
    state: &AppState,
    auth: &BearerAuth,
    action: SubscriptionAction,
) -> Result<SubscriptionResult, ApiError> {
    let user = state.session(auth, Gate::Feature(Feature::Billing)).await?;
    match state
        .bounded(subscription::change(&state.db, user.user_id, action))
        .await?
    {
        Ok(view) => {
            state.accounts.forget(user.user_id);
            Ok(SubscriptionResult {
                success: true,
                status: view.status.to_string(),
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
        Err(SubscriptionError::Db(e)) => Err(super::db_error("changing the subscription", e)),
    }
}
