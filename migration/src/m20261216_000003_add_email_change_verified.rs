//! Adds `auth_accounts.email_change_verified` (text, nullable): which half
//! of the pending email change was verified first, as `<request id>
//! <address the half was mailed to>`. The change applies only when the
//! other half of the same request is verified: proof is recorded, never
//! inferred from a token being gone (a token is also gone when a password
//! change voided it). Cleared by each new email-change request and when the
//! change applies.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .add_column(
                        ColumnDef::new(AuthAccounts::EmailChangeVerified)
                            .text()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .drop_column(AuthAccounts::EmailChangeVerified)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum AuthAccounts {
    Table,
    EmailChangeVerified,
}
