//! `change` paid early: a stored phase (docs/billing.md, "Plan changes"):
//! the plan in force runs to its end, the phase begins there; a checkout
//! meanwhile carries its value; a refund before it starts drops it.

use chrono::Duration;
use entity::{
    billing::{payment::PaymentStatus, renewal},
    entities::{payments, renewals, subscriptions},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::named::{on_both, paid, period_end, settle_as};
use super::prices::{offered, pay, subscriber};
use super::world::*;

/// PRO paid, `change` to BASIC, BASIC's renewal paid early: the phase.
/// Answers the renewal paid.
async fn scheduled(db: &DatabaseConnection, user: Uuid) -> renewals::Model {
    settle_as(db, &checkout(db, user, "PRO").await, PaymentStatus::Paid).await;
    entity::billing::subscription::choose_renewal_plan(
        db,
        user,
        "BASIC",
        &policy(),
        catalogue(),
        Default::default(),
    )
    .await
    .unwrap();
    let r = offered(db, user, catalogue(), Duration::days(30)).await;
    assert_eq!((r.plan.as_str(), r.amount), ("BASIC", 49_000));
    pay(db, &r).await;
    assert_eq!(
        subscription(db, user).await.scheduled_plan.as_deref(),
        Some("BASIC")
    );
    r
}

async fn phase_payment(db: &DatabaseConnection, r: &renewals::Model) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::RenewalId.eq(r.id))
        .one(db)
        .await
        .unwrap()
        .unwrap()
}

/// `change` to BASIC, its renewal paid a few days early: PRO runs on to its
/// end, then the loop's tick (any pass, in any order) begins BASIC at the
/// old end for the month paid, and tells nothing past due.
#[test]
fn a_change_paid_early_is_a_phase_the_loop_begins_at_the_old_end() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        let r = scheduled(&db, user).await;
        let end = period_end(&db, user).await;
        let s = subscription(&db, user).await;
        assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end)));
        assert_eq!(s.scheduled_plan.as_deref(), Some("BASIC"));
        let now = entity::base::db::now(&db).await.unwrap();
        time_passes(&db, end - now + Duration::hours(1)).await;
        let ended = period_end(&db, user).await;
        for pass in [
            renewal::Step::PastDue,
            renewal::Step::Lapse,
            renewal::Step::Create,
        ] {
            let now = entity::base::db::now(&db).await.unwrap();
            renewal::run_batch(&db, pass, &policy(), catalogue(), now, &[user])
                .await
                .unwrap();
        }
        let s = subscriptions::Entity::find_by_id(user)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.plan, "BASIC");
        assert_eq!(s.status, subscriptions::SubscriptionStatus::Active);
        assert_eq!((s.past_due_at, s.scheduled_plan), (None, None));
        assert_eq!(s.current_period_start, Some(ended));
        let p = payments::Entity::find()
            .filter(payments::Column::RenewalId.eq(r.id))
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(p.grant_start, Some(ended));
        assert_eq!(s.current_period_end, p.grant_end);
        assert!(p.grant_end.unwrap() - ended >= Duration::days(28));
    });
}

/// A whole refund of the phase's payment before the old end drops the
/// phase and takes no time of the plan in force.
#[test]
fn a_refund_before_the_phase_begins_drops_it_and_takes_no_time() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        let r = scheduled(&db, user).await;
        let end = period_end(&db, user).await;
        let p = phase_payment(&db, &r).await;
        settle_as(&db, &p.order_id, PaymentStatus::Refunded).await;
        let s = subscription(&db, user).await;
        assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end)));
        assert_eq!((s.scheduled_plan, s.scheduled_payment_id), (None, None));
    });
}

/// A checkout of ULTIMATE while the BASIC phase waits carries the phase's
/// whole value with PRO's unused days; refunding that checkout gives PRO
/// its days back and schedules the phase again.
#[test]
fn a_checkout_carries_the_phase_and_its_refund_schedules_it_again() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        let r = scheduled(&db, user).await;
        let end = period_end(&db, user).await;
        let phase = phase_payment(&db, &r).await;
        let ultimate = paid(&db, user, "ULTIMATE").await;
        assert!(ultimate.carried_seconds.unwrap() > 0);
        // The value carried: PRO's unused days and BASIC's whole month.
        let carried = ultimate.carried_value.unwrap();
        assert!(carried >= 49_000 - 1, "carried {carried}");
        let s = subscription(&db, user).await;
        assert_eq!(s.plan, "ULTIMATE");
        assert_eq!(s.scheduled_plan, None, "the phase was carried");
        assert_eq!(phase_payment(&db, &r).await.carried_into, Some(ultimate.id));
        settle_as(&db, &ultimate.order_id, PaymentStatus::Refunded).await;
        let s = subscription(&db, user).await;
        assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end)));
        assert_eq!(
            s.scheduled_plan.as_deref(),
            Some("BASIC"),
            "scheduled again"
        );
        assert_eq!(s.scheduled_payment_id, Some(phase.id));
        let back = phase_payment(&db, &r).await;
        assert_eq!(back.carried_into, None);
        assert_eq!(
            (back.grant_start, back.grant_end),
            (phase.grant_start, phase.grant_end)
        );
    });
}

