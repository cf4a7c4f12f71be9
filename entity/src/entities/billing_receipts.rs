//! `billing_receipts`: one numbered receipt per payment ever `PAID`
//! ([`crate::billing::ledger`]).

use sea_orm::entity::prelude::*;

/// A payment's receipt and its money figures.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "billing_receipts")]
pub struct Model {
    /// The receipt's number: ascending in the order payments were paid,
    /// never reused.
    #[sea_orm(primary_key)]
    pub number: i64,
    /// The payment (unique: one receipt each).
    pub payment_id: Uuid,
    /// The customer.
    pub user_id: Uuid,
    /// The plan the payment's time went to.
    pub plan: String,
    /// The amount paid (IDR).
    pub amount: i64,
    /// The value of the unused time carried into its period from the plan
    /// it replaced (IDR).
    pub carried_in_value: i64,
    /// The period it bought.
    pub period_start: Option<DateTimeUtc>,
    /// Its end.
    pub period_end: Option<DateTimeUtc>,
    /// What partial or whole refunds gave back so far (IDR).
    pub refunded_amount: i64,
    /// Seconds a whole refund took back from the period.
    pub taken_back_seconds: i64,
    /// The database's time of the payment.
    pub created_at: DateTimeUtc,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
