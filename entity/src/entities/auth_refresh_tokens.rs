//! `auth_refresh_tokens`: opaque refresh tokens, stored as SHA-256 only; each
//! refresh revokes the token and issues its child (`parent_id`).

use sea_orm::entity::prelude::*;

/// A refresh token.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_refresh_tokens")]
pub struct Model {
    /// Token id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Lowercase hex SHA-256 of the token string.
    #[sea_orm(column_type = "Text")]
    pub token_hash: String,
    /// The session (on delete cascade).
    pub session_id: Uuid,
    /// The user.
    pub user_id: Uuid,
    /// The token this one replaced.
    pub parent_id: Option<Uuid>,
    /// Used (rotated) or revoked.
    pub revoked: bool,
    /// When it was rotated (database clock).
    pub revoked_at: Option<DateTimeUtc>,
    /// Created (database clock).
    pub created_at: DateTimeUtc,
}

/// No navigable relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
