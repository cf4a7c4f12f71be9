//! Adds `audit_logs.client_request_id`: the `x-request-id` a client sent,
//! kept beside the server's own `request_id` (which the server always
//! generates), so a client cannot choose the id an audit row is filed under.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AuditLogs::Table)
                    .add_column(ColumnDef::new(AuditLogs::ClientRequestId).text().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AuditLogs::Table)
                    .drop_column(AuditLogs::ClientRequestId)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum AuditLogs {
    Table,
    ClientRequestId,
}
