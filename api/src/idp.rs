//! The built-in identity provider (issue 10): the handle the `/auth/v1`
//! routes, `/auth/confirm` and the OAuth callback share (`state.idp`).
//!
//! It speaks the hosted auth platform's protocol (GoTrue) as
//! `@supabase/auth-js` uses it: sessions `{access_token, token_type,
//! expires_in, expires_at, refresh_token, user}`, ES256 access tokens with
//! the platform's claims, opaque rotating refresh tokens, and errors in the
//! platform's two formats ([`AuthApiError`]). The rules live in
//! [`entity::identity`]; this module adds keys, tokens, mails and HTTP shapes.

mod keys;

use std::{sync::Arc, time::Duration};

use entity::{
    identity::{
        account::{self, Created, NewAccount, UserView},
        flow, otp,
        otp::MailKind,
        password, sessions, IdentityError,
    },
    users::AdminGrant,
    Settings,
};
use jsonwebtoken::{Algorithm, Header, Validation};
use poem::{
    http::{HeaderValue, StatusCode},
    Endpoint, IntoResponse, Middleware, Request, Response,
};
use poem_openapi::{
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
    ApiResponse, Object,
};
use sea_orm::DatabaseConnection;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use worker::{jobs::SendAuthEmail, Job, Queues};

use crate::{
    user_cache::{Lookup, UserCache},
    verified::VerifiedTokens,
};

pub use keys::KeySet;

/// The audience of access tokens.
pub const AUDIENCE: &str = "authenticated";
/// The request (and echoed response) header selecting the error format.
pub const API_VERSION_HEADER: &str = "x-supabase-api-version";
/// Access tokens remembered as verified (cleared when full).
const VERIFIED_TOKENS_MAX: usize = 16_384;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

tokio::task_local! {
    /// Whether the current `/auth` request asked for the 2024-01-01 error format.
    static NEW_ERROR_FORMAT: bool;
}

/// An error of `/auth/v1`, rendered in the platform's format: with
/// `X-Supabase-Api-Version` ≥ `2024-01-01` on the request,
/// `{code: "<error_code>", message}` (and the header echoed); otherwise
/// `{code: <status>, error_code, msg}`. `weak_password: {reasons}` is added for
/// `weak_password`; 429 carries `Retry-After`.
#[derive(Debug, Clone)]
pub struct AuthApiError {
    /// HTTP status.
    pub status: u16,
    /// The platform's error code (`invalid_credentials`, …).
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `weak_password` reasons.
    pub reasons: Option<Vec<String>>,
    /// Seconds for `Retry-After` (429).
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for AuthApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for AuthApiError {}

impl AuthApiError {
    /// An error with this status, code and message.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        AuthApiError {
            status,
            code,
            message: message.into(),
            reasons: None,
            retry_after: None,
        }
    }

    /// 400 `validation_failed`.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(400, "validation_failed", message)
    }

    /// 500 `unexpected_failure` (the cause is logged, not sent).
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "auth: unexpected failure");
        Self::new(
            500,
            "unexpected_failure",
            "Unexpected failure, please try again",
        )
    }

    /// 503 `database_unavailable`: a dependency did not answer in time.
    pub fn unavailable() -> Self {
        Self::new(
            503,
            "database_unavailable",
            "The service is temporarily unavailable; try again shortly",
        )
    }

    /// 429 `over_request_rate_limit` with `Retry-After`.
    pub fn rate_limited(retry_after: u64) -> Self {
        AuthApiError {
            retry_after: Some(retry_after.max(1)),
            ..Self::new(429, "over_request_rate_limit", "Request rate limit reached")
        }
    }

    /// 401 `no_authorization`.
    pub fn no_authorization() -> Self {
        Self::new(
            401,
            "no_authorization",
            "This endpoint requires a valid Bearer token",
        )
    }

    /// 403 `bad_jwt`.
    pub fn bad_jwt(why: &str) -> Self {
        Self::new(
            403,
            "bad_jwt",
            format!("invalid JWT: unable to parse or verify signature, {why}"),
        )
    }

    /// The body in the format the current request asked for.
    pub fn body(&self, new_format: bool) -> serde_json::Value {
        let mut body = if new_format {
            serde_json::json!({"code": self.code, "message": self.message})
        } else {
            serde_json::json!({"code": self.status, "error_code": self.code, "msg": self.message})
        };
        if let Some(r) = &self.reasons {
            body["weak_password"] = serde_json::json!({"reasons": r});
        }
        body
    }
}

impl From<IdentityError> for AuthApiError {
    fn from(e: IdentityError) -> Self {
        match e {
            IdentityError::Db(ref db) => {
                if entity::db::is_unavailable(db) {
                    tracing::error!(error = %db, "auth: database unavailable");
                    return Self::unavailable();
                }
                Self::internal(db)
            }
            IdentityError::WeakPassword { ref reasons, .. } => AuthApiError {
                reasons: Some(reasons.iter().map(|r| r.to_string()).collect()),
                ..Self::new(e.status(), e.code(), e.to_string())
            },
            IdentityError::OverEmailSendRateLimit(wait) => AuthApiError {
                retry_after: Some(wait.max(1) as u64),
                ..Self::new(e.status(), e.code(), e.to_string())
            },
            _ => Self::new(e.status(), e.code(), e.to_string()),
        }
    }
}

impl From<sea_orm::DbErr> for AuthApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        IdentityError::Db(e).into()
    }
}

impl IntoResponse for AuthApiError {
    fn into_response(self) -> Response {
        let new_format = NEW_ERROR_FORMAT.try_with(|v| *v).unwrap_or(false);
        let mut resp = Response::builder()
            .status(StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .content_type("application/json")
            .body(self.body(new_format).to_string());
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(s));
        }
        resp
    }
}

impl From<AuthApiError> for poem::Error {
    fn from(e: AuthApiError) -> Self {
        poem::Error::from_response(e.into_response())
    }
}

