//! Creates `auth_oauth_states`: OAuth authorizations started by
//! `GET /auth/v1/authorize` and waiting for their callback, keyed by the
//! SHA-256 of the `state` sent to the provider (see `entity::identity::oauth`). An index
//! on `created_at` serves the purge of abandoned records.

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
                    .table(AuthOauthStates::Table)
                    .col(text(AuthOauthStates::StateHash).primary_key())
                    .col(text(AuthOauthStates::Provider))
                    .col(text(AuthOauthStates::PkceVerifier))
                    .col(text(AuthOauthStates::RedirectTo))
                    .col(text_null(AuthOauthStates::CodeChallenge))
                    .col(text_null(AuthOauthStates::CodeChallengeMethod))
                    .col(timestamp_with_time_zone(AuthOauthStates::CreatedAt).default(now))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_oauth_states_created_at")
                    .table(AuthOauthStates::Table)
                    .col(AuthOauthStates::CreatedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(AuthOauthStates::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AuthOauthStates {
    Table,
    StateHash,
    Provider,
    PkceVerifier,
    RedirectTo,
    CodeChallenge,
    CodeChallengeMethod,
    CreatedAt,
}
