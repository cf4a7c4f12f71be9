//! `/auth/v1/authorize` and `/auth/v1/callback`: sign-in with GitHub and
//! Google (the platform's `signInWithOAuth`), through the adapters of
//! [`worker::oauth`] and the rules of [`entity::identity::oauth`].
//!
//! 1. `GET /authorize?provider=…&redirect_to=…[&scopes=…][&code_challenge=…&code_challenge_method=…]`
//!    checks the parameters, stores what the callback needs under the hash
//!    of a fresh `state` (`auth_oauth_states`: provider, our PKCE verifier,
//!    the checked `redirect_to`, the client's PKCE challenge) and answers
//!    302 to the provider.
//! 2. `GET /callback?code=…&state=…` takes that record (single use,
//!    expiring), exchanges the code, reads the profile, creates or links the
//!    user (`entity::identity::external::sign_in`), and answers 302
//!    to `redirect_to` with the session in the fragment (implicit flow) or
//!    `?code=` for `POST /token?grant_type=pkce` (PKCE flow). An address
//!    the provider did not verify gets no session: a confirmation mail and
//!    `provider_email_needs_verification` (GoTrue's `external.go`). Failures
//!    redirect too, with `error`, `error_code` and `error_description`.

use std::future::Future;

use entity::{
    accounts::users::AdminGrant,
    identity::oauth::{self, OAuthProvider, TakenState},
    identity::{
        external::{self, External},
        flow,
        otp::MailKind,
    },
};
use poem::web::Data;
use poem_openapi::{param::Query, ApiResponse, OpenApi};
use worker::oauth::OAuthError;

use crate::{identity::routes::AuthResult, routes::ApiTags};
use crate::{
    identity::{
        mail::{Outgoing, Slot},
        urlencode, AuthApiError, Idp,
    },
    state::AppState,
};

/// A `302 Found`.
#[derive(Debug, ApiResponse)]
pub enum Found {
    /// `authorize`: to the provider's consent page. `callback`: to
    /// `redirect_to` (allowed by `APP_URL` / `AUTH_REDIRECT_ALLOW_LIST`, else
    /// `APP_URL`) with `#access_token=…&expires_at=…&expires_in=…&refresh_token=…&token_type=bearer&provider_token=…`
    /// (implicit flow), `?code=…` (PKCE flow), or `error`, `error_code` and
    /// `error_description` (in the fragment for the implicit flow, the query
    /// for PKCE and when the flow is unknown).
    #[oai(status = 302)]
    Found(#[oai(header = "Location")] String),
}

/// OAuth sign-in (GitHub, Google).
pub struct AuthOAuthApi;

fn found(location: String) -> AuthResult<Found> {
    AuthResult::Ok(Found::Found(location), None)
}

fn idp(state: &AppState) -> Result<&Idp, AuthApiError> {
    if !state.settings.toggles.auth {
        return Err(AuthApiError::new(
            503,
            "feature_disabled",
            "auth is switched off (NEXT_PUBLIC_ENABLE_AUTH=false)",
        ));
    }
    state.idp.as_deref().ok_or_else(|| {
        AuthApiError::new(
            404,
            "not_found",
            "the built-in identity provider is off (AUTH_PROVIDER=external)",
        )
    })
}

/// One database call bounded by `DEPENDENCY_TIMEOUT_MS`.
async fn bounded<T, E: Into<AuthApiError>>(
    state: &AppState,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, AuthApiError> {
    match tokio::time::timeout(state.settings.dependency_timeout, call).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => {
            tracing::error!("oauth: a database call exceeded DEPENDENCY_TIMEOUT_MS");
            Err(AuthApiError::unavailable())
        }
    }
}

/// Where a failed callback sends the browser, and how.
struct ErrorRedirect {
    /// `redirect_to` of the flow, or `APP_URL` when the flow is unknown.
    target: String,
    /// Put the error in the fragment (implicit flow) instead of the query.
    in_fragment: bool,
}

impl ErrorRedirect {
    fn to(&self, error: &str, error_code: &str, description: &str) -> String {
        let params = format!(
            "error={}&error_code={}&error_description={}",
            urlencode(error),
            urlencode(error_code),
            urlencode(description)
        );
        with_params(&self.target, &params, self.in_fragment)
    }
}

/// `target` with `params` appended to its query, or as its fragment
/// (replacing any fragment it had).
fn with_params(target: &str, params: &str, in_fragment: bool) -> String {
    let base = target.split('#').next().unwrap_or(target);
    if in_fragment {
        format!("{base}#{params}")
    } else {
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}{params}")
    }
}

