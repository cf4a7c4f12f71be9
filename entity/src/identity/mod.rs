//! The built-in identity provider's rules: accounts with argon2id
//! passwords, linked identities, sessions with rotating refresh tokens,
//! one-time mail tokens, PKCE flow states and the one-mail-per-interval rule.
//!
//! Everything time-based is decided against the database's clock
//! ([`crate::base::db::now`]) and with conditional writes, so concurrent requests
//! on several api processes agree. The HTTP shapes (the hosted auth
//! platform's `/auth/v1` protocol) live in the api; this module only names
//! the platform's error codes ([`IdentityError::code`]).

pub mod account;
pub mod external;
pub mod flow;
pub mod oauth;
pub mod otp;
pub mod password;
pub mod redirect;
pub mod sessions;
pub mod tokens;
pub mod view;

use sea_orm::DbErr;

/// Why an identity operation failed. [`IdentityError::code`] is the hosted
/// auth platform's `error_code`.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Unknown email or wrong password (indistinguishable on purpose).
    #[error("Invalid login credentials")]
    InvalidCredentials,
    /// The email is not confirmed yet.
    #[error("Email not confirmed")]
    EmailNotConfirmed,
    /// Another account already uses this email (email change).
    #[error("A user with this email address has already been registered")]
    EmailExists,
    /// The password is too weak; the reasons are `length`, `characters`.
    #[error("Password should be at least {min} characters.")]
    WeakPassword {
        /// The configured minimum length.
        min: usize,
        /// Why: `length`, `characters`.
        reasons: Vec<&'static str>,
    },
    /// The new password equals the current one.
    #[error("New password should be different from the old password.")]
    SamePassword,
    /// The one-time token is unknown, used or expired.
    #[error("Token has expired or is invalid")]
    OtpExpired,
    /// A mail of this kind went to this user less than `AUTH_MAIL_INTERVAL_SECS` ago.
    #[error("For security purposes, you can only request this after {0} seconds.")]
    OverEmailSendRateLimit(i64),
    /// Too many code checks for this address in the current window
    /// (`AUTH_CODE_FAILURES_PER_HOUR`); the seconds left in it.
    #[error("Request rate limit reached")]
    OverRequestRateLimit(i64),
    /// No PKCE flow state for this auth code.
    #[error("invalid flow state, no valid flow state found")]
    FlowStateNotFound,
    /// The PKCE flow state is too old.
    #[error("invalid flow state, flow state has expired")]
    FlowStateExpired,
    /// The code verifier does not match the challenge.
    #[error("code challenge does not match previously saved code verifier")]
    BadCodeVerifier,
    /// The session no longer exists (signed out, revoked).
    #[error("Session from session_id claim in JWT does not exist")]
    SessionNotFound,
    /// The session passed its lifetime (`AUTH_SESSIONS_TIMEBOX_SECS`) or was
    /// idle too long (`AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS`).
    #[error("Invalid Refresh Token: Session Expired")]
    SessionExpired,
    /// A password change from a session signed in more than 24 h ago without
    /// the reauthentication nonce.
    #[error("Password update requires reauthentication")]
    ReauthenticationNeeded,
    /// The reauthentication nonce is wrong, used or expired.
    #[error("Requires a valid nonce")]
    ReauthenticationNotValid,
    /// Unknown refresh token.
    #[error("Invalid Refresh Token: Refresh Token Not Found")]
    RefreshTokenNotFound,
    /// A rotated refresh token was used again outside the reuse interval: the
    /// session is revoked.
    #[error("Invalid Refresh Token: Already Used")]
    RefreshTokenAlreadyUsed {
        /// The owner of the revoked session.
        user_id: uuid::Uuid,
    },
    /// The user does not exist.
    #[error("User not found")]
    UserNotFound,
    /// A field is missing or malformed (the message names it).
    #[error("{0}")]
    Validation(String),
    /// `data` would make the stored `user_metadata` larger than
    /// [`account::MAX_USER_METADATA_BYTES`].
    #[error("data: user_metadata may be at most 4096 bytes (JSON) stored")]
    MetadataTooLarge,
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] DbErr),
}

impl IdentityError {
    /// The platform's `error_code` (`invalid_credentials`, …); `unexpected_failure` for [`Self::Db`].
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidCredentials => "invalid_credentials",
            Self::EmailNotConfirmed => "email_not_confirmed",
            Self::EmailExists => "email_exists",
            Self::WeakPassword { .. } => "weak_password",
            Self::SamePassword => "same_password",
            Self::OtpExpired => "otp_expired",
            Self::OverEmailSendRateLimit(_) => "over_email_send_rate_limit",
            Self::OverRequestRateLimit(_) => "over_request_rate_limit",
            Self::FlowStateNotFound => "flow_state_not_found",
            Self::FlowStateExpired => "flow_state_expired",
            Self::BadCodeVerifier => "bad_code_verifier",
            Self::SessionNotFound => "session_not_found",
            Self::SessionExpired => "session_expired",
            Self::ReauthenticationNeeded => "reauthentication_needed",
            Self::ReauthenticationNotValid => "reauthentication_not_valid",
            Self::RefreshTokenNotFound => "refresh_token_not_found",
            Self::RefreshTokenAlreadyUsed { .. } => "refresh_token_already_used",
            Self::UserNotFound => "user_not_found",
            Self::Validation(_) | Self::MetadataTooLarge => "validation_failed",
            Self::Db(_) => "unexpected_failure",
        }
    }

    /// The HTTP status the platform answers with for this error.
    pub fn status(&self) -> u16 {
        match self {
            Self::InvalidCredentials
            | Self::EmailNotConfirmed
            | Self::BadCodeVerifier
            | Self::RefreshTokenNotFound
            | Self::RefreshTokenAlreadyUsed { .. }
            | Self::SessionExpired
            | Self::ReauthenticationNeeded
            | Self::Validation(_) => 400,
            Self::OtpExpired | Self::SessionNotFound => 403,
            Self::FlowStateNotFound | Self::UserNotFound => 404,
            Self::EmailExists
            | Self::WeakPassword { .. }
            | Self::SamePassword
            | Self::FlowStateExpired
            | Self::ReauthenticationNotValid
            | Self::MetadataTooLarge => 422,
            Self::OverEmailSendRateLimit(_) | Self::OverRequestRateLimit(_) => 429,
            Self::Db(_) => 500,
        }
    }
}

/// Whether `e` is a unique-constraint violation (PostgreSQL 23505, SQLite
/// "UNIQUE constraint failed").
pub(crate) fn is_unique_violation(e: &DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}
