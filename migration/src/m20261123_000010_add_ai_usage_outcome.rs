//! Adds `ai_usage.aborted` (the client went away or the upstream broke before
//! the answer ended) and `ai_usage.estimated` (the token counts are our
//! estimate because the provider sent none).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [AiUsage::Aborted, AiUsage::Estimated] {
            manager
                .alter_table(
                    Table::alter()
                        .table(AiUsage::Table)
                        .add_column(ColumnDef::new(col).boolean().not_null().default(false))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [AiUsage::Aborted, AiUsage::Estimated] {
            manager
                .alter_table(
                    Table::alter()
                        .table(AiUsage::Table)
                        .drop_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum AiUsage {
    Table,
    Aborted,
    Estimated,
}
