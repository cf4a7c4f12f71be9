//! Adds `auth_one_time_tokens.failed_attempts` (wrong codes tried for the
//! token's email; the token is void after five), an index on
//! `auth_one_time_tokens.relates_to` (the email those tries are counted
//! for), `auth_accounts.reauthentication_sent_at` (the one-mail-per-60-s
//! slot of the reauthentication nonce), and makes one outstanding token per
//! user, kind *and address* unique (an email change has one token for the new
//! and one for the current address) instead of per user and kind.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("ux_auth_one_time_tokens_user_kind")
                    .table(AuthOneTimeTokens::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_one_time_tokens_user_kind_to")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::UserId)
                    .col(AuthOneTimeTokens::Kind)
                    .col(AuthOneTimeTokens::RelatesTo)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthOneTimeTokens::Table)
                    .add_column(
                        ColumnDef::new(AuthOneTimeTokens::FailedAttempts)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_auth_one_time_tokens_relates_to")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::RelatesTo)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .add_column(
                        ColumnDef::new(AuthAccounts::ReauthenticationSentAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .drop_column(AuthAccounts::ReauthenticationSentAt)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("idx_auth_one_time_tokens_relates_to")
                    .table(AuthOneTimeTokens::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthOneTimeTokens::Table)
                    .drop_column(AuthOneTimeTokens::FailedAttempts)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("ux_auth_one_time_tokens_user_kind_to")
                    .table(AuthOneTimeTokens::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_one_time_tokens_user_kind")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::UserId)
                    .col(AuthOneTimeTokens::Kind)
                    .unique()
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthOneTimeTokens {
    Table,
    UserId,
    Kind,
    FailedAttempts,
    RelatesTo,
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthAccounts {
    Table,
    ReauthenticationSentAt,
}
