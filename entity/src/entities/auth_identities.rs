//! `auth_identities`: how a user signs in (`email`, `github`, `google`), one
//! row per provider account (unique `(provider, provider_id)`).

use sea_orm::entity::prelude::*;

/// A linked sign-in identity.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_identities")]
pub struct Model {
    /// Identity id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The user (foreign key to `users.id`, on delete cascade).
    pub user_id: Uuid,
    /// `email`, `github`, `google`.
    #[sea_orm(column_type = "Text")]
    pub provider: String,
    /// The provider's id of the account (for `email`: the user id).
    #[sea_orm(column_type = "Text")]
    pub provider_id: String,
    /// The provider's email, when it gave one.
    #[sea_orm(column_type = "Text", nullable)]
    pub email: Option<String>,
    /// The provider's profile as JSON text.
    #[sea_orm(column_type = "Text")]
    pub identity_data: String,
    /// Last sign-in through this identity.
    pub last_sign_in_at: Option<DateTimeUtc>,
    /// Created (UTC).
    pub created_at: DateTimeUtc,
    /// Last changed (UTC).
    pub updated_at: DateTimeUtc,
}

/// The user an identity belongs to.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// `auth_identities.user_id` → `users.id`.
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::UserId",
        to = "super::users::Column::Id"
    )]
    User,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::User.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
