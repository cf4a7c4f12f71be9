//! Adds `profiles.avatar_generation`: a counter bumped by every completed
//! avatar upload, so that the avatar cleanup decides from an exact generation
//! instead of comparing timestamps (see `entity::accounts::avatar`).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Profiles::Table)
                    .add_column(
                        ColumnDef::new(Profiles::AvatarGeneration)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Profiles::Table)
                    .drop_column(Profiles::AvatarGeneration)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Profiles {
    Table,
    AvatarGeneration,
}
