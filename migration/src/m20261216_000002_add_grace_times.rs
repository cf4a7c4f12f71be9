//! Adds the renewal grace's times to `subscriptions` (both nullable, set
//! by the transaction that records the past-due notice and cleared when the
//! subscription is paid or lapses):
//! * `past_due_at`: when the customer was told the period ended unpaid;
//! * `grace_ends_at`: when the plan lapses unless paid (`past_due_at` plus
//!   `RENEWAL_GRACE_SECS`). A `past_due` row from before this migration
//!   has neither; its grace ends `RENEWAL_GRACE_SECS` after its period end.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for col in [Subscriptions::PastDueAt, Subscriptions::GraceEndsAt] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Subscriptions::Table)
                        .add_column(ColumnDef::new(col).timestamp_with_time_zone().null())
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [Subscriptions::GraceEndsAt, Subscriptions::PastDueAt] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Subscriptions::Table)
                        .drop_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Subscriptions {
    Table,
    PastDueAt,
    GraceEndsAt,
}
