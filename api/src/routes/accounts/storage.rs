//! The storage routes of the `avatars` bucket, on the paths the auth
//! platform's storage clients use:
//!
//! * `PUT /storage/v1/object/upload/sign/avatars/{user_id}/avatar?token=…`:
//!   upload to a signed URL (the token from `POST /api/profile/avatar`);
//! * `GET /storage/v1/object/public/avatars/{user_id}/avatar`: the public file.

use entity::{
    accounts::avatar::{self, GrantError, ImageType, UploadGrant},
    Feature,
};
use futures::{stream, StreamExt, TryStreamExt};
use poem::{
    http::{header, StatusCode},
    web::Data,
    Body, IntoResponse, Request, Response,
};
use poem_openapi::{
    param::{Path, Query},
    payload::Json,
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, MetaSchema, Registry},
    types::Type,
    ApiResponse, Object, OpenApi,
};
use uuid::Uuid;
use worker::storage::UploadError;

use crate::routes::ApiTags;
use crate::{problem::ApiError, state::AppState};

/// Slack allowed on a multipart body's declared length over the file's own
/// limit (boundaries, part headers, the `cacheControl` field).
pub const MULTIPART_OVERHEAD: u64 = 64 * 1024;

/// The stored object.
#[derive(Debug, Clone, Object)]
pub struct UploadedObject {
    /// The object's key: `avatars/<user id>/avatar`.
    #[oai(rename = "Key")]
    pub key: String,
    /// The path inside the bucket: `<user id>/avatar`.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

crate::problem_responses!(
    /// Errors of the signed upload.
    UploadErrorResponse {
        BadRequest = 400: "The body's type is not the granted one (`type_mismatch`), its bytes are not an image of that type (`invalid_image`), it is empty (`empty_body`), or it could not be read (`invalid_body`).",
        Unauthorized = 401: "No token (`missing_token`), a bad one (`invalid_token`), an expired one (`token_expired`), or one asked for by a session of the built-in provider that has ended since: signed out, or ended by a password change (`session_not_found`).",
        Forbidden = 403: "The token is for another object (`token_path_mismatch`), or its account no longer exists (`unknown_user`).",
        RequestTimeout = 408: "The body arrived slower than `UPLOAD_MIN_RATE` bytes per second once `HTTP_BODY_RATE_GRACE_SECS` had passed (`body_timeout`); the connection is closed.",
        PayloadTooLarge = 413: "The body is larger than the granted size (declared by `Content-Length`, or counted).",
        TooManyRequests = 429: "The user (the grant's subject) already has `HTTP_MAX_UPLOADS_PER_USER` uploads arriving on this server (`rate_limited`, with `Retry-After`); checked before the body is read.",
        InternalServerError = 500: "The object could not be stored.",
        ServiceUnavailable = 503: "Auth is switched off (`feature_disabled`) or server-side writes are not configured (`not_configured`), the object store (`storage_unavailable`) or the database (`database_unavailable`) is unreachable or slow, or the server is receiving `HTTP_MAX_UPLOADS` uploads already (`overloaded`, with `Retry-After`).",
    }
);

crate::problem_responses!(
    /// Errors of serving an object.
    ServeErrorResponse {
        NotFound = 404: "No such object (`not_found`).",
        InternalServerError = 500: "The object could not be read.",
        ServiceUnavailable = 503: "The object store is unreachable (`storage_unavailable`).",
    }
);

/// The OpenAPI schema of raw file bytes.
fn binary() -> poem_openapi::registry::MetaSchemaRef {
    poem_openapi::registry::MetaSchemaRef::Inline(Box::new(MetaSchema {
        format: Some("binary"),
        ..MetaSchema::new("string")
    }))
}

/// The avatar file, or "not modified".
pub enum AvatarFile {
    /// 200: the bytes, typed by their magic number.
    Image {
        /// Content type.
        mime: &'static str,
        /// Size in bytes.
        size: u64,
        /// The object's ETag, when the store has one.
        etag: Option<String>,
        /// The bytes.
        body: Body,
    },
    /// 304: the client's `If-None-Match` is the current ETag; carries the
    /// same `ETag` and `Cache-Control` as the 200 (RFC 9110 §15.4.5).
    NotModified {
        /// The object's ETag.
        etag: String,
    },
}

/// `Cache-Control` of a served avatar: revalidate every time (the object at a
/// user's key changes in place).
const CACHE_CONTROL: &str = "no-cache";

impl IntoResponse for AvatarFile {
    fn into_response(self) -> Response {
        match self {
            AvatarFile::Image {
                mime,
                size,
                etag,
                body,
            } => {
                let mut r = Response::builder()
                    .status(StatusCode::OK)
                    .content_type(mime)
                    .header(header::CONTENT_LENGTH, size)
                    .header(header::CACHE_CONTROL, CACHE_CONTROL)
                    .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
                if let Some(etag) = etag {
                    r = r.header(header::ETAG, etag);
                }
                r.body(body)
            }
            AvatarFile::NotModified { etag } => Response::builder()
                .status(StatusCode::NOT_MODIFIED)
                .header(header::ETAG, etag)
                .header(header::CACHE_CONTROL, CACHE_CONTROL)
                .finish(),
        }
    }
}

impl ApiResponse for AvatarFile {
    fn meta() -> MetaResponses {
        let string = || String::schema_ref();
        let header = |name: &str, description: &str| MetaHeader {
            name: name.to_string(),
            description: Some(description.to_string()),
            required: false,
            deprecated: false,
            schema: string(),
        };
        MetaResponses {
            responses: vec![
                MetaResponse {
                    description: "The image; `Content-Type` is the type its bytes show. `Cache-Control: no-cache` with an `ETag`: clients revalidate and get 304 while it is unchanged.",
                    status: Some(200),
                    status_range: None,
                    content: ImageType::ALL
                        .iter()
                        .map(|t| MetaMediaType {
                            content_type: t.mime(),
                            schema: binary(),
                        })
                        .collect(),
                    headers: vec![
                        header("ETag", "The object's entity tag."),
                        header("Cache-Control", "`no-cache`."),
                    ],
                },
                MetaResponse {
                    description: "Not modified: `If-None-Match` names the current ETag. Carries the same `ETag` and `Cache-Control` as the 200.",
                    status: Some(304),
                    status_range: None,
                    content: vec![],
                    headers: vec![
                        header("ETag", "The object's entity tag."),
                        header("Cache-Control", "`no-cache`."),
                    ],
                },
            ],
        }
    }

