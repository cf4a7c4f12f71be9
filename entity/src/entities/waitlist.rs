//! `waitlist`: people who asked to be told when the product opens.
//!
//! `email` is unique. The application trims and lower-cases the address
//! before every insert (`crate::forms::waitlist::Lead::new`), so ` Foo@X.io` and
//! `foo@x.io` are both stored as `foo@x.io` and a plain unique index on the
//! column is enough: the second sign-up fails with
//! `SqlErr::UniqueConstraintViolation`. Never insert an un-normalized address.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// A waitlist sign-up.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "waitlist")]
pub struct Model {
    /// Row id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// E-mail address, trimmed and lower-cased; unique.
    #[sea_orm(column_type = "Text", unique)]
    pub email: String,
    /// Name as given.
    #[sea_orm(column_type = "Text")]
    pub name: String,
    /// When the sign-up arrived (UTC).
    pub created_at: DateTimeUtc,
}

/// Waitlist rows have no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

timestamps!(created_at);
