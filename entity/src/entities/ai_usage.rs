//! `ai_usage`: one row per AI call, for quotas and cost tracking
//! (deleted with the user).

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// `route` value for the streaming chat endpoint.
pub const ROUTE_CHAT: &str = "chat";
/// `route` value for the one-shot generation endpoint.
pub const ROUTE_GENERATE: &str = "generate";
/// Every allowed `route` value.
pub const ROUTES: [&str; 2] = [ROUTE_CHAT, ROUTE_GENERATE];

/// One AI call.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "ai_usage")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Calling user (foreign key to `users.id`, on delete cascade).
    pub user_id: Uuid,
    /// AI provider name, e.g. `openai`.
    #[sea_orm(column_type = "Text")]
    pub provider: String,
    /// Model name as sent to the provider.
    #[sea_orm(column_type = "Text")]
    pub model: String,
    /// Endpoint used: one of [`ROUTES`].
    #[sea_orm(column_type = "Text")]
    pub route: String,
    /// Prompt tokens counted by the provider.
    pub input_tokens: i32,
    /// Completion tokens counted by the provider.
    pub output_tokens: i32,
    /// The answer did not end normally: the client disconnected or the
    /// provider's stream broke; the tokens are what was produced until then.
    pub aborted: bool,
    /// The token counts are an estimate (about 4 bytes per token) because the
    /// provider sent no count before the answer ended.
    pub estimated: bool,
    /// When the call was made (UTC).
    pub created_at: DateTimeUtc,
}

/// A usage record belongs to one user.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The calling user.
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

timestamps!(created_at);