    fn register(_registry: &mut Registry) {}
}

/// The body of a signed upload, taken as a stream whatever its content type
/// (the route itself judges the type against the token, so a missing or
/// wrong `Content-Type` is its `type_mismatch`, not a generic 415).
pub struct UploadBody(pub Body);

impl<'a> poem_openapi::ApiExtractor<'a> for UploadBody {
    const TYPES: &'static [poem_openapi::ApiExtractorType] =
        &[poem_openapi::ApiExtractorType::RequestObject];

    type ParamType = ();
    type ParamRawType = ();

    fn request_meta() -> Option<poem_openapi::registry::MetaRequest> {
        let mut content: Vec<MetaMediaType> = ImageType::ALL
            .iter()
            .map(|t| MetaMediaType {
                content_type: t.mime(),
                schema: binary(),
            })
            .collect();
        content.push(MetaMediaType {
            content_type: "multipart/form-data",
            schema: binary(),
        });
        Some(poem_openapi::registry::MetaRequest {
            description: Some(
                "The file: raw bytes typed with the granted type, or multipart/form-data with one file part.",
            ),
            content,
            required: true,
        })
    }

    async fn from_request(
        _request: &'a Request,
        body: &mut poem::RequestBody,
        _param_opts: poem_openapi::ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        Ok(UploadBody(body.take()?))
    }
}

/// Storage routes.
pub struct StorageApi;

#[OpenApi(prefix_path = "/storage/v1")]
impl StorageApi {
    /// Upload an avatar to a signed URL
    ///
    /// The body is the file: either its raw bytes with `Content-Type` equal
    /// to the granted type, or `multipart/form-data` with the file as its
    /// one file part (what storage clients send for a browser `File`; a part
    /// typed `application/octet-stream` or untyped is judged by its bytes).
    /// The token (query `token`, from `POST /api/profile/avatar`) must be
    /// valid, unexpired and for this path, and the built-in provider's
    /// session that asked for it (if one did) must still exist, checked
    /// before the body is read; the body may not exceed the granted
    /// size (declared `Content-Length` and counted bytes) and its leading
    /// bytes must be an image of the granted type. The file streams to the
    /// object store and replaces the previous avatar only once complete; on
    /// any refusal nothing is written. The body must average
    /// `UPLOAD_MIN_RATE` bytes per second once `HTTP_BODY_RATE_GRACE_SECS`
    /// have passed (its deadline is that grace plus its size over that rate),
    /// else 408 `body_timeout`. While its body arrives an upload counts in
    /// a pool of its own, not toward `HTTP_MAX_IN_FLIGHT`: at most
    /// `HTTP_MAX_UPLOADS_PER_USER` per user (429) and `HTTP_MAX_UPLOADS`
    /// per server (503 `overloaded`).
    #[oai(
        path = "/object/upload/sign/avatars/:user_id/avatar",
        method = "put",
        operation_id = "uploadToSignedUrl",
        tag = "ApiTags::Storage"
    )]
    async fn upload(
        &self,
        state: Data<&AppState>,
        req: &Request,
        /// The uploading user's id.
        user_id: Path<String>,
        /// The signed-upload token.
        token: Query<Option<String>>,
        body: UploadBody,
    ) -> Result<Json<UploadedObject>, UploadErrorResponse> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let upload = Upload {
            user_id: &user_id.0,
            token: token.0.as_deref(),
            content_type,
            declared,
            admission: req
                .extensions()
                .get::<std::sync::Arc<crate::shed::UploadAdmission>>()
                .cloned(),
        };
        Ok(Json(upload_inner(&state, upload, body.0).await?))
    }

    /// Get a public avatar
    ///
    /// Serves `avatars/<user_id>/avatar` with the content type its bytes show.
    #[oai(
        path = "/object/public/avatars/:user_id/avatar",
        method = "get",
        operation_id = "getPublicAvatar",
        tag = "ApiTags::Storage"
    )]
    async fn serve(
        &self,
        state: Data<&AppState>,
        /// The user's id.
        user_id: Path<String>,
        /// An ETag from an earlier answer.
        #[oai(name = "If-None-Match")]
        if_none_match: poem_openapi::param::Header<Option<String>>,
    ) -> Result<AvatarFile, ServeErrorResponse> {
        Ok(serve_inner(&state, &user_id.0, if_none_match.0).await?)
    }
}

