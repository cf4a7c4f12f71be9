//! `user_roles`: the user's authorization role, at most one row per user
//! (primary key = `users.id`, deleted with the user).

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// Authorization role, stored as text: `admin` or `member`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Operator with access to the admin routes (`admin`).
    #[sea_orm(string_value = "admin")]
    Admin,
    /// Ordinary user (`member`).
    #[sea_orm(string_value = "member")]
    Member,
}

impl Role {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Member => "member",
        }
    }
}

/// A user's role.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "user_roles")]
pub struct Model {
    /// Owner; primary key and foreign key to `users.id` (on delete cascade).
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    /// The role.
    pub role: Role,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
    /// When the row was last changed (UTC).
    pub updated_at: DateTimeUtc,
}

/// A role belongs to one user.
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

timestamps!(created_at, updated_at);
