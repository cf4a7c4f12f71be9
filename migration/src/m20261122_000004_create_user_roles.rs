//! Creates `user_roles`: one row per user, deleted with the user.
//! `role` is text (`admin`|`member`), not a database enum.

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
                    .table(UserRoles::Table)
                    .col(pk_uuid(UserRoles::UserId))
                    .col(text(UserRoles::Role))
                    .col(timestamp_with_time_zone(UserRoles::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(UserRoles::UpdatedAt).default(now))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_user_roles_user_id")
                            .from(UserRoles::Table, UserRoles::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(UserRoles::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum UserRoles {
    Table,
    UserId,
    Role,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
