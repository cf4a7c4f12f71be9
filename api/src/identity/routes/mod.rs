//! `/auth/v1`: the built-in identity provider, speaking the hosted auth
//! platform's protocol (GoTrue) so `@supabase/auth-js` works against it.
//! Thin handlers: gate, rate limit, parse, one [`crate::identity::Idp`] call.
//!
//! Not problem details: these routes answer the platform's own error bodies
//! ([`AuthApiError`]), documented per route.
//!
//! Why this file is long: poem-openapi takes an API object's operations from
//! one `#[OpenApi]` impl, and `/auth/v1` is one object (its own error bodies,
//! its own tag); each handler is a few lines, the flows' work is in
//! [`crate::identity`]'s `signup`, `token`, `user`, `verify` and `mail`.

mod reply;

use std::time::{Duration, Instant};

use poem::{web::Data, Request};
use poem_openapi::{param::Query, payload::Json, ApiResponse, Object, OpenApi, Union};

pub use reply::AuthResult;

use crate::routes::ApiTags;
use crate::{
    identity::{
        AuthApiError, Idp, LinkOutcome, OtpRequest, SessionGrant, SignUp, SignUpOutcome,
        UpdateUser, UserJson, Verified,
    },
    middleware::RequestId,
    payload::{Mailbox, OpenJsonBody},
    problem::RateInfo,
    rate_limit::Limit,
    state::AppState,
};

/// `POST /signup` body.
#[derive(Debug, Clone, Object)]
pub struct SignUpBody {
    /// Email address.
    pub email: Mailbox,
    /// Password (at least `AUTH_PASSWORD_MIN_LENGTH` characters, default 8).
    pub password: String,
    /// Becomes `user_metadata`.
    #[oai(nullable)]
    pub data: Option<serde_json::Value>,
    /// PKCE code challenge (with `code_challenge_method`); the confirmation
    /// link then redirects with `?code=`.
    #[oai(nullable)]
    pub code_challenge: Option<String>,
    /// `s256` or `plain`.
    #[oai(nullable)]
    pub code_challenge_method: Option<String>,
}

/// `POST /token` body: the fields of the chosen `grant_type`.
#[derive(Debug, Clone, Object)]
pub struct TokenBody {
    /// `password`: email.
    #[oai(nullable)]
    pub email: Option<Mailbox>,
    /// `password`: password.
    #[oai(nullable)]
    pub password: Option<String>,
    /// `refresh_token`: the refresh token.
    #[oai(nullable)]
    pub refresh_token: Option<String>,
    /// `pkce`: the auth code from `?code=`.
    #[oai(nullable)]
    pub auth_code: Option<String>,
    /// `pkce`: the code verifier.
    #[oai(nullable)]
    pub code_verifier: Option<String>,
}

/// `POST /verify` body: `token_hash` + `type`, or `email` + `token` + `type`.
#[derive(Debug, Clone, Object)]
pub struct VerifyBody {
    /// `signup`, `invite`, `magiclink`, `recovery`, `email_change`, `email`.
    #[oai(
        rename = "type",
        validator(pattern = "^(signup|invite|magiclink|recovery|email_change|email)$")
    )]
    pub kind: String,
    /// The mail's `{{ .TokenHash }}`.
    #[oai(nullable)]
    pub token_hash: Option<String>,
    /// The mail's 6-digit `{{ .Token }}` (with `email`).
    #[oai(nullable)]
    pub token: Option<String>,
    /// Email (with `token`).
    #[oai(nullable)]
    pub email: Option<Mailbox>,
}

/// `POST /otp` body.
#[derive(Debug, Clone, Object)]
pub struct OtpBody {
    /// Email address (required).
    #[oai(nullable)]
    pub email: Option<Mailbox>,
    /// Create the user when unknown (default `true`).
    #[oai(nullable)]
    pub create_user: Option<bool>,
    /// `user_metadata` of a created user.
    #[oai(nullable)]
    pub data: Option<serde_json::Value>,
    /// PKCE code challenge.
    #[oai(nullable)]
    pub code_challenge: Option<String>,
    /// `s256` or `plain`.
    #[oai(nullable)]
    pub code_challenge_method: Option<String>,
}

