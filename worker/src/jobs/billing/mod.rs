//! Billing jobs: settlement of recorded provider events, reconciliation with
//! the provider, a page of the renewal loop, expiring a voided renewal's
//! checkout, and billing mails.

pub mod expire_checkout;
pub mod mail;
pub mod reconcile;
pub mod renewal;
pub mod settlement;
