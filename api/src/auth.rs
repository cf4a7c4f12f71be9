//! The logged-in user: `Authorization: Bearer <JWT>` → verified claims →
//! the stored account (created with its default rows on first sight).
//!
//! Every session route starts with [`AppState::session`]: one call that checks
//! the gates in a fixed order and only then looks at the token.

use entity::{
    users::{self, AdminGrant, Identity, UserContext},
    Feature,
};
use poem::Request;
use poem_openapi::{
    auth::Bearer, registry::Registry, ApiExtractor, ApiExtractorType, ExtractParamOptions,
    SecurityScheme,
};

use crate::{problem::ApiError, session::AuthError, state::AppState};

/// Session token of the auth platform: a JWT signed HS256 with
/// `BACKEND_JWT_SECRET` or with a key from the platform's JWKS (RS256, ES256,
/// EdDSA); `aud` must be `authenticated`, `sub` the user id (UUID).
#[derive(SecurityScheme)]
#[oai(rename = "BearerAuth", ty = "bearer", bearer_format = "JWT")]
struct BearerScheme(Bearer);

/// The session credential of a request: the bearer token when one was sent.
///
/// Declared in the OpenAPI document as the `BearerAuth` scheme, but unlike
/// poem-openapi's own extractor a missing or malformed `Authorization` header
/// does not answer 401 before the handler runs: [`AppState::session`] first
/// checks the route's gates (so a switched-off feature answers 503 whether or
/// not a token came), then answers 401 `missing_token`.
pub struct BearerAuth(pub Option<String>);

impl<'a> ApiExtractor<'a> for BearerAuth {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::SecurityScheme];
    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        <BearerScheme as ApiExtractor<'a>>::register(registry);
    }

    fn security_schemes() -> Vec<&'static str> {
        <BearerScheme as ApiExtractor<'a>>::security_schemes()
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
        Ok(BearerAuth(token))
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
    /// 4. the stored account (created on first sight), bounded by
    ///    `DEPENDENCY_TIMEOUT_MS` → 503 `database_unavailable`.
    pub async fn session(&self, auth: &BearerAuth, gate: Gate) -> Result<UserContext, ApiError> {
        self.require(Feature::Auth)?;
        match gate {
            Gate::Auth => {}
            Gate::ServerWrites => self.require_server_writes()?,
            Gate::Feature(f) => self.require(f)?,
        }
        let Some(token) = auth.0.as_deref() else {
            return Err(ApiError::Unauthorized(
                "missing_token",
                "log in first: send Authorization: Bearer <session token>".into(),
            ));
        };
        // Our own provider's tokens are checked locally with its public keys.
        let claims = match self.idp.as_deref() {
            Some(idp) if idp.owns(token) || !self.sessions.is_configured() => {
                idp.verify_session_token(token)?
            }
            _ => self.sessions.verify(token).await?,
        };
        // An external issuer's email counts only when the deployment says it
        // issues sessions for confirmed emails only.
        let email_confirmed = !claims.external || self.settings.auth_trust_email_claim;
        let grant = AdminGrant {
            user_ids: &self.settings.admin_user_ids,
            emails: if email_confirmed {
                &self.settings.admin_emails
            } else {
                &[]
            },
        };
        let identity = Identity {
            user_id: claims.sub,
            email: claims.email,
        };
        self.bounded_db(
            "loading the account",
            users::ensure_user_granting(&self.db, &identity, &grant),
        )
        .await
    }
}
