//! One-time mail tokens and the per-address rules of mails and codes.
//!
//! Each mail carries two secrets for the same row: a 6-digit code
//! (`{{ .Token }}`, for `verifyOtp({email, token})`) and a long random
//! `token_hash` (`{{ .TokenHash }}`, for links and `verifyOtp({token_hash})`).
//! Only their SHA-256 digests are stored. Consuming is a conditional DELETE
//! (single use); a token older than the expiry (`AUTH_OTP_EXPIRY_SECS`,
//! database clock) is [`IdentityError::OtpExpired`].
//!
//! Per recipient address, whatever account or flow the mail is for:
//! - one mail of a kind per `AUTH_MAIL_INTERVAL_SECS` (default 60 s)
//!   ([`claim_mail_slot`]: conditional UPDATEs of `auth_mail_slots` on the
//!   database clock, claimed also for addresses without an account, so the
//!   answers are alike), and at most `AUTH_CONFIRMATION_MAILS_PER_DAY`
//!   confirmation mails sent per 24 h ([`spend_daily_mail`], spent only by a
//!   mail that goes out; past it the mail is held back quietly);
//! - at most one live code: issuing a token voids the code half of every
//!   other token mailed to that address ([`issue_another`]); their links stay
//!   valid (a confirmation link is only voided by the confirmation itself);
//! - code checks are claimed before they are made, `AUTH_CODE_FAILURES_PER_HOUR`
//!   per address per hour ([`claim_code_attempt`]); past it they answer
//!   [`IdentityError::OverRequestRateLimit`]. A success (a right code, or any
//!   of the address's links) clears the window; links are never refused by it.
//!
//! A code is also void after [`MAX_FAILED_ATTEMPTS`] wrong codes for its
//! address while it was outstanding (its link is not).

use sea_orm::{
    sea_query::{Condition, Expr, ExprTrait},
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set,
};
use uuid::Uuid;

use super::{tokens, IdentityError};
use crate::entities::{auth_accounts as acc, auth_one_time_tokens as ott};

/// Wrong codes for an address after which the codes mailed to it are void
/// (their links are not).
pub const MAX_FAILED_ATTEMPTS: i32 = 5;

/// The window of [`claim_code_attempt`].
pub const CODE_WINDOW_SECS: i64 = 3600;

/// The window of the daily mail count.
const DAY_SECS: i64 = 86_400;

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
    /// The notice that a confirmation dropped a password chosen before the
    /// mailbox was proven, with a set-password link: a recovery token.
    PasswordNotice,
}

