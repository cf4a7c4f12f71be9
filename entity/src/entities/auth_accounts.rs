//! `auth_accounts`: a built-in (email + password) account of the identity
//! provider, one row per user (primary key = `users.id`, deleted with the user).

use sea_orm::entity::prelude::*;

/// An account of the built-in identity provider.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_accounts")]
pub struct Model {
    /// Owner; primary key and foreign key to `users.id`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    /// The email as given (trimmed).
    #[sea_orm(column_type = "Text")]
    pub email: String,
    /// The email lowercased (ASCII): unique among built-in accounts.
    #[sea_orm(column_type = "Text")]
    pub email_norm: String,
    /// argon2id PHC string, `None` for accounts without a password (magic link, OAuth).
    #[sea_orm(column_type = "Text", nullable)]
    pub password_hash: Option<String>,
    /// When the email was confirmed (database clock).
    pub email_confirmed_at: Option<DateTimeUtc>,
    /// A pending new email (email change), until confirmed.
    #[sea_orm(column_type = "Text", nullable)]
    pub email_change: Option<String>,
    /// Last confirmation mail (database clock): the 60-s rule.
    pub confirmation_sent_at: Option<DateTimeUtc>,
    /// Last recovery mail.
    pub recovery_sent_at: Option<DateTimeUtc>,
    /// Last magic-link / OTP mail.
    pub magiclink_sent_at: Option<DateTimeUtc>,
    /// Last email-change mail.
    pub email_change_sent_at: Option<DateTimeUtc>,
    /// Last reauthentication-nonce mail.
    pub reauthentication_sent_at: Option<DateTimeUtc>,
    /// The sign-up whose password `password_hash` holds while the email is
    /// unconfirmed (`None` once confirmed, or without a pre-proof password).
    pub signup_id: Option<Uuid>,
    /// Last successful sign-in.
    pub last_sign_in_at: Option<DateTimeUtc>,
    /// `user_metadata` as JSON text (`{}` by default).
    #[sea_orm(column_type = "Text")]
    pub user_metadata: String,
    /// The half of the pending email change verified first: `<request id>
    /// <address it was mailed to>` (`account::apply_email_change`); `None`
    /// until one is, and again after each new request and once applied.
    #[sea_orm(column_type = "Text", nullable)]
    pub email_change_verified: Option<String>,
    /// Created (UTC).
    pub created_at: DateTimeUtc,
    /// Last changed (UTC).
    pub updated_at: DateTimeUtc,
}

/// An account belongs to one user.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The owning user.
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::UserId",
        to = "super::users::Column::Id",
        on_delete = "Cascade"
    )]
    User,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::User.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
