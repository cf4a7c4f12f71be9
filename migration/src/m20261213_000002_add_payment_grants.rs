//! Adds to `payments` what a payment granted when it settled `PAID` (all
//! nullable: written at settlement, absent on payments that never paid and
//! on those paid before this migration):
//! * `grant_plan`, `grant_start`, `grant_end`: the plan and the period the
//!   payment bought (its own calendar month plus any carried time);
//! * `grant_from_plan`, `grant_from_end`: the paid plan it replaced and that
//!   plan's period end (NULL when it replaced nothing paid, or extended the
//!   same plan);
//! * `carried_seconds`, `carried_value`: the unused time of the replaced
//!   plan's running grants carried into this period, and its value in whole
//!   units of the currency;
//! * `carried_into`: on a grant whose unused time was carried into a later
//!   payment's period, that payment's id (the grant no longer runs; cleared
//!   when that payment is refunded and the value returns);
//! * `refunded_amount` (not null, default 0): what partial refunds or
//!   chargebacks gave back so far; the grant's value is `amount` less it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Each new column, in the order they are added.
fn columns() -> Vec<ColumnDef> {
    vec![
        ColumnDef::new(Payments::GrantPlan).text().null().to_owned(),
        ColumnDef::new(Payments::GrantStart)
            .timestamp_with_time_zone()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::GrantEnd)
            .timestamp_with_time_zone()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::GrantFromPlan)
            .text()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::GrantFromEnd)
            .timestamp_with_time_zone()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::CarriedSeconds)
            .big_integer()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::CarriedValue)
            .big_integer()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::CarriedInto)
            .uuid()
            .null()
            .to_owned(),
        ColumnDef::new(Payments::RefundedAmount)
            .big_integer()
            .not_null()
            .default(0)
            .to_owned(),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        for mut col in columns() {
            manager
                .alter_table(
                    Table::alter()
                        .table(Payments::Table)
                        .add_column(&mut col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for col in [
            Payments::RefundedAmount,
            Payments::CarriedInto,
            Payments::CarriedValue,
            Payments::CarriedSeconds,
            Payments::GrantFromEnd,
            Payments::GrantFromPlan,
            Payments::GrantEnd,
            Payments::GrantStart,
            Payments::GrantPlan,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Payments::Table)
                        .drop_column(col)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Payments {
    Table,
    GrantPlan,
    GrantStart,
    GrantEnd,
    GrantFromPlan,
    GrantFromEnd,
    CarriedSeconds,
    CarriedValue,
    CarriedInto,
    RefundedAmount,
}
