//! Creates `audit_logs` with an index on (`target_type`, `target_id`).
//! `actor_id` is not a foreign key so the trail outlives deleted users.

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
                    .table(AuditLogs::Table)
                    .col(pk_uuid(AuditLogs::Id))
                    .col(uuid_null(AuditLogs::ActorId))
                    .col(text(AuditLogs::Action))
                    .col(text(AuditLogs::TargetType))
                    .col(text(AuditLogs::TargetId))
                    .col(json_null(AuditLogs::OldValue))
                    .col(json_null(AuditLogs::NewValue))
                    .col(text_null(AuditLogs::RequestId))
                    .col(timestamp_with_time_zone(AuditLogs::CreatedAt).default(now))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_audit_logs_target")
                    .table(AuditLogs::Table)
                    .col(AuditLogs::TargetType)
                    .col(AuditLogs::TargetId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AuditLogs::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AuditLogs {
    Table,
    Id,
    ActorId,
    Action,
    TargetType,
    TargetId,
    OldValue,
    NewValue,
    RequestId,
    CreatedAt,
}
