//! Creates the built-in identity provider's tables: accounts with
//! password hashes, linked identities, sessions, rotating refresh tokens,
//! one-time tokens (hashed) and PKCE flow states. Every row hangs off
//! `users.id` and is deleted with the user.

use crate::now_default;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn user_fk(
    name: &str,
    table: impl IntoIden + 'static,
    col: impl IntoIden + 'static,
) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(name)
        .from(table, col)
        .to(Users::Table, Users::Id)
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let now = now_default(manager.get_database_backend());
        manager
            .create_table(
                Table::create()
                    .table(AuthAccounts::Table)
                    .col(pk_uuid(AuthAccounts::UserId))
                    .col(text(AuthAccounts::Email))
                    .col(text(AuthAccounts::EmailNorm))
                    .col(text_null(AuthAccounts::PasswordHash))
                    .col(timestamp_with_time_zone_null(
                        AuthAccounts::EmailConfirmedAt,
                    ))
                    .col(text_null(AuthAccounts::EmailChange))
                    .col(timestamp_with_time_zone_null(
                        AuthAccounts::ConfirmationSentAt,
                    ))
                    .col(timestamp_with_time_zone_null(AuthAccounts::RecoverySentAt))
                    .col(timestamp_with_time_zone_null(AuthAccounts::MagiclinkSentAt))
                    .col(timestamp_with_time_zone_null(
                        AuthAccounts::EmailChangeSentAt,
                    ))
                    .col(timestamp_with_time_zone_null(AuthAccounts::LastSignInAt))
                    .col(text(AuthAccounts::UserMetadata).default("{}"))
                    .col(timestamp_with_time_zone(AuthAccounts::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(AuthAccounts::UpdatedAt).default(now.clone()))
                    .foreign_key(&mut user_fk(
                        "fk_auth_accounts_user_id",
                        AuthAccounts::Table,
                        AuthAccounts::UserId,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_accounts_email_norm")
                    .table(AuthAccounts::Table)
                    .col(AuthAccounts::EmailNorm)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuthIdentities::Table)
                    .col(pk_uuid(AuthIdentities::Id))
                    .col(uuid(AuthIdentities::UserId))
                    .col(text(AuthIdentities::Provider))
                    .col(text(AuthIdentities::ProviderId))
                    .col(text_null(AuthIdentities::Email))
                    .col(text(AuthIdentities::IdentityData).default("{}"))
                    .col(timestamp_with_time_zone_null(AuthIdentities::LastSignInAt))
                    .col(timestamp_with_time_zone(AuthIdentities::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(AuthIdentities::UpdatedAt).default(now.clone()))
                    .foreign_key(&mut user_fk(
                        "fk_auth_identities_user_id",
                        AuthIdentities::Table,
                        AuthIdentities::UserId,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_identities_provider")
                    .table(AuthIdentities::Table)
                    .col(AuthIdentities::Provider)
                    .col(AuthIdentities::ProviderId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_identities_user_id")
                    .table(AuthIdentities::Table)
                    .col(AuthIdentities::UserId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuthSessions::Table)
                    .col(pk_uuid(AuthSessions::Id))
                    .col(uuid(AuthSessions::UserId))
                    .col(text(AuthSessions::Aal).default("aal1"))
                    .col(text(AuthSessions::AmrMethod))
                    .col(timestamp_with_time_zone(AuthSessions::CreatedAt).default(now.clone()))
                    .col(timestamp_with_time_zone(AuthSessions::RefreshedAt).default(now.clone()))
                    .foreign_key(&mut user_fk(
                        "fk_auth_sessions_user_id",
                        AuthSessions::Table,
                        AuthSessions::UserId,
                    ))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_sessions_user_id")
                    .table(AuthSessions::Table)
                    .col(AuthSessions::UserId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuthRefreshTokens::Table)
                    .col(pk_uuid(AuthRefreshTokens::Id))
                    .col(text(AuthRefreshTokens::TokenHash))
                    .col(uuid(AuthRefreshTokens::SessionId))
                    .col(uuid(AuthRefreshTokens::UserId))
                    .col(uuid_null(AuthRefreshTokens::ParentId))
                    .col(boolean(AuthRefreshTokens::Revoked).default(false))
                    .col(timestamp_with_time_zone_null(AuthRefreshTokens::RevokedAt))
                    .col(
                        timestamp_with_time_zone(AuthRefreshTokens::CreatedAt).default(now.clone()),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_auth_refresh_tokens_session_id")
                            .from(AuthRefreshTokens::Table, AuthRefreshTokens::SessionId)
                            .to(AuthSessions::Table, AuthSessions::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_refresh_tokens_token_hash")
                    .table(AuthRefreshTokens::Table)
                    .col(AuthRefreshTokens::TokenHash)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_refresh_tokens_parent_id")
                    .table(AuthRefreshTokens::Table)
                    .col(AuthRefreshTokens::ParentId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_refresh_tokens_session_id")
                    .table(AuthRefreshTokens::Table)
                    .col(AuthRefreshTokens::SessionId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuthOneTimeTokens::Table)
                    .col(pk_uuid(AuthOneTimeTokens::Id))
                    .col(uuid(AuthOneTimeTokens::UserId))
                    .col(text(AuthOneTimeTokens::Kind))
                    .col(text(AuthOneTimeTokens::TokenHashDigest))
                    .col(text(AuthOneTimeTokens::OtpDigest))
                    .col(text_null(AuthOneTimeTokens::RelatesTo))
                    .col(uuid_null(AuthOneTimeTokens::FlowStateId))
                    .col(
                        timestamp_with_time_zone(AuthOneTimeTokens::CreatedAt).default(now.clone()),
                    )
                    .foreign_key(&mut user_fk(
                        "fk_auth_one_time_tokens_user_id",
                        AuthOneTimeTokens::Table,
                        AuthOneTimeTokens::UserId,
                    ))
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
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_one_time_tokens_token_hash")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::TokenHashDigest)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_auth_one_time_tokens_otp")
                    .table(AuthOneTimeTokens::Table)
                    .col(AuthOneTimeTokens::OtpDigest)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuthFlowStates::Table)
                    .col(pk_uuid(AuthFlowStates::Id))
                    .col(uuid_null(AuthFlowStates::UserId))
                    .col(text(AuthFlowStates::Provider))
                    .col(text(AuthFlowStates::CodeChallenge))
                    .col(text(AuthFlowStates::CodeChallengeMethod))
                    .col(text(AuthFlowStates::AuthenticationMethod))
                    .col(text_null(AuthFlowStates::AuthCodeDigest))
                    .col(timestamp_with_time_zone_null(
                        AuthFlowStates::AuthCodeIssuedAt,
                    ))
                    .col(timestamp_with_time_zone(AuthFlowStates::CreatedAt).default(now))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_auth_flow_states_auth_code")
                    .table(AuthFlowStates::Table)
                    .col(AuthFlowStates::AuthCodeDigest)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            AuthFlowStates::Table.into_iden(),
            AuthOneTimeTokens::Table.into_iden(),
            AuthRefreshTokens::Table.into_iden(),
            AuthSessions::Table.into_iden(),
            AuthIdentities::Table.into_iden(),
            AuthAccounts::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(t).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum AuthAccounts {
    Table,
    UserId,
    Email,
    EmailNorm,
    PasswordHash,
    EmailConfirmedAt,
    EmailChange,
    ConfirmationSentAt,
    RecoverySentAt,
    MagiclinkSentAt,
    EmailChangeSentAt,
    LastSignInAt,
    UserMetadata,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum AuthIdentities {
    Table,
    Id,
    UserId,
    Provider,
    ProviderId,
    Email,
    IdentityData,
    LastSignInAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum AuthSessions {
    Table,
    Id,
    UserId,
    Aal,
    AmrMethod,
    CreatedAt,
    RefreshedAt,
}

#[derive(DeriveIden)]
enum AuthRefreshTokens {
    Table,
    Id,
    TokenHash,
    SessionId,
    UserId,
    ParentId,
    Revoked,
    RevokedAt,
    CreatedAt,
}

#[derive(DeriveIden)]
enum AuthOneTimeTokens {
    Table,
    Id,
    UserId,
    Kind,
    TokenHashDigest,
    OtpDigest,
    RelatesTo,
    FlowStateId,
    CreatedAt,
}

#[derive(DeriveIden)]
enum AuthFlowStates {
    Table,
    Id,
    UserId,
    Provider,
    CodeChallenge,
    CodeChallengeMethod,
    AuthenticationMethod,
    AuthCodeDigest,
    AuthCodeIssuedAt,
    CreatedAt,
}
