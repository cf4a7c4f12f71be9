//! `renewal_pauses`: when the renewal loop waited because payments were
//! switched off or not ready (`started_at`, the database's time at the first
//! paused tick; `ended_at`, at the first tick after, `NULL` while it lasts;
//! `open`, `true` while it lasts and `NULL` after, unique: one open pause).
//! Closing a pause extends every running grace by the time it lasted, so a
//! pause never shortens the time a customer has to pay. Both backends.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(RenewalPauses::Table)
                    .col(
                        ColumnDef::new(RenewalPauses::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(RenewalPauses::StartedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RenewalPauses::EndedAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(ColumnDef::new(RenewalPauses::Open).boolean().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("renewal_pauses_open_uidx")
                    .table(RenewalPauses::Table)
                    .col(RenewalPauses::Open)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(RenewalPauses::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum RenewalPauses {
    Table,
    Id,
    StartedAt,
    EndedAt,
    Open,
}