/// `POST /recover` body.
#[derive(Debug, Clone, Object)]
pub struct RecoverBody {
    /// Email address.
    pub email: Mailbox,
    /// PKCE code challenge.
    #[oai(nullable)]
    pub code_challenge: Option<String>,
    /// `s256` or `plain`.
    #[oai(nullable)]
    pub code_challenge_method: Option<String>,
}

/// `POST /resend` body.
#[derive(Debug, Clone, Object)]
pub struct ResendBody {
    /// `signup` or `email_change`.
    #[oai(rename = "type", validator(pattern = "^(signup|email_change)$"))]
    pub kind: String,
    /// Email address.
    pub email: Mailbox,
}

/// `PUT /user` body.
#[derive(Debug, Clone, Object)]
pub struct UpdateUserBody {
    /// New password (`weak_password`, `same_password`); ends every other
    /// session of the account. From a session signed in more than 24 h ago it
    /// needs `nonce` (400 `reauthentication_needed`).
    #[oai(nullable)]
    pub password: Option<String>,
    /// The code mailed by `GET /reauthenticate` (422
    /// `reauthentication_not_valid` when wrong, used or expired).
    #[oai(nullable)]
    pub nonce: Option<String>,
    /// New email: a confirmation mail goes to it and one to the current address; the change applies when both are verified (`type=email_change`).
    #[oai(nullable)]
    pub email: Option<Mailbox>,
    /// Merged into `user_metadata` (a `null` value removes the key).
    #[oai(nullable)]
    pub data: Option<serde_json::Value>,
    /// PKCE code challenge for the email-change link.
    #[oai(nullable)]
    pub code_challenge: Option<String>,
    /// `s256` or `plain`.
    #[oai(nullable)]
    pub code_challenge_method: Option<String>,
}

/// `{}`.
#[derive(Debug, Clone, Object)]
pub struct Empty {}

/// `{msg}`: the first verified half of an email change (no session).
#[derive(Debug, Clone, Object)]
pub struct VerifyMessage {
    /// `Confirmation link accepted. Please proceed to confirm link sent to
    /// the other email`.
    pub msg: String,
}

/// The verify answer: a session, or the first half of an email change.
#[derive(Debug, Clone, Union)]
#[allow(clippy::large_enum_variant)] // built once per answer, moved into the body
pub enum VerifyAnswer {
    /// Signed in.
    Session(SessionGrant),
    /// The first half of an email change was accepted; no session.
    Message(VerifyMessage),
}

/// The sign-up answer: a session (autoconfirm) or the unconfirmed user.
#[derive(Debug, Clone, Union)]
pub enum SignUpAnswer {
    /// `AUTH_AUTOCONFIRM=true`: signed in.
    Session(SessionGrant),
    /// Confirmation needed (also the answer to a repeated sign-up).
    User(UserJson),
}

/// A public JWK (P-256).
#[derive(Debug, Clone, Object)]
pub struct Jwk {
    /// `EC`.
    pub kty: String,
    /// `P-256`.
    pub crv: String,
    /// base64url x coordinate.
    pub x: String,
    /// base64url y coordinate.
    pub y: String,
    /// RFC 7638 thumbprint.
    pub kid: String,
    /// `ES256`.
    pub alg: String,
    /// `sig`.
    #[oai(rename = "use")]
    pub use_: String,
    /// `["verify"]`.
    pub key_ops: Vec<String>,
}

/// The JWKS.
#[derive(Debug, Clone, Object)]
pub struct Jwks {
    /// Current key first, then previous keys still accepted.
    pub keys: Vec<Jwk>,
}

/// Which sign-in methods are on.
#[derive(Debug, Clone, Object)]
pub struct ExternalProviders {
    /// Email + password, magic link, OTP.
    pub email: bool,
    /// Phone sign-in (never).
    pub phone: bool,
    /// GitHub OAuth.
    pub github: bool,
    /// Google OAuth.
    pub google: bool,
}

