//! Creates `webhook_events` with a unique `dedupe_key`, an index on
//! `order_id` (events of one payment) and one on `settled_at` (unsettled
//! events to replay: `WHERE settled_at IS NULL`).

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
                    .table(WebhookEvents::Table)
                    .col(pk_uuid(WebhookEvents::Id))
                    .col(text(WebhookEvents::Provider))
                    .col(text_uniq(WebhookEvents::DedupeKey))
                    .col(text(WebhookEvents::OrderId))
                    .col(text(WebhookEvents::ProviderStatus))
                    .col(json(WebhookEvents::Payload))
                    .col(timestamp_with_time_zone(WebhookEvents::ReceivedAt).default(now))
                    .col(timestamp_with_time_zone_null(WebhookEvents::SettledAt))
                    .col(text_null(WebhookEvents::SettlementError))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_webhook_events_order_id")
                    .table(WebhookEvents::Table)
                    .col(WebhookEvents::OrderId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_webhook_events_settled_at")
                    .table(WebhookEvents::Table)
                    .col(WebhookEvents::SettledAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(WebhookEvents::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum WebhookEvents {
    Table,
    Id,
    Provider,
    DedupeKey,
    OrderId,
    ProviderStatus,
    Payload,
    ReceivedAt,
    SettledAt,
    SettlementError,
}
