//! Creates `job_outbox`: jobs that follow a change already made (avatar
//! cleanup after a profile save, AI usage after an answer) and are kept in
//! the database until the worker has moved them to the queue. Indexed by the
//! time a row becomes due (`available_at_ms`, epoch milliseconds by the
//! database's clock), which is what the worker's relay scans.

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
                    .table(JobOutbox::Table)
                    .col(pk_uuid(JobOutbox::Id))
                    .col(text(JobOutbox::Kind))
                    .col(text(JobOutbox::Job))
                    .col(big_integer(JobOutbox::AvailableAtMs))
                    .col(integer(JobOutbox::Attempts).default(0))
                    .col(text_null(JobOutbox::LastError))
                    .col(timestamp_with_time_zone(JobOutbox::CreatedAt).default(now))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_job_outbox_available_at_ms")
                    .table(JobOutbox::Table)
                    .col(JobOutbox::AvailableAtMs)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(JobOutbox::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum JobOutbox {
    Table,
    Id,
    Kind,
    Job,
    AvailableAtMs,
    Attempts,
    LastError,
    CreatedAt,
}