impl MailKind {
    /// The token kind: `confirmation`, `recovery` (also of a
    /// [`MailKind::PasswordNotice`]), `magiclink`, `email_change`, `reauthentication`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmation => "confirmation",
            Self::Recovery | Self::PasswordNotice => "recovery",
            Self::Magiclink => "magiclink",
            Self::EmailChange => "email_change",
            Self::Reauthentication => "reauthentication",
        }
    }

    /// The `type` the platform puts into links and redirects for this kind.
    pub fn verify_type(self) -> &'static str {
        match self {
            Self::Confirmation => "signup",
            Self::Recovery | Self::PasswordNotice => "recovery",
            Self::Magiclink => "magiclink",
            Self::EmailChange => "email_change",
            Self::Reauthentication => "reauthentication",
        }
    }

    fn sent_at(self) -> acc::Column {
        match self {
            Self::Confirmation => acc::Column::ConfirmationSentAt,
            Self::Recovery | Self::PasswordNotice => acc::Column::RecoverySentAt,
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

/// The interval slot a mail of `kind` claims: a confirmation and a magic
/// link share one (`confirmation`), because which of the two an address is
/// sent (`/otp`: a magic link when it has a confirmed account, a
/// confirmation otherwise) must not show in the answers to the requests that
/// follow (`/resend` then `/otp` answer alike for a registered address and
/// an unknown one); the other kinds have their own.
fn slot_kind(kind: MailKind) -> &'static str {
    match kind {
        MailKind::Magiclink => MailKind::Confirmation.as_str(),
        k => k.as_str(),
    }
}

/// Releases the confirmation slot of `email_norm` (shared with magic links,
/// [`slot_kind`]) when its first confirmation proved the mailbox, so the
/// owner who just confirmed may ask for a magic link at once; the day's
/// count of confirmation mails stays. (An observer who claimed the slot
/// moments before can tell that the address was confirmed meanwhile; the
/// owner's sign-up then sign-in in one minute is worth that.)
pub async fn release_confirmation_slot<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
) -> Result<(), sea_orm::DbErr> {
    use crate::entities::auth_mail_slots as slot;
    slot::Entity::update_many()
        .col_expr(
            slot::Column::LastSentAt,
            Expr::value(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
        )
        .filter(slot::Column::EmailNorm.eq(email_norm))
        .filter(slot::Column::Kind.eq(MailKind::Confirmation.as_str()))
        .exec(db)
        .await?;
    Ok(())
}

/// Claims the right to send a `kind` mail to the address `email_norm` now,
/// whether or not an account has it: a conditional UPDATE of its
/// `auth_mail_slots` row that succeeds only when the previous mail of that
/// kind to that address (a magic link and a confirmation count as one
/// kind, [`slot_kind`]) is at least `interval_secs` old by the database's
/// clock (`0`: always). Of 20 concurrent claims exactly one succeeds. The
/// daily count is not touched: only a mail that goes out spends it
/// ([`spend_daily_mail`]).
///
/// # Errors
/// [`IdentityError::OverEmailSendRateLimit`] with the seconds to wait.
pub async fn claim_mail_slot<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
    kind: MailKind,
    interval_secs: i64,
) -> Result<(), IdentityError> {
    use crate::entities::auth_mail_slots as slot;
    let kind = slot_kind(kind);
    let now = crate::base::db::now(db).await?;
    let inserted = slot::Entity::insert(slot::ActiveModel {
        email_norm: Set(email_norm.to_string()),
        kind: Set(kind.to_string()),
        last_sent_at: Set(now),
        day_started_at: Set(now),
        day_count: Set(0),
    })
    .on_conflict_do_nothing()
    .exec_without_returning(db)
    .await?;
    if matches!(inserted, sea_orm::TryInsertResult::Inserted(n) if n > 0) {
        return Ok(());
    }
    let cutoff = now - chrono::Duration::seconds(interval_secs);
    let claimed = slot::Entity::update_many()
        .col_expr(slot::Column::LastSentAt, Expr::value(now))
        .filter(slot::Column::EmailNorm.eq(email_norm))
        .filter(slot::Column::Kind.eq(kind))
        .filter(slot::Column::LastSentAt.lte(cutoff))
        .exec(db)
        .await?;
    if claimed.rows_affected == 1 {
        return Ok(());
    }
    let row = slot::Entity::find_by_id((email_norm.to_string(), kind.to_string()))
        .one(db)
        .await?;
    let max_wait = Ord::max(interval_secs, 1);
    let wait = match row {
        Some(r) => (interval_secs - (now - r.last_sent_at).num_seconds()).clamp(1, max_wait),
        None => max_wait,
    };
    Err(IdentityError::OverEmailSendRateLimit(wait))
}

