//! The checks a generated history runs after its steps: renewal prices,
//! the ledger's completeness, one receipt per paid payment.

use entity::{
    billing::{ledger, payment::PaymentStatus},
    entities::{billing_ledger, billing_receipts, payments, renewals, subscriptions},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use super::world::{payments_of, policy};

/// The `price_change` mails queued for `user`: plan, amount, and the
/// application's time they were queued at (read from the mail's key,
/// `price_change:<user>:<plan>:<amount>:<micros>`), independent of the
/// notice the subscription stores.
pub(super) async fn price_mails(
    db: &DatabaseConnection,
    user: Uuid,
) -> Vec<(String, i64, chrono::DateTime<chrono::Utc>)> {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = db.get_database_backend();
    let sql = match backend {
        sea_orm::DbBackend::Postgres => {
            "SELECT \"key\" FROM billing_mails WHERE user_id = $1 AND kind = 'price_change'"
        }
        _ => "SELECT \"key\" FROM billing_mails WHERE user_id = ? AND kind = 'price_change'",
    };
    db.query_all_raw(Statement::from_sql_and_values(backend, sql, [user.into()]))
        .await
        .unwrap()
        .into_iter()
        .map(|row| {
            let key: String = row.try_get("", "key").unwrap();
            let parts: Vec<&str> = key.split(':').collect();
            let at =
                chrono::DateTime::from_timestamp_micros(parts[4].parse().unwrap()).expect("a time");
            (parts[2].to_string(), parts[3].parse().unwrap(), at)
        })
        .collect()
}

/// A renewal of the plan in force offered by a tick (at `now`, or by a
/// `change` after `now`) bills at
/// most the catalogue price, and more than the customer's latest paid
/// amount for the plan in this run (the price of record) only when a
/// `price_change` mail of this run announced at least that amount at least
/// the notice period before; one offered below the catalogue price leaves
/// the customer told of a rise, or bills a notice told in time (the rise
/// past it is announced next); a notice told in time and kept is billed,
/// up to the catalogue price. The record and the mails are the model's
/// own reading ([`Run`]: when the plan in force last began after FREE, not
/// the subscription's period start), which the tick's withdrawals update;
/// `before` is the subscription and `paid` its payments before the tick.
pub(super) async fn check_renewal_prices(
    db: &DatabaseConnection,
    user: Uuid,
    before: &subscriptions::Model,
    paid: &[payments::Model],
    cat: &entity::base::plans::Catalogue,
    now: chrono::DateTime<chrono::Utc>,
    run: &mut Run,
) -> Result<(), String> {
    let Some(run_start) = run.start else {
        return Ok(());
    };
    // The price last agreed to for the plan: the latest-created payment of
    // it ever paid whose grant reaches this run.
    let record = paid
        .iter()
        .filter(|p| matches!(p.status, PaymentStatus::Paid | PaymentStatus::Refunded))
        .filter(|p| p.plan == before.plan && p.paid_at.is_some())
        .filter(|p| p.grant_end.is_some_and(|e| e >= run_start))
        .max_by_key(|p| (p.created_at, p.id))
        .map(|p| p.amount);
    let offered = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .filter(renewals::Column::CreatedAt.gte(now))
        .all(db)
        .await
        .unwrap();
    let mails: Vec<_> = price_mails(db, user)
        .await
        .into_iter()
        .filter(|(_, _, at)| *at >= run_start)
        .collect();
    for r in offered {
        let list = cat.get(&r.plan).map_or(0, |p| p.price);
        if r.amount > list {
            return Err(format!(
                "a renewal of {} bills {} over the catalogue's {list}",
                r.plan, r.amount
            ));
        }
        // The price of record of the renewal's plan: of the plan in force,
        // its last paid price in the run; of the plan chosen by `change`,
        // the price it was chosen at.
        let record = if r.plan == before.plan {
            record
        } else if before.renewal_plan.as_deref() == Some(r.plan.as_str()) {
            run.chosen
                .as_ref()
                .filter(|(plan, _)| *plan == r.plan)
                .map(|(_, price)| *price)
        } else {
            None
        };
        let Some(record) = record else {
            continue;
        };
        let told_in_time = mails.iter().any(|(plan, amount, at)| {
            *plan == r.plan && *amount >= r.amount && *at + policy().price_notice <= now
        });
        if r.amount > record && !told_in_time {
            return Err(format!(
                "a renewal of {} bills {} over its price of record {record} (paid last in this run since {run_start}, or chosen at), without a mail in time (mails {mails:?})",
                r.plan, r.amount
            ));
        }
        let told_of_rise = mails
            .iter()
            .any(|(plan, amount, _)| *plan == r.plan && *amount > r.amount);
        // A notice told in time bills what it announced; a rise past it is
        // announced at the next renewal, once this one is paid.
        let matured = |plan: &str, amount: i64, at: chrono::DateTime<chrono::Utc>| {
            plan == r.plan && amount == r.amount && at + policy().price_notice <= now
        };
        // (After a race the model does not know which notice is held: any
        // mail of the run told in time of this amount.)
        let bills_the_notice = run
            .held
            .as_ref()
            .is_some_and(|(plan, amount, at)| matured(plan, *amount, *at))
            || (run.unsure && mails.iter().any(|(p, a, at)| matured(p, *a, *at)));
        if r.amount < list && !told_of_rise && !bills_the_notice {
            return Err(format!(
                "a renewal of {} at {} below the catalogue's {list}, and the customer was not told of a rise",
                r.plan, r.amount
            ));
        }
        // A notice held and told in time bills what it announced (up to the
        // catalogue's price), whatever rose since. (A step may also drop a
        // notice the model still holds, such as a refund that passes
        // through FREE to a phase: the rise is then told anew, which the
        // check above holds to; this one holds while the subscription keeps
        // the very notice the mail told.)
        let kept = |plan: &str, amount: i64, at: chrono::DateTime<chrono::Utc>| {
            before.price_notice_plan.as_deref() == Some(plan)
                && before.price_notice_amount == Some(amount)
                && before
                    .price_notice_at
                    .is_some_and(|t| t.timestamp_micros() == at.timestamp_micros())
        };
        if let Some((plan, amount, at)) = &run.held {
            if *plan == r.plan
                && *amount > record
                && *at + policy().price_notice <= now
                && kept(plan, *amount, *at)
            {
                let due = (*amount).min(list);
                if r.amount < due {
                    return Err(format!(
                        "a renewal of {} bills {}, below the {amount} announced on {at} (catalogue {list}, record {record}; the subscription held {:?} {:?} {:?})",
                        r.plan, r.amount, before.price_notice_plan, before.price_notice_amount, before.price_notice_at
                    ));
                }
            }
        }
        // Offered at or below the price of record: the notice is withdrawn.
        if list <= record && run.held.as_ref().is_some_and(|(p, _, _)| *p == r.plan) {
            run.held = None;
        }
    }
    Ok(())
}

/// The model's own reading of the customer's run and of the price-change
/// notice they hold (not the subscription's columns). A run begins when a
/// paid plan follows FREE and ends at FREE (a lapse, a refund). The notice
/// is the newest `price_change` mail of the run, until a payment of its
/// plan for at least its amount spends it, a renewal of the plan offered at
/// or below the price of record withdraws it ([`check_renewal_prices`]),
/// or the run ends. After two steps raced the model does not know which
/// came first and holds none until the next mail.
#[derive(Debug, Default)]
pub(super) struct Run {
    /// When the run began (the application's time after the step).
    pub(super) start: Option<chrono::DateTime<chrono::Utc>>,
    /// `price_change` mails seen so far.
    mails: usize,
    /// Plan, announced amount, and when it was told.
    held: Option<(String, i64, chrono::DateTime<chrono::Utc>)>,
    /// The plan last chosen by `change` and the catalogue price it was
    /// chosen at: its price of record until it is paid.
    chosen: Option<(String, i64)>,
    /// Two steps raced since the last mail: the notice held is unknown.
    unsure: bool,
}

impl Run {
    /// `change` chose `plan` at `price`: its price of record until paid; a
    /// notice of it told before is withdrawn (it was chosen at the price
    /// shown then).
    pub(super) fn chose(&mut self, plan: &str, price: i64) {
        self.chosen = Some((plan.to_string(), price));
        if self.held.as_ref().is_some_and(|(p, _, _)| p == plan) {
            self.held = None;
        }
    }

    /// After a step that left `plan` in force: payments newly paid (not
    /// paid in `paid_before`) spend the notice of their plan, then a new
    /// mail replaces it; FREE ends the run, as does passing through FREE
    /// within the step (`passed_free`: a new run begins now).
    pub(super) async fn after_step(
        &mut self,
        db: &DatabaseConnection,
        user: Uuid,
        plan: &str,
        paid_before: &[payments::Model],
        raced: bool,
        passed_free: bool,
    ) {
        let newly_paid = payments_of(db, user).await.into_iter().filter(|p| {
            p.paid_at.is_some()
                && !paid_before
                    .iter()
                    .any(|q| q.id == p.id && q.paid_at.is_some())
        });
        for p in newly_paid {
            if self
                .held
                .as_ref()
                .is_some_and(|(plan, amount, _)| *plan == p.plan && p.amount >= *amount)
            {
                self.held = None;
            }
        }
        let mut mails = price_mails(db, user).await;
        mails.sort_by_key(|(_, _, at)| *at);
        if mails.len() > self.mails {
            self.held = mails.last().cloned();
            self.unsure = false;
        }
        self.mails = mails.len();
        if raced {
            self.held = None;
            self.chosen = None;
            self.unsure = true;
        }
        if plan == "FREE" || passed_free {
            self.start = None;
            self.held = None;
            self.chosen = None;
            self.unsure = false;
        }
        if plan != "FREE" && self.start.is_none() {
            self.start = Some(entity::base::db::now(db).await.unwrap());
        }
    }
}

/// The ledger's rows of `user`, oldest first.
pub(super) async fn ledger_rows(db: &DatabaseConnection, user: Uuid) -> Vec<billing_ledger::Model> {
    billing_ledger::Entity::find()
        .filter(billing_ledger::Column::UserId.eq(user))
        .order_by_asc(billing_ledger::Column::Id)
        .all(db)
        .await
        .unwrap()
}

/// Every change of the plan, period end or grace is in the ledger: when a
/// step changed them, its rows were written by that step and lead from the
/// state before to the state now; when it changed nothing, no row, or rows
/// that each change something and lead back to where they began (two steps
/// racing: a refund taking back a month as a renewal payment adds one).
pub(super) async fn check_ledger(
    db: &DatabaseConnection,
    user: Uuid,
    before: &ledger::State,
    rows_before: usize,
) -> Result<(), String> {
    let now = ledger::State::read(db, user).await.unwrap();
    let rows = ledger_rows(db, user).await;
    let new = &rows[rows_before.min(rows.len())..];
    if now == *before {
        if new.is_empty() {
            return Ok(());
        }
        let idle = new.iter().any(|r| {
            r.plan_from == r.plan_to && r.end_from == r.end_to && r.grace_from == r.grace_to
        });
        if new.len() == 1 || idle {
            return Err(format!("nothing changed, yet the ledger wrote {new:?}"));
        }
    }
    let (Some(first), Some(last)) = (new.first(), new.last()) else {
        return Err(format!("{before:?} became {now:?} with no ledger row"));
    };
    let from = ledger::State {
        plan: first.plan_from.clone(),
        period_end: first.end_from,
        grace_ends_at: first.grace_from,
    };
    let to = ledger::State {
        plan: last.plan_to.clone(),
        period_end: last.end_to,
        grace_ends_at: last.grace_to,
    };
    if from != *before || to != now {
        return Err(format!(
            "the ledger says {from:?} → {to:?}, the subscription went {before:?} → {now:?}"
        ));
    }
    Ok(())
}

/// One numbered receipt per payment ever `PAID`, with its amount and what
/// went back of it.
pub(super) async fn check_receipts(db: &DatabaseConnection, user: Uuid) -> Result<(), String> {
    let receipts = billing_receipts::Entity::find()
        .filter(billing_receipts::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap();
    let paid: Vec<_> = payments_of(db, user)
        .await
        .into_iter()
        .filter(|p| p.paid_at.is_some())
        .collect();
    if receipts.len() != paid.len() {
        return Err(format!(
            "{} receipts for {} payments ever paid",
            receipts.len(),
            paid.len()
        ));
    }
    for p in paid {
        let Some(r) = receipts.iter().find(|r| r.payment_id == p.id) else {
            return Err(format!("no receipt for {}", p.order_id));
        };
        let back = if p.status == PaymentStatus::Refunded {
            p.amount
        } else {
            p.refunded_amount
        };
        if r.amount != p.amount || r.refunded_amount != back {
            return Err(format!(
                "receipt {} says {} paid, {} back; the payment {} paid, {back} back",
                r.number, r.amount, r.refunded_amount, p.amount
            ));
        }
    }
    Ok(())
}

/// A scheduled phase is backed by its payment (still `PAID`, not carried
/// on, of another plan than the one in force); after a tick (`ticked`) no
/// phase is left whose period end has passed.
pub(super) async fn check_phase(
    db: &DatabaseConnection,
    user: Uuid,
    ticked: bool,
) -> Result<(), String> {
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let (Some(plan), Some(id)) = (s.scheduled_plan.as_deref(), s.scheduled_payment_id) else {
        return if s.scheduled_plan.is_none() && s.scheduled_payment_id.is_none() {
            Ok(())
        } else {
            Err(format!(
                "half a phase: {:?} {:?}",
                s.scheduled_plan, s.scheduled_payment_id
            ))
        };
    };
    let p = payments::Entity::find_by_id(id)
        .one(db)
        .await
        .unwrap()
        .ok_or("a phase without its payment")?;
    if p.status != PaymentStatus::Paid || p.carried_into.is_some() {
        return Err(format!(
            "a phase of {plan} whose payment is {:?}, carried into {:?}",
            p.status, p.carried_into
        ));
    }
    if p.grant_plan.as_deref() != Some(plan) || s.plan == plan {
        return Err(format!(
            "a phase of {plan} on {} paid as {:?}",
            s.plan, p.grant_plan
        ));
    }
    let now = entity::base::db::now(db).await.unwrap();
    if ticked && s.current_period_end.is_none_or(|e| e <= now) {
        return Err(format!(
            "a tick left the phase of {plan} waiting after {} ended at {:?}",
            s.plan, s.current_period_end
        ));
    }
    Ok(())
}

/// Renewals keep the anchor: a paid plan's period ends on the anchor it
/// stores (every change of the end that is not a whole renewal month
/// re-anchors on the new end), and paying the renewal of the plan in force
/// for the period's end, before that end, moves the end exactly one
/// anchored month on without re-anchoring. `renewed` is the period end and
/// anchor before such a payment.
pub(super) async fn check_anchor(
    db: &DatabaseConnection,
    user: Uuid,
    renewed: Option<(
        chrono::DateTime<chrono::Utc>,
        Option<entity::billing::anchor::Anchor>,
    )>,
) -> Result<(), String> {
    use entity::billing::anchor;
    let zone = policy().zone;
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let stored = anchor::of_subscription(&s);
    if let (Some(a), Some(end), false) = (stored, s.current_period_end, s.plan == "FREE") {
        if !a.holds(end, zone) {
            return Err(format!(
                "{} ends {end}, off its anchor (day {}, {})",
                s.plan, a.day, a.time
            ));
        }
    }
    if let Some((old_end, before)) = renewed {
        let want = before
            .unwrap_or_else(|| anchor::Anchor::of(old_end, zone))
            .next_end(old_end, zone);
        if s.current_period_end != Some(want) || (before.is_some() && stored != before) {
            return Err(format!(
                "a renewal paid for the end {old_end} moved it to {:?}, anchored {stored:?} (want {want}, anchored {before:?})",
                s.current_period_end
            ));
        }
    }
    Ok(())
}
