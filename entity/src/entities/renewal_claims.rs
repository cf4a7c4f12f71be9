//! `renewal_claims`: which rows the scheduler queued for which pass of the
//! renewal loop, and when ([`crate::billing::renewal::claim_page`]).

use sea_orm::entity::prelude::*;

/// One row queued for one pass.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "renewal_claims")]
pub struct Model {
    /// The pass ([`crate::billing::renewal::Step::as_str`]: `create`, `remind`,
    /// `past_due`, `lapse`).
    #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
    pub step: String,
    /// The row queued: a user id, or a renewal id for `remind`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// When it was queued (the database's time); it may be queued again a
    /// lease after.
    pub claimed_at: DateTimeUtc,
}

/// No relations: a claim outlives nothing it names.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
