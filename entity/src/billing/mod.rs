//! Billing: payments and their state machine, checkout, provider webhook
//! verification, events recorded then settled, grants (the one value → time
//! conversion) and what a refund takes back, reconciliation, the subscription, billing mails, and renewal.

pub mod anchor;
pub mod checkout;
pub mod events;
pub mod grant;
pub mod mail;
pub mod payment;
pub mod reads;
pub mod reconcile;
pub mod renewal;
pub mod settlement;
pub mod subscription;
pub mod take_back;
pub mod webhook;