/// The documented error body (both formats in one schema).
#[derive(Debug, Clone, Object)]
pub struct AuthErrorBody {
    /// 2024-01-01 format: the error code (string); legacy format: the HTTP status (integer).
    pub code: serde_json::Value,
    /// 2024-01-01 format: the message.
    pub message: Option<String>,
    /// Legacy format: the error code.
    pub error_code: Option<String>,
    /// Legacy format: the message.
    pub msg: Option<String>,
    /// `weak_password` only: why (`length`, `characters`).
    pub weak_password: Option<WeakPasswordBody>,
}

/// `weak_password` details.
#[derive(Debug, Clone, Object)]
pub struct WeakPasswordBody {
    /// `length`, `characters`, `pwned`.
    pub reasons: Vec<String>,
}

const ERROR_STATUSES: &[(u16, &str)] = &[
    (400, "`validation_failed`, `invalid_credentials`, `email_not_confirmed`, `bad_code_verifier`, `refresh_token_not_found`, `refresh_token_already_used`."),
    (401, "`no_authorization`: no bearer token."),
    (403, "`bad_jwt`, `session_not_found`, `otp_expired` (unknown, used or expired token)."),
    (404, "`flow_state_not_found`, `user_not_found`."),
    (422, "`user_already_exists`, `email_exists`, `weak_password` (with `weak_password.reasons`), `same_password`, `flow_state_expired`, `otp_disabled`."),
    (429, "`over_request_rate_limit` (per-IP limit) or `over_email_send_rate_limit` (one mail of a kind per user per 60 s); `Retry-After` in seconds."),
    (500, "`unexpected_failure`."),
    (503, "`database_unavailable`: a dependency did not answer in time."),
];

impl ApiResponse for AuthApiError {
    const BAD_REQUEST_HANDLER: bool = true;

    fn meta() -> MetaResponses {
        MetaResponses {
            responses: ERROR_STATUSES
                .iter()
                .map(|(status, description)| MetaResponse {
                    description,
                    status: Some(*status),
                    status_range: None,
                    content: vec![MetaMediaType {
                        content_type: "application/json",
                        schema: AuthErrorBody::schema_ref(),
                    }],
                    headers: version_header()
                        .into_iter()
                        .chain((*status == 429).then(|| MetaHeader {
                            name: "Retry-After".into(),
                            description: Some("Seconds to wait.".into()),
                            required: true,
                            deprecated: false,
                            schema: u64::schema_ref(),
                        }))
                        .collect(),
                })
                .collect(),
        }
    }

    fn register(registry: &mut Registry) {
        AuthErrorBody::register(registry);
    }

    fn from_parse_request_error(err: poem::Error) -> Self {
        AuthApiError::validation(err.to_string())
    }
}

fn version_header() -> Option<MetaHeader> {
    Some(MetaHeader {
        name: "X-Supabase-Api-Version".into(),
        description: Some(
            "Echo of the request's `X-Supabase-Api-Version` when it is a date ≥ 2024-01-01 (then the body is `{code, message}`)."
                .into(),
        ),
        required: false,
        deprecated: false,
        schema: String::schema_ref(),
    })
}

/// Parses `X-Supabase-Api-Version`: `YYYY-MM-DD`, true when ≥ 2024-01-01.
pub fn is_new_format(value: &str) -> bool {
    let v = value.trim();
    chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").is_ok_and(|d| {
        v.len() == 10 && d >= chrono::NaiveDate::from_ymd_opt(2024, 1, 1).expect("valid date")
    })
}

/// Middleware of the `/auth` mount: reads `X-Supabase-Api-Version`, makes
/// [`AuthApiError`] render the matching format, and echoes the header.
pub struct AuthVersion;

impl<E: Endpoint> Middleware<E> for AuthVersion {
    type Output = AuthVersionEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        AuthVersionEndpoint(ep)
    }
}

/// See [`AuthVersion`].
pub struct AuthVersionEndpoint<E>(E);

impl<E: Endpoint> Endpoint for AuthVersionEndpoint<E> {
    type Output = Response;

    async fn call(&self, req: Request) -> poem::Result<Response> {
        let version = req
            .headers()
            .get(API_VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| is_new_format(v))
            .map(str::to_string);
        let new_format = version.is_some();
        let result = NEW_ERROR_FORMAT
            .scope(new_format, async {
                self.0.call(req).await.map(IntoResponse::into_response)
            })
            .await;
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                // Errors raised outside the handlers (404, 405, 413, …): JSON in
                // the platform's format too.
                let status = e.status();
                if e.is_from_response() {
                    e.into_response()
                } else {
                    let code = match status.as_u16() {
                        404 => "not_found",
                        405 => "method_not_allowed",
                        413 => "request_too_large",
                        415 => "validation_failed",
                        _ => "unexpected_failure",
                    };
                    let err = AuthApiError::new(status.as_u16(), code, e.to_string());
                    NEW_ERROR_FORMAT.sync_scope(new_format, || err.into_response())
                }
            }
        };
        if let Some(v) = version.and_then(|v| HeaderValue::from_str(&v).ok()) {
            resp.headers_mut().insert(API_VERSION_HEADER, v);
        }
        Ok(resp)
    }
}

// ---------------------------------------------------------------------------
// Shapes
// ---------------------------------------------------------------------------

/// `app_metadata` of a user.
#[derive(Debug, Clone, Object, Serialize, Deserialize)]
pub struct AppMetadata {
    /// The first provider the user signed up with (`email`, `github`, `google`).
    pub provider: String,
    /// Every linked provider.
    pub providers: Vec<String>,
}

/// A linked identity, as the platform shows it.
#[derive(Debug, Clone, Object, Serialize)]
pub struct IdentityJson {
    /// Identity row id.
    pub identity_id: String,
    /// The provider's id of the account (for `email`: the user id).
    pub id: String,
    /// The user.
    pub user_id: String,
    /// The provider's profile data.
    pub identity_data: serde_json::Value,
    /// `email`, `github`, `google`.
    pub provider: String,
    /// The identity's email.
    pub email: Option<String>,
    /// Last sign-in through it (RFC 3339).
    pub last_sign_in_at: Option<String>,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Updated (RFC 3339).
    pub updated_at: String,
}

