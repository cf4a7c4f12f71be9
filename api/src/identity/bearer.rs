//! The logged-in user: `Authorization: Bearer <JWT>` → verified claims →
//! the stored account (created with its default rows on first sight).
//!
//! Every session route starts with [`AppState::session`]: one call that checks
//! the gates in a fixed order and only then looks at the token.

use entity::{
    accounts::users::{self, AdminGrant, Identity, UserContext},
    Feature,
};
use poem::Request;
use poem_openapi::{
    auth::Bearer, registry::Registry, ApiExtractor, ApiExtractorType, ExtractParamOptions,
    SecurityScheme,
};
use uuid::Uuid;

use crate::{identity::session::AuthError, problem::ApiError, state::AppState};

/// Session token: an access token of the built-in provider (ES256, whose
/// `session_id` must name a session that still exists, else 401
/// `session_not_found`), or a JWT of an external auth platform signed HS256
/// with `BACKEND_JWT_SECRET` or with a key from the platform's JWKS (RS256,
/// ES256, EdDSA); `aud` must be `authenticated`, `sub` the user id (UUID).
#[derive(SecurityScheme)]
#[oai(rename = "BearerAuth", ty = "bearer", bearer_format = "JWT")]
struct BearerScheme(Bearer);

/// The same session token in the HttpOnly cookie `sb-access-token` that
/// `GET /auth/confirm` sets; used only when no `Authorization` header is
/// sent. On POST, PUT, PATCH and DELETE a cookie session is refused (401
/// `cross_site_cookie`) when the request's `Origin` is not `APP_URL`'s origin,
/// or, without `Origin`, when `Sec-Fetch-Site` says `cross-site`.
#[derive(SecurityScheme)]
#[oai(
    rename = "CookieAuth",
    ty = "api_key",
    key_in = "cookie",
    key_name = "sb-access-token"
)]
#[allow(dead_code)]
struct CookieScheme(poem_openapi::auth::ApiKey);

/// The session credential of a request: the bearer token when one was sent,
/// else the `sb-access-token` cookie (see [`session_cookie`]).
///
/// Declared in the OpenAPI document as the `BearerAuth` and `CookieAuth`
/// schemes, but unlike poem-openapi's own extractor a missing or malformed
/// credential does not answer 401 before the handler runs:
/// [`AppState::session`] first checks the route's gates (so a switched-off
/// feature answers 503 whether or not a token came), then answers 401
/// (`cross_site_cookie` for a refused cookie, else `missing_token`, …).
pub struct BearerAuth(pub Option<String>, CookieCheck);

/// How the cookie credential fared: not used, or refused as cross-site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum CookieCheck {
    /// The token (if any) came from the `Authorization` header, or the
    /// cookie was accepted.
    #[default]
    Fine,
    /// A cookie session on an unsafe method from another site.
    CrossSite,
}

/// Name of the session cookie accepted in place of `Authorization: Bearer`.
pub const SESSION_COOKIE: &str = "sb-access-token";

/// The value of the `sb-access-token` cookie (percent-decoded), when sent.
pub fn session_cookie(req: &Request) -> Option<String> {
    req.headers()
        .get_all(poem::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim() == SESSION_COOKIE)
        .map(|(_, value)| value.trim().trim_matches('"'))
        .filter(|v| !v.is_empty())
        .and_then(crate::identity::confirm::percent_decode)
}

/// Whether a cookie-authenticated request may go on: safe methods always;
/// POST, PUT, PATCH, DELETE (any unsafe method) only when `Origin` is
/// `app_url`'s origin, or, without `Origin`, unless `Sec-Fetch-Site` is
/// `cross-site` (a browser's cross-site form post always sends one or the
/// other; `SameSite=Lax` already keeps the cookie off most of them).
pub fn same_site_write(req: &Request, app_url: &str) -> bool {
    use poem::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return true;
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    match header("origin") {
        Some(origin) => {
            let (Ok(origin), Ok(app)) = (url::Url::parse(origin.trim()), url::Url::parse(app_url))
            else {
                return false;
            };
            origin.origin().is_tuple() && origin.origin() == app.origin()
        }
        None => !header("sec-fetch-site").is_some_and(|s| s.eq_ignore_ascii_case("cross-site")),
    }
}

