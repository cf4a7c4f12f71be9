//! The settlement rules of `entity::billing::settlement` on PostgreSQL, on a schema made
//! by the migrations: exactly-once effects under concurrency (row locks), the
//! state machine refusing late events, unknown statuses recorded, renewals.

use chrono::{Duration as Span, Utc};
use entity::{
    billing::events::{self, RecordError, Recorded},
    billing::settlement::{self, Settled},
    billing::webhook::{Notification, ProviderA, WebhookHeaders, WebhookVerifier},
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
        subscriptions::SubscriptionStatus,
        webhook_events,
    },
};
use migration::MigratorTrait;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Database, DatabaseConnection, EntityTrait, PaginatorTrait,
    QueryFilter, Set,
};
use serde_json::json;
use tests::{free_user, TestDb};
use uuid::Uuid;

/// The default billing terms: `BILLING_TIME_ZONE` (grants count their
/// months in it) and a three-day `RENEWAL_GRACE_SECS`.
const TERMS: entity::billing::Terms = entity::billing::Terms {
    zone: chrono_tz::Asia::Jakarta,
    grace: chrono::Duration::days(3),
};

/// A scratch database with the production schema.
async fn migrated() -> (TestDb, DatabaseConnection) {
    let tdb = TestDb::create().await;
    let db = Database::connect(&tdb.url)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", tdb.url));
    migration::Migrator::up(&db, None)
        .await
        .expect("migrations apply on PostgreSQL");
    (tdb, db)
}

/// A PENDING payment of `plan` for `user`; answers its order id.
async fn pending(db: &DatabaseConnection, user: Uuid, plan: &str, provider: &str) -> String {
    let order_id = entity::billing::payment::new_order_id("ORD", Utc::now());
    let now = Utc::now();
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set(plan.into()),
        amount: Set(99_000),
        currency: Set("IDR".into()),
        provider: Set(provider.into()),
        status: Set(PaymentStatus::Pending),
        checkout_token: Set(None),
        payment_url: Set(None),
        provider_reference: Set(None),
        paid_at: Set(None),
        idempotency_key: Set(None),
        reconciled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    }
    .insert(db)
    .await
    .expect("payment");
    order_id
}

/// A recorded, unsettled event reporting `status` for `order_id`.
async fn event(
    db: &DatabaseConnection,
    provider: &str,
    order_id: &str,
    status: &str,
    payload: serde_json::Value,
) -> Uuid {
    let id = Uuid::new_v4();
    webhook_events::ActiveModel {
        id: Set(id),
        provider: Set(provider.into()),
        dedupe_key: Set(format!("{order_id}:{status}:{id}")),
        order_id: Set(order_id.into()),
        provider_status: Set(status.into()),
        payload: Set(payload),
        received_at: Set(Utc::now()),
        settled_at: Set(None),
        settlement_error: Set(None),
    }
    .insert(db)
    .await
    .expect("event");
    id
}

async fn payment(db: &DatabaseConnection, order_id: &str) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

