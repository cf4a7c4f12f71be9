//! The application's clock (`entity::base::db::now`): the database's own
//! clock plus an offset that only tests set, so a test can start a billing
//! history on 31 January 2028 and cross month ends for real instead of
//! moving stored times back.
//!
//! - Table `app_clock`: at most one row (`id` = 1) with `offset_us`, the
//!   microseconds added to the database's clock. No row (production): no
//!   offset.
//! - PostgreSQL: function `app_now()`, `clock_timestamp()` plus that offset,
//!   for SQL that stamps or compares times in one statement. SQLite has no
//!   stored functions; `entity::base::db::now_sql` spells the same
//!   expression with `strftime` modifiers.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `app_now()` on PostgreSQL: `VOLATILE`, like `clock_timestamp()`.
const CREATE_APP_NOW: &str = r#"
CREATE OR REPLACE FUNCTION app_now() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
  SELECT clock_timestamp()
       + COALESCE((SELECT offset_us FROM app_clock WHERE id = 1), 0) * INTERVAL '1 microsecond'
$$
"#;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(AppClock::Table)
                    .col(
                        ColumnDef::new(AppClock::Id)
                            .small_integer()
                            .not_null()
                            .primary_key()
                            .check(Expr::col(AppClock::Id).eq(1)),
                    )
                    .col(ColumnDef::new(AppClock::OffsetUs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared(CREATE_APP_NOW)
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared("DROP FUNCTION IF EXISTS app_now()")
                .await?;
        }
        manager
            .drop_table(Table::drop().table(AppClock::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum AppClock {
    Table,
    Id,
    OffsetUs,
}
