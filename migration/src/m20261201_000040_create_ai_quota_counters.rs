//! Creates `ai_quota_counters`: the AI tokens counted per user and calendar
//! month (`YYYYMM`, UTC), reservations of requests in flight included, for
//! deployments without Redis (with Redis the counter lives there). Deleted
//! with the user.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AiQuotaCounters::Table)
                    .col(uuid(AiQuotaCounters::UserId))
                    .col(string_len(AiQuotaCounters::Month, 6))
                    .col(big_integer(AiQuotaCounters::Tokens).default(0))
                    .col(big_integer(AiQuotaCounters::Granted).default(0))
                    .primary_key(
                        Index::create()
                            .col(AiQuotaCounters::UserId)
                            .col(AiQuotaCounters::Month),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_ai_quota_counters_user_id")
                            .from(AiQuotaCounters::Table, AiQuotaCounters::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AiQuotaCounters::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AiQuotaCounters {
    Table,
    UserId,
    Month,
    Tokens,
    Granted,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