#[OpenApi(prefix_path = "/auth/v1", tag = "ApiTags::Auth")]
impl AuthOAuthApi {
    /// Start an OAuth sign-in
    ///
    /// 302 to the provider's authorization page (`client_id`, the registered
    /// callback `OAUTH_REDIRECT_URI`, the scopes — GitHub `read:user
    /// user:email`, Google `openid email profile`, plus `scopes` — a random
    /// `state` and a PKCE S256 challenge whose verifier stays on the server).
    /// With `code_challenge` + `code_challenge_method` (`s256` or `plain`) the
    /// callback answers `?code=` for `POST /token?grant_type=pkce`; without,
    /// the session in the fragment. `redirect_to` outside `APP_URL`'s origin
    /// and `AUTH_REDIRECT_ALLOW_LIST` becomes `APP_URL`. 400
    /// `validation_failed` for a missing or unknown `provider` or bad PKCE
    /// parameters; 400 `provider_disabled` when the provider is not
    /// configured (`OAUTH_<P>_CLIENT_ID` / `_SECRET`). Per-client (IP) limit
    /// `AUTH_RATE_LIMIT_PER_5MIN` (429 `over_request_rate_limit` with
    /// `Retry-After`); a started authorization expires after 10 minutes and
    /// the scheduler deletes it.
    #[oai(path = "/authorize", method = "get", operation_id = "authAuthorize")]
    // One argument per query parameter (poem-openapi), and the request for
    // the client's address.
    #[allow(clippy::too_many_arguments)]
    async fn authorize(
        &self,
        state: Data<&AppState>,
        req: &poem::Request,
        /// `github` or `google`.
        provider: Query<Option<String>>,
        /// Where the browser goes after the callback.
        redirect_to: Query<Option<String>>,
        /// Extra scopes, separated by spaces or commas.
        scopes: Query<Option<String>>,
        /// The client's PKCE challenge (43–128 characters of `[A-Za-z0-9-._~]`).
        code_challenge: Query<Option<String>>,
        /// `s256` or `plain`, with `code_challenge`.
        code_challenge_method: Query<Option<String>>,
    ) -> AuthResult<Found> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = super::routes::limit(
                    &state,
                    req,
                    "auth_authorize",
                    super::routes::general(&state),
                )
                .await?;
                let name = provider
                    .0
                    .as_deref()
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| AuthApiError::validation("provider is required"))?;
                let provider = OAuthProvider::parse(name).ok_or_else(|| {
                    AuthApiError::validation(format!(
                        "Unsupported provider: {name} (expected github or google)"
                    ))
                })?;
                if !state.oauth.enabled(provider) {
                    return Err(AuthApiError::new(
                        400,
                        "provider_disabled",
                        format!("Unsupported provider: {} is not enabled", provider.as_str()),
                    ));
                }
                let client_pkce = oauth::client_pkce(
                    code_challenge.0.as_deref(),
                    code_challenge_method.0.as_deref(),
                )
                .map_err(|e| AuthApiError::validation(e.to_string()))?;
                let scopes = oauth::scopes(provider, scopes.0.as_deref())
                    .map_err(|e| AuthApiError::validation(e.to_string()))?;
                let redirect = idp.redirect_target(redirect_to.0.as_deref());
                let started = state.oauth.authorize(provider, &scopes).map_err(|e| {
                    AuthApiError::internal(format!("oauth authorize {}: {e}", provider.as_str()))
                })?;
                bounded(
                    &state,
                    oauth::save_state(
                        &state.db,
                        &oauth::NewState {
                            state: &started.state,
                            provider,
                            pkce_verifier: &started.pkce_verifier,
                            redirect_to: &redirect,
                            client_pkce: client_pkce.as_ref(),
                        },
                    ),
                )
                .await?;
                Ok((Found::Found(started.url), Some(rate)))
            }
            .await,
        )
    }

    /// OAuth callback (the provider sends the browser here)
    ///
    /// Takes the `state`'s record (single use; at most 10 minutes old by the
    /// database's clock), exchanges `code` at the provider (with the client
    /// secret and our PKCE verifier), reads the profile, creates or links the
    /// user (an existing account with the same email is linked only when the
    /// provider says the address is verified; an unconfirmed one is then
    /// confirmed by that proof and keeps none of the credentials chosen
    /// before it; a profile whose data is over 4 KiB as JSON is refused,
    /// `validation_failed`) and answers 302 to
    /// `redirect_to`: the session in the fragment with `provider_token`
    /// (implicit flow) or `?code=` (PKCE flow). An address the provider did
    /// not verify gets no session until it is confirmed (as GoTrue's
    /// `external.go`): a new or still pending account is mailed a
    /// confirmation issued for this sign-in (whose link signs in, and keeps
    /// the identity), and the redirect carries `error_code`
    /// `provider_email_needs_verification`; the same code, with nothing
    /// made, when another account holds the address. Failures redirect with
    /// `error_code` `bad_oauth_callback` (no state or no code),
    /// `bad_oauth_state` (unknown or used state), `flow_state_expired`, the
    /// provider's own error (e.g. `access_denied`), `unexpected_failure`
    /// (provider unreachable or undocumented answer),
    /// `email_address_not_provided`. With the built-in provider off: 404
    /// `not_found` (or 503 `feature_disabled` when auth is switched off).
    #[oai(path = "/callback", method = "get", operation_id = "authCallback")]
    async fn callback(
        &self,
        state: Data<&AppState>,
        /// The provider's authorization code.
        code: Query<Option<String>>,
        /// The `state` sent to the provider.
        #[oai(name = "state")]
        oauth_state: Query<Option<String>>,
        /// The provider's error (e.g. `access_denied` when the user refused).
        error: Query<Option<String>>,
        /// The provider's description of `error`.
        error_description: Query<Option<String>>,
    ) -> AuthResult<Found> {
        let unknown = ErrorRedirect {
            target: state.settings.app_url.clone(),
            in_fragment: false,
        };
        let idp = match idp(&state) {
            Ok(idp) => idp,
            Err(e) => return AuthResult::Err(e),
        };
        let Some(raw_state) = oauth_state.0.as_deref().filter(|s| !s.is_empty()) else {
            return found(unknown.to(
                "invalid_request",
                "bad_oauth_callback",
                "OAuth state parameter missing",
            ));
        };
        let taken = match bounded(&state, oauth::take_state(&state.db, raw_state)).await {
            Ok(t) => t,
            Err(e) => {
                return found(unknown.to("server_error", e.code, &e.message));
            }
        };
        let record = match taken {
            TakenState::Found(r) => r,
            TakenState::NotFound => {
                return found(unknown.to(
                    "invalid_request",
                    "bad_oauth_state",
                    "OAuth callback with invalid state",
                ))
            }
            TakenState::Expired => {
                return found(unknown.to(
                    "invalid_request",
                    "flow_state_expired",
                    "OAuth state has expired; sign in again",
                ))
            }
        };
        let fail = ErrorRedirect {
            target: record.redirect_to.clone(),
            in_fragment: record.client_pkce.is_none(),
        };
        if let Some(err) = error.0.as_deref().filter(|e| !e.is_empty()) {
            let code = if err.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                err
            } else {
                "provider_error"
            };
            return found(
                fail.to(
                    err,
                    code,
                    error_description
                        .0
                        .as_deref()
                        .unwrap_or("The provider refused the sign-in"),
                ),
            );
        }
        let Some(code) = code.0.as_deref().filter(|c| !c.is_empty()) else {
            return found(fail.to(
                "invalid_request",
                "bad_oauth_callback",
                "OAuth callback without a code",
            ));
        };
        match sign_in(&state, idp, &record, code).await {
            Ok(location) => found(location),
            Err(e) => found(fail.to(
                // GoTrue's `getErrorQueryString` (`external.go`): a sign-in
                // refused for the user's sake is `access_denied`, which
                // auth-js shows as the error.
                if e.status >= 500 {
                    "server_error"
                } else if matches!(
                    e.code,
                    "provider_email_needs_verification" | "signup_disabled" | "user_banned"
                ) {
                    "access_denied"
                } else {
                    "invalid_request"
                },
                e.code,
                &e.message,
            )),
        }
    }
}

