//! Creates `waitlist` with a unique index on `email`.
//!
//! The application trims and lower-cases the address before every insert, so
//! a plain unique index on the stored value is enough to reject a second
//! sign-up with the same address; no expression index (`lower(email)`) needed.

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
                    .table(Waitlist::Table)
                    .col(pk_uuid(Waitlist::Id))
                    .col(text(Waitlist::Email))
                    .col(text(Waitlist::Name))
                    .col(timestamp_with_time_zone(Waitlist::CreatedAt).default(now))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_waitlist_email")
                    .table(Waitlist::Table)
                    .col(Waitlist::Email)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Waitlist::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Waitlist {
    Table,
    Id,
    Email,
    Name,
    CreatedAt,
}
