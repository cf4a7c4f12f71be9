//! Creates `subscriptions`: one row per user, deleted with the user.
//! `status` is text (`active`|`canceled`|`past_due`), not a database enum.

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
                    .table(Subscriptions::Table)
                    .col(pk_uuid(Subscriptions::UserId))
                    .col(text(Subscriptions::Plan))
                    .col(text(Subscriptions::Status))
                    .col(boolean(Subscriptions::CancelAtPeriodEnd).default(false))
                    .col(timestamp_with_time_zone_null(
                        Subscriptions::CurrentPeriodStart,
                    ))
                    .col(timestamp_with_time_zone_null(
                        Subscriptions::CurrentPeriodEnd,
                    ))
                    .col(timestamp_with_time_zone_null(Subscriptions::CanceledAt))
                    .col(timestamp_with_time_zone(Subscriptions::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(Subscriptions::UpdatedAt).default(now))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_subscriptions_user_id")
                            .from(Subscriptions::Table, Subscriptions::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Subscriptions::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Subscriptions {
    Table,
    UserId,
    Plan,
    Status,
    CancelAtPeriodEnd,
    CurrentPeriodStart,
    CurrentPeriodEnd,
    CanceledAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
