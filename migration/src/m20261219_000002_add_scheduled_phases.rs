//! Scheduled phases (decisions.md, "Subscriptions": `change` is Stripe's
//! "at period end"): a renewal of the plan chosen by `change`, paid before
//! the period end, is a stored future phase that the renewal loop's switch
//! applies at the old end. Two nullable columns on `subscriptions`:
//! `scheduled_plan` (the plan the phase runs) and `scheduled_payment_id`
//! (the payment whose stored grant is the phase: its length, its money).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for col in [
            ColumnDef::new(Subscriptions::ScheduledPlan)
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Subscriptions::ScheduledPaymentId)
                .uuid()
                .null()
                .to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Subscriptions::Table)
                        .add_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            Subscriptions::ScheduledPaymentId,
            Subscriptions::ScheduledPlan,
        ] {
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
    ScheduledPlan,
    ScheduledPaymentId,
}
