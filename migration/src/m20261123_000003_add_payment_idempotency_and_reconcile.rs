//! Adds to `payments`:
//! * `idempotency_key` (text, nullable) with a unique index on
//!   `(user_id, idempotency_key)`: the `Idempotency-Key` header of the
//!   `POST /api/payments` that created the row, so a retried request finds
//!   its first answer instead of creating a second payment (the unique index
//!   decides between concurrent retries, not a clock);
//! * `reconciled_at` (timestamp, nullable): when the worker last asked the
//!   provider's status API about this `PENDING` payment, so reconciliation
//!   asks about each payment at most once per `PAYMENT_RECONCILE_AFTER_SECS`.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const KEY_INDEX: &str = "payments_user_idempotency_key_uidx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite adds one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .add_column(ColumnDef::new(Payments::IdempotencyKey).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .add_column(
                        ColumnDef::new(Payments::ReconciledAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(KEY_INDEX)
                    .table(Payments::Table)
                    .col(Payments::UserId)
                    .col(Payments::IdempotencyKey)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(KEY_INDEX)
                    .table(Payments::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .drop_column(Payments::ReconciledAt)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .drop_column(Payments::IdempotencyKey)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Payments {
    Table,
    UserId,
    IdempotencyKey,
    ReconciledAt,
}
