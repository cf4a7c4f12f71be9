//! The renewal loop's records:
//! * `renewals`: one row per renewal offered (user, the period end it renews,
//!   plan, amount fixed at creation, currency, status `open` / `paid` /
//!   `void`, when the next reminder is due); the partial unique index
//!   `renewals_open_uidx` on `(user_id, period_end) WHERE status = 'open'`
//!   keeps it to one open renewal per subscription and period end under any
//!   number of workers, ticks or crashes; `renewals_remind_idx` serves the
//!   reminder pass;
//! * `payments.renewal_id` (nullable): the renewal a payment pays;
//! * `subscriptions.renewal_plan` (nullable): the plan the next renewal bills
//!   when the customer chose another one (`change`);
//! * `subscriptions_paid_period_end_idx` on `(current_period_end, user_id)`
//!   `WHERE plan <> 'FREE'`: the keyset pages of the scheduler's renewal,
//!   grace and lapse passes;
//! * PostgreSQL only: the `account_changed` row trigger on `renewals` (the
//!   function of `m20261126_000001_notify_account_changes`), since
//!   `GET /api/me`'s cached details show the open renewal.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

use crate::now_default;

#[derive(DeriveMigrationName)]
pub struct Migration;

const OPEN_INDEX: &str = "renewals_open_uidx";
const REMIND_INDEX: &str = "renewals_remind_idx";
const PAYMENT_INDEX: &str = "payments_renewal_id_idx";
const PERIOD_INDEX: &str = "subscriptions_paid_period_end_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(Renewals::Table)
                    .col(ColumnDef::new(Renewals::Id).uuid().not_null().primary_key())
                    .col(ColumnDef::new(Renewals::UserId).uuid().not_null())
                    .col(
                        ColumnDef::new(Renewals::PeriodEnd)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .col(ColumnDef::new(Renewals::Plan).text().not_null())
                    .col(ColumnDef::new(Renewals::Amount).big_integer().not_null())
                    .col(ColumnDef::new(Renewals::Currency).text().not_null())
                    .col(
                        ColumnDef::new(Renewals::Status)
                            .text()
                            .not_null()
                            .default("open"),
                    )
                    .col(
                        ColumnDef::new(Renewals::NextReminderAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(
                        ColumnDef::new(Renewals::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null()
                            .default(now_default(backend)),
                    )
                    .col(
                        ColumnDef::new(Renewals::UpdatedAt)
                            .timestamp_with_time_zone()
                            .not_null()
                            .default(now_default(backend)),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("renewals_user_id_fkey")
                            .from(Renewals::Table, Renewals::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        // Partial indexes: the same text on PostgreSQL and SQLite.
        db.execute_unprepared(&format!(
            "CREATE UNIQUE INDEX {OPEN_INDEX} ON renewals (user_id, period_end) WHERE status = 'open'"
        ))
        .await?;
        db.execute_unprepared(&format!(
            "CREATE INDEX {REMIND_INDEX} ON renewals (next_reminder_at, id) WHERE status = 'open'"
        ))
        .await?;
        db.execute_unprepared(&format!(
            "CREATE INDEX {PERIOD_INDEX} ON subscriptions (current_period_end, user_id) WHERE plan <> 'FREE'"
        ))
        .await?;
        if backend == DbBackend::Postgres {
            db.execute_unprepared(
                "CREATE TRIGGER renewals_notify_account_changed
                 AFTER INSERT OR UPDATE OR DELETE ON renewals
                 FOR EACH ROW EXECUTE FUNCTION notify_account_changed('user_id')",
            )
            .await?;
        }
        // SQLite adds one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .add_column(ColumnDef::new(Payments::RenewalId).uuid().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(PAYMENT_INDEX)
                    .table(Payments::Table)
                    .col(Payments::RenewalId)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Subscriptions::Table)
                    .add_column(ColumnDef::new(Subscriptions::RenewalPlan).text().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Subscriptions::Table)
                    .drop_column(Subscriptions::RenewalPlan)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(PAYMENT_INDEX)
                    .table(Payments::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .drop_column(Payments::RenewalId)
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(
                "DROP TRIGGER IF EXISTS renewals_notify_account_changed ON renewals",
            )
            .await?;
        }
        db.execute_unprepared(&format!("DROP INDEX IF EXISTS {PERIOD_INDEX}"))
            .await?;
        db.execute_unprepared(&format!("DROP INDEX IF EXISTS {REMIND_INDEX}"))
            .await?;
        db.execute_unprepared(&format!("DROP INDEX IF EXISTS {OPEN_INDEX}"))
            .await?;
        manager
            .drop_table(Table::drop().table(Renewals::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Renewals {
    Table,
    Id,
    UserId,
    PeriodEnd,
    Plan,
    Amount,
    Currency,
    Status,
    NextReminderAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Payments {
    Table,
    RenewalId,
}

#[derive(DeriveIden)]
enum Subscriptions {
    Table,
    RenewalPlan,
}
