//! Short aliases for every entity, as `sea-orm-cli` would generate them:
//! `use entity::entities::prelude::*;` then `Users::find()`, `Payments::find()`...

pub use super::ai_quota_counters::Entity as AiQuotaCounters;
pub use super::ai_usage::Entity as AiUsage;
pub use super::audit_logs::Entity as AuditLogs;
pub use super::billing_ledger::Entity as BillingLedger;
pub use super::billing_receipts::Entity as BillingReceipts;
pub use super::job_outbox::Entity as JobOutbox;
pub use super::payments::Entity as Payments;
pub use super::profiles::Entity as Profiles;
pub use super::renewal_claims::Entity as RenewalClaims;
pub use super::renewal_pauses::Entity as RenewalPauses;
pub use super::renewals::Entity as Renewals;
pub use super::subscriptions::Entity as Subscriptions;
pub use super::user_roles::Entity as UserRoles;
pub use super::users::Entity as Users;
pub use super::waitlist::Entity as Waitlist;
pub use super::webhook_events::Entity as WebhookEvents;
