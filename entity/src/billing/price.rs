//! What a renewal bills: the price of record and price-change notices
//! (decisions.md, "Stored prices, one conversion"; docs/billing.md,
//! "Prices").
//!
//! * The **price of record** of a subscription is the amount of the
//!   payment for the plan in force that the customer agreed to last
//!   ([`of_record`]: the latest created among those ever `PAID`, refunded
//!   since or not, whose grant reaches the current run, since the
//!   subscription last left FREE). A plan in force
//!   with no such payment (given by an operator, or from before payments
//!   were stored) has none, and its renewal bills the catalogue price.
//! * A renewal of the plan in force bills the price of record, unless the
//!   catalogue price is lower (a cut reaches everyone at once), or it is
//!   higher and a **price-change mail** announced at least that price at
//!   least `PRICE_CHANGE_NOTICE_DAYS` before the renewal is created. A
//!   renewal offered while the catalogue is back at or below the price of
//!   record withdraws the notice held: a later rise is announced anew.
//! * A notice told in time bills the price it announced even when the
//!   catalogue rose further since; that further rise is announced at the
//!   next renewal offered after it is paid.
//! * The first renewal offered at the old price after a rise records the
//!   notice (plan, new price, the database's time) and queues the mail in
//!   the same transaction, so the customer hears of the rise a whole
//!   renewal ahead of it. With `PRICE_CHANGE_NOTICE_DAYS=0` that renewal
//!   already bills the new price (the mail still goes).
//! * A renewal of a plan chosen by `change` is priced the same way, its
//!   price of record being the catalogue price it was chosen at
//!   (`renewal_plan_price`): a cut reaches it, a rise after the choice
//!   needs its notice (red team: a rise between the choice and the
//!   renewal was billed untold).
//!
//! [`renewal_price`] decides all of it from stored figures alone.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};

use crate::entities::{
    billing_ledger,
    payments::{self, PaymentStatus},
    subscriptions,
};

/// What a renewal created now bills, and the notice to record with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priced {
    /// The renewal's amount (whole units of the catalogue's currency).
    pub amount: i64,
    /// A price rise to announce now (the new catalogue price): record the
    /// notice and queue the price-change mail with the renewal.
    pub announce: Option<i64>,
    /// The notice held is withdrawn: the catalogue price fell back to the
    /// price of record or below, so a later rise needs a notice of its own.
    pub withdraw: bool,
}

/// The notice a subscription holds, as [`renewal_price`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice<'a> {
    /// The plan the notice was about.
    pub plan: &'a str,
    /// The price it announced.
    pub amount: i64,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

impl<'a> Notice<'a> {
    /// The notice stored on `s`, if any.
    pub fn of(s: &'a subscriptions::Model) -> Option<Self> {
        Some(Notice {
            plan: s.price_notice_plan.as_deref()?,
            amount: s.price_notice_amount?,
            at: s.price_notice_at?,
        })
    }
}

/// What a renewal of `plan`, created at `now` for a subscription whose
/// price of record for `plan` is `record` ([`record_for`]) and which holds
/// `notice`, bills when the catalogue sells `plan` at `catalogue_price`
/// (see the module's rules). `notice_period` is
/// `PRICE_CHANGE_NOTICE_DAYS`.
pub fn renewal_price(
    plan: &str,
    record: Option<i64>,
    notice: Option<Notice<'_>>,
    catalogue_price: i64,
    now: DateTime<Utc>,
    notice_period: Duration,
) -> Priced {
    let at_catalogue = Priced {
        amount: catalogue_price,
        announce: None,
        withdraw: false,
    };
    let Some(record) = record else {
        return at_catalogue;
    };
    if catalogue_price <= record {
        return Priced {
            withdraw: notice.is_some_and(|n| n.plan == plan),
            ..at_catalogue
        };
    }
    // A notice of this plan that announced a rise over the record.
    match notice.filter(|n| n.plan == plan && n.amount > record) {
        // Told in time: the announced price, up to the catalogue's. A
        // further rise since is announced at the next renewal, once this
        // one is paid (the notice it holds is spent then), so a renewal
        // voided and offered again still bills what was announced.
        Some(n) if n.at + notice_period <= now => Priced {
            amount: n.amount.min(catalogue_price),
            announce: None,
            withdraw: false,
        },
        // Told too recently, of at least this price: the record meanwhile.
        Some(n) if n.amount >= catalogue_price => Priced {
            amount: record,
            announce: None,
            withdraw: false,
        },
        // No notice of this price yet (none, or one of a lower price told
        // too recently, which this one replaces): announce it.
        _ if notice_period <= Duration::zero() => Priced {
            amount: catalogue_price,
            announce: Some(catalogue_price),
            withdraw: false,
        },
        _ => Priced {
            amount: record,
            announce: Some(catalogue_price),
            withdraw: false,
        },
    }
}

