//! When a renewal grace ends: one rule, read by the renewal loop (its
//! past-due and lapse passes, the pay link) and by the grant rule (a payment
//! in grace continues from the old end). A leaf: it reads the subscription
//! row only.

use chrono::{DateTime, Duration, Utc};

use crate::entities::subscriptions::{self, SubscriptionStatus};

/// When the renewal grace of `s` ends: its stored `grace_ends_at` (the
/// past-due notice plus `grace`, extended by pauses); a `past_due` row
/// stored before those times were: `grace` after its period end. `None`
/// unless `past_due`: an `active` subscription past its end has not been
/// told yet, and its grace starts only when it is.
pub fn grace_end(s: &subscriptions::Model, grace: Duration) -> Option<DateTime<Utc>> {
    if s.status != SubscriptionStatus::PastDue {
        return None;
    }
    s.grace_ends_at
        .or_else(|| s.current_period_end.map(|e| later(e, grace)))
}

/// `t + d`, or the latest time when that is past it.
pub(crate) fn later(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}
