//! `auth_sessions`: one signed-in session (the JWT `session_id`); deleting it
//! signs it out and drops its refresh tokens.

use sea_orm::entity::prelude::*;

/// A session.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "auth_sessions")]
pub struct Model {
    /// Session id (the `session_id` claim).
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The user.
    pub user_id: Uuid,
    /// Authenticator assurance level (`aal1`).
    #[sea_orm(column_type = "Text")]
    pub aal: String,
    /// How it was established (`password`, `otp`, `magiclink`, `oauth`, …): the `amr` claim.
    #[sea_orm(column_type = "Text")]
    pub amr_method: String,
    /// Created (database clock).
    pub created_at: DateTimeUtc,
    /// Last refresh (database clock).
    pub refreshed_at: DateTimeUtc,
}

/// No navigable relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
