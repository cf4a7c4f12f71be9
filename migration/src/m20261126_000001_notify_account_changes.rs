//! PostgreSQL only: row triggers on `users`, `user_roles` and `subscriptions`
//! that send `NOTIFY account_changed, '<user id>'` on every insert, update or
//! delete, so api processes can keep accounts and plans in memory and drop
//! them the moment they change (`api::identity::account_cache`). PostgreSQL delivers a
//! notification only when its transaction commits, and folds duplicates
//! within one transaction. On SQLite this migration does nothing.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (table, column holding the user id) of every table the cache reads.
const TABLES: [(&str, &str); 3] = [
    ("users", "id"),
    ("user_roles", "user_id"),
    ("subscriptions", "user_id"),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE OR REPLACE FUNCTION notify_account_changed() RETURNS trigger
             LANGUAGE plpgsql AS $$
             BEGIN
               IF TG_OP = 'DELETE' THEN
                 PERFORM pg_notify('account_changed', to_jsonb(OLD) ->> TG_ARGV[0]);
               ELSE
                 PERFORM pg_notify('account_changed', to_jsonb(NEW) ->> TG_ARGV[0]);
               END IF;
               RETURN NULL;
             END
             $$",
        )
        .await?;
        for (table, column) in TABLES {
            db.execute_unprepared(&format!(
                "CREATE TRIGGER {table}_notify_account_changed
                 AFTER INSERT OR UPDATE OR DELETE ON {table}
                 FOR EACH ROW EXECUTE FUNCTION notify_account_changed('{column}')"
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
        for (table, _) in TABLES {
            db.execute_unprepared(&format!(
                "DROP TRIGGER IF EXISTS {table}_notify_account_changed ON {table}"
            ))
            .await?;
        }
        db.execute_unprepared("DROP FUNCTION IF EXISTS notify_account_changed()")
            .await?;
        Ok(())
    }
}
