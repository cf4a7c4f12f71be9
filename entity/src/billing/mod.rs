//! Billing: payments and their state machine, checkout, provider webhook
//! verification, events recorded then settled, grants (the one value → time
//! conversion) and what a refund takes back, the ledger and receipts, reconciliation, the subscription, operator grants, billing mails, and renewal.

pub mod anchor;
pub mod checkout;
pub mod events;
pub mod grace;
pub mod grant;
pub mod ledger;
pub mod mail;
pub mod operator;
pub mod payment;
pub mod phase;
pub mod price;
pub mod reads;
pub mod reconcile;
pub mod renewal;
pub mod settlement;
pub mod subscription;
pub mod take_back;
pub mod webhook;

/// The billing terms every grant is computed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// `BILLING_TIME_ZONE`: months are counted in it (the billing anchor).
    pub zone: chrono_tz::Tz,
    /// `RENEWAL_GRACE_SECS`: how long after its notice an unpaid period may
    /// still be paid from its old end ([`grant::in_grace`]).
    pub grace: chrono::Duration,
}

impl Terms {
    /// The terms of `settings`.
    pub fn from_settings(settings: &crate::Settings) -> Self {
        Self {
            zone: settings.billing_time_zone,
            grace: chrono::Duration::from_std(settings.renewal_grace)
                .unwrap_or(chrono::Duration::MAX),
        }
    }
}
