//! Creates `ai_usage`, deleted with the user, with an index on
//! (`user_id`, `created_at`) for per-user quota windows.

use crate::now_default;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let now = now_default(manager.get_database_backend());
        manager
            .create_table(
                Table::create()
                    .table(AiUsage::Table)
                    .col(pk_uuid(AiUsage::Id))
                    .col(uuid(AiUsage::UserId))
                    .col(text(AiUsage::Provider))
                    .col(text(AiUsage::Model))
                    .col(text(AiUsage::Route))
                    .col(integer(AiUsage::InputTokens))
                    .col(integer(AiUsage::OutputTokens))
                    .col(timestamp_with_time_zone(AiUsage::CreatedAt).default(now))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_ai_usage_user_id")
                            .from(AiUsage::Table, AiUsage::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_ai_usage_user_id_created_at")
                    .table(AiUsage::Table)
                    .col(AiUsage::UserId)
                    .col(AiUsage::CreatedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AiUsage::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AiUsage {
    Table,
    Id,
    UserId,
    Provider,
    Model,
    Route,
    InputTokens,
    OutputTokens,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