/// The callback's work after the state checked out: the redirect on success.
async fn sign_in(
    state: &AppState,
    idp: &Idp,
    record: &oauth::TakenRecord,
    code: &str,
) -> Result<String, AuthApiError> {
    let provider = record.provider;
    let (tokens, profile) = state
        .oauth
        .sign_in(provider, code, &record.pkce_verifier)
        .await
        .map_err(|e| {
            tracing::warn!(provider = provider.as_str(), error = %e, "oauth: sign-in with the provider failed");
            match e {
                OAuthError::Refused(_) => AuthApiError::new(
                    400,
                    "bad_oauth_callback",
                    "The provider refused the authorization code",
                ),
                OAuthError::NoEmail => AuthApiError::new(
                    400,
                    "email_address_not_provided",
                    "Error getting user email from external provider",
                ),
                OAuthError::Disabled(_) => AuthApiError::new(
                    400,
                    "provider_disabled",
                    format!("Unsupported provider: {} is not enabled", provider.as_str()),
                ),
                _ => AuthApiError::new(
                    502,
                    "unexpected_failure",
                    "Error getting user profile from external provider",
                ),
            }
        })?;
    let grant = AdminGrant {
        user_ids: &state.settings.admin_user_ids,
        emails: &state.settings.admin_emails,
    };
    let outcome = bounded(
        state,
        external::sign_in(
            &state.db,
            &external::OAuthProfile {
                provider: provider.as_str().to_owned(),
                provider_id: profile.provider_id.clone(),
                email: Some(profile.email.clone()),
                email_verified: profile.email_verified,
                user_metadata: profile.user_metadata.clone(),
            },
            &grant,
        ),
    )
    .await?;
    let refused = |sent: bool| {
        let p = provider.as_str();
        AuthApiError::new(
            422,
            "provider_email_needs_verification",
            if sent {
                format!("Unverified email with {p}. A confirmation email has been sent to your {p} email")
            } else {
                format!("Unverified email with {p}. Verify the email with {p} in order to sign in")
            },
        )
    };
    let (user_id, identity_id) = match outcome {
        External::SignedIn {
            user_id,
            identity_id,
        } => (user_id, identity_id),
        External::Refused => return Err(refused(false)),
        External::NeedsConfirmation {
            user_id,
            email,
            email_norm,
            request_id,
        } => {
            // GoTrue's `external.go`: no session for an unverified address,
            // only the confirmation mail issued for this sign-in (held back
            // quietly inside the address's interval).
            idp.user_changed(user_id);
            let pkce = record
                .client_pkce
                .as_ref()
                .map(|p| (p.challenge.clone(), p.method));
            let mut mail = Outgoing::new(user_id, MailKind::Confirmation, &email, &email_norm)
                .redirect(Some(&record.redirect_to))
                .pkce(pkce.as_ref())
                .slot(Slot::Quiet);
            if let Some(r) = request_id {
                mail = mail.signup(r, None);
            }
            idp.send_mail(mail).await?;
            return Err(refused(true));
        }
    };
    idp.user_changed(user_id);
    match &record.client_pkce {
        Some(pkce) => {
            let auth_code = bounded(
                state,
                external::grant_flow(
                    &state.db,
                    user_id,
                    identity_id,
                    flow::FlowStart {
                        provider: provider.as_str().to_owned(),
                        code_challenge: pkce.challenge.clone(),
                        code_challenge_method: pkce.method.as_str().to_owned(),
                        authentication_method: "oauth".into(),
                        user_id: Some(user_id),
                        password_hash: None,
                    },
                ),
            )
            .await?
            .ok_or_else(|| refused(false))?;
            Ok(with_params(
                &record.redirect_to,
                &format!("code={}", urlencode(&auth_code)),
                false,
            ))
        }
        None => {
            let s = idp
                .issue_oauth_session(user_id, identity_id)
                .await?
                .ok_or_else(|| refused(false))?;
            let mut params = format!(
                "access_token={}&expires_at={}&expires_in={}&provider_token={}&refresh_token={}&token_type=bearer",
                s.access_token,
                s.expires_at,
                s.expires_in,
                urlencode(&tokens.access_token),
                urlencode(&s.refresh_token),
            );
            if let Some(r) = &tokens.refresh_token {
                params.push_str(&format!("&provider_refresh_token={}", urlencode(r)));
            }
            Ok(with_params(&record.redirect_to, &params, true))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_go_to_the_query_or_replace_the_fragment() {
        assert_eq!(
            with_params("https://a.test/x", "code=1", false),
            "https://a.test/x?code=1"
        );
        assert_eq!(
            with_params("https://a.test/x?y=2#old", "code=1", false),
            "https://a.test/x?y=2&code=1"
        );
        assert_eq!(
            with_params("https://a.test/x#old", "access_token=t", true),
            "https://a.test/x#access_token=t"
        );
    }
}
