//! `auth_one_time_tokens`: the outstanding mail token of each kind per user
//! (confirmation, recovery, magic link, email change), stored only as
//! digests; consumed by a conditional DELETE (single use).

use sea_orm::entity::prelude::*;

/// An outstanding one-time token.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_one_time_tokens")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The user.
    pub user_id: Uuid,
    /// `confirmation`, `recovery`, `magiclink`, `email_change`.
    #[sea_orm(column_type = "Text")]
    pub kind: String,
    /// SHA-256 (hex) of the link's `token_hash`.
    #[sea_orm(column_type = "Text")]
    pub token_hash_digest: String,
    /// SHA-256 (hex) of `<email>:<6-digit code>`.
    #[sea_orm(column_type = "Text")]
    pub otp_digest: String,
    /// The email the token was sent to (the new email for an email change).
    #[sea_orm(column_type = "Text", nullable)]
    pub relates_to: Option<String>,
    /// The PKCE flow this token belongs to, when the client started one.
    pub flow_state_id: Option<Uuid>,
    /// Wrong codes tried for `relates_to` while this token was outstanding;
    /// at [`crate::identity::otp::MAX_FAILED_ATTEMPTS`] the token is void.
    pub failed_attempts: i32,
    /// The request this mail was issued for: the sign-up of a confirmation
    /// mail (or resent for), the email change both halves of an email change
    /// belong to; `None` for other mails.
    pub signup_id: Option<Uuid>,
    /// Issued (database clock); expires `AUTH_OTP_EXPIRY_SECS` later.
    pub created_at: DateTimeUtc,
}

/// No navigable relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