/// A user, as the platform shows it.
#[derive(Debug, Clone, Object, Serialize)]
pub struct UserJson {
    /// User id (the JWT `sub`).
    pub id: String,
    /// Always `authenticated`.
    pub aud: String,
    /// Always `authenticated`.
    pub role: String,
    /// Email address.
    pub email: String,
    /// When the email was confirmed (RFC 3339), or absent.
    pub email_confirmed_at: Option<String>,
    /// Phone (always empty: no phone sign-in).
    pub phone: String,
    /// Same as `email_confirmed_at`.
    pub confirmed_at: Option<String>,
    /// When the last confirmation mail was sent.
    pub confirmation_sent_at: Option<String>,
    /// When the last recovery mail was sent.
    pub recovery_sent_at: Option<String>,
    /// A pending new email (email change).
    pub new_email: Option<String>,
    /// When the email-change mail was sent.
    pub email_change_sent_at: Option<String>,
    /// Last sign-in (RFC 3339).
    pub last_sign_in_at: Option<String>,
    /// `{provider, providers}`.
    pub app_metadata: AppMetadata,
    /// Data the user set (`data` of sign-up and `PUT /user`).
    pub user_metadata: serde_json::Value,
    /// Linked identities.
    pub identities: Vec<IdentityJson>,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Updated (RFC 3339).
    pub updated_at: String,
    /// Always `false`.
    pub is_anonymous: bool,
}

fn ts(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl UserJson {
    /// From the stored view.
    pub fn from_view(v: &UserView) -> Self {
        let a = v.account.as_ref();
        let providers = v.providers();
        UserJson {
            id: v.user.id.to_string(),
            aud: AUDIENCE.into(),
            role: AUDIENCE.into(),
            email: a
                .map(|a| a.email.clone())
                .or_else(|| v.user.email.clone())
                .unwrap_or_default(),
            email_confirmed_at: a.and_then(|a| a.email_confirmed_at).map(ts),
            phone: String::new(),
            confirmed_at: a.and_then(|a| a.email_confirmed_at).map(ts),
            confirmation_sent_at: a.and_then(|a| a.confirmation_sent_at).map(ts),
            recovery_sent_at: a.and_then(|a| a.recovery_sent_at).map(ts),
            new_email: a.and_then(|a| a.email_change.clone()),
            email_change_sent_at: a.and_then(|a| a.email_change_sent_at).map(ts),
            last_sign_in_at: a.and_then(|a| a.last_sign_in_at).map(ts),
            app_metadata: AppMetadata {
                provider: providers[0].clone(),
                providers,
            },
            user_metadata: v.user_metadata(),
            identities: v
                .identities
                .iter()
                .map(|i| IdentityJson {
                    identity_id: i.id.to_string(),
                    id: i.provider_id.clone(),
                    user_id: i.user_id.to_string(),
                    identity_data: serde_json::from_str(&i.identity_data)
                        .unwrap_or_else(|_| serde_json::json!({})),
                    provider: i.provider.clone(),
                    email: i.email.clone(),
                    last_sign_in_at: i.last_sign_in_at.map(ts),
                    created_at: ts(i.created_at),
                    updated_at: ts(i.updated_at),
                })
                .collect(),
            created_at: ts(v.user.created_at),
            updated_at: ts(a.map(|a| a.updated_at).unwrap_or(v.user.created_at)),
            is_anonymous: false,
        }
    }

    /// A user that looks exactly like a fresh unconfirmed sign-up of `email`
    /// (random ids, times now): the answer to a repeated sign-up.
    pub fn decoy(
        email: &str,
        metadata: serde_json::Value,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        let id = Uuid::new_v4().to_string();
        UserJson {
            id: id.clone(),
            aud: AUDIENCE.into(),
            role: AUDIENCE.into(),
            email: email.into(),
            email_confirmed_at: None,
            phone: String::new(),
            confirmed_at: None,
            confirmation_sent_at: Some(ts(now)),
            recovery_sent_at: None,
            new_email: None,
            email_change_sent_at: None,
            last_sign_in_at: None,
            app_metadata: AppMetadata {
                provider: "email".into(),
                providers: vec!["email".into()],
            },
            user_metadata: metadata,
            identities: vec![IdentityJson {
                identity_id: Uuid::new_v4().to_string(),
                id: id.clone(),
                user_id: id.clone(),
                identity_data: serde_json::json!({"sub": id, "email": email, "email_verified": false}),
                provider: "email".into(),
                email: Some(email.into()),
                last_sign_in_at: None,
                created_at: ts(now),
                updated_at: ts(now),
            }],
            created_at: ts(now),
            updated_at: ts(now),
            is_anonymous: false,
        }
    }
}

/// A session, as the platform answers it.
#[derive(Debug, Clone, Object, Serialize)]
pub struct SessionGrant {
    /// ES256 JWT.
    pub access_token: String,
    /// Always `bearer`.
    pub token_type: String,
    /// Seconds the access token is valid (`AUTH_ACCESS_TOKEN_TTL_SECS`).
    pub expires_in: i64,
    /// Unix seconds when the access token expires.
    pub expires_at: i64,
    /// Opaque refresh token (single use; rotates).
    pub refresh_token: String,
    /// The user.
    pub user: UserJson,
}

/// One `amr` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Amr {
    /// `password`, `otp`, `oauth`, …
    pub method: String,
    /// Unix seconds.
    pub timestamp: i64,
}

/// The claims of our access tokens (the platform's set).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccessClaims {
    /// `{API_EXTERNAL_URL}/auth/v1`.
    pub iss: String,
    /// User id.
    pub sub: Uuid,
    /// `authenticated`.
    pub aud: String,
    /// Expiry (Unix seconds).
    pub exp: i64,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Email.
    pub email: String,
    /// Phone (empty).
    pub phone: String,
    /// `{provider, providers}`.
    pub app_metadata: serde_json::Value,
    /// The user's metadata.
    pub user_metadata: serde_json::Value,
    /// `authenticated`.
    pub role: String,
    /// `aal1`.
    pub aal: String,
    /// How the session was established.
    pub amr: Vec<Amr>,
    /// The session.
    pub session_id: Uuid,
    /// `false`.
    pub is_anonymous: bool,
}