/// Spends one of the `max` mails of `kind` that may go to `email_norm` in
/// the current 24 h (database clock; the count starts again a day after
/// its first mail), for a mail about to go out; `false`, spending nothing,
/// when they are spent. Called after [`claim_mail_slot`] (whose row it
/// counts on), only for mails that are sent: a request that sends nothing
/// (a `/resend` for an address without a pending account) spends nothing,
/// so nobody can spend an address's budget without mailing its owner.
pub async fn spend_daily_mail<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
    kind: MailKind,
    max: u32,
) -> Result<bool, sea_orm::DbErr> {
    use crate::entities::auth_mail_slots as slot;
    let kind = slot_kind(kind);
    let now = crate::base::db::now(db).await?;
    let day_cutoff = now - chrono::Duration::seconds(DAY_SECS);
    let key = || {
        Condition::all()
            .add(slot::Column::EmailNorm.eq(email_norm))
            .add(slot::Column::Kind.eq(kind))
    };
    // A new day: the count starts again.
    let new_day = slot::Entity::update_many()
        .col_expr(slot::Column::DayStartedAt, Expr::value(now))
        .col_expr(slot::Column::DayCount, Expr::value(1))
        .filter(key())
        .filter(slot::Column::DayStartedAt.lte(day_cutoff))
        .exec(db)
        .await?;
    if new_day.rows_affected == 1 {
        return Ok(true);
    }
    let same_day = slot::Entity::update_many()
        .col_expr(
            slot::Column::DayCount,
            Expr::col(slot::Column::DayCount).add(1),
        )
        .filter(key())
        .filter(slot::Column::DayStartedAt.gt(day_cutoff))
        .filter(slot::Column::DayCount.lt(max as i32))
        .exec(db)
        .await?;
    Ok(same_day.rows_affected == 1)
}

/// Claims one `{email, token}` code check for the address `email_norm`,
/// known or not, before the code is compared: at most `max` per
/// [`CODE_WINDOW_SECS`] (database clock; conditional UPDATEs of its
/// `auth_code_attempts` row, so concurrent checks on several processes never
/// get more). A success clears the window ([`clear_code_attempts`]).
///
/// # Errors
/// [`IdentityError::OverRequestRateLimit`] with the seconds left in the window.
pub async fn claim_code_attempt<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
    max: u32,
) -> Result<(), IdentityError> {
    use crate::entities::auth_code_attempts as att;
    let now = crate::base::db::now(db).await?;
    let inserted = att::Entity::insert(att::ActiveModel {
        email_norm: Set(email_norm.to_string()),
        attempts: Set(1),
        window_started_at: Set(now),
    })
    .on_conflict_do_nothing()
    .exec_without_returning(db)
    .await?;
    if matches!(inserted, sea_orm::TryInsertResult::Inserted(n) if n > 0) {
        return Ok(());
    }
    let cutoff = now - chrono::Duration::seconds(CODE_WINDOW_SECS);
    let res = att::Entity::update_many()
        .col_expr(att::Column::Attempts, Expr::value(1))
        .col_expr(att::Column::WindowStartedAt, Expr::value(now))
        .filter(att::Column::EmailNorm.eq(email_norm))
        .filter(att::Column::WindowStartedAt.lte(cutoff))
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        return Ok(());
    }
    let res = att::Entity::update_many()
        .col_expr(
            att::Column::Attempts,
            Expr::col(att::Column::Attempts).add(1),
        )
        .filter(att::Column::EmailNorm.eq(email_norm))
        .filter(att::Column::WindowStartedAt.gt(cutoff))
        .filter(att::Column::Attempts.lt(max as i32))
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        return Ok(());
    }
    let started = att::Entity::find_by_id(email_norm.to_string())
        .one(db)
        .await?
        .map(|r| r.window_started_at)
        .unwrap_or(now);
    let wait = (CODE_WINDOW_SECS - (now - started).num_seconds()).clamp(1, CODE_WINDOW_SECS);
    Err(IdentityError::OverRequestRateLimit(wait))
}

/// Clears the code-check window of `email_norm` (a code or link of it was used).
pub async fn clear_code_attempts<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
) -> Result<(), IdentityError> {
    use crate::entities::auth_code_attempts as att;
    att::Entity::delete_many()
        .filter(att::Column::EmailNorm.eq(email_norm))
        .exec(db)
        .await?;
    Ok(())
}

