//! Creates `billing_mails`: one row per billing mail ever queued (receipt,
//! refund notice, renewal reminder, past-due, lapse), keyed by what the mail
//! is about (`receipt:<order id>`, …). The key's primary index makes queueing
//! a mail twice impossible, under any number of settlements, ticks or
//! workers; `sent_at` is set once the transport accepted it, so a re-run of
//! the send job does not mail again.

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
                    .table(BillingMails::Table)
                    .col(text(BillingMails::Key).primary_key())
                    .col(text(BillingMails::Kind))
                    .col(uuid(BillingMails::UserId))
                    .col(timestamp_with_time_zone(BillingMails::CreatedAt).default(now))
                    .col(timestamp_with_time_zone_null(BillingMails::SentAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_billing_mails_user_id")
                    .table(BillingMails::Table)
                    .col(BillingMails::UserId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(BillingMails::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum BillingMails {
    Table,
    Key,
    Kind,
    UserId,
    CreatedAt,
    SentAt,
}
