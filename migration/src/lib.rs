//! Database migrations for the subscription backend, one file per migration
//! (`mYYYYMMDD_HHMMSS_what.rs`, named by `DeriveMigrationName` after the module).
//!
//! Every migration runs on both PostgreSQL and SQLite: plain text columns for
//! statuses and roles (no database enums), foreign keys declared inside
//! `CREATE TABLE` (SQLite cannot add them later), and indexes created with
//! separate `CREATE INDEX` statements. Tables are created in foreign-key order
//! and dropped in reverse by `down`.
//!
//! The matching SeaORM entities live in `entity::entities`; keep both in step.
//!
//! Apply them with [`up_locked`] (the api's `MIGRATE_ON_START` and `migration
//! up`): on PostgreSQL it serialises concurrent appliers with an advisory lock.

pub use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

mod m20261122_000001_create_users;
mod m20261122_000002_create_profiles;
mod m20261122_000003_create_subscriptions;
mod m20261122_000004_create_user_roles;
mod m20261122_000005_create_payments;
mod m20261122_000006_create_webhook_events;
mod m20261122_000007_create_audit_logs;
mod m20261122_000008_create_waitlist;
mod m20261122_000009_create_ai_usage;
mod m20261123_000001_add_profile_avatar_generation;
mod m20261123_000002_add_audit_client_request_id;
mod m20261123_000003_add_payment_idempotency_and_reconcile;
mod m20261123_000010_add_ai_usage_outcome;
mod m20261123_000020_create_identity;
mod m20261123_000021_create_oauth_states;
mod m20261126_000001_notify_account_changes;
mod m20261130_000030_create_job_outbox;
mod m20261130_000045_identity_trust;
mod m20261201_000040_create_ai_quota_counters;
mod m20261202_000050_notify_identity_and_usage;
mod m20261210_000001_identity_address_rules;
mod m20261213_000001_create_billing_mails;
mod m20261213_000002_add_payment_grants;
mod m20261214_000001_create_renewals;
mod m20261215_000001_create_renewal_claims;
mod m20261216_000001_add_billing_anchor;
mod m20261216_000002_add_grace_times;
mod m20261216_000003_add_email_change_verified;
mod m20261217_000001_create_renewal_pauses;
mod m20261218_000001_create_billing_ledger;
mod m20261219_000001_add_price_notices;
mod m20261219_000002_add_scheduled_phases;
mod m20261220_000001_create_app_clock;
mod m20261221_000001_add_renewal_plan_price;

mod lock;
pub use lock::{up_locked, MIGRATION_LOCK_KEY};

/// The list of all migrations, in the order they are applied.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261122_000001_create_users::Migration),
            Box::new(m20261122_000002_create_profiles::Migration),
            Box::new(m20261122_000003_create_subscriptions::Migration),
            Box::new(m20261122_000004_create_user_roles::Migration),
            Box::new(m20261122_000005_create_payments::Migration),
            Box::new(m20261122_000006_create_webhook_events::Migration),
            Box::new(m20261122_000007_create_audit_logs::Migration),
            Box::new(m20261122_000008_create_waitlist::Migration),
            Box::new(m20261122_000009_create_ai_usage::Migration),
            Box::new(m20261123_000001_add_profile_avatar_generation::Migration),
            Box::new(m20261123_000002_add_audit_client_request_id::Migration),
            Box::new(m20261123_000003_add_payment_idempotency_and_reconcile::Migration),
            Box::new(m20261123_000010_add_ai_usage_outcome::Migration),
            Box::new(m20261123_000020_create_identity::Migration),
            Box::new(m20261123_000021_create_oauth_states::Migration),
            Box::new(m20261126_000001_notify_account_changes::Migration),
            Box::new(m20261130_000030_create_job_outbox::Migration),
            Box::new(m20261130_000045_identity_trust::Migration),
            Box::new(m20261201_000040_create_ai_quota_counters::Migration),
            Box::new(m20261202_000050_notify_identity_and_usage::Migration),
            Box::new(m20261210_000001_identity_address_rules::Migration),
            Box::new(m20261213_000001_create_billing_mails::Migration),
            Box::new(m20261213_000002_add_payment_grants::Migration),
            Box::new(m20261214_000001_create_renewals::Migration),
            Box::new(m20261215_000001_create_renewal_claims::Migration),
            Box::new(m20261216_000001_add_billing_anchor::Migration),
            Box::new(m20261216_000002_add_grace_times::Migration),
            Box::new(m20261216_000003_add_email_change_verified::Migration),
            Box::new(m20261217_000001_create_renewal_pauses::Migration),
            Box::new(m20261218_000001_create_billing_ledger::Migration),
            Box::new(m20261219_000001_add_price_notices::Migration),
            Box::new(m20261219_000002_add_scheduled_phases::Migration),
            Box::new(m20261220_000001_create_app_clock::Migration),
            Box::new(m20261221_000001_add_renewal_plan_price::Migration),
        ]
    }
}

/// Database default for "now" in a timestamp-with-time-zone column.
///
/// PostgreSQL: `CURRENT_TIMESTAMP`. SQLite: its `CURRENT_TIMESTAMP` is
/// `YYYY-MM-DD HH:MM:SS` (space, no offset), which sorts and compares wrongly
/// against the RFC 3339 text sqlx writes for `DateTime<Utc>`
/// (`YYYY-MM-DDTHH:MM:SS.ffffff+00:00`), so we produce the same shape instead.
pub(crate) fn now_default(backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Sqlite => Expr::cust("strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')"),
        _ => Expr::current_timestamp(),
    }
}