/// Deletes the mail slots and code windows that no longer hold anything
/// back (older than a day by the database's clock). Returns how many.
pub async fn delete_stale_address_rows<C: ConnectionTrait>(db: &C) -> Result<u64, IdentityError> {
    use crate::entities::{auth_code_attempts as att, auth_mail_slots as slot};
    let now = crate::base::db::now(db).await?;
    let day_cutoff = now - chrono::Duration::seconds(DAY_SECS);
    let slots = slot::Entity::delete_many()
        .filter(slot::Column::LastSentAt.lt(day_cutoff))
        .filter(slot::Column::DayStartedAt.lt(day_cutoff))
        .exec(db)
        .await?
        .rows_affected;
    let windows = att::Entity::delete_many()
        .filter(att::Column::WindowStartedAt.lt(now - chrono::Duration::seconds(CODE_WINDOW_SECS)))
        .exec(db)
        .await?
        .rows_affected;
    Ok(slots + windows)
}

/// Stamps the `kind` mail of `user_id` as sent now (the account's
/// `*_sent_at`, shown to the user and read by the expiry of unconfirmed
/// accounts); the interval itself is [`claim_mail_slot`]'s.
pub async fn stamp_mail_sent<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
) -> Result<(), IdentityError> {
    let now = crate::base::db::now(db).await?;
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

/// What a token is issued for.
#[derive(Debug, Clone, Copy)]
pub struct Issue<'a> {
    /// The account.
    pub user_id: Uuid,
    /// Which mail.
    pub kind: MailKind,
    /// The address the code is bound to (the new address for an email change).
    pub email_norm: &'a str,
    /// The PKCE flow, if any.
    pub flow_state_id: Option<Uuid>,
    /// The request the mail is issued for: the sign-up of a confirmation
    /// mail, the email change (`PUT /user`, `/resend`) both halves of an
    /// email change belong to.
    pub signup_id: Option<Uuid>,
}

/// Issues a token, replacing the outstanding one of its kind of the user,
/// except for the sign-in mails (confirmation, magic link, recovery): a later
/// one voids the earlier codes, not the earlier links (so asking for another
/// mail never kills the link the owner is about to open); the first link
/// used voids the others of its kind ([`consume`], [`void_kind`]).
pub async fn issue<C: ConnectionTrait>(db: &C, t: Issue<'_>) -> Result<IssuedOtp, IdentityError> {
    // Sign-in mails (confirmation, magic link, recovery) keep the links of
    // earlier ones: anyone may ask for another mail, and that must not void
    // the link the owner is about to open; their codes are void (below), and
    // using one link voids the others ([`void_kind`]).
    if !matches!(
        t.kind,
        MailKind::Confirmation
            | MailKind::Magiclink
            | MailKind::Recovery
            | MailKind::PasswordNotice
    ) {
        ott::Entity::delete_many()
            .filter(ott::Column::UserId.eq(t.user_id))
            .filter(ott::Column::Kind.eq(t.kind.as_str()))
            .exec(db)
            .await?;
    }
    issue_another(db, t).await
}

/// Issues a token next to the outstanding ones of the user (the second mail
/// of an email change, to the current address). Every other code mailed to
/// the same address, of any account, is void from now on (at most one live
/// code per address); their links stay.
pub async fn issue_another<C: ConnectionTrait>(
    db: &C,
    t: Issue<'_>,
) -> Result<IssuedOtp, IdentityError> {
    ott::Entity::update_many()
        .col_expr(
            ott::Column::FailedAttempts,
            Expr::value(MAX_FAILED_ATTEMPTS),
        )
        .filter(ott::Column::RelatesTo.eq(t.email_norm))
        .exec(db)
        .await?;
    let code = tokens::otp_code();
    let token_hash = tokens::random_hex(32);
    let now = crate::base::db::now(db).await?;
    ott::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(t.user_id),
        kind: Set(t.kind.as_str().into()),
        token_hash_digest: Set(tokens::sha256_hex(&token_hash)),
        otp_digest: Set(tokens::otp_digest(t.email_norm, &code)),
        relates_to: Set(Some(t.email_norm.to_string())),
        flow_state_id: Set(t.flow_state_id),
        failed_attempts: Set(0),
        signup_id: Set(t.signup_id),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(IssuedOtp { code, token_hash })
}

