//! The billing ledger and receipts (decisions.md, "Ledger and receipts"):
//!
//! - `billing_ledger`: one append-only row per change of a subscription's
//!   plan, period end or grace (`kind`: `payment`, `renewal`, `refund`,
//!   `past_due`, `lapse`, `pause`, `operator`), with what caused it (the
//!   payment, the renewal, the operator), the plan, end and grace before and
//!   after, the seconds the end moved and the money it moved (IDR). A row is
//!   never updated or deleted: a trigger refuses both, on PostgreSQL and on
//!   SQLite.
//! - `billing_receipts`: one numbered receipt per payment ever `PAID`
//!   (`number`, ascending in the order payments were paid, never reused),
//!   mailed or not, with its money figures: the amount, the value carried
//!   into its grant, what partial or whole refunds gave back and the
//!   seconds a refund took back. Payments already paid before this migration
//!   get theirs, numbered in the order they were paid (a refunded one with
//!   its whole amount gone back; the seconds its refund took are not known
//!   for those and stay 0).
//! - `payments.carried_out_value`: what a grant's unused time was worth when
//!   a plan change carried it on (the carry stores it per source), which a
//!   refund of that payment follows.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let ts = |c: BillingLedger| {
            ColumnDef::new(c)
                .timestamp_with_time_zone()
                .null()
                .to_owned()
        };
        manager
            .create_table(
                Table::create()
                    .table(BillingLedger::Table)
                    .col(
                        ColumnDef::new(BillingLedger::Id)
                            .uuid()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(BillingLedger::UserId).uuid().not_null())
                    .col(
                        ColumnDef::new(BillingLedger::Kind)
                            .string_len(16)
                            .not_null(),
                    )
                    .col(ColumnDef::new(BillingLedger::PaymentId).uuid().null())
                    .col(ColumnDef::new(BillingLedger::RenewalId).uuid().null())
                    .col(ColumnDef::new(BillingLedger::ActorId).uuid().null())
                    .col(
                        ColumnDef::new(BillingLedger::PlanFrom)
                            .string_len(32)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(BillingLedger::PlanTo)
                            .string_len(32)
                            .not_null(),
                    )
                    .col(ts(BillingLedger::EndFrom))
                    .col(ts(BillingLedger::EndTo))
                    .col(ts(BillingLedger::GraceFrom))
                    .col(ts(BillingLedger::GraceTo))
                    .col(
                        ColumnDef::new(BillingLedger::Seconds)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(BillingLedger::Value)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(BillingLedger::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("billing_ledger_user_idx")
                    .table(BillingLedger::Table)
                    .col(BillingLedger::UserId)
                    .col(BillingLedger::CreatedAt)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(BillingReceipts::Table)
                    .col(
                        ColumnDef::new(BillingReceipts::Number)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::PaymentId)
                            .uuid()
                            .not_null()
                            .unique_key(),
                    )
                    .col(ColumnDef::new(BillingReceipts::UserId).uuid().not_null())
                    .col(
                        ColumnDef::new(BillingReceipts::Plan)
                            .string_len(32)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::Amount)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::CarriedInValue)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::PeriodStart)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::PeriodEnd)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::RefundedAmount)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::TakenBackSeconds)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(BillingReceipts::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("billing_receipts_user_idx")
                    .table(BillingReceipts::Table)
                    .col(BillingReceipts::UserId)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .add_column(
                        ColumnDef::new(Payments::CarriedOutValue)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        // Every payment already paid gets its receipt, in the order paid.
        db.execute_unprepared(
            "INSERT INTO billing_receipts
               (payment_id, user_id, plan, amount, carried_in_value, period_start, period_end,
                refunded_amount, taken_back_seconds, created_at)
             SELECT id, user_id, COALESCE(grant_plan, plan), amount, COALESCE(carried_value, 0),
                    grant_start, grant_end,
                    CASE WHEN status = 'REFUNDED' THEN amount ELSE refunded_amount END, 0, paid_at
             FROM payments WHERE paid_at IS NOT NULL ORDER BY paid_at, id",
        )
        .await?;
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared(
                    "CREATE OR REPLACE FUNCTION billing_ledger_append_only() RETURNS trigger
                     LANGUAGE plpgsql AS $$
                     BEGIN
                       RAISE EXCEPTION 'billing_ledger is append-only';
                     END
                     $$",
                )
                .await?;
                db.execute_unprepared(
                    "CREATE TRIGGER billing_ledger_append_only
                     BEFORE UPDATE OR DELETE ON billing_ledger
                     FOR EACH ROW EXECUTE FUNCTION billing_ledger_append_only()",
                )
                .await?;
            }
            _ => {
                for op in ["UPDATE", "DELETE"] {
                    db.execute_unprepared(&format!(
                        "CREATE TRIGGER billing_ledger_no_{lower} BEFORE {op} ON billing_ledger
                         BEGIN SELECT RAISE(ABORT, 'billing_ledger is append-only'); END",
                        lower = op.to_lowercase()
                    ))
                    .await?;
                }
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Payments::Table)
                    .drop_column(Payments::CarriedOutValue)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(BillingReceipts::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(BillingLedger::Table).to_owned())
            .await?;
        if manager.get_database_backend() == DbBackend::Postgres {
            manager
                .get_connection()
                .execute_unprepared("DROP FUNCTION IF EXISTS billing_ledger_append_only()")
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden, Clone, Copy)]
enum BillingLedger {
    Table,
    Id,
    UserId,
    Kind,
    PaymentId,
    RenewalId,
    ActorId,
    PlanFrom,
    PlanTo,
    EndFrom,
    EndTo,
    GraceFrom,
    GraceTo,
    Seconds,
    Value,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Payments {
    Table,
    CarriedOutValue,
}

#[derive(DeriveIden)]
enum BillingReceipts {
    Table,
    Number,
    PaymentId,
    UserId,
    Plan,
    Amount,
    CarriedInValue,
    PeriodStart,
    PeriodEnd,
    RefundedAmount,
    TakenBackSeconds,
    CreatedAt,
}
