//! `POST /api/profile/avatar`: a signed upload for the caller's avatar.

use chrono::Utc;
use entity::{
    accounts::avatar::{self, UploadGrant, UploadRequest},
    Feature,
};
use poem::web::Data;
use poem_openapi::{Object, OpenApi};

use crate::routes::ApiTags;
use crate::{
    identity::bearer::BearerAuth, pattern::Matching, payload::JsonBody, problem::ApiError,
    state::AppState,
};

crate::string_pattern!(
    /// An image type an avatar may have.
    pub ImageType = r"^image/(jpeg|png|webp|gif)$"
);

/// The file the client is about to upload.
#[derive(Debug, Clone, Object)]
#[oai(deny_unknown_fields, example)]
pub struct AvatarUploadRequest {
    /// Size of the file in bytes: 1 to 2,097,152 (2 MiB). The upload may not
    /// send more bytes than this.
    #[oai(
        rename = "fileSize",
        validator(minimum(value = "1"), maximum(value = "2097152"))
    )]
    pub file_size: i64,
    /// MIME type of the file: `image/jpeg`, `image/png`, `image/webp` or
    /// `image/gif`. The upload must be of this type (checked by magic bytes).
    #[oai(rename = "fileType")]
    pub file_type: Matching<ImageType>,
}

impl poem_openapi::types::Example for AvatarUploadRequest {
    fn example() -> Self {
        AvatarUploadRequest {
            file_size: 48_213,
            file_type: Matching::new("image/png").expect("the example matches"),
        }
    }
}

/// A signed upload: where to put the file and the token that allows it.
#[derive(Debug, Clone, Object)]
pub struct SignedUpload {
    /// The storage bucket: `avatars`.
    pub bucket: String,
    /// The object path inside the bucket: `<user id>/avatar`.
    pub path: String,
    /// The signed-upload token (valid 2 hours, for this path, size and type
    /// only; asked with a token of the built-in provider, only while that
    /// session lasts).
    pub token: String,
    /// The full upload URL: `PUT` the file's bytes here
    /// (`{APP_URL}/storage/v1/object/upload/sign/avatars/<user id>/avatar?token=…`).
    #[oai(rename = "signedUrl")]
    pub signed_url: String,
}

/// Grants one user may ask for per [`GRANT_WINDOW`] (shared across api
/// processes in Redis).
pub const GRANTS_PER_WINDOW: u32 = 30;
/// The window of [`GRANTS_PER_WINDOW`]: an hour.
pub const GRANT_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

crate::limited_ok!(
    /// The answer of `POST /api/profile/avatar` (rate limited per user).
    AvatarGrantResponse,
    SignedUpload,
    "The signed upload."
);

crate::problem_responses!(
    /// Errors of `POST /api/profile/avatar`.
    AvatarUploadErrorResponse {
        BadRequest = 400: "`fileSize` above 2 MiB or below 1 (`out_of_range`), `fileType` not `image/jpeg`, `image/png`, `image/webp` or `image/gif` (`invalid_format`), or the body is not the expected JSON; `field` names the field.",
        Unauthorized = 401: "No valid session token (`missing_token`, `malformed`, `bad_signature`, `expired`, …), a session cookie on a write from another site (`cross_site_cookie`), or a token of the built-in provider whose session has ended: signed out, or ended by a password change (`session_not_found`).",
        PayloadTooLarge = 413: "The body exceeds 64 KiB.",
        InternalServerError = 500: "The signed upload could not be created.",
        ServiceUnavailable = 503: "Auth is switched off (`feature_disabled`) or not configured, server-side writes are not configured (`not_configured`: `BACKEND_SERVICE_ROLE_KEY`), the session keys cannot be fetched, or the database is unreachable or slow (`database_unavailable`).",
    }
);

/// Avatar uploads.
pub struct AvatarApi;

#[OpenApi(prefix_path = "/api")]
impl AvatarApi {
    /// Create a signed avatar upload
    ///
    /// Checks the declared size and type and answers a token, signed with
    /// `BACKEND_SERVICE_ROLE_KEY` and valid for 2 hours, that allows one
    /// object: `avatars/<your user id>/avatar`, at most `fileSize` bytes of
    /// type `fileType`. Upload the bytes with
    /// `PUT /storage/v1/object/upload/sign/avatars/<user id>/avatar?token=…`
    /// (`signedUrl`), then save `avatar_path` = `path` with `POST /api/profile`.
    /// Asked with a token of the built-in provider, the grant is bound to
    /// that session: once it has ended (signed out, or ended by a password
    /// change) the upload answers 401 `session_not_found`. Rate limited per
    /// user: 30 grants per hour (429 with `Retry-After`).
    #[oai(
        path = "/profile/avatar",
        method = "post",
        operation_id = "createAvatarUpload",
        tag = "ApiTags::User"
    )]
    async fn create(
        &self,
        state: Data<&AppState>,
        auth: BearerAuth,
        body: JsonBody<AvatarUploadRequest>,
    ) -> Result<AvatarGrantResponse, AvatarUploadErrorResponse> {
        AvatarGrantResponse::from_result(create_inner(&state, &auth, body.0).await)
    }
}

async fn create_inner(
    state: &AppState,
    auth: &BearerAuth,
    body: AvatarUploadRequest,
) -> Result<(SignedUpload, crate::problem::RateInfo), ApiError> {
    state.require(Feature::Auth)?;
    let key = state.upload_signing_key()?;
    let (user, session) = state
        .session_and_id(auth, crate::identity::bearer::Gate::ServerWrites)
        .await?;
    let request = UploadRequest::new(body.file_size, &body.file_type)?;
    let rate = state
        .limit_user(
            "avatar_grant",
            user.user_id,
            GRANTS_PER_WINDOW,
            GRANT_WINDOW,
            std::time::Instant::now() + state.settings.dependency_timeout,
        )
        .await?;
    let grant = UploadGrant::new(user.user_id, request, Utc::now()).for_session(session);
    let token = grant.sign(key);
    let signed_url = format!(
        "{}/storage/v1/object/upload/sign/{}?token={token}",
        state.settings.api_external_url.trim_end_matches('/'),
        avatar::object_key_of_path(&grant.path),
    );
    Ok((
        SignedUpload {
            bucket: grant.bucket,
            path: grant.path,
            token,
            signed_url,
        },
        rate,
    ))
}
