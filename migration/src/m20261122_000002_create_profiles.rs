//! Creates `profiles`: one row per user, deleted with the user.

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
                    .table(Profiles::Table)
                    .col(pk_uuid(Profiles::UserId))
                    .col(text_null(Profiles::FullName))
                    .col(text_null(Profiles::AvatarPath))
                    .col(text_null(Profiles::AvatarUrl))
                    .col(timestamp_with_time_zone(Profiles::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(Profiles::UpdatedAt).default(now))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_profiles_user_id")
                            .from(Profiles::Table, Profiles::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Profiles::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Profiles {
    Table,
    UserId,
    FullName,
    AvatarPath,
    AvatarUrl,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