/// `GET /settings`.
#[derive(Debug, Clone, Object)]
pub struct AuthSettings {
    /// Enabled providers.
    pub external: ExternalProviders,
    /// Sign-ups are off (never).
    pub disable_signup: bool,
    /// `AUTH_AUTOCONFIRM`.
    pub mailer_autoconfirm: bool,
    /// Always `false`.
    pub phone_autoconfirm: bool,
    /// Always empty.
    pub sms_provider: String,
    /// Always `false`.
    pub saml_enabled: bool,
}

/// `GET /health`.
#[derive(Debug, Clone, Object)]
pub struct AuthHealth {
    /// Server version.
    pub version: String,
    /// `GoTrue` (what clients expect).
    pub name: String,
    /// One sentence.
    pub description: String,
    /// `builtin`.
    pub provider: String,
}

/// A `303 See Other`.
#[derive(Debug, ApiResponse)]
pub enum SeeOther {
    /// Redirect to `redirect_to` (allowed by `APP_URL` / `AUTH_REDIRECT_ALLOW_LIST`, else `APP_URL`) with the
    /// session in the fragment (implicit flow), `?code=` (PKCE), or `#error=…&error_code=…&error_description=…`.
    #[oai(status = 303)]
    SeeOther(#[oai(header = "Location")] String),
}

/// `204 No Content`.
#[derive(Debug, ApiResponse)]
pub enum NoContent {
    /// Signed out.
    #[oai(status = 204)]
    NoContent,
}

/// The identity provider.
pub struct AuthApi;

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

fn bearer(req: &Request) -> Option<&str> {
    crate::identity::session::bearer_token(req).ok()
}

fn request_id(req: &Request) -> Option<String> {
    req.extensions().get::<RequestId>().map(|r| r.0.clone())
}

/// Per-IP limit `name` (`max` per 5 minutes); 429 `over_request_rate_limit`.
pub(crate) async fn limit(
    state: &AppState,
    req: &Request,
    name: &'static str,
    max: u32,
) -> Result<RateInfo, AuthApiError> {
    let ip = state.client_ip(req);
    limit_subject(state, name, max, &ip).await
}

/// Limit `name` of one subject (an IP, a user id): `max` per 5 minutes;
/// 429 `over_request_rate_limit`.
async fn limit_subject(
    state: &AppState,
    name: &'static str,
    max: u32,
    subject: &str,
) -> Result<RateInfo, AuthApiError> {
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let d = state
        .limiter
        .check(
            Limit {
                name,
                max,
                window: Duration::from_secs(300),
            },
            subject,
            deadline,
        )
        .await;
    if d.allowed {
        Ok(d.info)
    } else {
        Err(AuthApiError::rate_limited(d.info.retry_after))
    }
}

pub(crate) fn general(state: &AppState) -> u32 {
    state.settings.auth_rate_limit_per_5min
}

#[OpenApi(prefix_path = "/auth/v1", tag = "ApiTags::Auth")]
impl AuthApi {
    /// Sign up with email and password
    ///
    /// Creates the account (argon2id hash) with the default rows. With
    /// `AUTH_AUTOCONFIRM=true` the answer is a session; otherwise a
    /// confirmation mail is queued and the answer is the unconfirmed user. A
    /// repeated sign-up of an existing email answers the same status, shape
    /// and clocks (a look-alike user; no email enumeration), except with
    /// autoconfirm (422 `user_already_exists`). Until the email is confirmed
    /// every sign-up replaces the pending password; its mail is held back
    /// quietly (200 all the same) within `AUTH_MAIL_INTERVAL_SECS` of the
    /// previous mail to the address or past `AUTH_CONFIRMATION_MAILS_PER_DAY`
    /// mails sent to it in 24 h;
    /// a mail sent voids the address's earlier codes, not its links. A
    /// confirmation keeps the pre-proof password and `data` only when its mail
    /// was issued for the sign-up that set them and no other request (another
    /// sign-up with another password, a code sign-up, an OAuth sign-in)
    /// touched the pending account, in either order; for an `ADMIN_EMAILS`
    /// address none is kept. `data` larger than 4 KiB (as JSON): 422
    /// `validation_failed` naming `data`, whether or not the address has an
    /// account. Per-IP limit `AUTH_RATE_LIMIT_PER_5MIN`.
    #[oai(path = "/signup", method = "post", operation_id = "authSignUp")]
    async fn signup(
        &self,
        state: Data<&AppState>,
        req: &Request,
        redirect_to: Query<Option<String>>,
        body: OpenJsonBody<SignUpBody>,
    ) -> AuthResult<Json<SignUpAnswer>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_signup", general(&state)).await?;
                let rid = request_id(req);
                let out = idp
                    .sign_up(SignUp {
                        email: &body.email.0,
                        password: &body.password,
                        data: body.data.as_ref(),
                        redirect_to: redirect_to.0.as_deref(),
                        code_challenge: body.code_challenge.as_deref(),
                        code_challenge_method: body.code_challenge_method.as_deref(),
                        request_id: rid,
                    })
                    .await?;
                Ok((
                    Json(match out {
                        SignUpOutcome::Session(s) => SignUpAnswer::Session(*s),
                        SignUpOutcome::User(u) => SignUpAnswer::User(*u),
                    }),
                    Some(rate),
                ))
            }
            .await,
        )
    }

    /// Sign in or refresh: grant_type=password, refresh_token or pkce
    ///
    /// `password`: `{email, password}` → session (400 `invalid_credentials`
    /// for an unknown email or a wrong password alike, 400 `email_not_confirmed`).
    /// `refresh_token`: `{refresh_token}` → a new session; the token rotates.
    /// A `pkce` exchange of a sign-up's flow installs that sign-up's password.
    /// The previous token still yields the active one for
    /// `AUTH_REFRESH_REUSE_INTERVAL_SECS`; any other reuse revokes the session
    /// (400 `refresh_token_already_used`). `pkce`: `{auth_code, code_verifier}`
    /// (404 `flow_state_not_found`, 422 `flow_state_expired`, 400
    /// `bad_code_verifier`). Per-IP limits: `AUTH_RATE_LIMIT_PER_5MIN`
    /// (password, pkce), `AUTH_RATE_LIMIT_REFRESH_PER_5MIN` (refresh).
    #[oai(path = "/token", method = "post", operation_id = "authToken")]
    async fn token(
        &self,
        state: Data<&AppState>,
        req: &Request,
        /// `password`, `refresh_token` or `pkce`.
        #[oai(validator(pattern = "^(password|refresh_token|pkce)$"))]
        grant_type: Query<String>,
        body: OpenJsonBody<TokenBody>,
    ) -> AuthResult<Json<SessionGrant>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let missing = |f: &str| AuthApiError::validation(format!("{f} is required"));
                match grant_type.0.as_str() {
                    "password" => {
                        let rate = limit(&state, req, "auth_token", general(&state)).await?;
                        let email = body
                            .email
                            .as_ref()
                            .map(|e| e.0.as_str())
                            .ok_or_else(|| missing("email"))?;
                        let pw = body
                            .password
                            .as_deref()
                            .ok_or_else(|| missing("password"))?;
                        Ok((Json(idp.sign_in_password(email, pw).await?), Some(rate)))
                    }
                    "refresh_token" => {
                        let rate = limit(
                            &state,
                            req,
                            "auth_refresh",
                            state.settings.auth_rate_limit_refresh_per_5min,
                        )
                        .await?;
                        let t = body
                            .refresh_token
                            .as_deref()
                            .ok_or_else(|| missing("refresh_token"))?;
                        Ok((Json(idp.refresh(t).await?), Some(rate)))
                    }
                    "pkce" => {
                        let rate = limit(&state, req, "auth_token", general(&state)).await?;
                        let code = body
                            .auth_code
                            .as_deref()
                            .ok_or_else(|| missing("auth_code"))?;
                        let v = body
                            .code_verifier
                            .as_deref()
                            .ok_or_else(|| missing("code_verifier"))?;
                        Ok((Json(idp.exchange_pkce(code, v).await?), Some(rate)))
                    }
                    _ => Err(AuthApiError::validation(
                        "grant_type: expected password, refresh_token or pkce",
                    )),
                }
            }
            .await,
        )
    }

    /// Verify a mail's token
    ///
    /// `{type, token_hash}` (the mail's `{{ .TokenHash }}`) or `{type, email,
    /// token}` (the 6-digit `{{ .Token }}`) → session. Unknown, used or expired
    /// (`AUTH_OTP_EXPIRY_SECS`) tokens: 403 `otp_expired`; a code after five
    /// wrong codes for its address, or after a later mail to that address: 403
    /// `otp_expired` (its link still works). Code checks per address, known or
    /// not: `AUTH_CODE_FAILURES_PER_HOUR` per hour, then 429
    /// `over_request_rate_limit` with `Retry-After` until the hour is over or a
    /// link of the address is used; links are never refused by it. The first
    /// proof of an account's address decides, once, what it keeps: what the
    /// consumed mail's own request chose (not for an `ADMIN_EMAILS` address),
    /// nothing else; every other identity, mail token, PKCE flow and session
    /// of the account is voided. A confirmation that drops a password chosen
    /// before the mailbox was proven signs in and mails a set-password
    /// notice. An `email_change` token applies the address its request named,
    /// once both of that request's mails are verified; the first of the two
    /// answers 200 `{msg}` and no session. Per-IP limit
    /// `AUTH_RATE_LIMIT_PER_5MIN`.
    #[oai(path = "/verify", method = "post", operation_id = "authVerify")]
    async fn verify_post(
        &self,
        state: Data<&AppState>,
        req: &Request,
        body: OpenJsonBody<VerifyBody>,
    ) -> AuthResult<Json<VerifyAnswer>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_verify", general(&state)).await?;
                let s = match (&body.token_hash, &body.email, &body.token) {
                    (Some(h), _, _) if !h.is_empty() => {
                        idp.verify_token_hash(&body.kind, h).await?
                    }
                    (_, Some(e), Some(t)) => idp.verify_code(&body.kind, &e.0, t).await?,
                    _ => {
                        return Err(AuthApiError::validation(
                            "verify requires token_hash, or email and token",
                        ))
                    }
                };
                let answer = match s {
                    Verified::Session(s) => VerifyAnswer::Session(*s),
                    Verified::Message(msg) => VerifyAnswer::Message(VerifyMessage { msg }),
                };
                Ok((Json(answer), Some(rate)))
            }
            .await,
        )
    }

    /// Follow a mail link
    ///
    /// `?token=<token_hash>&type=…&redirect_to=…` → 303 to `redirect_to`
    /// (checked against `APP_URL` and `AUTH_REDIRECT_ALLOW_LIST`, else
    /// `APP_URL`): `#access_token=…&expires_at=…&expires_in=…&refresh_token=…&token_type=bearer&type=…`
    /// (implicit flow) or `?code=…` (PKCE flow), or on failure
    /// `#error=access_denied&error_code=…&error_description=…`. The first
    /// verified half of an email change: `#message=…` and no session.
    #[oai(path = "/verify", method = "get", operation_id = "authVerifyLink")]
    async fn verify_get(
        &self,
        state: Data<&AppState>,
        req: &Request,
        token: Query<Option<String>>,
        #[oai(name = "type")] kind: Query<Option<String>>,
        redirect_to: Query<Option<String>>,
    ) -> SeeOther {
        let target = entity::identity::redirect::allowed_redirect(
            &state.settings.app_url,
            &state.settings.auth_redirect_allow_list,
            redirect_to.0.as_deref(),
        );
        let kind = kind.0.unwrap_or_default();
        let result = async {
            let idp = idp(&state)?;
            limit(&state, req, "auth_verify", general(&state)).await?;
            let token = token
                .0
                .as_deref()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| AuthApiError::validation("token is required"))?;
            idp.verify_link(&kind, token).await
        }
        .await;
        SeeOther::SeeOther(match result {
            Ok(LinkOutcome::Code(code)) => {
                let sep = if target.contains('?') { '&' } else { '?' };
                format!("{}{sep}code={}", strip_fragment(&target), crate::identity::urlencode(&code))
            }
            Ok(LinkOutcome::Message(m)) => format!(
                "{}#message={}",
                strip_fragment(&target),
                crate::identity::urlencode(&m),
            ),
            Ok(LinkOutcome::Session(s)) => format!(
                "{}#access_token={}&expires_at={}&expires_in={}&refresh_token={}&token_type=bearer&type={}",
                strip_fragment(&target),
                s.access_token,
                s.expires_at,
                s.expires_in,
                crate::identity::urlencode(&s.refresh_token),
                crate::identity::urlencode(&kind),
            ),
            Err(e) => format!(
                "{}#error={}&error_code={}&error_description={}",
                strip_fragment(&target),
                if e.status >= 500 { "server_error" } else { "access_denied" },
                e.code,
                crate::identity::urlencode(if e.code == "otp_expired" {
                    "Email link is invalid or has expired"
                } else {
                    &e.message
                }),
            ),
        })
    }

    /// Send a magic link / one-time code
    ///
    /// Queues a mail with a link and a 6-digit code (a confirmation mail for a
    /// new or unconfirmed user; a code sign-up of an unconfirmed account
    /// contests it, so its confirmation keeps no password or `data` chosen
    /// before the mailbox was proven). `data` larger than 4 KiB (as JSON): 422
    /// `validation_failed` naming `data`, whether or not the address has an
    /// account. `create_user: false` and an unknown email: 422
    /// `otp_disabled` (the one answer that shows whether an address has an
    /// account, as on the platform). At most one mail of a kind per address per
    /// `AUTH_MAIL_INTERVAL_SECS` (60 s; 429 `over_email_send_rate_limit`).
    /// Per-IP limit `AUTH_RATE_LIMIT_PER_5MIN`.
    #[oai(path = "/otp", method = "post", operation_id = "authOtp")]
    async fn otp(
        &self,
        state: Data<&AppState>,
        req: &Request,
        redirect_to: Query<Option<String>>,
        body: OpenJsonBody<OtpBody>,
    ) -> AuthResult<Json<Empty>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_otp", general(&state)).await?;
                let email = body
                    .email
                    .as_ref()
                    .map(|e| e.0.as_str())
                    .ok_or_else(|| AuthApiError::validation("email is required"))?;
                idp.send_otp(OtpRequest {
                    email,
                    create_user: body.create_user.unwrap_or(true),
                    data: body.data.as_ref(),
                    redirect_to: redirect_to.0.as_deref(),
                    code_challenge: body.code_challenge.as_deref(),
                    code_challenge_method: body.code_challenge_method.as_deref(),
                    request_id: request_id(req),
                })
                .await?;
                Ok((Json(Empty {}), Some(rate)))
            }
            .await,
        )
    }

    /// Send a password-recovery mail
    ///
    /// Always `{}` (whether the email exists is not revealed), except the
    /// mail interval rule, applied per address whether or not an account has
    /// it (`AUTH_MAIL_INTERVAL_SECS`, 429 `over_email_send_rate_limit`), and
    /// the per-IP limit.
    #[oai(path = "/recover", method = "post", operation_id = "authRecover")]
    async fn recover(
        &self,
        state: Data<&AppState>,
        req: &Request,
        redirect_to: Query<Option<String>>,
        body: OpenJsonBody<RecoverBody>,
    ) -> AuthResult<Json<Empty>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_recover", general(&state)).await?;
                idp.recover(OtpRequest {
                    email: &body.email.0,
                    create_user: false,
                    data: None,
                    redirect_to: redirect_to.0.as_deref(),
                    code_challenge: body.code_challenge.as_deref(),
                    code_challenge_method: body.code_challenge_method.as_deref(),
                    request_id: request_id(req),
                })
                .await?;
                Ok((Json(Empty {}), Some(rate)))
            }
            .await,
        )
    }

    /// Send the confirmation or email-change mail again
    ///
    /// `{}` whether or not the address has an account. The mail interval is
    /// claimed per address for both (429 `over_email_send_rate_limit`);
    /// `AUTH_CONFIRMATION_MAILS_PER_DAY` bounds the confirmation mails sent
    /// (a resend that sends nothing spends none; past it the mail is held
    /// back, `{}` all the same). Per-IP limit `AUTH_RATE_LIMIT_PER_5MIN`.
    #[oai(path = "/resend", method = "post", operation_id = "authResend")]
    async fn resend(
        &self,
        state: Data<&AppState>,
        req: &Request,
        redirect_to: Query<Option<String>>,
        body: OpenJsonBody<ResendBody>,
    ) -> AuthResult<Json<Empty>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_otp", general(&state)).await?;
                idp.resend(
                    &body.kind,
                    &body.email.0,
                    redirect_to.0.as_deref(),
                    request_id(req),
                )
                .await?;
                Ok((Json(Empty {}), Some(rate)))
            }
            .await,
        )
    }

    /// The signed-in user
    ///
    /// Bearer access token of this provider; the session must still exist
    /// (403 `session_not_found` after sign-out or revocation).
    #[oai(path = "/user", method = "get", operation_id = "authGetUser")]
    async fn get_user(&self, state: Data<&AppState>, req: &Request) -> AuthResult<Json<UserJson>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                Ok((Json(idp.current_user(bearer(req)).await?), None))
            }
            .await,
        )
    }

    /// Update the signed-in user
    ///
    /// `password` (422 `weak_password` / `same_password`; voids the account's
    /// outstanding recovery, magic-link and email-change mails), `email` (a
    /// confirmation mail to the new address and one to the current one, both
    /// bound to this request and its address; the mail interval of both
    /// addresses is claimed before anything is written, so a refused request,
    /// 429 `over_email_send_rate_limit`, changes nothing; applied, to that
    /// address only, when both are verified; applying voids the account's
    /// outstanding recovery and magic-link mails), `data` (merged into
    /// `user_metadata`; 422 `validation_failed` naming `data` when it would
    /// grow it past 4 KiB as JSON, while an update that shrinks it is taken).
    /// A request carrying `password` or `email` is limited per IP and per user
    /// (`AUTH_RATE_LIMIT_PER_5MIN` each; 429 `over_request_rate_limit` with
    /// `Retry-After`); `data`-only updates are not.
    #[oai(path = "/user", method = "put", operation_id = "authUpdateUser")]
    async fn put_user(
        &self,
        state: Data<&AppState>,
        req: &Request,
        redirect_to: Query<Option<String>>,
        body: OpenJsonBody<UpdateUserBody>,
    ) -> AuthResult<Json<UserJson>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let claims = idp.authenticate(bearer(req)).await?;
                let rate = if body.password.is_some() || body.email.is_some() {
                    let by_ip = limit(&state, req, "auth_user_change", general(&state)).await?;
                    let by_user = limit_subject(
                        &state,
                        "auth_user_change_user",
                        general(&state),
                        &claims.sub.to_string(),
                    )
                    .await?;
                    Some(if by_user.remaining < by_ip.remaining {
                        by_user
                    } else {
                        by_ip
                    })
                } else {
                    None
                };
                let u = idp
                    .update_user(
                        &claims,
                        UpdateUser {
                            password: body.password.as_deref(),
                            nonce: body.nonce.as_deref(),
                            email: body.email.as_ref().map(|e| e.0.as_str()),
                            data: body.data.as_ref(),
                            redirect_to: redirect_to.0.as_deref(),
                            code_challenge: body.code_challenge.as_deref(),
                            code_challenge_method: body.code_challenge_method.as_deref(),
                            request_id: request_id(req),
                        },
                    )
                    .await?;
                Ok((Json(u), rate))
            }
            .await,
        )
    }

    /// Mail a reauthentication nonce
    ///
    /// Mails the signed-in user a 6-digit code for `PUT /user {password,
    /// nonce}` (needed when the session signed in more than 24 h ago). One
    /// mail per `AUTH_MAIL_INTERVAL_SECS` (60 s; 429
    /// `over_email_send_rate_limit`). Per-IP limit `AUTH_RATE_LIMIT_PER_5MIN`.
    #[oai(
        path = "/reauthenticate",
        method = "get",
        operation_id = "authReauthenticate"
    )]
    async fn reauthenticate(
        &self,
        state: Data<&AppState>,
        req: &Request,
    ) -> AuthResult<Json<Empty>> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let rate = limit(&state, req, "auth_otp", general(&state)).await?;
                let claims = idp.authenticate(bearer(req)).await?;
                idp.reauthenticate(&claims).await?;
                Ok((Json(Empty {}), Some(rate)))
            }
            .await,
        )
    }

    /// Sign out
    ///
    /// `scope=global` (default: every session of the user), `local` (this
    /// session), `others`. The sessions' refresh tokens stop working at once;
    /// access tokens already issued stay valid until their `exp` for routes
    /// that verify them locally (as on the platform), but `GET /user` refuses them.
    #[oai(path = "/logout", method = "post", operation_id = "authLogout")]
    async fn logout(
        &self,
        state: Data<&AppState>,
        req: &Request,
        scope: Query<Option<String>>,
    ) -> AuthResult<NoContent> {
        AuthResult::from(
            async {
                let idp = idp(&state)?;
                let claims = idp.authenticate(bearer(req)).await?;
                idp.logout(&claims, scope.0.as_deref()).await?;
                Ok((NoContent::NoContent, None))
            }
            .await,
        )
    }

    /// Public signing keys (JWKS)
    ///
    /// ES256 public keys: the current one and previous ones still accepted
    /// (`AUTH_JWT_PREVIOUS_KEYS`). Never private material.
    #[oai(
        path = "/.well-known/jwks.json",
        method = "get",
        operation_id = "authJwks"
    )]
    async fn jwks(&self, state: Data<&AppState>) -> AuthResult<Json<Jwks>> {
        AuthResult::from((|| {
            let idp = idp(&state)?;
            let keys = idp.jwks()["keys"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|k| Jwk {
                    kty: k["kty"].as_str().unwrap_or_default().into(),
                    crv: k["crv"].as_str().unwrap_or_default().into(),
                    x: k["x"].as_str().unwrap_or_default().into(),
                    y: k["y"].as_str().unwrap_or_default().into(),
                    kid: k["kid"].as_str().unwrap_or_default().into(),
                    alg: "ES256".into(),
                    use_: "sig".into(),
                    key_ops: vec!["verify".into()],
                })
                .collect();
            Ok((Json(Jwks { keys }), None))
        })())
    }

    /// Provider settings
    #[oai(path = "/settings", method = "get", operation_id = "authSettings")]
    async fn settings(&self, state: Data<&AppState>) -> AuthResult<Json<AuthSettings>> {
        AuthResult::from((|| {
            idp(&state)?;
            Ok((
                Json(AuthSettings {
                    external: ExternalProviders {
                        email: true,
                        phone: false,
                        github: state.settings.oauth.github.is_some(),
                        google: state.settings.oauth.google.is_some(),
                    },
                    disable_signup: false,
                    mailer_autoconfirm: state.settings.auth_autoconfirm,
                    phone_autoconfirm: false,
                    sms_provider: String::new(),
                    saml_enabled: false,
                }),
                None,
            ))
        })())
    }

    /// Provider health
    #[oai(path = "/health", method = "get", operation_id = "authHealth")]
    async fn health(&self, state: Data<&AppState>) -> AuthResult<Json<AuthHealth>> {
        AuthResult::from((|| {
            idp(&state)?;
            Ok((
                Json(AuthHealth {
                    version: env!("CARGO_PKG_VERSION").into(),
                    name: "GoTrue".into(),
                    description: "Built-in identity provider speaking the GoTrue protocol".into(),
                    provider: "builtin".into(),
                }),
                None,
            ))
        })())
    }
}

fn strip_fragment(url: &str) -> &str {
    url.split('#').next().unwrap_or(url)
}
