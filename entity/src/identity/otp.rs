//! One-time mail tokens and the one-mail-of-a-kind-per-user rule (one per
//! `AUTH_MAIL_INTERVAL_SECS`, default 60 s).
//!
//! Each mail carries two secrets for the same row: a 6-digit code
//! (`{{ .Token }}`, for `verifyOtp({email, token})`) and a long random
//! `token_hash` (`{{ .TokenHash }}`, for links and `verifyOtp({token_hash})`).
//! Only their SHA-256 digests are stored. A user has at most one outstanding
//! token per kind (an email change has two: one per address): a new mail
//! replaces the previous token. Consuming is a conditional DELETE (single
//! use); a token older than the expiry (`AUTH_OTP_EXPIRY_SECS`, database
//! clock) is [`IdentityError::OtpExpired`].
//!
//! Codes cannot be guessed: every wrong code for an email adds one to
//! `failed_attempts` of the tokens mailed to that email (one atomic UPDATE,
//! whatever the client's IP); at [`MAX_FAILED_ATTEMPTS`] the token (its code
//! and the link of the same mail) is void, and a new mail issues a new one.

use sea_orm::{
    sea_query::{Condition, Expr},
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set,
};
use uuid::Uuid;

use super::{tokens, IdentityError};
use crate::entities::{auth_accounts as acc, auth_one_time_tokens as ott};

/// Default seconds between two mails of one kind to one user
/// (`AUTH_MAIL_INTERVAL_SECS`).
pub const DEFAULT_MAIL_INTERVAL_SECS: i64 = 60;

/// Wrong codes for an email after which the tokens mailed to it are void.
pub const MAX_FAILED_ATTEMPTS: i32 = 5;

/// The kinds of mail (and of one-time token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MailKind {
    /// Sign-up confirmation.
    Confirmation,
    /// Password recovery.
    Recovery,
    /// Magic link / email OTP sign-in.
    Magiclink,
    /// Confirmation of an email change (sent to the new and the current address).
    EmailChange,
    /// The nonce that a password change from an old session needs.
    Reauthentication,
}

impl MailKind {
    /// `confirmation`, `recovery`, `magiclink`, `email_change`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmation => "confirmation",
            Self::Recovery => "recovery",
            Self::Magiclink => "magiclink",
            Self::EmailChange => "email_change",
            Self::Reauthentication => "reauthentication",
        }
    }

    /// The `type` the platform puts into links and redirects for this kind.
    pub fn verify_type(self) -> &'static str {
        match self {
            Self::Confirmation => "signup",
            Self::Recovery => "recovery",
            Self::Magiclink => "magiclink",
            Self::EmailChange => "email_change",
            Self::Reauthentication => "reauthentication",
        }
    }

    fn sent_at(self) -> acc::Column {
        match self {
            Self::Confirmation => acc::Column::ConfirmationSentAt,
            Self::Recovery => acc::Column::RecoverySentAt,
            Self::Magiclink => acc::Column::MagiclinkSentAt,
            Self::EmailChange => acc::Column::EmailChangeSentAt,
            Self::Reauthentication => acc::Column::ReauthenticationSentAt,
        }
    }
}

/// The token kinds a verify `type` accepts: `signup`/`invite` → confirmation,
/// `magiclink` → magic link, `email` → either, `recovery`, `email_change`.
///
/// # Errors
/// [`IdentityError::Validation`] for another type.
pub fn kinds_for_type(verify_type: &str) -> Result<&'static [MailKind], IdentityError> {
    Ok(match verify_type {
        "signup" | "invite" => &[MailKind::Confirmation],
        "magiclink" => &[MailKind::Magiclink, MailKind::Confirmation],
        "email" => &[MailKind::Confirmation, MailKind::Magiclink],
        "recovery" => &[MailKind::Recovery],
        "email_change" => &[MailKind::EmailChange],
        _ => {
            return Err(IdentityError::Validation(
                "type: expected signup, invite, magiclink, recovery, email_change or email".into(),
            ))
        }
    })
}

