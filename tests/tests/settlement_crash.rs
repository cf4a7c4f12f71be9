//! Exactly-once settlement across a worker crash, against the real api and
//! worker binaries, PostgreSQL and Redis: 1,000 signed notifications arrive
//! while a worker settles them; the worker is killed with SIGKILL part-way;
//! a new worker picks up the orphaned jobs; every payment ends up settled
//! exactly once (payments, events, audit rows and subscription periods
//! counted).

use std::time::{Duration, Instant};

use chrono::{Months, Utc};
use entity::{
    entities::{
        payments::{self, PaymentStatus},
        subscriptions::{self, SubscriptionStatus},
        users,
    },
    payment::provider_a_signature,
};
use futures::StreamExt;
use sea_orm::{sqlx, ActiveValue::Set, EntityTrait};
use serde_json::json;
use tests::{client, connect_db, wait_until, EnvMap, ProviderAStatusApi, Reply, Stack};
use uuid::Uuid;

const A_KEY: &str = "SB-Mid-server-crash-tests";
const N: usize = 1_000;
/// `WORKER_HEARTBEAT_MS`: the killed worker's jobs come back after a few beats.
const HEARTBEAT_MS: u64 = 500;

/// provider_a configured, its status API (which confirms each notice) `status`.
fn env(stack: &Stack, status: &wiremock::MockServer) -> EnvMap {
    stack
        .env()
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status.uri())
        .with("WORKER_HEARTBEAT_MS", HEARTBEAT_MS.to_string())
        .with("WORKER_CONCURRENCY", "8")
}

/// `N` FREE users, each with one PENDING PRO payment (provider_a), inserted
/// in three statements; answers the order ids.
async fn seed(db: &sea_orm::DatabaseConnection) -> Vec<String> {
    let now = Utc::now();
    let ids: Vec<Uuid> = (0..N).map(|_| Uuid::new_v4()).collect();
    let orders: Vec<String> = (0..N)
        .map(|_| entity::payment::new_order_id("ORD", now))
        .collect();
    users::Entity::insert_many(ids.iter().map(|&id| users::ActiveModel {
        id: Set(id),
        email: Set(Some(format!("{id}@example.com"))),
        created_at: Set(now),
    }))
    .exec(db)
    .await
    .expect("insert users");
    subscriptions::Entity::insert_many(ids.iter().map(|&id| subscriptions::ActiveModel {
        user_id: Set(id),
        plan: Set("FREE".into()),
        status: Set(SubscriptionStatus::Active),
        cancel_at_period_end: Set(false),
        current_period_start: Set(None),
        current_period_end: Set(None),
        canceled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    }))
    .exec(db)
    .await
    .expect("insert subscriptions");
    payments::Entity::insert_many(ids.iter().zip(&orders).map(|(&user, order)| {
        payments::ActiveModel {
            id: Set(Uuid::new_v4()),
            order_id: Set(order.clone()),
            user_id: Set(user),
            plan: Set("PRO".into()),
            amount: Set(99_000),
            currency: Set("IDR".into()),
            provider: Set("provider_a".into()),
            status: Set(PaymentStatus::Pending),
            checkout_token: Set(None),
            payment_url: Set(None),
            provider_reference: Set(None),
            paid_at: Set(None),
            idempotency_key: Set(None),
            reconciled_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
        }
    }))
    .exec(db)
    .await
    .expect("insert payments");
    orders
}

/// A signed provider_a `settlement` notification as Midtrans documents it.
fn notification(order_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": "settlement",
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": "200",
        "signature_key": provider_a_signature(order_id, "200", "99000.00", A_KEY),
        "payment_type": "bank_transfer",
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": "99000.00",
        "fraud_status": "accept",
        "currency": "IDR",
    }))
    .unwrap()
}

async fn scalar(pool: &sqlx::PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn paid(pool: &sqlx::PgPool) -> i64 {
    scalar(pool, "SELECT count(*) FROM payments WHERE status = 'PAID'").await
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_1000_settlements_settles_each_exactly_once() {
    let started = Instant::now();
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let env = env(&stack, &status_api);
    let api = stack.api(&env).await; // migrates
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let orders = seed(&db).await;
    for order in &orders {
        status.set(order, "settlement");
    }

    let mut worker = stack.worker(&env).await;

    // Kill the worker with SIGKILL once some, but not all, are settled.
    let killer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let n = paid(&pool).await;
                if n >= 100 || Instant::now() > deadline {
                    worker.kill9();
                    return (n, worker);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // 1,000 notifications, 32 at a time.
    let url = api.url("/api/webhooks/provider_a");
    let answers: Vec<Reply> = futures::stream::iter(orders.iter().map(|order| {
        let req = client()
            .post(&url)
            .header("content-type", "application/json")
            .body(notification(order));
        Reply::send(req)
    }))
    .buffer_unordered(32)
    .collect()
    .await;
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json, json!({"received": true}));
    }

    let (paid_at_kill, _dead) = killer.await.unwrap();
    let after_kill = paid(&pool).await;
    assert!(
        (1..N as i64).contains(&after_kill),
        "the worker was killed part-way: {paid_at_kill} paid when killed, {after_kill} just after"
    );
    eprintln!("SIGKILL with {after_kill}/{N} settled");

    // A new worker: the orphaned jobs come back after missed heartbeats.
    let _worker2 = stack.worker(&env).await;
    let all = wait_until(Duration::from_secs(45), || async {
        paid(&pool).await == N as i64
            && scalar(
                &pool,
                "SELECT count(*) FROM webhook_events WHERE settled_at IS NULL",
            )
            .await
                == 0
    })
    .await;
    assert!(
        all,
        "all settled after the restart: {} paid",
        paid(&pool).await
    );
    // A little longer for any duplicate delivery to show itself.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    assert_eq!(paid(&pool).await, N as i64, "PAID payments");
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM payments").await,
        N as i64
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM webhook_events").await,
        N as i64,
        "one event per notification"
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM webhook_events \
             WHERE settled_at IS NOT NULL AND settlement_error IS NULL"
        )
        .await,
        N as i64,
        "every event settled, none refused"
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        N as i64,
        "settle audit rows"
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(DISTINCT target_id) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        N as i64,
        "exactly one settle audit row per order"
    );
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM payments p JOIN audit_logs a \
             ON a.target_id = p.order_id AND a.action = 'payment.settle'"
        )
        .await,
        N as i64,
        "every settle audit row names one of the payments"
    );

    // 1,000 active PRO subscriptions, each exactly one month from its payment.
    let subs = subscriptions::Entity::find().all(&db).await.unwrap();
    let pays = payments::Entity::find().all(&db).await.unwrap();
    assert_eq!(subs.len(), N);
    for s in &subs {
        assert_eq!(s.plan, "PRO", "{}", s.user_id);
        assert_eq!(s.status, SubscriptionStatus::Active);
        let pay = pays.iter().find(|p| p.user_id == s.user_id).unwrap();
        let start = s.current_period_start.expect("period start");
        let end = s.current_period_end.expect("period end");
        assert_eq!(
            Some(start),
            pay.paid_at,
            "the period starts when it was paid"
        );
        assert_eq!(
            start.checked_add_months(Months::new(1)),
            Some(end),
            "one month, not extended twice ({})",
            s.user_id
        );
    }
    eprintln!("took {:?}", started.elapsed());
}
