//! The price a plan chosen by `change` was chosen at (decisions.md,
//! "Stored prices, one conversion"): `subscriptions.renewal_plan_price`,
//! the catalogue price of `renewal_plan` when the customer chose it (whole
//! units of the catalogue's currency). It is that plan's price of record
//! until it is paid: a later cut reaches its renewal at once, a later rise
//! only after a price-change notice, as for the plan in force
//! (`entity::billing::price`). Nullable: rows chosen before this column
//! renew at the catalogue price.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Subscriptions::Table)
                    .add_column(
                        ColumnDef::new(Subscriptions::RenewalPlanPrice)
                            .big_integer()
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
                    .table(Subscriptions::Table)
                    .drop_column(Subscriptions::RenewalPlanPrice)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Subscriptions {
    Table,
    RenewalPlanPrice,
}
