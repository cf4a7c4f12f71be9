//! `POST /api/profile`: save the caller's name and avatar references.

use entity::accounts::profile::{self, ProfileInput};
use poem::{web::Data, Request};
use poem_openapi::{payload::Json, Object, OpenApi};

use crate::routes::ApiTags;
use worker::jobs::{DeleteAvatar, Job};

use crate::{
    identity::bearer::{BearerAuth, Gate},
    middleware::RequestId,
    pattern::{Matching, NoNul},
    payload::JsonBody,
    problem::ApiError,
    state::AppState,
};

crate::string_pattern!(
    /// `<lowercase hyphenated UUID>/avatar`, or empty.
    pub AvatarPath = r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/avatar)?$"
);

crate::string_pattern!(
    /// An absolute `http(s)` URL with a host name or IPv4 address, or empty.
    pub AvatarUrl = r"^(https?://(([A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*|((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9]))(:([1-5]?[0-9]{1,4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?([/?#][!-~]*)?)?$"
);

/// Profile fields to save. A field left out keeps its stored value; an empty
/// string clears it.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct ProfileRequest {
    /// Display name, at most 100 characters (trimmed), no NUL.
    #[oai(validator(max_length = 100))]
    pub full_name: Option<Matching<NoNul>>,
    /// Object key of the avatar: exactly `<your user id>/avatar` (lowercase
    /// hyphenated UUID), or empty. Another user's key is 400.
    #[oai(validator(max_length = 43))]
    pub avatar_path: Option<Matching<AvatarPath>>,
    /// Public URL of the avatar: an absolute `http(s)` URL (≤ 2,048 characters), or empty.
    #[oai(validator(max_length = 2048))]
    pub avatar_url: Option<Matching<AvatarUrl>>,
}

impl poem_openapi::types::Example for ProfileRequest {
    fn example() -> Self {
        ProfileRequest {
            full_name: Matching::new("Ann Lee"),
            avatar_path: Matching::new("7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar"),
            avatar_url: Matching::new(
                "https://app.example.com/storage/v1/object/public/avatars/7f6c2c6e-1f0a-4c39-9d55-2a8f0f1b9a11/avatar",
            ),
        }
    }
}

/// The saved profile (`null` for a field never set or cleared).
#[derive(Debug, Clone, Object)]
#[oai(nullable_all)]
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
        BadRequest = 400: "A field is invalid (`field` names it): name too long, avatar_url not an http(s) URL, avatar_path not your own `<user id>/avatar` (`not_your_avatar`).",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The profile could not be saved.",
        ServiceUnavailable = 503: "Auth is switched off (`feature_disabled`) or not configured (`not_configured`), server-side writes are not configured (`not_configured`: `BACKEND_SERVICE_ROLE_KEY`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Profile.
pub struct ProfileApi;

#[OpenApi(prefix_path = "/api")]
impl ProfileApi {
    /// Save the profile
    ///
    /// Saves the caller's full name and avatar references and answers the
    /// saved profile. When the save removes the stored `avatar_path`, or
    /// replaces another object key of the caller with `<user id>/avatar`, an
    /// avatar-cleanup job deletes the old object (unless it is uploaded again
    /// meanwhile).
    #[oai(
        path = "/profile",
        method = "post",
        operation_id = "saveProfile",
        tag = "ApiTags::User"
    )]
    async fn save(
        &self,
        state: Data<&AppState>,
        req: &Request,
        auth: BearerAuth,
        body: JsonBody<ProfileRequest>,
    ) -> Result<Json<ProfileResult>, ProfileErrorResponse> {
        let request_id = req.extensions().get::<RequestId>().map(|r| r.0.clone());
        Ok(Json(save_inner(&state, &auth, request_id, body.0).await?))
    }
}

async fn save_inner(
    state: &AppState,
    auth: &BearerAuth,
    request_id: Option<String>,
    body: ProfileRequest,
) -> Result<ProfileResult, ApiError> {
    let user = state.session(auth, Gate::ServerWrites).await?;
    let input = ProfileInput::new(
        user.user_id,
        body.full_name.as_deref(),
        body.avatar_path.as_deref(),
        body.avatar_url.as_deref(),
    )?;
    let cleanup = |saved: &profile::SavedProfile, old: &str| {
        Job::DeleteAvatar(DeleteAvatar {
            user_id: user.user_id,
            path: old.to_string(),
            generation: saved.profile.avatar_generation,
            request_id: request_id.clone(),
        })
    };
    // On the Redis queue the cleanup job is kept in the job outbox in the
    // save's transaction, so a Redis blink cannot lose it (crate::followup).
    let (saved, kept) = if state.queues.kind() == "redis" {
        state
            .bounded_db(
                "saving the profile",
                profile::save_with_followup(&state.db, user.user_id, input, |saved, old| {
                    worker::outbox::to_row(&cleanup(saved, old))
                }),
            )
            .await?
    } else {
        let saved = state
            .bounded_db(
                "saving the profile",
                profile::save(&state.db, user.user_id, input),
            )
            .await?;
        (saved, None)
    };
    state.accounts.forget(user.user_id);
    if let Some(old) = &saved.replaced_object {
        let job = cleanup(&saved, old);
        let outcome = match kept {
            Some(row) => state.queue_kept_followup(job, row).await,
            None => state.queue_followup(job).await,
        };
        tracing::info!(object = %old, ?outcome, "avatar cleanup job after the profile save");
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