/// The request facts the upload checks.
struct Upload<'a> {
    user_id: &'a str,
    token: Option<&'a str>,
    content_type: &'a str,
    declared: Option<u64>,
    /// The load-shedding gate's admission (absent when the route is called
    /// without the gate).
    admission: Option<std::sync::Arc<crate::shed::UploadAdmission>>,
}

fn bad(code: &'static str, detail: impl Into<String>) -> ApiError {
    ApiError::Invalid(code, detail.into())
}

fn too_large(max: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "the file exceeds the {max} bytes granted by the upload token"
    ))
}

async fn upload_inner(
    state: &AppState,
    upload: Upload<'_>,
    body: Body,
) -> Result<UploadedObject, ApiError> {
    state.require(Feature::Auth)?;
    let key = state.upload_signing_key()?;
    let token = upload.token.filter(|t| !t.is_empty()).ok_or_else(|| {
        ApiError::Unauthorized(
            "missing_token",
            "the upload needs the signed token: ?token=…".into(),
        )
    })?;
    let path = avatar::path_of_segment(upload.user_id);
    let grant = UploadGrant::verify(key, token, avatar::BUCKET, &path).map_err(|e| match e {
        GrantError::Expired => ApiError::Unauthorized("token_expired", e.to_string()),
        GrantError::Invalid => ApiError::Unauthorized("invalid_token", e.to_string()),
        GrantError::WrongObject => ApiError::Forbidden("token_path_mismatch", e.to_string()),
    })?;
    // Before a byte is read: the session that asked for the grant must
    // still exist.
    if !state
        .bounded_db(
            "checking the upload's session",
            avatar::grant_session_alive(&state.db, &grant),
        )
        .await?
    {
        return Err(ApiError::Unauthorized(
            crate::identity::bearer::SESSION_NOT_FOUND,
            "the session this upload token was issued to has ended (signed out, or ended \
             by a password change): sign in again and ask for a new one"
                .into(),
        ));
    }
    // From here the server waits for the client's bytes: the in-flight
    // slot goes back, the upload counts in its own pool and for its user.
    let _uploading = match &upload.admission {
        Some(a) => Some(a.begin(grant.sub).map_err(upload_refused)?),
        None => None,
    };
    let finish = upload.admission.as_deref();
    let granted = grant.content_type;
    let max = grant.max_size;

    let mime: Option<mime::Mime> = upload.content_type.parse().ok();
    let is_multipart = mime
        .as_ref()
        .is_some_and(|m| m.type_() == mime::MULTIPART && m.subtype() == mime::FORM_DATA);
    let written = if is_multipart {
        if upload
            .declared
            .is_some_and(|n| n > max + MULTIPART_OVERHEAD)
        {
            return Err(too_large(max));
        }
        let boundary = multer::parse_boundary(upload.content_type)
            .map_err(|e| bad("invalid_body", format!("multipart body: {e}")))?;
        let mut form = multer::Multipart::with_constraints(
            body.into_bytes_stream(),
            boundary,
            multer::Constraints::new()
                .size_limit(multer::SizeLimit::new().whole_stream(max + MULTIPART_OVERHEAD)),
        );
        let field = loop {
            let field = form
                .next_field()
                .await
                .map_err(|e| multipart_error(e, max))?
                .ok_or_else(|| bad("empty_body", "the multipart body has no file part"))?;
            if field.file_name().is_some() || field.content_type().is_some() {
                break field;
            }
        };
        if let Some(t) = field.content_type() {
            let generic = t.essence_str() == "application/octet-stream";
            if !generic && ImageType::from_mime(t.essence_str()) != Some(granted) {
                return Err(type_mismatch(granted, t.essence_str()));
            }
        }
        store(
            state,
            &grant,
            finish,
            field.map_err(|e| multipart_error(e, max)),
        )
        .await?
    } else {
        if ImageType::from_mime(upload.content_type) != Some(granted) {
            return Err(type_mismatch(granted, upload.content_type));
        }
        if upload.declared.is_some_and(|n| n > max) {
            return Err(too_large(max));
        }
        let stream = body.into_bytes_stream().map_err(body_error);
        store(state, &grant, finish, stream).await?
    };
    let object_key = avatar::object_key(grant.sub);
    tracing::info!(key = %object_key, bytes = written, "avatar uploaded");
    Ok(UploadedObject {
        key: object_key,
        path: grant.path,
        size: written,
    })
}

