//! The logged-in user: `Authorization: Bearer <JWT>` → verified claims →
//! the stored account (created with its default rows on first sight).

use entity::users::{self, Identity, UserContext};
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

impl AppState {
    /// Verifies the token and returns the caller's stored context, creating
    /// the account's default rows on first sight. 401 on a bad token, 503
    /// when no key is configured or the keys cannot be fetched.
    pub async fn authenticate(&self, auth: &BearerAuth) -> Result<UserContext, ApiError> {
        let claims = self.sessions.verify(&auth.0.token).await?;
        let identity = Identity {
            user_id: claims.sub,
            email: claims.email,
        };
        let ensure = users::ensure_user(&self.db, &identity, &self.settings.admin_emails);
        match tokio::time::timeout(self.settings.dependency_timeout, ensure).await {
            Ok(Ok(user)) => Ok(user),
            Ok(Err(e)) => Err(crate::routes::db_error("loading the account", e)),
            Err(_) => Err(ApiError::Unavailable {
                code: "database_unavailable",
                detail: "the database did not answer in time; try again shortly".into(),
            }),
        }
    }
}
