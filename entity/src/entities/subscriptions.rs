//! `subscriptions`: the user's current plan, exactly one row per user
//! (primary key = `users.id`, deleted with the user).

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// State of a subscription, stored as text: `active`, `canceled` or `past_due`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionStatus {
    /// The plan is in force (`active`).
    #[sea_orm(string_value = "active")]
    Active,
    /// The subscription has ended (`canceled`).
    #[sea_orm(string_value = "canceled")]
    Canceled,
    /// A renewal payment is overdue (`past_due`).
    #[sea_orm(string_value = "past_due")]
    PastDue,
}

impl SubscriptionStatus {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Canceled => "canceled",
            Self::PastDue => "past_due",
        }
    }
}

/// A user's subscription.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "subscriptions")]
pub struct Model {
    /// Owner; primary key and foreign key to `users.id` (on delete cascade).
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: Uuid,
    /// Plan id from the plan catalogue, e.g. `FREE`, `BASIC`, `PRO`, `ULTIMATE`.
    #[sea_orm(column_type = "Text")]
    pub plan: String,
    /// Subscription state.
    pub status: SubscriptionStatus,
    /// True when the user asked to stop at the end of the current period.
    pub cancel_at_period_end: bool,
    /// Start of the paid period (UTC); `None` for free plans.
    pub current_period_start: Option<DateTimeUtc>,
    /// End of the paid period (UTC); `None` for free plans.
    pub current_period_end: Option<DateTimeUtc>,
    /// When the subscription was canceled (UTC), if it was.
    pub canceled_at: Option<DateTimeUtc>,
    /// When the row was created (UTC).
    pub created_at: DateTimeUtc,
    /// When the row was last changed (UTC).
    pub updated_at: DateTimeUtc,
    /// The plan the next renewal bills when the customer chose another one
    /// (`change`); `None`: the current plan.
    #[sea_orm(column_type = "Text", nullable)]
    pub renewal_plan: Option<String>,
    /// The catalogue price of `renewal_plan` when the customer chose it
    /// (whole units of the catalogue's currency): its price of record until
    /// it is paid ([`crate::billing::price`]). Read only with
    /// `renewal_plan`; `None` on choices older than this column.
    pub renewal_plan_price: Option<i64>,
    /// The billing anchor's day of the month, 1–31 (`billing::anchor`);
    /// `None` on free plans and on subscriptions stored before anchors.
    pub billing_anchor_day: Option<i16>,
    /// The billing anchor's local time of day in `BILLING_TIME_ZONE`.
    pub billing_anchor_time: Option<Time>,
    /// When the past-due notice was recorded (the period ended unpaid);
    /// `None` unless `past_due` (and on `past_due` rows older than it).
    pub past_due_at: Option<DateTimeUtc>,
    /// When the renewal grace ends: `past_due_at` plus
    /// `RENEWAL_GRACE_SECS` (extended by any pause of the renewal loop);
    /// the plan lapses to FREE after it unless paid.
    pub grace_ends_at: Option<DateTimeUtc>,
    /// The plan the last price-change mail was about
    /// ([`crate::billing::price`]); `None`: no notice since this column.
    #[sea_orm(column_type = "Text", nullable)]
    pub price_notice_plan: Option<String>,
    /// The higher catalogue price that mail announced (whole units of the
    /// catalogue's currency).
    pub price_notice_amount: Option<i64>,
    /// When that price-change mail was recorded (the database's clock).
    pub price_notice_at: Option<DateTimeUtc>,
    /// The plan of a scheduled phase: a renewal of the plan chosen by
    /// `change`, paid before the period end, runs from the old end
    /// (`crate::billing::phase`); `None`: none scheduled.
    #[sea_orm(column_type = "Text", nullable)]
    pub scheduled_plan: Option<String>,
    /// The payment whose stored grant is that phase.
    pub scheduled_payment_id: Option<Uuid>,
}

/// A subscription belongs to one user.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    /// The owning user.
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::UserId",
        to = "super::users::Column::Id",
        on_delete = "Cascade"
    )]
    User,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::User.def()
    }
}

timestamps!(created_at, updated_at);