/// Claims the right to send a `kind` mail to `user_id` now: a conditional
/// UPDATE of the account's `*_sent_at` column that succeeds only when the
/// previous mail of that kind is at least `interval_secs` old by the
/// database's clock (`0`: always). Of 20 concurrent claims exactly one succeeds.
///
/// # Errors
/// [`IdentityError::OverEmailSendRateLimit`] with the seconds to wait;
/// [`IdentityError::UserNotFound`] when the account is gone.
pub async fn claim_mail_slot<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
    interval_secs: i64,
) -> Result<(), IdentityError> {
    let now = crate::db::now(db).await?;
    let cutoff = now - chrono::Duration::seconds(interval_secs);
    let col = kind.sent_at();
    let res = acc::Entity::update_many()
        .col_expr(col, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .filter(Condition::any().add(col.is_null()).add(col.lte(cutoff)))
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        return Ok(());
    }
    let wait = match acc::Entity::find_by_id(user_id).one(db).await? {
        Some(a) => {
            let sent = match kind {
                MailKind::Confirmation => a.confirmation_sent_at,
                MailKind::Recovery => a.recovery_sent_at,
                MailKind::Magiclink => a.magiclink_sent_at,
                MailKind::EmailChange => a.email_change_sent_at,
                MailKind::Reauthentication => a.reauthentication_sent_at,
            };
            let max = interval_secs.max(1);
            sent.map(|s| interval_secs - (now - s).num_seconds())
                .unwrap_or(max)
                .clamp(1, max)
        }
        None => return Err(IdentityError::UserNotFound),
    };
    Err(IdentityError::OverEmailSendRateLimit(wait))
}

/// Stamps the `kind` mail of `user_id` as sent now without the interval rule:
/// for a repeated sign-up of an unconfirmed account, whose mail the per-IP
/// limits bound instead.
pub async fn stamp_mail_sent<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
) -> Result<(), IdentityError> {
    let now = crate::db::now(db).await?;
    acc::Entity::update_many()
        .col_expr(kind.sent_at(), Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// The secrets of a freshly issued token, to put into the mail.
#[derive(Debug, Clone)]
pub struct IssuedOtp {
    /// The 6-digit code.
    pub code: String,
    /// The link secret (64 hex characters).
    pub token_hash: String,
}

/// Issues a `kind` token for `user_id`, replacing any outstanding one of
/// that kind. `email_norm` is the address the code is bound to (the new
/// address for an email change); `flow_state_id` links a PKCE flow.
pub async fn issue<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
    email_norm: &str,
    flow_state_id: Option<Uuid>,
) -> Result<IssuedOtp, IdentityError> {
    ott::Entity::delete_many()
        .filter(ott::Column::UserId.eq(user_id))
        .filter(ott::Column::Kind.eq(kind.as_str()))
        .exec(db)
        .await?;
    issue_another(db, user_id, kind, email_norm, flow_state_id).await
}

/// Issues a `kind` token for `user_id` next to the outstanding ones (the
/// second mail of an email change, to the current address).
pub async fn issue_another<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
    email_norm: &str,
    flow_state_id: Option<Uuid>,
) -> Result<IssuedOtp, IdentityError> {
    let code = tokens::otp_code();
    let token_hash = tokens::random_hex(32);
    let now = crate::db::now(db).await?;
    ott::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user_id),
        kind: Set(kind.as_str().into()),
        token_hash_digest: Set(tokens::sha256_hex(&token_hash)),
        otp_digest: Set(tokens::otp_digest(email_norm, &code)),
        relates_to: Set(Some(email_norm.to_string())),
        flow_state_id: Set(flow_state_id),
        failed_attempts: Set(0),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(IssuedOtp { code, token_hash })
}

