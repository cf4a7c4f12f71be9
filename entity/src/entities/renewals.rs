//! `renewals`: a renewal offered to a paid subscription before its period
//! ends ([`crate::billing::renewal`]). A record, not a payment: payments made through
//! its pay link carry its id (`payments.renewal_id`).

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// State of a renewal, stored as text: `open`, `paid` or `void`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum RenewalStatus {
    /// Waiting for its payment (`open`); at most one per user and period end
    /// (partial unique index `renewals_open_uidx`).
    #[sea_orm(string_value = "open")]
    Open,
    /// A payment of it settled `PAID` (`paid`).
    #[sea_orm(string_value = "paid")]
    Paid,
    /// No longer payable: cancelled, the plan or period end moved, or the
    /// subscription lapsed (`void`).
    #[sea_orm(string_value = "void")]
    Void,
}

impl RenewalStatus {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Paid => "paid",
            Self::Void => "void",
        }
    }
}

/// One renewal.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "renewals")]
pub struct Model {
    /// Row id (also what the pay link's token names).
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The subscriber (foreign key to `users.id`, on delete cascade).
    pub user_id: Uuid,
    /// The subscription's `current_period_end` this renewal continues (UTC);
    /// also when it is due.
    pub period_end: DateTimeUtc,
    /// Plan id billed.
    #[sea_orm(column_type = "Text")]
    pub plan: String,
    /// The catalogue price when created, whole units of `currency`; kept
    /// even when the catalogue changes later.
    pub amount: i64,
    /// ISO 4217 currency.
    #[sea_orm(column_type = "Text")]
    pub currency: String,
    /// State.
    pub status: RenewalStatus,
    /// When the next reminder is due (UTC); `None`: none left.
    pub next_reminder_at: Option<DateTimeUtc>,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
    /// When the row was last changed (UTC).
    pub updated_at: DateTimeUtc,
}

/// A renewal belongs to one user.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The subscriber.
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

timestamps!(created_at, updated_at);