// ---------------------------------------------------------------------------
// The provider
// ---------------------------------------------------------------------------

/// The built-in provider: database, keys, mail queue, settings.
pub struct Idp {
    db: DatabaseConnection,
    settings: Arc<Settings>,
    keys: KeySet,
    refresh_secret: Vec<u8>,
    queues: Queues,
    issuer: String,
    validation: Validation,
    /// Access tokens that verified (bounded; see [`VerifiedTokens`]).
    verified: VerifiedTokens<AccessClaims>,
    /// One permit per core for password hashing ([`Idp::hashing`]).
    hashing: tokio::sync::Semaphore,
    /// `GET /user` answers per session, validated in Redis ([`UserCache`]).
    users: UserCache<UserJson>,
}

/// Why an access token was refused.
#[derive(Debug, Clone, Copy)]
enum Rejected {
    Malformed,
    Algorithm,
    NoKid,
    UnknownKey,
    Expired,
    NotYetValid,
    Audience,
    Issuer,
    Signature,
}

impl std::fmt::Debug for Idp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idp")
            .field("kid", &self.keys.kid)
            .finish_non_exhaustive()
    }
}

/// What a verified bearer token of ours says.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The claims.
    pub claims: AccessClaims,
}

impl Idp {
    /// Loads the keys (see [`keys`]) and builds the provider.
    pub fn new(
        settings: Arc<Settings>,
        db: DatabaseConnection,
        queues: Queues,
    ) -> anyhow::Result<Self> {
        let keys = keys::load(
            settings.auth_jwt_private_key.as_deref(),
            settings.auth_jwt_previous_keys.as_deref(),
            &settings.data_dir,
        )?;
        let refresh_secret = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            h.update(b"auth refresh token v1\0");
            h.update(&keys.secret_bytes);
            h.finalize().to_vec()
        };
        let issuer = format!(
            "{}/auth/v1",
            settings.api_external_url.trim_end_matches('/')
        );
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&[AUDIENCE]);
        validation.set_issuer(&[issuer.as_str()]);
        validation.set_required_spec_claims(&["exp", "aud", "sub", "iss"]);
        validation.leeway = 0;
        Ok(Idp {
            db,
            keys,
            refresh_secret,
            issuer,
            validation,
            verified: VerifiedTokens::new(VERIFIED_TOKENS_MAX),
            hashing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, usize::from),
            ),
            users: UserCache::new(
                queues.redis(),
                &settings.queue_prefix,
                settings.dependency_timeout,
            ),
            queues,
            settings,
        })
    }

    /// `{API_EXTERNAL_URL}/auth/v1`: the `iss` of our tokens.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The public JWKS: `{keys: [...]}` (current key first, then previous ones).
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({"keys": self.keys.public.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()})
    }

    /// Whether `token`'s header names one of our keys.
    pub fn owns(&self, token: &str) -> bool {
        jsonwebtoken::decode_header(token)
            .ok()
            .and_then(|h| h.kid)
            .is_some_and(|kid| self.keys.public.iter().any(|k| k.kid == kid))
    }

    /// Verifies one of our access tokens (signature, `exp`, `aud`, `iss`) —
    /// locally, without asking the database whether the session still exists.
    pub fn verify_access(&self, token: &str) -> Result<AccessClaims, AuthApiError> {
        self.check(token).map_err(|why| {
            AuthApiError::bad_jwt(match why {
                Rejected::Malformed => "malformed token",
                Rejected::Algorithm => "unexpected algorithm",
                Rejected::NoKid => "no kid",
                Rejected::UnknownKey => "unknown key",
                Rejected::Expired => "token is expired",
                _ => "invalid token",
            })
        })
    }

    /// Verifies one of our access tokens for the logged-in `/api` routes
    /// (locally: signature, `exp`, `aud`, `iss`; the session is not looked up,
    /// so a signed-out session's token works until its `exp`, as on the platform).
    pub fn verify_session_token(
        &self,
        token: &str,
    ) -> Result<crate::session::Claims, crate::session::AuthError> {
        use crate::session::AuthError as E;
        let c = self.check(token).map_err(|why| match why {
            Rejected::Malformed => E::Malformed,
            Rejected::Algorithm => E::UnsupportedAlgorithm,
            Rejected::NoKid | Rejected::UnknownKey => E::UnknownKey,
            Rejected::Expired => E::Expired,
            Rejected::NotYetValid => E::NotYetValid,
            Rejected::Audience => E::WrongAudience,
            Rejected::Issuer => E::WrongIssuer,
            Rejected::Signature => E::BadSignature,
        })?;
        Ok(crate::session::Claims {
            sub: c.sub,
            email: Some(c.email).filter(|e| !e.is_empty()),
            exp: c.exp,
            role: Some(c.role),
            iat: Some(c.iat),
            external: false,
        })
    }

    /// The checks both verifiers share. A token that verified before is
    /// answered from [`VerifiedTokens`] with only `exp` checked again (leeway 0,
    /// as in [`Validation`] here).
    fn check(&self, token: &str) -> Result<AccessClaims, Rejected> {
        use jsonwebtoken::errors::ErrorKind as K;
        let token = token.trim();
        if token.is_empty() || token.len() > 16 * 1024 {
            return Err(Rejected::Malformed);
        }
        if let Some(c) = self.verified.get(token) {
            return if c.exp <= chrono::Utc::now().timestamp() {
                Err(Rejected::Expired)
            } else {
                Ok(c)
            };
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejected::Malformed)?;
        if header.alg != Algorithm::ES256 {
            return Err(Rejected::Algorithm);
        }
        let kid = header.kid.ok_or(Rejected::NoKid)?;
        let key = self
            .keys
            .public
            .iter()
            .find(|k| k.kid == kid)
            .ok_or(Rejected::UnknownKey)?;
        let claims = jsonwebtoken::decode::<AccessClaims>(token, &key.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                K::ExpiredSignature => Rejected::Expired,
                K::ImmatureSignature => Rejected::NotYetValid,
                K::InvalidAudience => Rejected::Audience,
                K::InvalidIssuer => Rejected::Issuer,
                K::InvalidSignature | K::InvalidEcdsaKey => Rejected::Signature,
                _ => Rejected::Malformed,
            })?
            .claims;
        self.verified.insert(token, &claims);
        Ok(claims)
    }

    /// Verifies the bearer token AND that its session still exists
    /// (`GET/PUT /user`, `POST /logout`).
    pub async fn authenticate(&self, bearer: Option<&str>) -> Result<AccessClaims, AuthApiError> {
        let token = bearer.ok_or_else(AuthApiError::no_authorization)?;
        let claims = self.verify_access(token)?;
        let exists = self
            .bounded(sessions::exists(&self.db, claims.session_id))
            .await??;
        if !exists {
            return Err(IdentityError::SessionNotFound.into());
        }
        Ok(claims)
    }

    /// `GET /user`: verifies the bearer token and answers its user while the
    /// session still exists, in one query ([`account::load_for_session`]).
    pub async fn current_user(&self, bearer: Option<&str>) -> Result<UserJson, AuthApiError> {
        let token = bearer.ok_or_else(AuthApiError::no_authorization)?;
        let claims = self.verify_access(token)?;
        let generation = match self.users.lookup(claims.sub, claims.session_id).await {
            Lookup::Hit(user) => return Ok(user),
            Lookup::Miss(generation) => generation,
        };
        let view = self
            .bounded(account::load_for_session(
                &self.db,
                claims.sub,
                claims.session_id,
            ))
            .await??;
        let user = UserJson::from_view(&view);
        if let Some(generation) = generation {
            self.users
                .store(claims.sub, claims.session_id, generation, &user);
        }
        Ok(user)
    }

    /// Records that `user_id`'s account, identities or sessions changed (after
    /// the change committed, before answering): `GET /user` answers cached
    /// for the user, in this process and the others, are no longer used.
    pub async fn user_changed(&self, user_id: Uuid) {
        self.users.changed(user_id).await;
    }

    async fn bounded<F: std::future::Future>(&self, f: F) -> Result<F::Output, AuthApiError> {
        tokio::time::timeout(self.settings.dependency_timeout * 4, f)
            .await
            .map_err(|_| {
                tracing::error!("auth: a database call exceeded its time budget");
                AuthApiError::unavailable()
            })
    }

    /// Runs an argon2id hash or verification (~12 ms of CPU and the cost's
    /// work memory, 7 MiB by default) on the blocking pool, at most one per
    /// core at a time: a burst of sign-ins queues here instead of running
    /// hundreds of hashes at once (each with its own work memory). Waiting
    /// longer than the time budget: 503.
    async fn hashing<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, AuthApiError> {
        let _permit = self
            .bounded(self.hashing.acquire())
            .await?
            .map_err(AuthApiError::internal)?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(AuthApiError::internal)
    }

    fn grant(&self) -> AdminGrant<'_> {
        AdminGrant {
            user_ids: &self.settings.admin_user_ids,
            emails: &self.settings.admin_emails,
        }
    }

    fn ttl(&self) -> i64 {
        self.settings.auth_access_token_ttl.as_secs() as i64
    }

    /// Mints the session answer for an issued session.
    async fn grant_for(
        &self,
        issued: sessions::IssuedSession,
    ) -> Result<SessionGrant, AuthApiError> {
        let view = match issued.view {
            Some(view) => view,
            None => {
                self.bounded(account::load(&self.db, issued.session.user_id))
                    .await??
            }
        };
        let user = UserJson::from_view(&view);
        let iat = issued.session.refreshed_at.timestamp();
        let exp = iat + self.ttl();
        let claims = AccessClaims {
            iss: self.issuer.clone(),
            sub: issued.session.user_id,
            aud: AUDIENCE.into(),
            exp,
            iat,
            email: user.email.clone(),
            phone: String::new(),
            app_metadata: serde_json::to_value(&user.app_metadata).unwrap_or_default(),
            user_metadata: user.user_metadata.clone(),
            role: AUDIENCE.into(),
            aal: issued.session.aal.clone(),
            amr: vec![Amr {
                method: issued.session.amr_method.clone(),
                timestamp: issued.session.created_at.timestamp(),
            }],
            session_id: issued.session.id,
            is_anonymous: false,
        };
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.keys.kid.clone());
        let access_token = jsonwebtoken::encode(&header, &claims, &self.keys.encoding)
            .map_err(AuthApiError::internal)?;
        Ok(SessionGrant {
            access_token,
            token_type: "bearer".into(),
            expires_in: self.ttl(),
            expires_at: exp,
            refresh_token: issued.refresh_token,
            user,
        })
    }

    /// A new session for `user_id`, established by `amr_method` (`password`,
    /// `otp`, `oauth`, …) through `provider` (informational: an OAuth
    /// identity's last sign-in is recorded by `upsert_oauth_user`). Used by the
    /// OAuth callback.
    pub async fn issue_session(
        &self,
        user_id: Uuid,
        amr_method: &str,
        provider: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let _ = provider;
        let issued = self
            .bounded(sessions::create(
                &self.db,
                &self.refresh_secret,
                user_id,
                amr_method,
            ))
            .await??;
        self.bounded(account::record_sign_in(&self.db, user_id))
            .await??;
        self.user_changed(user_id).await;
        self.grant_for(issued).await
    }

    /// `grant_type=password`.
    pub async fn sign_in_password(
        &self,
        email: &str,
        pw: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (_, norm) =
            account::normalize_email(email).map_err(|_| IdentityError::InvalidCredentials)?;
        if pw.is_empty() || pw.len() > password::MAX_PASSWORD_BYTES {
            return Err(IdentityError::InvalidCredentials.into());
        }
        let acc = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let phc = acc.as_ref().and_then(|a| a.password_hash.clone());
        let (pw, cost) = (pw.to_string(), self.settings.auth_password_hash_cost);
        let ok = self
            .hashing(move || match phc {
                Some(phc) => password::verify(&pw, &phc),
                None => password::verify(&pw, password::dummy_hash(cost)),
            })
            .await?;
        let Some(acc) = acc.filter(|a| ok && a.password_hash.is_some()) else {
            return Err(IdentityError::InvalidCredentials.into());
        };
        if acc.email_confirmed_at.is_none() {
            return Err(IdentityError::EmailNotConfirmed.into());
        }
        self.issue_session(acc.user_id, "password", "email").await
    }

    /// `grant_type=refresh_token`.
    pub async fn refresh(&self, token: &str) -> Result<SessionGrant, AuthApiError> {
        let reuse = self.settings.auth_refresh_reuse_interval.as_millis() as i64;
        let issued = match self
            .bounded(sessions::refresh(
                &self.db,
                &self.refresh_secret,
                token,
                reuse,
            ))
            .await?
        {
            Ok(issued) => issued,
            Err(IdentityError::RefreshTokenAlreadyUsed { user_id }) => {
                // The session was revoked.
                self.user_changed(user_id).await;
                return Err(IdentityError::RefreshTokenAlreadyUsed { user_id }.into());
            }
            Err(e) => return Err(e.into()),
        };
        self.grant_for(issued).await
    }

    /// `grant_type=pkce`: exchanges an auth code with its verifier.
    pub async fn exchange_pkce(
        &self,
        auth_code: &str,
        code_verifier: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let ex = self
            .bounded(flow::exchange(&self.db, auth_code, code_verifier))
            .await??;
        let amr = if ex.provider == "email" {
            "otp"
        } else {
            "oauth"
        };
        self.issue_session(ex.user_id, amr, &ex.provider).await
    }

    /// Verifies a mail's `token_hash` of `kind` (`signup`, `email`,
    /// `magiclink`, `recovery`, `invite`, `email_change`) and signs the user in.
    pub async fn verify_token_hash(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (user_id, _) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
        self.issue_session(user_id, "otp", "email").await
    }

    /// Verifies `email` + 6-digit `code` of `kind` and signs the user in.
    pub async fn verify_code(
        &self,
        kind: &str,
        email: &str,
        code: &str,
    ) -> Result<SessionGrant, AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let (user_id, _) = self
            .consume(
                kind,
                otp::Proof::Code {
                    email_norm: &norm,
                    code,
                },
            )
            .await?;
        self.issue_session(user_id, "otp", "email").await
    }

    /// Verifies a link for `GET /verify`: the user and, when the mail was
    /// part of a PKCE flow, the auth code to redirect with.
    pub async fn verify_link(
        &self,
        kind: &str,
        token_hash: &str,
    ) -> Result<LinkOutcome, AuthApiError> {
        let (user_id, flow_id) = self
            .consume(kind, otp::Proof::TokenHash(token_hash))
            .await?;
        match flow_id {
            Some(f) => {
                let code = self
                    .bounded(flow::issue_auth_code(&self.db, f, user_id))
                    .await??;
                Ok(LinkOutcome::Code(code))
            }
            None => Ok(LinkOutcome::Session(Box::new(
                self.issue_session(user_id, "otp", "email").await?,
            ))),
        }
    }

    /// Consumes a one-time token and applies its effect (confirm the email,
    /// apply an email change); returns the user and the PKCE flow, if any.
    async fn consume(
        &self,
        kind: &str,
        proof: otp::Proof<'_>,
    ) -> Result<(Uuid, Option<Uuid>), AuthApiError> {
        let kinds = otp::kinds_for_type(kind)?;
        let expiry = self.settings.auth_otp_expiry.as_secs() as i64;
        let row = self
            .bounded(otp::consume(&self.db, kinds, proof, expiry))
            .await??;
        let grant = self.grant();
        let applied = async {
            if row.kind == MailKind::EmailChange.as_str() {
                self.bounded(account::apply_email_change(&self.db, row.user_id))
                    .await??;
            }
            self.bounded(account::confirm_email(&self.db, row.user_id, &grant))
                .await??;
            Ok::<_, AuthApiError>(())
        }
        .await;
        // Also when the second step failed: the first may have committed.
        self.user_changed(row.user_id).await;
        applied?;
        Ok((row.user_id, row.flow_state_id))
    }

    /// `POST /signup`.
    pub async fn sign_up(&self, req: SignUp<'_>) -> Result<SignUpOutcome, AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        password::check_strength(req.password, self.settings.auth_password_min_length)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let meta = match req.data {
            Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
            None | Some(serde_json::Value::Null) => serde_json::json!({}),
            Some(_) => return Err(AuthApiError::validation("data must be an object")),
        };
        let (pw, cost) = (
            req.password.to_string(),
            self.settings.auth_password_hash_cost,
        );
        let hash = self.hashing(move || password::hash(&pw, cost)).await?;
        let autoconfirm = self.settings.auth_autoconfirm;
        let grant = self.grant();
        let created = self
            .bounded(account::create(
                &self.db,
                NewAccount {
                    email: &email,
                    email_norm: &norm,
                    password_hash: Some(hash),
                    user_metadata: meta.clone(),
                    confirmed: autoconfirm,
                },
                &grant,
            ))
            .await??;
        match created {
            Created::New(acc) if autoconfirm => Ok(SignUpOutcome::Session(Box::new(
                self.issue_session(acc.user_id, "password", "email").await?,
            ))),
            Created::New(acc) => {
                self.send_mail(
                    acc.user_id,
                    MailKind::Confirmation,
                    &email,
                    &norm,
                    req.redirect_to,
                    pkce.as_ref(),
                    "signup",
                    req.request_id.clone(),
                )
                .await?;
                let view = self.bounded(account::load(&self.db, acc.user_id)).await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::from_view(&view))))
            }
            Created::Existing(_) if autoconfirm => Err(AuthApiError::new(
                422,
                "user_already_exists",
                "User already registered",
            )),
            Created::Existing(acc) => {
                // Indistinguishable from a fresh sign-up: same status and shape.
                // An unconfirmed account gets its confirmation mail again (60-s
                // rule applies silently).
                if acc.email_confirmed_at.is_none() {
                    if let Err(e) = self
                        .send_mail(
                            acc.user_id,
                            MailKind::Confirmation,
                            &acc.email,
                            &norm,
                            req.redirect_to,
                            pkce.as_ref(),
                            "signup",
                            req.request_id.clone(),
                        )
                        .await
                    {
                        if e.status != 429 {
                            return Err(e);
                        }
                    }
                }
                let now = self.bounded(entity::db::now(&self.db)).await??;
                Ok(SignUpOutcome::User(Box::new(UserJson::decoy(
                    &email, meta, now,
                ))))
            }
        }
    }

    /// `POST /otp`: a magic link / code mail (creating the user when allowed).
    pub async fn send_otp(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (email, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let existing = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??;
        let (user_id, kind) = match existing {
            Some(a) if a.email_confirmed_at.is_some() => (a.user_id, MailKind::Magiclink),
            Some(a) => (a.user_id, MailKind::Confirmation),
            None if !req.create_user => {
                return Err(AuthApiError::new(
                    422,
                    "otp_disabled",
                    "Signups not allowed for otp",
                ))
            }
            None => {
                let meta = match req.data {
                    Some(serde_json::Value::Object(m)) => serde_json::Value::Object(m.clone()),
                    _ => serde_json::json!({}),
                };
                let grant = self.grant();
                let created = self
                    .bounded(account::create(
                        &self.db,
                        NewAccount {
                            email: &email,
                            email_norm: &norm,
                            password_hash: None,
                            user_metadata: meta,
                            confirmed: false,
                        },
                        &grant,
                    ))
                    .await??;
                let a = match created {
                    Created::New(a) | Created::Existing(a) => a,
                };
                (a.user_id, MailKind::Confirmation)
            }
        };
        let verify_type = if kind == MailKind::Magiclink {
            "magiclink"
        } else {
            "signup"
        };
        self.send_mail(
            user_id,
            kind,
            &email,
            &norm,
            req.redirect_to,
            pkce.as_ref(),
            verify_type,
            req.request_id,
        )
        .await
    }

    /// `POST /recover`: a recovery mail when the account exists; `Ok` either way
    /// (except the 60-s rule).
    pub async fn recover(&self, req: OtpRequest<'_>) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(req.email)?;
        let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
        let Some(acc) = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??
        else {
            return Ok(());
        };
        self.send_mail(
            acc.user_id,
            MailKind::Recovery,
            &acc.email,
            &norm,
            req.redirect_to,
            pkce.as_ref(),
            "recovery",
            req.request_id,
        )
        .await
    }

    /// `POST /resend`: the confirmation (`signup`) or email-change mail again.
    pub async fn resend(
        &self,
        kind: &str,
        email: &str,
        redirect_to: Option<&str>,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let (_, norm) = account::normalize_email(email)?;
        let Some(acc) = self
            .bounded(account::find_by_email(&self.db, &norm))
            .await??
        else {
            return Ok(());
        };
        match kind {
            "signup" if acc.email_confirmed_at.is_none() => {
                self.send_mail(
                    acc.user_id,
                    MailKind::Confirmation,
                    &acc.email,
                    &norm,
                    redirect_to,
                    None,
                    "signup",
                    request_id,
                )
                .await
            }
            "email_change" => match acc.email_change.clone() {
                Some(new) => {
                    let new_norm = new.to_ascii_lowercase();
                    self.send_mail(
                        acc.user_id,
                        MailKind::EmailChange,
                        &new,
                        &new_norm,
                        redirect_to,
                        None,
                        "email_change",
                        request_id,
                    )
                    .await
                }
                None => Ok(()),
            },
            "signup" => Ok(()),
            _ => Err(AuthApiError::validation(
                "type: expected signup or email_change",
            )),
        }
    }

    /// `PUT /user`: password, email (sends the change mail), data.
    pub async fn update_user(
        &self,
        claims: &AccessClaims,
        req: UpdateUser<'_>,
    ) -> Result<UserJson, AuthApiError> {
        let view = self.bounded(account::load(&self.db, claims.sub)).await??;
        let Some(acc) = view.account.clone() else {
            return Err(IdentityError::UserNotFound.into());
        };
        if let Some(pw) = req.password {
            password::check_strength(pw, self.settings.auth_password_min_length)?;
            let (pw1, old) = (pw.to_string(), acc.password_hash.clone());
            let same = self
                .hashing(move || old.is_some_and(|h| password::verify(&pw1, &h)))
                .await?;
            if same {
                return Err(IdentityError::SamePassword.into());
            }
            let (pw2, cost) = (pw.to_string(), self.settings.auth_password_hash_cost);
            let hash = self.hashing(move || password::hash(&pw2, cost)).await?;
            self.bounded(account::set_password(&self.db, claims.sub, &hash))
                .await??;
            self.user_changed(claims.sub).await;
        }
        if let Some(data) = req.data {
            match data {
                serde_json::Value::Object(m) => {
                    self.bounded(account::merge_metadata(&self.db, claims.sub, m))
                        .await??;
                    self.user_changed(claims.sub).await;
                }
                serde_json::Value::Null => {}
                _ => return Err(AuthApiError::validation("data must be an object")),
            }
        }
        if let Some(new_email) = req.email {
            let (new_email, new_norm) = account::normalize_email(new_email)?;
            if new_norm != acc.email_norm {
                let pkce = flow::pkce_params(req.code_challenge, req.code_challenge_method)?;
                self.bounded(account::request_email_change(
                    &self.db, claims.sub, &new_email, &new_norm,
                ))
                .await??;
                self.user_changed(claims.sub).await;
                self.send_mail(
                    claims.sub,
                    MailKind::EmailChange,
                    &new_email,
                    &new_norm,
                    req.redirect_to,
                    pkce.as_ref(),
                    "email_change",
                    req.request_id,
                )
                .await?;
            }
        }
        let view = self.bounded(account::load(&self.db, claims.sub)).await??;
        Ok(UserJson::from_view(&view))
    }

    /// `POST /logout?scope=`.
    pub async fn logout(
        &self,
        claims: &AccessClaims,
        scope: Option<&str>,
    ) -> Result<(), AuthApiError> {
        let scope = sessions::LogoutScope::parse(scope)?;
        self.bounded(sessions::logout(
            &self.db,
            claims.sub,
            claims.session_id,
            scope,
        ))
        .await??;
        self.user_changed(claims.sub).await;
        Ok(())
    }

    /// `redirect_to` as allowed (`APP_URL`'s origin or `AUTH_REDIRECT_ALLOW_LIST`), else `APP_URL`.
    pub fn redirect_target(&self, candidate: Option<&str>) -> String {
        entity::redirect::allowed_redirect(
            &self.settings.app_url,
            &self.settings.auth_redirect_allow_list,
            candidate,
        )
    }

    /// Claims the 60-s slot, issues the token and queues the mail.
    #[allow(clippy::too_many_arguments)]
    async fn send_mail(
        &self,
        user_id: Uuid,
        kind: MailKind,
        to: &str,
        to_norm: &str,
        redirect_to: Option<&str>,
        pkce: Option<&(String, flow::ChallengeMethod)>,
        verify_type: &str,
        request_id: Option<String>,
    ) -> Result<(), AuthApiError> {
        let Some(from) = self.settings.email_from.clone() else {
            return Err(AuthApiError::new(
                500,
                "email_address_not_authorized",
                "Error sending email: EMAIL_FROM is not configured",
            ));
        };
        self.bounded(otp::claim_mail_slot(&self.db, user_id, kind))
            .await??;
        self.user_changed(user_id).await;
        let flow_id = match pkce {
            Some((challenge, method)) => Some(
                self.bounded(flow::create_flow_state(
                    &self.db,
                    flow::FlowStart {
                        provider: "email".into(),
                        code_challenge: challenge.clone(),
                        code_challenge_method: method.as_str().into(),
                        authentication_method: verify_type.into(),
                        user_id: Some(user_id),
                    },
                ))
                .await??,
            ),
            None => None,
        };
        let issued = self
            .bounded(otp::issue(&self.db, user_id, kind, to_norm, flow_id))
            .await??;
        let redirect = self.redirect_target(redirect_to);
        let link_token = if flow_id.is_some() {
            format!("pkce_{}", issued.token_hash)
        } else {
            issued.token_hash.clone()
        };
        let confirmation_url = format!(
            "{}/verify?token={}&type={}&redirect_to={}",
            self.issuer,
            link_token,
            verify_type,
            urlencode(&redirect)
        );
        let job = Job::SendAuthEmail(SendAuthEmail {
            kind,
            from,
            to: to.to_string(),
            token: issued.code,
            token_hash: issued.token_hash,
            confirmation_url,
            redirect_to: redirect,
            site_url: self.settings.app_url.clone(),
            request_id,
        });
        self.queues
            .push_within(job, self.settings.dependency_timeout)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "auth: could not queue the mail");
                AuthApiError::unavailable()
            })?;
        Ok(())
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved kept).
pub fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The result of a verified mail link.
#[derive(Debug)]
pub enum LinkOutcome {
    /// Implicit flow: the session for the URL fragment.
    Session(Box<SessionGrant>),
    /// PKCE flow: the auth code for `?code=`.
    Code(String),
}