async fn audit_rows(db: &DatabaseConnection, target: &str) -> u64 {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(target))
        .count(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_settlement_event_pays_and_activates_once_even_when_settled_concurrently() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "PRO", "provider_a").await;
    let ev = event(&db, "provider_a", &order, "settlement", json!({})).await;

    let runs = (0..20).map(|_| {
        let db = db.clone();
        tokio::spawn(
            async move { settlement::settle_event(&db, ev, TERMS, Some("job".into())).await },
        )
    });
    let outcomes: Vec<Settled> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let moved = outcomes
        .iter()
        .filter(|o| matches!(o, Settled::Moved { .. }))
        .count();
    assert_eq!(moved, 1, "{outcomes:?}");
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Settled::Moved { .. } | Settled::AlreadySettled)));

    let p = payment(&db, &order).await;
    assert_eq!(p.status, PaymentStatus::Paid);
    assert!(p.paid_at.is_some());
    let s = tests::subscription_row(&db, u).await;
    assert_eq!(s.plan, "PRO");
    assert_eq!(s.status, SubscriptionStatus::Active);
    assert!(!s.cancel_at_period_end);
    let (start, end) = (
        s.current_period_start.unwrap(),
        s.current_period_end.unwrap(),
    );
    assert!(end - start >= Span::days(28) && end - start <= Span::days(31));
    assert_eq!(audit_rows(&db, &order).await, 1);
    let e = webhook_events::Entity::find_by_id(ev)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert!(e.settled_at.is_some());
    assert_eq!(e.settlement_error, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn late_events_do_not_regress_and_a_refund_follows_a_payment() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "PRO", "provider_b").await;
    let paid = event(&db, "provider_b", &order, "SUCCESS", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, paid, TERMS, None)
            .await
            .unwrap(),
        Settled::Moved {
            to: PaymentStatus::Paid,
            ..
        }
    ));

    // A `pending` delivered late: refused, recorded with the reason, retried never.
    let late = event(&db, "provider_b", &order, "PENDING", json!({})).await;
    let r = settlement::settle_event(&db, late, TERMS, None)
        .await
        .unwrap();
    assert!(matches!(r, Settled::Refused(_)), "{r:?}");
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Paid);
    let e = webhook_events::Entity::find_by_id(late)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert!(e.settled_at.is_some());
    assert!(e.settlement_error.unwrap().contains("PENDING"));

    // FAILED after PAID is refused too; REFUND moves it.
    let failed = event(&db, "provider_b", &order, "FAILED", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, failed, TERMS, None)
            .await
            .unwrap(),
        Settled::Refused(_)
    ));
    let refund = event(&db, "provider_b", &order, "REFUNDED", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, refund, TERMS, None)
            .await
            .unwrap(),
        Settled::Moved {
            from: PaymentStatus::Paid,
            to: PaymentStatus::Refunded,
            ..
        }
    ));
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Refunded);
    assert_eq!(audit_rows(&db, &order).await, 2, "paid + refunded");
    let s = tests::subscription_row(&db, u).await;
    assert_eq!(s.plan, "FREE", "the refund took back the only paid period");
    assert_eq!(s.current_period_end, None);
    assert_eq!(audit_rows(&db, &u.to_string()).await, 1, "take-back row");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refund_ends_the_subscription_where_it_would_have_without_the_payment() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let first = pending(&db, u, "PRO", "provider_a").await;
    settlement::settle_status_check(&db, &first, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let end1 = tests::subscription_row(&db, u)
        .await
        .current_period_end
        .unwrap();
    let second = pending(&db, u, "PRO", "provider_a").await;
    settlement::settle_status_check(&db, &second, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    assert!(
        tests::subscription_row(&db, u)
            .await
            .current_period_end
            .unwrap()
            > end1
    );

    // A chargeback of the renewal: back to the first period's end.
    let chargeback = event(&db, "provider_a", &second, "chargeback", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, chargeback, TERMS, None)
            .await
            .unwrap(),
        Settled::Moved {
            to: PaymentStatus::Refunded,
            ..
        }
    ));
    let s = tests::subscription_row(&db, u).await;
    assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end1)));

    // A partial chargeback that does not cover the amount changes nothing;
    // one that does is a whole refund: nothing else paid, FREE at once.
    let part = event(
        &db,
        "provider_a",
        &first,
        "partial_chargeback",
        json!({"gross_amount": "99000.00", "refund_amount": "500.00"}),
    )
    .await;
    assert_eq!(
        settlement::settle_event(&db, part, TERMS, None)
            .await
            .unwrap(),
        Settled::Unchanged
    );
    assert_eq!(payment(&db, &first).await.status, PaymentStatus::Paid);
    let whole = event(
        &db,
        "provider_a",
        &first,
        "partial_chargeback",
        json!({"gross_amount": "99000.00", "refund_amount": "99000.00"}),
    )
    .await;
    settlement::settle_event(&db, whole, TERMS, None)
        .await
        .unwrap();
    assert_eq!(payment(&db, &first).await.status, PaymentStatus::Refunded);
    let s = tests::subscription_row(&db, u).await;
    assert_eq!((s.plan.as_str(), s.current_period_end), ("FREE", None));
    assert_eq!(audit_rows(&db, &u.to_string()).await, 2);
}

