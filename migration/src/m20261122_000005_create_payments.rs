//! Creates `payments` with a unique `order_id` and an index on `user_id`.
//! The foreign key to `users` has no cascade: payments are kept.

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
                    .table(Payments::Table)
                    .col(pk_uuid(Payments::Id))
                    .col(text_uniq(Payments::OrderId))
                    .col(uuid(Payments::UserId))
                    .col(text(Payments::Plan))
                    .col(big_integer(Payments::Amount))
                    .col(text(Payments::Currency))
                    .col(text(Payments::Provider))
                    .col(text(Payments::Status))
                    .col(text_null(Payments::CheckoutToken))
                    .col(text_null(Payments::PaymentUrl))
                    .col(text_null(Payments::ProviderReference))
                    .col(timestamp_with_time_zone_null(Payments::PaidAt))
                    .col(timestamp_with_time_zone(Payments::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(Payments::UpdatedAt).default(now))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_payments_user_id")
                            .from(Payments::Table, Payments::UserId)
                            .to(Users::Table, Users::Id),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_payments_user_id")
                    .table(Payments::Table)
                    .col(Payments::UserId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Dropping the table drops its indexes on both backends.
        manager
            .drop_table(Table::drop().table(Payments::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Payments {
    Table,
    Id,
    OrderId,
    UserId,
    Plan,
    Amount,
    Currency,
    Provider,
    Status,
    CheckoutToken,
    PaymentUrl,
    ProviderReference,
    PaidAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
