//! Two steps at once: what the providers and the renewal loop do to one
//! customer concurrently (a webhook while a tick runs, a refund while the
//! renewal is paid, an operator's grant during a checkout). Each step's
//! inputs are chosen first (the payment to refund, the checkout to
//! settle), then both run together on the pool; the invariants after every
//! step (the ledger chains from the state before to the state after, one
//! receipt per payment, no free time, the phase and the anchor) must hold
//! for whichever order their transactions took.

use chrono::Duration;
use entity::{
    base::plans::Catalogue,
    billing::{payment::PaymentStatus, renewal, settlement, subscription},
    entities::{
        payments,
        renewals::{self, RenewalStatus},
    },
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use super::{world::*, Step};

/// One step with its inputs chosen.
enum Ready {
    Settle(String, PaymentStatus),
    Partial(String, i64),
    Tick(usize),
    Give(&'static str, i64),
    Change(&'static str),
    Cancel(bool),
    Nothing,
}

/// Chooses the inputs of `step` as the sequential history would.
async fn prepare(db: &DatabaseConnection, user: Uuid, step: &Step) -> Ready {
    let settled = || async {
        payments_of(db, user)
            .await
            .into_iter()
            .filter(|p| p.status == PaymentStatus::Paid)
            .collect::<Vec<_>>()
    };
    match step {
        Step::Pay(i) => Ready::Settle(checkout(db, user, PLANS[*i].0).await, PaymentStatus::Paid),
        Step::Refund(k) => {
            let paid = settled().await;
            if paid.is_empty() {
                return Ready::Nothing;
            }
            Ready::Settle(
                paid[k % paid.len()].order_id.clone(),
                PaymentStatus::Refunded,
            )
        }
        Step::PartialRefund(k, pct) => {
            let paid: Vec<_> = settled()
                .await
                .into_iter()
                .filter(|p| p.refunded_amount < p.amount - 1)
                .collect();
            if paid.is_empty() {
                return Ready::Nothing;
            }
            let p = &paid[k % paid.len()];
            let back = (p.refunded_amount + ((p.amount - p.refunded_amount) * pct / 100).max(1))
                .min(p.amount - 1);
            Ready::Partial(p.order_id.clone(), back)
        }
        Step::Tick(k) => Ready::Tick(*k),
        Step::PayRenewal | Step::PayStaleRenewal => {
            let mut find = renewals::Entity::find().filter(renewals::Column::UserId.eq(user));
            if matches!(step, Step::PayRenewal) {
                find = find.filter(renewals::Column::Status.eq(RenewalStatus::Open));
            }
            let Some(r) = find
                .order_by_desc(renewals::Column::CreatedAt)
                .one(db)
                .await
                .unwrap()
            else {
                return Ready::Nothing;
            };
            let order = renewal_checkout(db, user, &r).await;
            Ready::Settle(order, PaymentStatus::Paid)
        }
        Step::Give(i, hours) => Ready::Give(PLANS[*i].0, *hours),
        Step::Change(i) => Ready::Change(PLANS[*i].0),
        Step::Cancel(c) => Ready::Cancel(*c),
        _ => Ready::Nothing,
    }
}

/// Runs a prepared step; answers what happened, and an operator's grant
/// (plan, seconds) when one was given.
async fn run(
    db: &DatabaseConnection,
    user: Uuid,
    ready: Ready,
    cat: &Catalogue,
) -> (String, Option<(String, i64)>) {
    match ready {
        Ready::Settle(order, status) => {
            let outcome = settlement::settle_status_check(db, &order, status, TERMS, None)
                .await
                .unwrap();
            (format!("settle {order} {status:?}: {outcome:?}"), None)
        }
        Ready::Partial(order, back) => {
            // As the webhook path records it: in one transaction with the
            // payment locked and still `PAID` (the status the provider's
            // status API reported), so a whole refund settles before or
            // after it, never between its write and its receipt.
            let txn = entity::base::db::begin_write(db).await.unwrap();
            let mut find = payments::Entity::find().filter(payments::Column::OrderId.eq(&order));
            if db.get_database_backend() == sea_orm::DbBackend::Postgres {
                find = sea_orm::QuerySelect::lock_exclusive(find);
            }
            let still_paid = find
                .one(&txn)
                .await
                .unwrap()
                .is_some_and(|p| p.status == PaymentStatus::Paid);
            if still_paid {
                entity::billing::ledger::record_partial_refund(&txn, &order, back)
                    .await
                    .unwrap();
            }
            txn.commit().await.unwrap();
            let outcome =
                settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
                    .await
                    .unwrap();
            (format!("partial refund {order} {back}: {outcome:?}"), None)
        }
        Ready::Tick(k) => {
            use renewal::Step::{Create, Lapse, PastDue};
            let orders = [
                [Lapse, PastDue, Create],
                [PastDue, Create, Lapse],
                [Create, Lapse, PastDue],
            ];
            let now = entity::base::db::now(db).await.unwrap();
            let mut outcomes = Vec::new();
            for pass in orders[k % orders.len()] {
                let report = renewal::run_batch(db, pass, &policy(), cat, now, &[user])
                    .await
                    .unwrap();
                outcomes.extend(report.outcomes);
            }
            (format!("tick: {outcomes:?}"), None)
        }
        Ready::Give(plan, hours) => {
            let now = entity::base::db::now(db).await.unwrap();
            let grant = entity::billing::operator::OperatorGrant {
                user_id: user,
                plan: plan.into(),
                until: now + Duration::hours(hours),
                reason: "generated".into(),
            };
            let outcome =
                entity::billing::operator::give(db, Uuid::new_v4(), &grant, TERMS.zone, None, None)
                    .await;
            let given = outcome
                .as_ref()
                .ok()
                .map(|g| (plan.to_string(), g.seconds + 1));
            (format!("give {plan} for {hours} h: {outcome:?}"), given)
        }
        Ready::Change(plan) => {
            let outcome = subscription::choose_renewal_plan(
                db,
                user,
                plan,
                &policy(),
                cat,
                Default::default(),
            )
            .await;
            (format!("change to {plan}: {}", outcome.is_ok()), None)
        }
        Ready::Cancel(cancel) => {
            let action = if cancel {
                subscription::SubscriptionAction::Cancel
            } else {
                subscription::SubscriptionAction::Resume
            };
            let outcome = subscription::change(db, user, action, Default::default()).await;
            (format!("{action:?}: {}", outcome.is_ok()), None)
        }
        Ready::Nothing => ("nothing".into(), None),
    }
}

/// Runs `a` and `b` together; answers the log line and the operator's
/// grants given.
pub(super) async fn race(
    db: &DatabaseConnection,
    user: Uuid,
    a: &Step,
    b: &Step,
    cat: &Catalogue,
) -> (String, Vec<(String, i64)>) {
    let ready_a = prepare(db, user, a).await;
    let ready_b = prepare(db, user, b).await;
    let ((log_a, given_a), (log_b, given_b)) =
        tokio::join!(run(db, user, ready_a, cat), run(db, user, ready_b, cat));
    (
        format!("race {a:?} ‖ {b:?}: {log_a} ‖ {log_b}"),
        given_a.into_iter().chain(given_b).collect(),
    )
}