/// Red team: a checkout that carried a waiting phase, charged back long
/// after the phase's slot began, gave the phase back as a whole month from
/// the chargeback (a free month of it). A phase given back runs only what
/// is left of its own slot: nothing once it is over, the rest of it while
/// it runs.
#[test]
fn a_phase_given_back_by_a_refund_runs_only_what_is_left_of_its_slot() {
    on_both(|db| async move {
        for (after_end, left) in [(Duration::days(40), false), (Duration::days(3), true)] {
            let user = subscriber(&db).await;
            let r = scheduled(&db, user).await;
            let phase = phase_payment(&db, &r).await;
            let slot_end = phase.grant_end.unwrap();
            let ultimate = paid(&db, user, "ULTIMATE").await;
            let end = phase.grant_start.unwrap();
            let now = entity::base::db::now(&db).await.unwrap();
            time_passes(&db, end - now + after_end).await;
            settle_as(&db, &ultimate.order_id, PaymentStatus::Refunded).await;
            let s = subscription(&db, user).await;
            if left {
                assert_eq!(s.plan, "BASIC", "the rest of the slot");
                assert_eq!(s.current_period_end, Some(slot_end));
            } else {
                assert_ne!(s.plan, "BASIC", "the slot is over: {s:?}");
            }
            assert_eq!(s.scheduled_plan, None);
        }
    });
}

/// The generator: PRO runs with BASIC's phase waiting, an operator gives
/// PRO 40 more days (the end moves past the phase's stored slot), then PRO
/// is bought again. The checkout carries the phase's whole value, as with
/// any checkout while a phase waits; it read the phase's stored slot as
/// over, carried nothing of it and left it waiting.
#[test]
fn a_checkout_carries_a_waiting_phase_whole_after_a_grant_moved_the_end() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        let r = scheduled(&db, user).await;
        let phase = phase_payment(&db, &r).await;
        let end = period_end(&db, user).await;
        let grant = entity::billing::operator::OperatorGrant {
            user_id: user,
            plan: "PRO".into(),
            until: end + Duration::days(40),
            reason: "goodwill".into(),
        };
        entity::billing::operator::give(&db, Uuid::new_v4(), &grant, TERMS.zone, None, None)
            .await
            .unwrap();
        let now = entity::base::db::now(&db).await.unwrap();
        // Past the phase's stored slot, an hour before the new end.
        time_passes(&db, end + Duration::days(40) - now - Duration::hours(1)).await;
        let order = checkout(&db, user, "PRO").await;
        settle_as(&db, &order, PaymentStatus::Paid).await;
        let s = subscription(&db, user).await;
        assert_eq!((s.plan.as_str(), s.scheduled_plan), ("PRO", None));
        let phase = payments::Entity::find_by_id(phase.id)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        let bought = payments::Entity::find()
            .filter(payments::Column::OrderId.eq(&order))
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(phase.carried_into, Some(bought.id), "the phase is carried");
        // 49,000 of BASIC at PRO's 99,000 a month: about 14 days.
        let month = (bought.grant_end.unwrap() - bought.grant_start.unwrap()).num_seconds()
            - bought.carried_seconds.unwrap();
        let want = 49_000 * month / 99_000;
        let got = bought.carried_seconds.unwrap();
        assert!(
            (want - 60..=want + 60).contains(&got),
            "carried {got} s, want {want} s"
        );
    });
}

/// The generator's races: the PRO checkout and the BASIC phase behind it
/// refunded at the same moment. Each settlement locked its payment, then
/// the subscription, and the refund of the checkout then reached for the
/// phase's payment: PostgreSQL found a deadlock and failed one of them.
/// A customer's subscription row is now locked before any of their
/// payments, so the two wait for each other and both settle.
#[test]
fn refunds_of_a_checkout_and_its_phase_at_once_both_settle() {
    on_both(|db| async move {
        for _ in 0..8 {
            let user = subscriber(&db).await;
            let r = scheduled(&db, user).await;
            let phase = phase_payment(&db, &r).await;
            let pro = payments_of(&db, user)
                .await
                .into_iter()
                .find(|p| p.plan == "PRO")
                .expect("the PRO checkout");
            let refund = |order: String| {
                let db = db.clone();
                async move {
                    entity::billing::settlement::settle_status_check(
                        &db,
                        &order,
                        PaymentStatus::Refunded,
                        TERMS,
                        None,
                    )
                    .await
                }
            };
            let (a, b) = tokio::join!(
                tokio::spawn(refund(pro.order_id.clone())),
                tokio::spawn(refund(phase.order_id.clone()))
            );
            a.unwrap().expect("the checkout's refund settles");
            b.unwrap().expect("the phase's refund settles");
            let s = subscription(&db, user).await;
            assert_eq!((s.plan.as_str(), s.scheduled_plan), ("FREE", None));
        }
    });
}