/// An upload the upload pool did not admit: 429 past the user's bound
/// (`HTTP_MAX_UPLOADS_PER_USER`), 503 `overloaded` past the process's
/// (`HTTP_MAX_UPLOADS`); both with `Retry-After`.
fn upload_refused(why: crate::shed::UploadRefused) -> ApiError {
    match why {
        crate::shed::UploadRefused::PerUser(max) => {
            let now = chrono::Utc::now().timestamp().max(0) as u64;
            ApiError::RateLimited(crate::problem::RateInfo {
                limit: max as u64,
                remaining: 0,
                reset: now + crate::shed::RETRY_AFTER_SECS,
                retry_after: crate::shed::RETRY_AFTER_SECS,
            })
        }
        crate::shed::UploadRefused::Pool => {
            if worker::metrics::enabled() {
                metrics::counter!(worker::metrics::HTTP_SHED, "reason" => "uploads").increment(1);
            }
            ApiError::Unavailable {
                code: "overloaded",
                detail: "the server is receiving as many uploads as it can (HTTP_MAX_UPLOADS); \
                         retry shortly"
                    .into(),
            }
        }
    }
}

fn type_mismatch(granted: ImageType, got: &str) -> ApiError {
    bad(
        "type_mismatch",
        format!(
            "the upload token allows {} only; the body is {:?}",
            granted.mime(),
            got
        ),
    )
}