/// PRO is superseded at once by ULTIMATE, which carries PRO's unused time;
/// then PRO is refunded: the payment is REFUNDED and the time it carried
/// leaves ULTIMATE (the plan in force stays ULTIMATE, for its own month).
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_of_a_superseded_plan_takes_its_carried_time_back_from_the_later_plan() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let pro = pending(&db, u, "PRO", "provider_b").await;
    settlement::settle_status_check(&db, &pro, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let ultimate = pending(&db, u, "ULTIMATE", "provider_b").await;
    settlement::settle_status_check(&db, &ultimate, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let before = tests::subscription_row(&db, u).await;
    let carried = payment(&db, &ultimate).await.carried_seconds.unwrap();
    assert!(carried > 0, "PRO's unused month was carried into ULTIMATE");
    settlement::settle_status_check(&db, &pro, PaymentStatus::Refunded, TERMS, None)
        .await
        .unwrap();
    assert_eq!(payment(&db, &pro).await.status, PaymentStatus::Refunded);
    let after = tests::subscription_row(&db, u).await;
    assert_eq!(after.plan, "ULTIMATE");
    assert_eq!(
        after.current_period_end,
        before
            .current_period_end
            .map(|e| e - Span::seconds(carried))
    );
    assert_eq!(payment(&db, &ultimate).await.carried_seconds, Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_payment_pays_and_is_audited_as_late() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "PRO", "provider_b").await;
    settlement::settle_status_check(&db, &order, PaymentStatus::Expired, TERMS, None)
        .await
        .unwrap();
    let paid = event(&db, "provider_b", &order, "SUCCESS", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, paid, TERMS, None)
            .await
            .unwrap(),
        Settled::Moved {
            from: PaymentStatus::Expired,
            to: PaymentStatus::Paid,
            ..
        }
    ));
    assert_eq!(tests::subscription_row(&db, u).await.plan, "PRO");
    let late = audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(order.as_str()))
        .filter(audit_logs::Column::Action.eq("late_payment"))
        .count(&db)
        .await
        .unwrap();
    assert_eq!(late, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_challenged_capture_stays_pending_and_unknown_statuses_are_recorded() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "BASIC", "provider_a").await;
    let challenged = event(
        &db,
        "provider_a",
        &order,
        "capture",
        json!({"fraud_status": "challenge"}),
    )
    .await;
    assert_eq!(
        settlement::settle_event(&db, challenged, TERMS, None)
            .await
            .unwrap(),
        Settled::Unchanged
    );
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
    assert_eq!(tests::subscription_row(&db, u).await.plan, "FREE");

    let odd = event(&db, "provider_a", &order, "teleported", json!({})).await;
    assert!(matches!(
        settlement::settle_event(&db, odd, TERMS, None)
            .await
            .unwrap(),
        Settled::Invalid(_)
    ));
    assert_eq!(
        settlement::settle_event(&db, Uuid::new_v4(), TERMS, None)
            .await
            .unwrap(),
        Settled::UnknownEvent
    );
    assert_eq!(audit_rows(&db, &order).await, 0);
    // Both notices are kept, settled: the challenge without an error, the
    // unknown status with the reason it changed nothing.
    let row = |id: Uuid| {
        let db = db.clone();
        async move {
            webhook_events::Entity::find_by_id(id)
                .one(&db)
                .await
                .unwrap()
                .expect("the recorded event")
        }
    };
    let challenged = row(challenged).await;
    assert!(challenged.settled_at.is_some());
    assert_eq!(challenged.settlement_error, None);
    let odd = row(odd).await;
    assert_eq!(odd.provider_status, "teleported");
    assert!(odd.settled_at.is_some());
    assert_eq!(
        odd.settlement_error.as_deref(),
        Some("the event reports a status its provider does not define")
    );
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_of_the_same_plan_extends_from_the_period_end() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let first = pending(&db, u, "PRO", "provider_a").await;
    settlement::settle_status_check(&db, &first, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let end1 = tests::subscription_row(&db, u)
        .await
        .current_period_end
        .unwrap();

    let second = pending(&db, u, "PRO", "provider_a").await;
    settlement::settle_status_check(&db, &second, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let s = tests::subscription_row(&db, u).await;
    assert_eq!(s.current_period_start.unwrap(), end1);
    assert!(s.current_period_end.unwrap() - end1 >= Span::days(28));

    // Another plan starts now.
    let other = pending(&db, u, "ULTIMATE", "provider_a").await;
    settlement::settle_status_check(&db, &other, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
    let s = tests::subscription_row(&db, u).await;
    assert_eq!(s.plan, "ULTIMATE");
    assert!(s.current_period_start.unwrap() < end1);
}

/// A provider_a notification for `order_id`, verified by the real verifier.
fn notification(order_id: &str, status: &str, gross_amount: &str) -> Notification {
    const KEY: &str = "SB-Mid-server-rules";
    let body = json!({
        "transaction_status": status,
        "status_code": "200",
        "gross_amount": gross_amount,
        "order_id": order_id,
        "payment_type": "bank_transfer",
        "signature_key": entity::billing::payment::provider_a_signature(order_id, "200", gross_amount, KEY),
    });
    ProviderA {
        server_key: KEY.into(),
    }
    .verify(
        &serde_json::to_vec(&body).unwrap(),
        &WebhookHeaders::default(),
    )
    .expect("a correctly signed notification verifies")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notification_is_recorded_once_even_when_delivered_concurrently() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "PRO", "provider_a").await;
    let n = notification(&order, "settlement", "99000.00");

    let runs = (0..50).map(|_| {
        let (db, n) = (db.clone(), n.clone());
        tokio::spawn(async move { events::record_event(&db, &n).await })
    });
    let outcomes: Vec<Recorded> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let new: Vec<Uuid> = outcomes
        .iter()
        .filter_map(|o| match o {
            Recorded::New(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(new.len(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| match o {
        Recorded::New(_) => true,
        Recorded::Duplicate { event_id, settled } => *event_id == new[0] && !settled,
    }));
    assert_eq!(webhook_events::Entity::find().count(&db).await.unwrap(), 1);

    // The sweep sees it while unsettled, not after settlement.
    let later = Utc::now() + Span::seconds(1);
    assert_eq!(
        events::unsettled_events(&db, later, 10).await.unwrap(),
        vec![new[0]]
    );
    settlement::settle_event(&db, new[0], TERMS, None)
        .await
        .unwrap();
    assert!(events::unsettled_events(&db, later, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        events::record_event(&db, &n).await.unwrap(),
        Recorded::Duplicate {
            event_id: new[0],
            settled: true
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_orders_and_other_amounts_record_nothing() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "PRO", "provider_a").await;

    let wrong_amount = notification(&order, "settlement", "1000.00");
    assert!(matches!(
        events::record_event(&db, &wrong_amount).await,
        Err(RecordError::AmountMismatch {
            stored: 99_000,
            notified: Some(1_000)
        })
    ));
    let fraction = notification(&order, "settlement", "99000.50");
    assert!(matches!(
        events::record_event(&db, &fraction).await,
        Err(RecordError::AmountMismatch { notified: None, .. })
    ));
    let unknown = notification("ORD-1-NOTHERE1", "settlement", "99000.00");
    assert!(matches!(
        events::record_event(&db, &unknown).await,
        Err(RecordError::UnknownOrder { .. })
    ));
    // A provider_b payment is not settled by a provider_a notification.
    let other = pending(&db, u, "PRO", "provider_b").await;
    assert!(matches!(
        events::record_event(&db, &notification(&other, "settlement", "99000")).await,
        Err(RecordError::UnknownOrder { .. })
    ));
    assert_eq!(webhook_events::Entity::find().count(&db).await.unwrap(), 0);
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_whose_settlement_was_not_queued_can_be_forgotten_for_the_retry() {
    let (_tdb, db) = migrated().await;
    let u = free_user(&db).await;
    let order = pending(&db, u, "BASIC", "provider_a").await;
    let n = notification(&order, "settlement", "99000");
    let Recorded::New(id) = events::record_event(&db, &n).await.unwrap() else {
        panic!("first delivery");
    };
    assert!(events::forget_unqueued_event(&db, id).await.unwrap());
    // The provider's retry is a first delivery again.
    assert!(matches!(
        events::record_event(&db, &n).await.unwrap(),
        Recorded::New(_)
    ));
}
