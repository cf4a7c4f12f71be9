//! Price-change notices (decisions.md, "Stored prices, one conversion"): a
//! catalogue price rise reaches a subscriber only at the first renewal
//! created at least `PRICE_CHANGE_NOTICE_DAYS` after a price-change mail to
//! them. Three nullable columns on `subscriptions` record the last such
//! notice: `price_notice_plan` (the plan it was about), `price_notice_amount`
//! (the new price announced, whole IDR) and `price_notice_at` (when the mail
//! was recorded, the database's clock). The price of record itself is not
//! a column: it is the amount of the latest payment still `PAID` for the
//! plan in force (`entity::billing::price`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for col in [
            ColumnDef::new(Subscriptions::PriceNoticePlan)
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Subscriptions::PriceNoticeAmount)
                .big_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Subscriptions::PriceNoticeAt)
                .timestamp_with_time_zone()
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
            Subscriptions::PriceNoticeAt,
            Subscriptions::PriceNoticeAmount,
            Subscriptions::PriceNoticePlan,
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
    PriceNoticePlan,
    PriceNoticeAmount,
    PriceNoticeAt,
}
