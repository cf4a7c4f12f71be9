//! The built-in identity provider: the handle the `/auth/v1`
//! routes, `/auth/confirm` and the OAuth callback share (`state.idp`).
//!
//! It speaks the hosted auth platform's protocol (GoTrue) as
//! `@supabase/auth-js` uses it: sessions `{access_token, token_type,
//! expires_in, expires_at, refresh_token, user}`, ES256 access tokens with
//! the platform's claims, opaque rotating refresh tokens, and errors in the
//! platform's two formats ([`AuthApiError`]). The rules live in
//! [`entity::identity`]; this module adds keys, tokens, mails and HTTP shapes.

pub mod account_cache;
pub mod bearer;
pub mod confirm;
mod error;
mod keys;
mod mail;
pub mod oauth;
pub mod routes;
pub mod session;
mod shapes;
mod signup;
mod token;
mod user;
pub mod verified;
mod verify;

use std::{sync::Arc, time::Duration};

use entity::{accounts::users::AdminGrant, Settings};
use jsonwebtoken::{Algorithm, Validation};
use sea_orm::DatabaseConnection;
use uuid::Uuid;
use worker::Queues;

use crate::{identity::account_cache::AccountCache, identity::verified::VerifiedTokens};

pub use keys::KeySet;

/// The audience of access tokens.
pub const AUDIENCE: &str = "authenticated";
/// The request (and echoed response) header selecting the error format.
pub const API_VERSION_HEADER: &str = "x-supabase-api-version";
/// Access tokens remembered as verified (cleared when full).
const VERIFIED_TOKENS_MAX: usize = 16_384;

pub use error::*;
pub use shapes::*;

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
    /// The api's one cache of accounts: `GET /user` answers per session
    /// ([`AccountCache::session_user`]).
    accounts: Arc<AccountCache>,
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
        accounts: Arc<AccountCache>,
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
            accounts,
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

    /// Records that `user_id`'s account, identities or sessions changed (after
    /// the change committed, before answering): this process drops what it
    /// kept of the user at once; the others when PostgreSQL's notification
    /// of the change reaches them ([`crate::identity::account_cache`]).
    pub fn user_changed(&self, user_id: Uuid) {
        self.accounts.forget(user_id);
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

    /// Who a confirmation makes admin: `ADMIN_USER_IDS`, and `ADMIN_EMAILS`
    /// except under `AUTH_AUTOCONFIRM=true` (no mailbox was proven then).
    fn grant(&self) -> AdminGrant<'_> {
        AdminGrant {
            user_ids: &self.settings.admin_user_ids,
            emails: if self.settings.auth_autoconfirm {
                &[]
            } else {
                &self.settings.admin_emails
            },
        }
    }

    fn ttl(&self) -> i64 {
        self.settings.auth_access_token_ttl.as_secs() as i64
    }

    /// `redirect_to` as allowed (`APP_URL`'s origin or `AUTH_REDIRECT_ALLOW_LIST`), else `APP_URL`.
    pub fn redirect_target(&self, candidate: Option<&str>) -> String {
        entity::identity::redirect::allowed_redirect(
            &self.settings.app_url,
            &self.settings.auth_redirect_allow_list,
            candidate,
        )
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved kept).
pub fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// How long tokens live, for docs and tests.
pub fn access_ttl(settings: &Settings) -> Duration {
    settings.auth_access_token_ttl
}