/// Voids every outstanding token of `user_id` (all kinds).
pub async fn void_all<C: ConnectionTrait>(db: &C, user_id: Uuid) -> Result<(), IdentityError> {
    ott::Entity::delete_many()
        .filter(ott::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Whether `user_id` still has an outstanding `kind` token (the other half
/// of an email change).
pub async fn outstanding<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
) -> Result<bool, IdentityError> {
    Ok(ott::Entity::find()
        .filter(ott::Column::UserId.eq(user_id))
        .filter(ott::Column::Kind.eq(kind.as_str()))
        .one(db)
        .await?
        .is_some())
}

/// How a client proves it got the mail.
#[derive(Debug, Clone, Copy)]
pub enum Proof<'a> {
    /// The link's `token_hash`.
    TokenHash(&'a str),
    /// The email and its 6-digit code.
    Code {
        /// The normalised email.
        email_norm: &'a str,
        /// The code.
        code: &'a str,
    },
}

/// Consumes the token proven by `proof` among `kinds`: unknown, used,
/// expired or void after [`MAX_FAILED_ATTEMPTS`] wrong codes →
/// [`IdentityError::OtpExpired`]. Single use by conditional DELETE (which
/// also requires fewer than [`MAX_FAILED_ATTEMPTS`] wrong codes). A code that
/// matches no token counts one wrong try against every token mailed to that
/// email, in one UPDATE.
pub async fn consume<C: ConnectionTrait>(
    db: &C,
    kinds: &[MailKind],
    proof: Proof<'_>,
    expiry_secs: i64,
) -> Result<ott::Model, IdentityError> {
    let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    let q = ott::Entity::find().filter(ott::Column::Kind.is_in(kinds));
    let q = match proof {
        Proof::TokenHash(h) => {
            let h = h.trim();
            // Links made by the platform prefix PKCE tokens with `pkce_`.
            let h = h.strip_prefix("pkce_").unwrap_or(h);
            if h.is_empty() || h.len() > 256 {
                return Err(IdentityError::OtpExpired);
            }
            q.filter(ott::Column::TokenHashDigest.eq(tokens::sha256_hex(h)))
        }
        Proof::Code { email_norm, code } => {
            let code = code.trim();
            if code.is_empty() || code.len() > 64 {
                return Err(IdentityError::OtpExpired);
            }
            q.filter(ott::Column::OtpDigest.eq(tokens::otp_digest(email_norm, code)))
        }
    };
    let Some(row) = q.one(db).await? else {
        if let Proof::Code { email_norm, .. } = proof {
            ott::Entity::update_many()
                .col_expr(
                    ott::Column::FailedAttempts,
                    Expr::cust("failed_attempts + 1"),
                )
                .filter(ott::Column::RelatesTo.eq(email_norm))
                .exec(db)
                .await?;
        }
        return Err(IdentityError::OtpExpired);
    };
    let deleted = ott::Entity::delete_many()
        .filter(ott::Column::Id.eq(row.id))
        .filter(ott::Column::FailedAttempts.lt(MAX_FAILED_ATTEMPTS))
        .exec(db)
        .await?
        .rows_affected;
    if deleted != 1 {
        return Err(IdentityError::OtpExpired);
    }
    let now = crate::db::now(db).await?;
    if (now - row.created_at).num_milliseconds() > expiry_secs.saturating_mul(1000) {
        return Err(IdentityError::OtpExpired);
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_types_map_to_kinds() {
        assert_eq!(kinds_for_type("signup").unwrap(), &[MailKind::Confirmation]);
        assert!(kinds_for_type("email")
            .unwrap()
            .contains(&MailKind::Magiclink));
        assert_eq!(kinds_for_type("recovery").unwrap(), &[MailKind::Recovery]);
        assert!(kinds_for_type("sms").is_err());
        assert_eq!(MailKind::Confirmation.verify_type(), "signup");
    }
}