/// What `POST /signup` answers.
#[derive(Debug)]
pub enum SignUpOutcome {
    /// Confirmed at once (`AUTH_AUTOCONFIRM`): a session.
    Session(Box<SessionGrant>),
    /// Confirmation needed: the user.
    User(Box<UserJson>),
}

/// `POST /signup` input.
#[derive(Debug, Clone)]
pub struct SignUp<'a> {
    /// Email.
    pub email: &'a str,
    /// Password.
    pub password: &'a str,
    /// `user_metadata`.
    pub data: Option<&'a serde_json::Value>,
    /// `?redirect_to=`.
    pub redirect_to: Option<&'a str>,
    /// PKCE challenge.
    pub code_challenge: Option<&'a str>,
    /// PKCE method.
    pub code_challenge_method: Option<&'a str>,
    /// Request id for the mail job's log line.
    pub request_id: Option<String>,
}

/// `POST /otp` and `POST /recover` input.
#[derive(Debug, Clone)]
pub struct OtpRequest<'a> {
    /// Email.
    pub email: &'a str,
    /// Create the user when unknown (`/otp` only).
    pub create_user: bool,
    /// `user_metadata` of a created user.
    pub data: Option<&'a serde_json::Value>,
    /// `?redirect_to=`.
    pub redirect_to: Option<&'a str>,
    /// PKCE challenge.
    pub code_challenge: Option<&'a str>,
    /// PKCE method.
    pub code_challenge_method: Option<&'a str>,
    /// Request id.
    pub request_id: Option<String>,
}

