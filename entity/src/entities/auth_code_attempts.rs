//! `auth_code_attempts`: the `{email, token}` code checks of one address in
//! the current window, known address or not
//! ([`crate::identity::otp::claim_code_attempt`]).

use sea_orm::entity::prelude::*;

/// One address's window.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_code_attempts")]
pub struct Model {
    /// The address, normalised.
    #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
    pub email_norm: String,
    /// Code checks claimed in the window (a success deletes the row).
    pub attempts: i32,
    /// Start of the window (database clock).
    pub window_started_at: DateTimeUtc,
}

/// No relations: an address need not belong to an account.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
