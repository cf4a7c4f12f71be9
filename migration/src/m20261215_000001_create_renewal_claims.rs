//! `renewal_claims`: which rows the scheduler has queued for which pass of
//! the renewal loop, and when (`step`, `id`: a user id, or a renewal id for
//! the reminder pass; `claimed_at`, the database's time). A row claimed less
//! than a lease ago is not queued again, so a tick never re-queues a page
//! whose batch job is still waiting; the scheduler deletes claims once their
//! lease is over. Both backends.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(RenewalClaims::Table)
                    .col(ColumnDef::new(RenewalClaims::Step).text().not_null())
                    .col(ColumnDef::new(RenewalClaims::Id).uuid().not_null())
                    .col(
                        ColumnDef::new(RenewalClaims::ClaimedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .primary_key(
                        Index::create()
                            .col(RenewalClaims::Step)
                            .col(RenewalClaims::Id),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(RenewalClaims::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum RenewalClaims {
    Table,
    Step,
    Id,
    ClaimedAt,
}
