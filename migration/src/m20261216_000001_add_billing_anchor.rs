//! Adds the billing anchor to `subscriptions` (Stripe's
//! `billing_cycle_anchor`; `entity::billing::anchor`): the day of the month
//! and the local time of day, in `BILLING_TIME_ZONE`, on which its periods
//! end. Both nullable: NULL on free plans and on subscriptions stored
//! before this migration (anchored on their current end at their next
//! payment).
//! * `billing_anchor_day` (`SMALLINT`, 1–31; in a shorter month, its last
//!   day);
//! * `billing_anchor_time` (`TIME`, microseconds).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for mut col in [
            ColumnDef::new(Subscriptions::BillingAnchorDay)
                .small_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Subscriptions::BillingAnchorTime)
                .time()
                .null()
                .to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Subscriptions::Table)
                        .add_column(&mut col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            Subscriptions::BillingAnchorTime,
            Subscriptions::BillingAnchorDay,
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
    BillingAnchorDay,
    BillingAnchorTime,
}
