//! `POST /api/admin/users/role`: an admin sets a user's role (audited).

use entity::{
    accounts::roles::{self, RoleError},
    entities::user_roles::Role,
};
use poem::{web::Data, Request};
use poem_openapi::{payload::Json, Enum, Object, OpenApi};
use uuid::Uuid;

use crate::routes::ApiTags;
use crate::{
    identity::bearer::BearerAuth, middleware::RequestId, payload::JsonBody, problem::ApiError,
    state::AppState,
};

/// A role a user can hold: `admin` or `member`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename_all = "lowercase")]
pub enum RoleName {
    /// May change roles.
    Admin,
    /// Every other user.
    Member,
}

impl From<RoleName> for Role {
    fn from(r: RoleName) -> Self {
        match r {
            RoleName::Admin => Role::Admin,
            RoleName::Member => Role::Member,
        }
    }
}

/// The role to set.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct RoleRequest {
    /// The user's id (UUID).
    pub user_id: Uuid,
    /// `admin` or `member`.
    pub role: RoleName,
}

impl poem_openapi::types::Example for RoleRequest {
    fn example() -> Self {
        RoleRequest {
            user_id: Uuid::from_u128(0x7f6c2c6e_1f0a_4c39_9d55_2a8f0f1b9a11),
            role: RoleName::Admin,
        }
    }
}

/// The role now set (echo of the request).
#[derive(Debug, Clone, Object)]
pub struct RoleResult {
    /// Always `true`.
    pub success: bool,
    /// The user's id.
    pub user_id: String,
    /// The role now held.
    pub role: String,
}

crate::problem_responses!(
    /// Errors of `POST /api/admin/users/role`.
    RoleErrorResponse {
        BadRequest = 400: "`user_id` is not a UUID or `role` is not `admin`/`member` (`field` names it), or an admin tried to demote their own account (`self_demotion`).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "Logged in, but not an admin (`forbidden`).",
        NotFound = 404: "No user has this id (`unknown_user`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The change could not be saved.",
        ServiceUnavailable = 503: "Auth or admin is switched off (`feature_disabled`) or not configured (`not_configured`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Admin.
pub struct AdminApi;

#[OpenApi(prefix_path = "/api")]
impl AdminApi {
    /// Set a user's role
    ///
    /// Admins only. Writes the change and one `audit_logs` row (actor,
    /// target, old and new role, request id) in one transaction. Setting the
    /// role a user already has succeeds and writes nothing. An admin cannot
    /// demote their own account.
    #[oai(
        path = "/admin/users/role",
        method = "post",
        operation_id = "setUserRole",
        tag = "ApiTags::Admin"
    )]
    async fn set_role(
        &self,
        state: Data<&AppState>,
        req: &Request,
        auth: BearerAuth,
        body: JsonBody<RoleRequest>,
    ) -> Result<Json<RoleResult>, RoleErrorResponse> {
        Ok(Json(
            set_role_inner(&state, &auth, body.0, RequestId::of(req)).await?,
        ))
    }
}

async fn set_role_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: RoleRequest,
    (request_id, client_request_id): (Option<String>, Option<String>),
) -> Result<RoleResult, ApiError> {
    let actor = state.admin_session(auth).await?;
    let (target, role) = (body.user_id, Role::from(body.role));
    match state
        .bounded(roles::set_role(
            &state.db,
            &actor,
            target,
            role,
            request_id,
            client_request_id,
        ))
        .await?
    {
        Ok(change) => {
            state.accounts.forget(change.user_id);
            Ok(RoleResult {
                success: true,
                user_id: change.user_id.to_string(),
                role: change.role.as_str().to_string(),
            })
        }
        Err(RoleError::Forbidden) => Err(ApiError::Forbidden(
            "forbidden",
            "the admin role is required".into(),
        )),
        Err(RoleError::SelfDemotion) => Err(ApiError::Invalid(
            "self_demotion",
            "an admin cannot demote their own account".into(),
        )),
        Err(RoleError::UnknownUser) => Err(ApiError::NotFound(
            "unknown_user",
            "no user has this id".into(),
        )),
        Err(RoleError::Db(e)) => Err(crate::routes::db_error("changing the role", e)),
    }
}
