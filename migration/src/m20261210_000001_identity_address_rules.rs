//! The per-address rules of the built-in identity provider:
//!
//! - `auth_mail_slots`: one row per recipient address and mail kind, the
//!   mail interval (`last_sent_at`) and the daily count of confirmation mails
//!   (`day_started_at`, `day_count`), claimed by conditional `UPDATE`s on the
//!   database clock, whether or not an account has that address;
//! - `auth_code_attempts`: one row per address, the `{email, token}` code
//!   checks of the current window (`window_started_at`, `attempts`);
//! - `auth_accounts.signup_id` and `auth_one_time_tokens.signup_id`: which
//!   sign-up set the pending password, and which sign-up a mail was issued
//!   for (a pre-proof password survives a confirmation only when they match);
//! - `auth_flow_states.password_hash`: the password of the sign-up that
//!   started a PKCE flow, installed by that flow's exchange;
//! - one outstanding token per user, kind and address is no longer unique (a
//!   later sign-up voids the earlier codes but keeps their links); a plain
//!   index on `(user_id, kind)` replaces it.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AuthMailSlots::Table)
                    .col(text(AuthMailSlots::EmailNorm))
                    .col(text(AuthMailSlots::Kind))
                    .col(timestamp_with_time_zone(AuthMailSlots::LastSentAt))
                    .col(timestamp_with_time_zone(AuthMailSlots::DayStartedAt))
                    .col(integer(AuthMailSlots::DayCount).default(0))
                    .primary_key(
                        Index::create()
                            .col(AuthMailSlots::EmailNorm)
                            .col(AuthMailSlots::Kind),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(AuthCodeAttempts::Table)
                    .col(text(AuthCodeAttempts::EmailNorm).primary_key())
                    .col(integer(AuthCodeAttempts::Attempts).default(0))
                    .col(timestamp_with_time_zone(AuthCodeAttempts::WindowStartedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .add_column(ColumnDef::new(AuthAccounts::SignupId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthOneTimeTokens::Table)
                    .add_column(ColumnDef::new(AuthOneTimeTokens::SignupId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthFlowStates::Table)
                    .add_column(ColumnDef::new(AuthFlowStates::PasswordHash).text().null())
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
                    .name("idx_auth_one_time_tokens_user_kind")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::UserId)
                    .col(AuthOneTimeTokens::Kind)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_auth_one_time_tokens_user_kind")
                    .table(AuthOneTimeTokens::Table)
                    .to_owned(),
            )
            .await?;
        // Tokens that the unique index would refuse: keep the newest of each.
        let db = manager.get_connection();
        db.execute_unprepared(
            "DELETE FROM auth_one_time_tokens WHERE EXISTS (SELECT 1 FROM auth_one_time_tokens n \
             WHERE n.user_id = auth_one_time_tokens.user_id AND n.kind = auth_one_time_tokens.kind \
             AND n.relates_to = auth_one_time_tokens.relates_to \
             AND n.created_at > auth_one_time_tokens.created_at)",
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
                    .table(AuthFlowStates::Table)
                    .drop_column(AuthFlowStates::PasswordHash)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthOneTimeTokens::Table)
                    .drop_column(AuthOneTimeTokens::SignupId)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(AuthAccounts::Table)
                    .drop_column(AuthAccounts::SignupId)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(AuthCodeAttempts::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(AuthMailSlots::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthMailSlots {
    Table,
    EmailNorm,
    Kind,
    LastSentAt,
    DayStartedAt,
    DayCount,
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthCodeAttempts {
    Table,
    EmailNorm,
    Attempts,
    WindowStartedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthAccounts {
    Table,
    SignupId,
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthOneTimeTokens {
    Table,
    UserId,
    Kind,
    RelatesTo,
    SignupId,
}

#[derive(DeriveIden, Clone, Copy)]
enum AuthFlowStates {
    Table,
    PasswordHash,
}