/// Voids the outstanding `kind` tokens of `user_id`, codes and links (the
/// confirmation links left once the email is confirmed).
pub async fn void_kind<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kind: MailKind,
) -> Result<(), IdentityError> {
    ott::Entity::delete_many()
        .filter(ott::Column::UserId.eq(user_id))
        .filter(ott::Column::Kind.eq(kind.as_str()))
        .exec(db)
        .await?;
    Ok(())
}

/// Voids every outstanding token of `user_id` (all kinds): what the first
/// proof of the account's address leaves ([`super::account::confirm_email`]).
pub async fn void_all<C: ConnectionTrait>(db: &C, user_id: Uuid) -> Result<(), IdentityError> {
    ott::Entity::delete_many()
        .filter(ott::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// The kinds a password change, a reset or an applied email change voids:
/// whoever held a recovery, magic-link or email-change mail of the account
/// before it may no longer use it.
pub const VOIDED_BY_CREDENTIAL_CHANGE: [MailKind; 3] = [
    MailKind::Recovery,
    MailKind::Magiclink,
    MailKind::EmailChange,
];

/// Voids the outstanding tokens of `user_id` of the `kinds`.
pub async fn void_kinds<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    kinds: &[MailKind],
) -> Result<(), IdentityError> {
    let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    ott::Entity::delete_many()
        .filter(ott::Column::UserId.eq(user_id))
        .filter(ott::Column::Kind.is_in(kinds))
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

/// Consumes the token proven by `proof` among `kinds`: unknown, used or
/// expired → [`IdentityError::OtpExpired`]. Single use by conditional
/// DELETE.
///
/// A code check is first claimed against its address's window
/// ([`claim_code_attempt`], `max_code_checks` per hour; past it
/// [`IdentityError::OverRequestRateLimit`], whether or not the address has
/// an account); a code void after [`MAX_FAILED_ATTEMPTS`] wrong codes is
/// refused, and a code that matches no token counts one wrong try against
/// every token mailed to that address, in one UPDATE. A link (`token_hash`)
/// is never refused by either rule. Any success clears the address's window.
pub async fn consume<C: ConnectionTrait>(
    db: &C,
    kinds: &[MailKind],
    proof: Proof<'_>,
    expiry_secs: i64,
    max_code_checks: u32,
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
            claim_code_attempt(db, email_norm, max_code_checks).await?;
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
                    Expr::col(ott::Column::FailedAttempts).add(1),
                )
                .filter(ott::Column::RelatesTo.eq(email_norm))
                .exec(db)
                .await?;
        }
        return Err(IdentityError::OtpExpired);
    };
    let mut delete = ott::Entity::delete_many().filter(ott::Column::Id.eq(row.id));
    if let Proof::Code { .. } = proof {
        delete = delete.filter(ott::Column::FailedAttempts.lt(MAX_FAILED_ATTEMPTS));
    }
    if delete.exec(db).await?.rows_affected != 1 {
        return Err(IdentityError::OtpExpired);
    }
    let now = crate::base::db::now(db).await?;
    if (now - row.created_at).num_milliseconds() > expiry_secs.saturating_mul(1000) {
        return Err(IdentityError::OtpExpired);
    }
    if let Some(address) = row.relates_to.as_deref() {
        clear_code_attempts(db, address).await?;
    }
    // A sign-in by a magic link or recovery mail voids the other mails of
    // its kind to the user (each new one kept the earlier links).
    if row.kind == MailKind::Magiclink.as_str() || row.kind == MailKind::Recovery.as_str() {
        ott::Entity::delete_many()
            .filter(ott::Column::UserId.eq(row.user_id))
            .filter(ott::Column::Kind.eq(row.kind.as_str()))
            .exec(db)
            .await?;
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