impl<'a> ApiExtractor<'a> for BearerAuth {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::SecurityScheme];
    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        <BearerScheme as ApiExtractor<'a>>::register(registry);
        <CookieScheme as ApiExtractor<'a>>::register(registry);
    }

    fn security_schemes() -> Vec<&'static str> {
        let mut schemes = <BearerScheme as ApiExtractor<'a>>::security_schemes();
        schemes.extend(<CookieScheme as ApiExtractor<'a>>::security_schemes());
        schemes
    }

    async fn from_request(
        request: &'a Request,
        body: &mut poem::RequestBody,
        param_opts: ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        let token = <BearerScheme as ApiExtractor<'a>>::from_request(request, body, param_opts)
            .await
            .ok()
            .map(|b| b.0.token);
        if request
            .headers()
            .contains_key(poem::http::header::AUTHORIZATION)
        {
            return Ok(BearerAuth(token, CookieCheck::Fine));
        }
        let Some(cookie) = session_cookie(request) else {
            return Ok(BearerAuth(None, CookieCheck::Fine));
        };
        let same_site = request
            .data::<AppState>()
            .is_some_and(|s| same_site_write(request, &s.settings.app_url));
        Ok(if same_site {
            BearerAuth(Some(cookie), CookieCheck::Fine)
        } else {
            BearerAuth(None, CookieCheck::CrossSite)
        })
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e.status() {
            401 => ApiError::Unauthorized(e.code(), e.to_string()),
            _ => ApiError::Unavailable {
                code: e.code(),
                detail: e.to_string(),
            },
        }
    }
}

/// What a session route needs besides the auth feature, checked by
/// [`AppState::session`] after the auth gate and before the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing more than auth (`NEXT_PUBLIC_ENABLE_AUTH` on and configured).
    Auth,
    /// Server-side writes armed (`BACKEND_SERVICE_ROLE_KEY`): profile, avatar.
    ServerWrites,
    /// The feature's toggle and configuration: `Billing` (subscription),
    /// `Admin` (role changes), later `Payments`, `Ai`.
    Feature(Feature),
}

impl AppState {
    /// The one entry of every session route. In this order:
    /// 1. auth toggle and readiness → 503 `feature_disabled` / `not_configured`;
    /// 2. the route's own `gate` → 503 `feature_disabled` / `not_configured`;
    /// 3. the token → 401 (`missing_token` when none was sent, then `malformed`,
    ///    `bad_signature`, `expired`, …),
    ///    503 when the keys cannot be fetched;
    /// 4. the stored account (created on first sight) and, for a token of the
    ///    built-in provider, that its session still exists (one query), bounded
    ///    by `DEPENDENCY_TIMEOUT_MS` → 503 `database_unavailable`; a session
    ///    that ended (signed out, ended by a password change) → 401
    ///    `session_not_found`.
    pub async fn session(&self, auth: &BearerAuth, gate: Gate) -> Result<UserContext, ApiError> {
        self.session_and_id(auth, gate).await.map(|(user, _)| user)
    }

    /// [`AppState::session`] behind the admin gate (`Feature::Admin`), for an
    /// admin only: any other caller → 403 `forbidden`. The one check of
    /// every admin route.
    pub async fn admin_session(&self, auth: &BearerAuth) -> Result<UserContext, ApiError> {
        let actor = self.session(auth, Gate::Feature(Feature::Admin)).await?;
        if !actor.is_admin() {
            return Err(ApiError::Forbidden(
                "forbidden",
                "the admin role is required".into(),
            ));
        }
        Ok(actor)
    }

    /// [`AppState::session`] and the token's session id (`None` for a token
    /// of another issuer), for answers bound to the session (an avatar
    /// upload grant).
    pub async fn session_and_id(
        &self,
        auth: &BearerAuth,
        gate: Gate,
    ) -> Result<(UserContext, Option<Uuid>), ApiError> {
        let (identity, session, grant) = self.checked_identity(auth, gate).await?;
        let user = self
            .bounded_db(
                "loading the account",
                users::ensure_session_user(&self.db, &identity, session, &grant),
            )
            .await?
            .ok_or_else(session_not_found)?;
        Ok((user, session))
    }