/// The price of record of `sub`'s plan in force: the amount of the payment
/// for it agreed to last (by creation: a checkout or renewal stores its
/// amount when created, so an old checkout paid late does not lower it),
/// among those ever `PAID` (a refund does not undo the price agreed to)
/// whose grant reaches the current run: the time since the subscription
/// last left FREE, as its billing ledger records it (a run of the plan
/// that lapsed or was refunded to FREE before does not price it; a plan
/// change, an operator's grant or a phase within the run does not end it).
/// A subscription whose ledger has no such row (older than the ledger) is
/// read from its current period's start. `None`: none.
pub async fn of_record<C: ConnectionTrait>(
    db: &C,
    sub: &subscriptions::Model,
) -> Result<Option<i64>, DbErr> {
    let run_start = billing_ledger::Entity::find()
        .filter(billing_ledger::Column::UserId.eq(sub.user_id))
        .filter(billing_ledger::Column::PlanFrom.eq(crate::base::plans::FREE))
        .filter(billing_ledger::Column::PlanTo.ne(crate::base::plans::FREE))
        .order_by_desc(billing_ledger::Column::CreatedAt)
        .order_by_desc(billing_ledger::Column::Id)
        .one(db)
        .await?
        .map(|row| row.created_at);
    let mut find = payments::Entity::find()
        .filter(payments::Column::UserId.eq(sub.user_id))
        .filter(payments::Column::Plan.eq(sub.plan.as_str()))
        .filter(payments::Column::Status.is_in([PaymentStatus::Paid, PaymentStatus::Refunded]))
        .filter(payments::Column::PaidAt.is_not_null());
    if let Some(start) = run_start.or(sub.current_period_start) {
        find = find.filter(payments::Column::GrantEnd.gte(start));
    }
    Ok(find
        .order_by_desc(payments::Column::CreatedAt)
        .order_by_desc(payments::Column::Id)
        .one(db)
        .await?
        .map(|p| p.amount))
}

/// The price of record of `plan` for a renewal of `sub`: of the plan in
/// force, [`of_record`]; of the plan chosen by `change`, the catalogue price
/// it was chosen at; of any other plan, none (the catalogue price).
pub async fn record_for<C: ConnectionTrait>(
    db: &C,
    sub: &subscriptions::Model,
    plan: &str,
) -> Result<Option<i64>, DbErr> {
    if plan == sub.plan {
        of_record(db, sub).await
    } else if sub.renewal_plan.as_deref() == Some(plan) {
        Ok(sub.renewal_plan_price)
    } else {
        Ok(None)
    }
}

/// Clears the price-change notice recorded on `am` (spent, withdrawn, or
/// the plan lapsed).
pub fn clear_notice(am: &mut subscriptions::ActiveModel) {
    use sea_orm::Set;
    am.price_notice_plan = Set(None);
    am.price_notice_amount = Set(None);
    am.price_notice_at = Set(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(days: i64) -> DateTime<Utc> {
        "2027-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::days(days)
    }

    const NOTICE: Duration = Duration::days(30);

    fn price(
        plan: &str,
        record: Option<i64>,
        notice: Option<Notice<'_>>,
        catalogue: i64,
        now: i64,
    ) -> Priced {
        renewal_price(plan, record, notice, catalogue, t(now), NOTICE)
    }

    #[test]
    fn a_rise_waits_for_its_notice_and_a_cut_does_not() {
        // Unchanged price.
        assert_eq!(price("PRO", Some(99_000), None, 99_000, 0).amount, 99_000);
        // A cut reaches the next renewal, without notice.
        let cut = price("PRO", Some(99_000), None, 89_000, 0);
        assert_eq!((cut.amount, cut.announce), (89_000, None));
        // A rise: the old price now, and the notice to give.
        let rise = price("PRO", Some(99_000), None, 129_000, 0);
        assert_eq!((rise.amount, rise.announce), (99_000, Some(129_000)));
        let told = Notice {
            plan: "PRO",
            amount: 129_000,
            at: t(0),
        };
        // Told 29 days ago: still the old price, nothing more to announce.
        let early = price("PRO", Some(99_000), Some(told), 129_000, 29);
        assert_eq!((early.amount, early.announce), (99_000, None));
        // Told 30 days ago: the new price.
        let due = price("PRO", Some(99_000), Some(told), 129_000, 30);
        assert_eq!((due.amount, due.announce), (129_000, None));
        // A smaller rise than announced is covered by the notice.
        assert_eq!(
            price("PRO", Some(99_000), Some(told), 119_000, 30).amount,
            119_000
        );
        // A larger one told in time bills what was announced; the further
        // rise is announced once that is paid (red team: it fell back to
        // the old price and the matured notice was overwritten).
        let more = price("PRO", Some(99_000), Some(told), 139_000, 90);
        assert_eq!((more.amount, more.announce), (129_000, None));
        // A larger one while the notice is too recent: the old price, and
        // the new rise announced in its place.
        let sooner = price("PRO", Some(99_000), Some(told), 139_000, 10);
        assert_eq!((sooner.amount, sooner.announce), (99_000, Some(139_000)));
        // Another plan's notice needs its own.
        let other = Notice {
            plan: "BASIC",
            ..told
        };
        let other = price("PRO", Some(99_000), Some(other), 129_000, 90);
        assert_eq!((other.amount, other.announce), (99_000, Some(129_000)));
        // Back at the price of record: the notice is withdrawn.
        let back = price("PRO", Some(99_000), Some(told), 99_000, 10);
        assert_eq!(
            (back.amount, back.announce, back.withdraw),
            (99_000, None, true)
        );
    }

    #[test]
    fn none_on_record_bills_the_catalogue() {
        let p = price("PRO", None, None, 129_000, 0);
        assert_eq!((p.amount, p.announce), (129_000, None));
    }

    #[test]
    fn no_notice_period_announces_and_applies_at_once() {
        let p = renewal_price("PRO", Some(99_000), None, 129_000, t(0), Duration::zero());
        assert_eq!((p.amount, p.announce), (129_000, Some(129_000)));
    }
}