/// A body that could not be read: 408 `body_timeout` when it arrived too
/// slowly (`UPLOAD_MIN_RATE`), else 400 `invalid_body`.
fn body_error(e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return ApiError::BodyTimeout(e.to_string());
    }
    bad("invalid_body", format!("reading the body failed: {e}"))
}

fn multipart_error(e: multer::Error, max: u64) -> ApiError {
    match e {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => {
            too_large(max)
        }
        multer::Error::StreamReadFailed(e) => match e.downcast::<std::io::Error>() {
            Ok(io) => body_error(*io),
            Err(e) => bad("invalid_body", format!("multipart body: {e}")),
        },
        e => bad("invalid_body", format!("multipart body: {e}")),
    }
}

/// Reads the file's first [`avatar::SNIFF_LEN`] bytes (fewer when it is
/// shorter) and checks them: not empty, at most `max` bytes so far, an image
/// of the granted type. Returns the chunks read, to be written first.
async fn read_head<S>(file: &mut S, grant: &UploadGrant) -> Result<Vec<bytes::Bytes>, ApiError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, ApiError>> + Unpin,
{
    let mut head = Vec::new();
    let mut head_bytes = Vec::with_capacity(avatar::SNIFF_LEN);
    let mut total = 0u64;
    while head_bytes.len() < avatar::SNIFF_LEN {
        let Some(chunk) = file.next().await.transpose()? else {
            break;
        };
        total += chunk.len() as u64;
        if total > grant.max_size {
            return Err(too_large(grant.max_size));
        }
        let want = avatar::SNIFF_LEN - head_bytes.len();
        head_bytes.extend_from_slice(&chunk[..want.min(chunk.len())]);
        head.push(chunk);
    }
    if head_bytes.is_empty() {
        return Err(bad("empty_body", "the body is empty"));
    }
    if ImageType::sniff(&head_bytes) != Some(grant.content_type) {
        return Err(bad(
            "invalid_image",
            format!(
                "the file is not an image of type {}",
                grant.content_type.mime()
            ),
        ));
    }
    Ok(head)
}

/// Checks the head of `file`, stages it in the store under the grant's size
/// limit, then finalises under the profile row lock: in one transaction bump
/// the profile's avatar generation ([`avatar::begin_upload`]), put the object
/// in place, commit. The avatar cleanup takes the same lock, so it never
/// deletes an upload that completed after the removal it acts on. On any
/// failure before the object is in place nothing is written. Returns the
/// bytes written.
async fn store<S>(
    state: &AppState,
    grant: &UploadGrant,
    admission: Option<&crate::shed::UploadAdmission>,
    file: S,
) -> Result<u64, ApiError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, ApiError>> + Send,
{
    let mut file = std::pin::pin!(file);
    let head = read_head(&mut file, grant).await?;
    let body = stream::iter(head.into_iter().map(Ok)).chain(file);
    let key = avatar::object_key(grant.sub);
    let staged = state
        .storage
        .stage(&key, grant.content_type.mime(), body, grant.max_size)
        .await
        .map_err(|e| match e {
            UploadError::TooLarge { max } => too_large(max),
            UploadError::Body(e) => e,
            UploadError::Store(e) => store_error("storing the avatar", e),
        })?;
    // Received: the server works for it again.
    let _finishing = admission.map(crate::shed::UploadAdmission::finishing);
    let timeout = state.settings.dependency_timeout;
    let begun = tokio::time::timeout(timeout, avatar::begin_upload(&state.db, grant.sub)).await;
    let (txn, generation) = match begun {
        Ok(Ok(begun)) => begun,
        Ok(Err(e)) => {
            staged.abort().await;
            if matches!(
                e.sql_err(),
                Some(sea_orm::SqlErr::ForeignKeyConstraintViolation(_))
            ) {
                return Err(ApiError::Forbidden(
                    "unknown_user",
                    "the account this upload token was issued to no longer exists".into(),
                ));
            }
            return Err(crate::routes::db_error("locking the profile", e));
        }
        Err(_) => {
            staged.abort().await;
            return Err(database_timeout());
        }
    };
    let size = staged
        .complete()
        .await
        .map_err(|e| store_error("storing the avatar", e))?;
    match tokio::time::timeout(timeout, txn.commit()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(crate::routes::db_error(
                "committing the avatar generation",
                e,
            ))
        }
        Err(_) => return Err(database_timeout()),
    }
    tracing::debug!(key, generation, "avatar generation bumped");
    Ok(size)
}

