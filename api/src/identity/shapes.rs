//! The platform's JSON shapes (users, identities, sessions, access-token
//! claims) and the inputs of the provider's operations.

use entity::identity::view::UserView;
use poem_openapi::Object;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::AUDIENCE;

/// `app_metadata` of a user.
#[derive(Debug, Clone, Object, Serialize, Deserialize)]
pub struct AppMetadata {
    /// The first provider the user signed up with (`email`, `github`, `google`).
    pub provider: String,
    /// Every linked provider.
    pub providers: Vec<String>,
}

/// A linked identity, as the platform shows it. Fields without a value are
/// absent (as on the platform), never `null`.
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
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// Last sign-in through it (RFC 3339).
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sign_in_at: Option<String>,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Updated (RFC 3339).
    pub updated_at: String,
}

/// A user, as the platform shows it. Fields without a value are absent (as
/// on the platform), never `null`.
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
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email_confirmed_at: Option<String>,
    /// Phone (always empty: no phone sign-in).
    pub phone: String,
    /// Same as `email_confirmed_at`.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_at: Option<String>,
    /// When the last confirmation mail was sent.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation_sent_at: Option<String>,
    /// When the last recovery mail was sent.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_sent_at: Option<String>,
    /// A pending new email (email change).
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_email: Option<String>,
    /// When the email-change mail was sent.
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email_change_sent_at: Option<String>,
    /// Last sign-in (RFC 3339).
    #[oai(skip_serializing_if_is_none)]
    #[serde(skip_serializing_if = "Option::is_none")]
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
            // The account's (database clock) when there is one, like every
            // other time here.
            created_at: ts(a.map(|a| a.created_at).unwrap_or(v.user.created_at)),
            updated_at: ts(a.map(|a| a.updated_at).unwrap_or(v.user.created_at)),
            is_anonymous: false,
        }
    }

    /// A user that looks exactly like a fresh unconfirmed sign-up of `email`
    /// (random ids): the answer to a repeated sign-up. `created` stands for
    /// the account's creation (also its `updated_at` and its identity's
    /// times), `sent` for the confirmation mail, both read from the database's
    /// clock at the steps where a new account's are.
    pub fn decoy(
        email: &str,
        metadata: serde_json::Value,
        created: chrono::DateTime<chrono::Utc>,
        sent: chrono::DateTime<chrono::Utc>,
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
            confirmation_sent_at: Some(ts(sent)),
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
                created_at: ts(created),
                updated_at: ts(created),
            }],
            created_at: ts(created),
            updated_at: ts(created),
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

/// The result of a verified mail link.
#[derive(Debug)]
pub enum LinkOutcome {
    /// Implicit flow: the session for the URL fragment.
    Session(Box<SessionGrant>),
    /// PKCE flow: the auth code for `?code=`.
    Code(String),
    /// The first half of an email change: accepted, no session (the
    /// platform's `#message=`).
    Message(String),
}

/// The result of a verified mail token (`POST /verify`).
#[derive(Debug)]
pub enum Verified {
    /// Signed in.
    Session(Box<SessionGrant>),
    /// The first half of an email change: accepted, no session (the
    /// platform's 200 `{msg}`).
    Message(String),
}

/// What the first verified half of an email change answers, as the
/// platform words it.
pub const EMAIL_CHANGE_FIRST_HALF: &str =
    "Confirmation link accepted. Please proceed to confirm link sent to the other email";

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
    /// The reauthentication nonce (`GET /reauthenticate`'s code).
    pub nonce: Option<&'a str>,
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
