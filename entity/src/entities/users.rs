//! `users`: one row per account. The id is the subject (`sub`) of the session JWT;
//! every per-user table points here.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// A user account.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "users")]
pub struct Model {
    /// Account id; the session JWT `sub`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Login e-mail as known to the identity provider, if any.
    #[sea_orm(column_type = "Text", nullable)]
    pub email: Option<String>,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
}

/// Relations of a user: one profile, one subscription, one role, many payments
/// and many AI usage records; one built-in account and its identities.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The user's profile (`profiles.user_id`).
    #[sea_orm(has_one = "super::profiles::Entity")]
    Profile,
    /// The user's subscription (`subscriptions.user_id`).
    #[sea_orm(has_one = "super::subscriptions::Entity")]
    Subscription,
    /// The user's role (`user_roles.user_id`).
    #[sea_orm(has_one = "super::user_roles::Entity")]
    Role,
    /// The user's payments (`payments.user_id`).
    #[sea_orm(has_many = "super::payments::Entity")]
    Payments,
    /// The user's AI usage records (`ai_usage.user_id`).
    #[sea_orm(has_many = "super::ai_usage::Entity")]
    AiUsage,
    /// The user's built-in account (`auth_accounts.user_id`).
    #[sea_orm(has_one = "super::auth_accounts::Entity")]
    AuthAccount,
    /// The user's sign-in identities (`auth_identities.user_id`).
    #[sea_orm(has_many = "super::auth_identities::Entity")]
    AuthIdentities,
}

impl Related<super::auth_accounts::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::AuthAccount.def()
    }
}

impl Related<super::auth_identities::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::AuthIdentities.def()
    }
}

impl Related<super::profiles::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Profile.def()
    }
}

impl Related<super::subscriptions::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Subscription.def()
    }
}

impl Related<super::user_roles::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Role.def()
    }
}

impl Related<super::payments::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Payments.def()
    }
}

impl Related<super::ai_usage::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::AiUsage.def()
    }
}

timestamps!(created_at);
