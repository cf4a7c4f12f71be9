//! `profiles`: the user's display data, exactly one row per user
//! (primary key = `users.id`, deleted with the user).

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// A user's profile.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "profiles")]
pub struct Model {
    /// Owner; primary key and foreign key to `users.id` (on delete cascade).
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    /// Display name, if the user gave one.
    #[sea_orm(column_type = "Text", nullable)]
    pub full_name: Option<String>,
    /// Object-store key of the avatar, of the form `<user_id>/avatar`.
    #[sea_orm(column_type = "Text", nullable)]
    pub avatar_path: Option<String>,
    /// Public URL of the avatar, if one is served.
    #[sea_orm(column_type = "Text", nullable)]
    pub avatar_url: Option<String>,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
    /// When the row was last changed (UTC).
    pub updated_at: DateTimeUtc,
    /// How many avatar uploads of this user have completed (starts at 0;
    /// bumped by each upload, under the row lock, as the object is put in
    /// place). The avatar cleanup compares it with the value a profile save
    /// recorded, so a later upload is never deleted (`entity::accounts::avatar`).
    pub avatar_generation: i64,
}

/// A profile belongs to one user.
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
