//! The scheduled jobs against the real worker binaries, PostgreSQL and Redis:
//! the settlement sweep settles an event whose job was lost, paid
//! subscriptions past their period fall back to FREE once even with two
//! workers, and stale PENDING payments expire (once their provider says it
//! does not know them).

use std::time::Duration;

use chrono::{Duration as Span, Utc};
use entity::entities::{
    audit_logs,
    payments::{self, PaymentStatus},
    subscriptions,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel,
    PaginatorTrait, QueryFilter, Set,
};
use tests::{
    connect_db, free_user, pending_payment, pending_payment_at, unsettled_event, wait_until,
    EnvMap, Stack,
};

fn env(stack: &Stack) -> EnvMap {
    stack
        .env()
        .with("SCHEDULER_TICK_SECS", "1")
        .with("SETTLEMENT_SWEEP_AFTER_SECS", "1")
        .with("PAYMENT_EXPIRE_AFTER_SECS", "3600")
        // No renewal grace: a paid period that ended lapses at once.
        .with("RENEWAL_GRACE_SECS", "0")
        // Payments ready (the renewal loop pauses while they are not).
        .with("PAYMENT_PROVIDER", "provider_a")
        .with("PROVIDER_A_SERVER_KEY", "SB-Mid-server-scheduler-tests")
        .with(
            "BACKEND_SERVICE_ROLE_KEY",
            "scheduler-service-role-0123456789abcdef0123",
        )
}

async fn status(db: &DatabaseConnection, order_id: &str) -> PaymentStatus {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await
        .unwrap()
        .expect("payment")
        .status
}

async fn audits(db: &DatabaseConnection, target: &str) -> u64 {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(target))
        .count(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_settles_an_event_whose_job_was_lost() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let _api = stack.api(&env).await; // migrates
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_b").await;
    // Recorded 5 s ago, its settlement job never queued (or deleted from Redis).
    unsettled_event(
        &db,
        "provider_b",
        &order,
        "SUCCESS",
        Utc::now() - Span::seconds(5),
    )
    .await;
    let _worker = stack.worker(&env).await;
    let paid = wait_until(Duration::from_secs(30), || async {
        status(&db, &order).await == PaymentStatus::Paid
    })
    .await;
    assert!(paid, "the sweep queued the lost settlement");
    assert_eq!(audits(&db, &order).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn lapsed_subscriptions_and_stale_payments_expire_once_with_two_workers() {
    let stack = Stack::new().await;
    // provider_a's status API knows none of the orders (HTTP 404): a stale
    // payment is asked about, then expires.
    let status_api = wiremock::MockServer::start().await;
    let env = env(&stack).with("PROVIDER_A_API_BASE_URL", status_api.uri());
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;

    // A PRO subscription whose paid period ended a minute ago.
    let user = free_user(&db).await;
    let mut sub = subscriptions::Entity::find_by_id(user)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .into_active_model();
    sub.plan = Set("PRO".into());
    sub.current_period_start = Set(Some(Utc::now() - Span::days(31)));
    sub.current_period_end = Set(Some(Utc::now() - Span::minutes(1)));
    sub.update(&db).await.unwrap();
    // A payment left PENDING for two hours (expiry after one), and a fresh one.
    let stale = pending_payment_at(&db, user, "provider_a", Utc::now() - Span::hours(2)).await;
    let fresh = pending_payment_at(&db, user, "provider_a", Utc::now()).await;

    let _w1 = stack.worker(&env).await;
    let _w2 = stack.worker(&env).await;
    let done = wait_until(Duration::from_secs(30), || async {
        let s = subscriptions::Entity::find_by_id(user)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        s.plan == "FREE" && status(&db, &stale).await == PaymentStatus::Expired
    })
    .await;
    assert!(done, "the scheduled jobs ran");
    // Let several more ticks pass with both workers: nothing happens twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Told past due first (grace always warns, even a grace of 0), then
    // expired: once each.
    for action in ["subscription.past_due", "subscription.expire"] {
        let n = audit_logs::Entity::find()
            .filter(audit_logs::Column::TargetId.eq(user.to_string()))
            .filter(audit_logs::Column::Action.eq(action))
            .count(&db)
            .await
            .unwrap();
        assert_eq!(n, 1, "{action}");
    }
    assert_eq!(audits(&db, &user.to_string()).await, 2);
    assert_eq!(audits(&db, &stale).await, 1, "one payment audit row");
    assert_eq!(status(&db, &fresh).await, PaymentStatus::Pending);
    let s = subscriptions::Entity::find_by_id(user)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.current_period_end, None);
}
