//! `billing_ledger`: one append-only row per change of a subscription's
//! plan, period end or grace ([`crate::billing::ledger`]). The database
//! refuses updates and deletes.

use sea_orm::entity::prelude::*;

/// One change of a subscription.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "billing_ledger")]
pub struct Model {
    /// Time-ordered id (UUID v7).
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The customer.
    pub user_id: Uuid,
    /// What changed it: `payment`, `renewal`, `refund`, `past_due`, `lapse`,
    /// `pause`, `operator`.
    pub kind: String,
    /// The payment that caused it (`payment`, `renewal`, `refund`).
    pub payment_id: Option<Uuid>,
    /// The renewal it paid (`renewal`).
    pub renewal_id: Option<Uuid>,
    /// The admin who made it (`operator`).
    pub actor_id: Option<Uuid>,
    /// The plan before.
    pub plan_from: String,
    /// The plan after.
    pub plan_to: String,
    /// The period end before (`None`: FREE).
    pub end_from: Option<DateTimeUtc>,
    /// The period end after.
    pub end_to: Option<DateTimeUtc>,
    /// When the grace was to end before (`None`: not in grace).
    pub grace_from: Option<DateTimeUtc>,
    /// When the grace ends after.
    pub grace_to: Option<DateTimeUtc>,
    /// Whole seconds the period end moved (`end_to − end_from`; 0 when
    /// either is `None`).
    pub seconds: i64,
    /// Money moved (IDR): the amount paid, the amount refunded, 0 for an
    /// operator's grant or the loop's changes.
    pub value: i64,
    /// The database's time of the change.
    pub created_at: DateTimeUtc,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
