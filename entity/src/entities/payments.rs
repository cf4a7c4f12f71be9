//! `payments`: one row per checkout attempt with a payment provider.
//!
//! A payment keeps its user from being deleted (foreign key without cascade):
//! the financial trail outlives the account's other data.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// `provider` value for the first payment provider.
pub const PROVIDER_A: &str = "provider_a";
/// `provider` value for the second payment provider.
pub const PROVIDER_B: &str = "provider_b";
/// Every allowed `provider` value.
pub const PROVIDERS: [&str; 2] = [PROVIDER_A, PROVIDER_B];
/// `currency` value for Indonesian rupiah, the only currency used so far.
pub const CURRENCY_IDR: &str = "IDR";

/// State of a payment, stored as upper-case text:
/// `PENDING`, `PAID`, `FAILED`, `EXPIRED` or `REFUNDED`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentStatus {
    /// Created, waiting for the provider's verdict (`PENDING`).
    #[sea_orm(string_value = "PENDING")]
    Pending,
    /// Settled successfully (`PAID`).
    #[sea_orm(string_value = "PAID")]
    Paid,
    /// Rejected or failed at the provider (`FAILED`).
    #[sea_orm(string_value = "FAILED")]
    Failed,
    /// Not paid before the checkout expired (`EXPIRED`).
    #[sea_orm(string_value = "EXPIRED")]
    Expired,
    /// Paid, then refunded (`REFUNDED`).
    #[sea_orm(string_value = "REFUNDED")]
    Refunded,
}

impl PaymentStatus {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Paid => "PAID",
            Self::Failed => "FAILED",
            Self::Expired => "EXPIRED",
            Self::Refunded => "REFUNDED",
        }
    }
}

/// A payment (checkout) record.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "payments")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Our order id sent to the provider, unique; form
    /// `PREFIX-<epoch ms>-<8 upper-case alphanumerics>`.
    #[sea_orm(column_type = "Text", unique)]
    pub order_id: String,
    /// Paying user (foreign key to `users.id`, no cascade).
    pub user_id: Uuid,
    /// Plan id bought, e.g. `BASIC`, `PRO`, `ULTIMATE`.
    #[sea_orm(column_type = "Text")]
    pub plan: String,
    /// Amount in whole units of `currency` (IDR has no minor unit in practice).
    pub amount: i64,
    /// ISO 4217 currency code, e.g. [`CURRENCY_IDR`].
    #[sea_orm(column_type = "Text")]
    pub currency: String,
    /// Payment provider: one of [`PROVIDERS`].
    #[sea_orm(column_type = "Text")]
    pub provider: String,
    /// Payment state.
    pub status: PaymentStatus,
    /// Provider's checkout/session token, if it issued one.
    #[sea_orm(column_type = "Text", nullable)]
    pub checkout_token: Option<String>,
    /// URL where the user pays, if the provider gave one.
    #[sea_orm(column_type = "Text", nullable)]
    pub payment_url: Option<String>,
    /// Provider's own transaction id, once known.
    #[sea_orm(column_type = "Text", nullable)]
    pub provider_reference: Option<String>,
    /// When the payment was settled as paid (UTC).
    pub paid_at: Option<DateTimeUtc>,
    /// `Idempotency-Key` header of the request that created the row, if any;
    /// unique per user (index `payments_user_idempotency_key_uidx`).
    #[sea_orm(column_type = "Text", nullable)]
    pub idempotency_key: Option<String>,
    /// When reconciliation last asked the provider about this payment (UTC).
    pub reconciled_at: Option<DateTimeUtc>,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
    /// When the row was last changed (UTC).
    pub updated_at: DateTimeUtc,
    /// The plan this payment granted when it settled `PAID` (`None`: never
    /// paid, or paid before grants were stored).
    #[sea_orm(column_type = "Text", nullable)]
    pub grant_plan: Option<String>,
    /// Start of the period it granted.
    pub grant_start: Option<DateTimeUtc>,
    /// End of the period it granted: its own calendar month plus
    /// `carried_seconds`.
    pub grant_end: Option<DateTimeUtc>,
    /// The paid plan it replaced (`None`: it replaced nothing paid, or
    /// extended the same plan).
    #[sea_orm(column_type = "Text", nullable)]
    pub grant_from_plan: Option<String>,
    /// The replaced plan's period end, restored when this payment is refunded.
    pub grant_from_end: Option<DateTimeUtc>,
    /// Seconds of unused time carried into the period from the replaced plan.
    pub carried_seconds: Option<i64>,
    /// What the carried time was worth, whole units of `currency` (rounded down).
    pub carried_value: Option<i64>,
    /// Set when this grant's unused time was carried into a later payment's
    /// period (that payment's id): the grant no longer runs.
    pub carried_into: Option<Uuid>,
    /// What partial refunds or chargebacks gave back so far (whole units).
    pub refunded_amount: i64,
    /// What this grant's own money carried on when it was carried into
    /// `carried_into` (the unused part of its own month), in millionths of
    /// a unit (exact enough that a refund following it leaves no second
    /// unpaid): what a refund of it follows. `None`
    /// before it was carried, or carried before this was stored.
    pub carried_out_value: Option<i64>,
    /// The renewal this payment pays (`renewals.id`), when it was started
    /// from a renewal's pay link; `None` for a checkout of `POST /api/payments`.
    pub renewal_id: Option<Uuid>,
}

/// A payment belongs to one user.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The paying user.
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::UserId",
        to = "super::users::Column::Id"
    )]
    User,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::User.def()
    }
}

timestamps!(created_at, updated_at);
