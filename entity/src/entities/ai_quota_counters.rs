//! `ai_quota_counters`: AI tokens counted per user and calendar month (UTC),
//! reservations of requests in flight included: the database store of
//! [`crate::ai::quota`] ([`crate::ai::quota::reserve_in_db`]).

use sea_orm::entity::prelude::*;

/// One user's month.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "ai_quota_counters")]
pub struct Model {
    /// The user.
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    /// The month, `YYYYMM` (UTC).
    #[sea_orm(primary_key, auto_increment = false)]
    pub month: String,
    /// Tokens counted: the month's `ai_usage` sum when the row was seeded,
    /// plus every reservation since, each settled to its real tokens.
    pub tokens: i64,
    /// What the last reservation granted (read back by it).
    pub granted: i64,
}

/// The user the counter belongs to.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The counting user.
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::UserId",
        to = "super::users::Column::Id",
        on_delete = "Cascade"
    )]
    Users,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Users.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