/// `PUT /user` input.
#[derive(Debug, Clone)]
pub struct UpdateUser<'a> {
    /// New password.
    pub password: Option<&'a str>,
    /// New email.
    pub email: Option<&'a str>,
    /// Metadata to merge.
    pub data: Option<&'a serde_json::Value>,
    /// `?redirect_to=` for the email-change link.
    pub redirect_to: Option<&'a str>,
    /// PKCE challenge.
    pub code_challenge: Option<&'a str>,
    /// PKCE method.
    pub code_challenge_method: Option<&'a str>,
    /// Request id.
    pub request_id: Option<String>,
}

/// How long tokens live, for docs and tests.
pub fn access_ttl(settings: &Settings) -> Duration {
    settings.auth_access_token_ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_dates() {
        assert!(is_new_format("2024-01-01"));
        assert!(is_new_format("2025-06-30"));
        assert!(!is_new_format("2023-12-31"));
        assert!(!is_new_format("2024-1-1"));
        assert!(!is_new_format("latest"));
    }

    #[test]
    fn both_error_formats() {
        let e = AuthApiError::from(IdentityError::WeakPassword {
            min: 8,
            reasons: vec!["length"],
        });
        assert_eq!(e.status, 422);
        let new = e.body(true);
        assert_eq!(new["code"], "weak_password");
        assert!(new["message"].is_string());
        assert_eq!(new["weak_password"]["reasons"][0], "length");
        let old = e.body(false);
        assert_eq!(old["code"], 422);
        assert_eq!(old["error_code"], "weak_password");
        assert!(old["msg"].is_string());
    }
}
