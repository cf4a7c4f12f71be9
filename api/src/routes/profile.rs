//! `POST /api/profile`: save the caller's name and avatar references.

use entity::profile::{self, ProfileInput};
use poem::web::Data;
use poem_openapi::{payload::Json, Object, OpenApi};

use super::ApiTags;
use crate::{auth::BearerAuth, payload::JsonBody, problem::ApiError, state::AppState};

/// Profile fields to save. A field left out keeps its stored value; an empty
/// string clears it.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct ProfileRequest {
    /// Display name, at most 100 characters (trimmed).
    pub full_name: Option<String>,
    /// Object key of the avatar: exactly `<your user id>/avatar`, or empty.
    pub avatar_path: Option<String>,
    /// Public URL of the avatar: an absolute `http(s)` URL (≤ 2,048 characters), or empty.
    pub avatar_url: Option<String>,
}

impl poem_openapi::types::Example for ProfileRequest {
    fn example() -> Self {
        ProfileRequest {
            full_name: Some("Ann Lee".into()),
            avatar_path: Some("7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar".into()),
            avatar_url: Some(
                "https://app.example.com/storage/v1/object/public/avatars/7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar".into(),
            ),
        }
    }
}

/// The saved profile.
#[derive(Debug, Clone, Object)]
pub struct ProfileView {
    /// Display name.
    pub full_name: Option<String>,
    /// Object key of the avatar (`<user id>/avatar`).
    pub avatar_path: Option<String>,
    /// Public URL of the avatar.
    pub avatar_url: Option<String>,
}

/// `{ success: true, profile }`.
#[derive(Debug, Clone, Object)]
pub struct ProfileResult {
    /// Always `true`.
    pub success: bool,
    /// The profile as saved.
    pub profile: ProfileView,
}

crate::problem_responses!(
    /// Errors of `POST /api/profile`.
    ProfileErrorResponse {
        BadRequest = 400: "A field is invalid (`field` names it): name too long, avatar_url not an http(s) URL, avatar_path not your own `<user id>/avatar`.",
        Unauthorized = 401: "No valid session token.",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The profile could not be saved.",
        ServiceUnavailable = 503: "Server-side writes are not configured (`not_configured`: `BACKEND_SERVICE_ROLE_KEY`) or the database is unreachable.",
    }
);

/// Profile.
pub struct ProfileApi;

#[OpenApi]
impl ProfileApi {
    /// Save the profile
    ///
    /// Saves the caller's full name and avatar references and answers the
    /// saved profile.
    #[oai(
        path = "/profile",
        method = "post",
        operation_id = "saveProfile",
        tag = "ApiTags::User"
    )]
    async fn save(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        body: JsonBody<ProfileRequest>,
    ) -> Result<Json<ProfileResult>, ProfileErrorResponse> {
        Ok(Json(save_inner(&state, &auth, body.0).await?))
    }
}

async fn save_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: ProfileRequest,
) -> Result<ProfileResult, ApiError> {
    state.require_server_writes()?;
    let user = state.authenticate(auth).await?;
    let input = ProfileInput::new(
        user.user_id,
        body.full_name.as_deref(),
        body.avatar_path.as_deref(),
        body.avatar_url.as_deref(),
    )?;
    let saved = profile::save(&state.db, user.user_id, input)
        .await
        .map_err(|e| super::db_error("saving the profile", e))?;
    if let Some(old) = &saved.replaced_object {
        // The avatar-cleanup job arrives with the object store (issue 3, avatars).
        tracing::info!(object = %old, "avatar reference replaced");
    }
    let p = saved.profile;
    Ok(ProfileResult {
        success: true,
        profile: ProfileView {
            full_name: p.full_name,
            avatar_path: p.avatar_path,
            avatar_url: p.avatar_url,
        },
    })
}
