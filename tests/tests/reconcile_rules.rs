//! The reconciliation claim of `entity::billing::reconcile` on PostgreSQL, on a schema
//! made by the migrations: which payments are due, and concurrent claims
//! never hand the same payment to two callers in one round.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration as Span, Utc};
use entity::{
    billing::reconcile::{claim_due_payments, release_claim},
    entities::payments::PaymentStatus,
};
use migration::MigratorTrait;
use sea_orm::{Database, DatabaseConnection};
use tests::{free_user, pending_payment_at, TestDb};

const AFTER: Span = Span::minutes(15);
const EXPIRE: Span = Span::days(1);

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

async fn claim(db: &DatabaseConnection, now: DateTime<Utc>) -> Vec<String> {
    claim_due_payments(db, now, AFTER, EXPIRE, 500)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_pending_payments_between_the_delays_are_due() {
    let (_tdb, db) = migrated().await;
    let now = Utc::now();
    let user = free_user(&db).await;
    let due = pending_payment_at(&db, user, "provider_a", now - Span::minutes(20)).await;
    let fresh = pending_payment_at(&db, user, "provider_a", now - Span::minutes(5)).await;
    let _expiring = pending_payment_at(&db, user, "provider_b", now - Span::days(2)).await;
    let paid = pending_payment_at(&db, user, "provider_b", now - Span::hours(1)).await;
    entity::billing::settlement::settle_status_check(
        &db,
        &paid,
        PaymentStatus::Paid,
        entity::billing::Terms {
            zone: chrono_tz::Asia::Jakarta,
            grace: chrono::Duration::days(3),
        },
        None,
    )
    .await
    .unwrap();

    assert_eq!(claim(&db, now).await, vec![due.clone()]);
    // Claimed: not due again within the period, due again after it.
    assert!(claim(&db, now).await.is_empty());
    // Almost a period later only the then-due fresh payment is claimed.
    assert_eq!(
        claim(&db, now + AFTER - Span::seconds(1)).await,
        vec![fresh]
    );
    assert_eq!(claim(&db, now + AFTER + Span::seconds(1)).await, vec![due]);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_claims_hand_each_payment_out_once() {
    let (_tdb, db) = migrated().await;
    let now = Utc::now();
    let user = free_user(&db).await;
    let mut all = BTreeSet::new();
    for _ in 0..200 {
        all.insert(pending_payment_at(&db, user, "provider_a", now - Span::hours(1)).await);
    }
    let claims = (0..8).map(|_| {
        let db = db.clone();
        tokio::spawn(async move { claim(&db, now).await })
    });
    let mut seen = Vec::new();
    for c in futures::future::join_all(claims).await {
        seen.extend(c.unwrap());
    }
    let distinct: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), distinct.len(), "no payment claimed twice");
    assert_eq!(distinct, all, "every due payment claimed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_released_claim_is_due_again_at_once() {
    let (_tdb, db) = migrated().await;
    let now = Utc::now();
    let user = free_user(&db).await;
    let order = pending_payment_at(&db, user, "provider_b", now - Span::hours(1)).await;
    assert_eq!(claim(&db, now).await, vec![order.clone()]);
    // Another round's claim is not released by mistake.
    assert!(!release_claim(&db, &order, now - Span::seconds(1))
        .await
        .unwrap());
    assert!(claim(&db, now + Span::seconds(1)).await.is_empty());
    assert!(release_claim(&db, &order, now).await.unwrap());
    assert_eq!(claim(&db, now + Span::seconds(1)).await, vec![order]);
}