    /// [`AppState::session`] and the caller's plan in force (its id), read
    /// with the account (and the session's existence) in one query
    /// ([`users::ensure_user_with_plan`]), or from [`crate::identity::account_cache`]
    /// while PostgreSQL reports the account, its role, its subscription and
    /// its sessions unchanged (a hit does no I/O). A session this process
    /// has not seen alive yet (a new one, or one signed in through another
    /// api process) is a miss: the database decides, so it is never refused
    /// for being new.
    pub async fn session_with_plan(
        &self,
        auth: &BearerAuth,
        gate: Gate,
    ) -> Result<(UserContext, String), ApiError> {
        let (identity, session, grant) = self.checked_identity(auth, gate).await?;
        let email = identity.email.as_deref();
        if let Some(hit) = self.accounts.plan(identity.user_id, email, session) {
            return Ok(hit);
        }
        let ticket = self.accounts.ticket();
        let found = self
            .bounded_db(
                "loading the account and its plan",
                users::ensure_user_with_plan(&self.db, &identity, session, &grant),
            )
            .await?
            .ok_or_else(session_not_found)?;
        self.accounts.put_plan(ticket, email, session, &found);
        Ok(found)
    }

    /// Steps 1–3 of [`AppState::session`]: the gates and the token, giving
    /// the caller's identity, the token's session id (the built-in
    /// provider's tokens only) and who may be granted admin at first sight.
    async fn checked_identity(
        &self,
        auth: &BearerAuth,
        gate: Gate,
    ) -> Result<(Identity, Option<Uuid>, AdminGrant<'_>), ApiError> {
        self.require(Feature::Auth)?;
        match gate {
            Gate::Auth => {}
            Gate::ServerWrites => self.require_server_writes()?,
            Gate::Feature(f) => self.require(f)?,
        }
        if auth.1 == CookieCheck::CrossSite {
            return Err(ApiError::Unauthorized(
                "cross_site_cookie",
                "a session cookie is not accepted on a write from another site: \
                 send Authorization: Bearer <session token>"
                    .into(),
            ));
        }
        let Some(token) = auth.0.as_deref() else {
            return Err(ApiError::Unauthorized(
                "missing_token",
                "log in first: send Authorization: Bearer <session token>".into(),
            ));
        };
        // Our own provider's tokens are checked locally with its public keys;
        // it grants `ADMIN_EMAILS` itself when a mail proves the address.
        let own = self
            .idp
            .as_deref()
            .is_some_and(|idp| idp.owns(token) || !self.sessions.is_configured());
        let claims = match self.idp.as_deref() {
            Some(idp) if own => idp.verify_session_token(token)?,
            _ => self.sessions.verify(token).await?,
        };
        // Another issuer's email claim (HS256 or JWKS-signed) counts only when
        // the deployment says it issues sessions for confirmed emails only.
        let email_confirmed = !own && self.settings.auth_trust_email_claim;
        let grant = AdminGrant {
            user_ids: &self.settings.admin_user_ids,
            emails: if email_confirmed {
                &self.settings.admin_emails
            } else {
                &[]
            },
        };
        // Only our own tokens name a session of ours; another issuer's
        // sessions are its own business.
        let session = if own { claims.session_id } else { None };
        // Our own provider keeps `users.email` current itself (an email
        // change writes it with the account), so its tokens' claim, which
        // may predate a change (an access token lives an hour), is never
        // written back; another issuer's claim is the only source we have.
        let identity = Identity {
            user_id: claims.sub,
            email: if own { None } else { claims.email },
        };
        Ok((identity, session, grant))
    }
}

/// 401 `session_not_found`: the token verified, but the built-in provider's
/// session it belongs to has ended.
fn session_not_found() -> ApiError {
    ApiError::Unauthorized(
        SESSION_NOT_FOUND,
        "this session has ended (signed out, or ended by a password change): sign in again".into(),
    )
}

/// The problem code of a logged-in request whose session has ended.
pub const SESSION_NOT_FOUND: &str = "session_not_found";