/// 503: the database did not answer within `DEPENDENCY_TIMEOUT_MS`.
fn database_timeout() -> ApiError {
    ApiError::Unavailable {
        code: "database_unavailable",
        detail: "the database did not answer in time; try again shortly".into(),
    }
}

/// Maps an object-store failure: unreachable → 503, anything else → 500.
fn store_error(what: &str, e: object_store::Error) -> ApiError {
    tracing::error!(error = %e, "{what}: object store failed");
    match e {
        object_store::Error::Generic { .. } => ApiError::Unavailable {
            code: "storage_unavailable",
            detail: "the object store is unreachable; try again shortly".into(),
        },
        e => ApiError::internal(format!("{what}: {e}")),
    }
}

/// `If-None-Match` (RFC 9110 §13.1.2): `*`, or a list of entity tags
/// compared weakly (a `W/` prefix ignored) with the object's `etag`.
fn etag_matches(header: &str, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    let etag = bare(etag);
    header
        .split(',')
        .any(|t| t.trim() == "*" || bare(t) == etag)
}

async fn serve_inner(
    state: &AppState,
    user_id: &str,
    if_none_match: Option<String>,
) -> Result<AvatarFile, ApiError> {
    let not_found = || ApiError::NotFound("not_found", "no such object".into());
    let user = Uuid::parse_str(user_id).map_err(|_| not_found())?;
    let key = avatar::object_key(user);
    let found = match state.storage.get(&key).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(not_found()),
        Err(e) => return Err(store_error("reading the avatar", e)),
    };
    let size = found.meta.size;
    let etag = found.meta.e_tag.clone();
    if let (Some(etag), Some(header)) = (&etag, &if_none_match) {
        if etag_matches(header, etag) {
            return Ok(AvatarFile::NotModified { etag: etag.clone() });
        }
    }
    let mut chunks = found.into_stream();
    // Read enough of the head to name the type, then stream the rest.
    let mut head: Vec<bytes::Bytes> = Vec::new();
    let mut head_len = 0;
    while head_len < avatar::SNIFF_LEN {
        match chunks.next().await {
            Some(Ok(c)) => {
                head_len += c.len();
                head.push(c);
            }
            Some(Err(e)) => return Err(store_error("reading the avatar", e)),
            None => break,
        }
    }
    let joined: Vec<u8> = head
        .iter()
        .flat_map(|c| c.iter().copied())
        .take(avatar::SNIFF_LEN)
        .collect();
    let mime = ImageType::sniff(&joined)
        .map(ImageType::mime)
        .unwrap_or("application/octet-stream");
    let rest = chunks.map_err(std::io::Error::other);
    let body = stream::iter(head.into_iter().map(Ok)).chain(rest);
    Ok(AvatarFile::Image {
        mime,
        size,
        etag,
        body: Body::from_bytes_stream(body),
    })
}

#[cfg(test)]
mod tests {
    use super::etag_matches;

    #[test]
    fn if_none_match_compares_weakly_and_accepts_lists_and_star() {
        assert!(etag_matches("\"abc\"", "\"abc\""));
        assert!(etag_matches("W/\"abc\"", "\"abc\""));
        assert!(etag_matches("\"x\", \"abc\"", "\"abc\""));
        assert!(etag_matches("*", "\"abc\""));
        assert!(!etag_matches("\"abd\"", "\"abc\""));
        assert!(!etag_matches("", "\"abc\""));
    }
}
