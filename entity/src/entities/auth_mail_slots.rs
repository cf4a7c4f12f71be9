//! `auth_mail_slots`: the mail interval and the daily count of mails of one
//! kind to one recipient address, whether or not an account has that address
//! ([`crate::identity::otp::claim_mail_slot`]).

use sea_orm::entity::prelude::*;

/// One address and mail kind.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_mail_slots")]
pub struct Model {
    /// The recipient, normalised (trimmed, ASCII-lowercased).
    #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
    pub email_norm: String,
    /// The mail kind (`confirmation`, `recovery`, …).
    #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
    pub kind: String,
    /// The last mail claimed (database clock).
    pub last_sent_at: DateTimeUtc,
    /// Start of the current 24-h count (database clock).
    pub day_started_at: DateTimeUtc,
    /// Mails claimed since `day_started_at`.
    pub day_count: i32,
}

/// No relations: an address need not belong to an account.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
