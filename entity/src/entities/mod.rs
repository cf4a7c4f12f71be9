//! SeaORM entities: one module per table, in the classic `DeriveEntityModel`
//! format (`Entity`, `Model`, `ActiveModel`, `Column`, `Relation` in each).
//!
//! Conventions shared by every table:
//! - ids are `Uuid` (PostgreSQL `uuid`; on SQLite sqlx stores them as a 16-byte
//!   blob, so always compare them through SeaORM/sqlx, never as text);
//! - timestamps are `DateTimeUtc` (PostgreSQL `timestamp with time zone`; on
//!   SQLite RFC 3339 text such as `2026-11-22T10:00:00.123+00:00`);
//! - statuses and roles are plain text columns (no database enums), so SQLite
//!   and PostgreSQL behave the same; the allowed values are Rust enums with
//!   `DeriveActiveEnum` or `pub const` strings next to the table;
//! - `created_at` / `updated_at` / `received_at` have a database default of
//!   "now", and [`ActiveModelBehavior::before_save`](sea_orm::ActiveModelBehavior::before_save)
//!   fills them in when left `NotSet` and bumps `updated_at` on every update
//!   made through `ActiveModel::{insert, update, save}` (bulk
//!   `Entity::insert`/`Entity::update_many` do not run the hook).
//!
//! The schema itself is created by the `migration` crate; keep both in step.

/// Implements `ActiveModelBehavior` for the module's `ActiveModel`: on insert
/// the creation column is set to now when left `NotSet`; with a second column,
/// that one is set to now on every insert and update unless the caller set it.
macro_rules! timestamps {
    ($created:ident) => {
        #[async_trait::async_trait]
        impl sea_orm::ActiveModelBehavior for ActiveModel {
            /// Fills the creation time on insert when not set.
            async fn before_save<C: sea_orm::ConnectionTrait>(
                mut self,
                _db: &C,
                insert: bool,
            ) -> Result<Self, sea_orm::DbErr> {
                if insert && self.$created.is_not_set() {
                    self.$created = sea_orm::Set(chrono::Utc::now());
                }
                Ok(self)
            }
        }
    };
    ($created:ident, $updated:ident) => {
        #[async_trait::async_trait]
        impl sea_orm::ActiveModelBehavior for ActiveModel {
            /// Fills the creation time on insert when not set, and the update
            /// time on every save unless the caller set it.
            async fn before_save<C: sea_orm::ConnectionTrait>(
                mut self,
                _db: &C,
                insert: bool,
            ) -> Result<Self, sea_orm::DbErr> {
                let now = chrono::Utc::now();
                if insert && self.$created.is_not_set() {
                    self.$created = sea_orm::Set(now);
                }
                if !self.$updated.is_set() {
                    self.$updated = sea_orm::Set(now);
                }
                Ok(self)
            }
        }
    };
}

pub mod prelude;

pub mod ai_quota_counters;
pub mod ai_usage;
pub mod audit_logs;
pub mod auth_accounts;
pub mod auth_code_attempts;
pub mod auth_flow_states;
pub mod auth_identities;
pub mod auth_mail_slots;
pub mod auth_one_time_tokens;
pub mod auth_refresh_tokens;
pub mod auth_sessions;
pub mod billing_ledger;
pub mod billing_receipts;
pub mod job_outbox;
pub mod payments;
pub mod profiles;
pub mod renewal_claims;
pub mod renewal_pauses;
pub mod renewals;
pub mod subscriptions;
pub mod user_roles;
pub mod users;
pub mod waitlist;
pub mod webhook_events;
