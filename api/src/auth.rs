//! The logged-in user: `Authorization: Bearer <JWT>` → verified claims →
//! the stored account (created with its default rows on first sight).
//!
//! Every session route starts with [`AppState::session`]: one call that checks
//! the gates in a fixed order and only then looks at the token.

use entity::{
    users::{self, AdminGrant, Identity, UserContext},
    Feature,
};
use poem_openapi::{auth::Bearer, SecurityScheme};

use crate::{problem::ApiError, session::AuthError, state::AppState};

/// Session token of the auth platform: a JWT signed HS256 with
/// `BACKEND_JWT_SECRET` or with a key from the platform's JWKS (RS256, ES256,
/// EdDSA); `aud` must be `authenticated`, `sub` the user id (UUID).
#[derive(SecurityScheme)]
#[oai(ty = "bearer", bearer_format = "JWT")]
pub struct BearerAuth(pub Bearer);

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
    /// 3. the token → 401 (`missing_token`, `invalid_token`, `token_expired`, …),
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
        let claims = self.sessions.verify(&auth.0.token).await?;
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
