//! PostgreSQL only: the rest of the row triggers the api's cache of accounts
//! (`api::identity::account_cache`) listens to, beside those of
//! `m20261126_000001_notify_account_changes` (`users`, `user_roles`,
//! `subscriptions`):
//! - `profiles`, `auth_accounts`, `auth_identities` on every insert, update
//!   or delete, and `auth_sessions` on delete (a session ended: its
//!   `GET /auth/v1/user` answer goes; a refresh, which only updates the row,
//!   sends nothing): `NOTIFY account_changed, '<user id>'`;
//! - `ai_usage` on every insert, update or delete:
//!   `NOTIFY ai_usage_changed, '<user id>'`.
//!
//! PostgreSQL delivers a notification only when its transaction commits, and
//! folds duplicates within one transaction. On SQLite this migration does
//! nothing.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (table, column holding the user id, events, channel).
const TRIGGERS: [(&str, &str, &str, &str); 5] = [
    (
        "profiles",
        "user_id",
        "INSERT OR UPDATE OR DELETE",
        "account_changed",
    ),
    (
        "auth_accounts",
        "user_id",
        "INSERT OR UPDATE OR DELETE",
        "account_changed",
    ),
    (
        "auth_identities",
        "user_id",
        "INSERT OR UPDATE OR DELETE",
        "account_changed",
    ),
    ("auth_sessions", "user_id", "DELETE", "account_changed"),
    (
        "ai_usage",
        "user_id",
        "INSERT OR UPDATE OR DELETE",
        "ai_usage_changed",
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        // TG_ARGV[0]: the channel; TG_ARGV[1]: the user id's column.
        db.execute_unprepared(
            "CREATE OR REPLACE FUNCTION notify_user_changed() RETURNS trigger
             LANGUAGE plpgsql AS $$
             BEGIN
               IF TG_OP = 'DELETE' THEN
                 PERFORM pg_notify(TG_ARGV[0], to_jsonb(OLD) ->> TG_ARGV[1]);
               ELSE
                 PERFORM pg_notify(TG_ARGV[0], to_jsonb(NEW) ->> TG_ARGV[1]);
               END IF;
               RETURN NULL;
             END
             $$",
        )
        .await?;
        for (table, column, events, channel) in TRIGGERS {
            db.execute_unprepared(&format!(
                "CREATE TRIGGER {table}_notify_user_changed
                 AFTER {events} ON {table}
                 FOR EACH ROW EXECUTE FUNCTION notify_user_changed('{channel}', '{column}')"
            ))
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        for (table, ..) in TRIGGERS {
            db.execute_unprepared(&format!(
                "DROP TRIGGER IF EXISTS {table}_notify_user_changed ON {table}"
            ))
            .await?;
        }
        db.execute_unprepared("DROP FUNCTION IF EXISTS notify_user_changed()")
            .await?;
        Ok(())
    }
}
