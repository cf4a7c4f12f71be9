//! `renewal_pauses`: when the renewal loop waited because payments were off
//! ([`crate::billing::renewal::pause`]).

use sea_orm::entity::prelude::*;

/// One pause of the renewal loop.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "renewal_pauses")]
pub struct Model {
    /// Random id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The database's time at the first paused tick.
    pub started_at: DateTimeUtc,
    /// The database's time at the first tick after it; `None` while it lasts.
    pub ended_at: Option<DateTimeUtc>,
    /// `Some(true)` while it lasts, `None` after (unique: one open pause).
    pub open: Option<bool>,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
