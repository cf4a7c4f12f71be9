//! Exactly-once settlement across a worker crash, against the real api and
//! worker binaries, PostgreSQL and Redis: 1,000 signed notifications arrive
//! while a worker settles them; the worker is killed with SIGKILL part-way;
//! a new worker picks up the orphaned jobs; every payment ends up settled
//! exactly once (payments, events, audit rows and subscription periods
//! counted).

use std::time::{Duration, Instant};

use entity::entities::{
    payments,
    subscriptions::{self, SubscriptionStatus},
};
use futures::StreamExt;
use sea_orm::EntityTrait;
use serde_json::json;
use tests::{
    client, connect_db, count, paid_payments, pending_pro_payments, provider_a_settlement,
    wait_until, EnvMap, ProviderAStatusApi, Reply, Stack,
};

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

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_1000_settlements_settles_each_exactly_once() {
    let started = Instant::now();
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let env = env(&stack, &status_api);
    let api = stack.api(&env).await; // migrates
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let orders = pending_pro_payments(&db, N).await;
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
                let n = paid_payments(&pool).await;
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
            .body(provider_a_settlement(order, A_KEY));
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
    let after_kill = paid_payments(&pool).await;
    assert!(
        (1..N as i64).contains(&after_kill),
        "the worker was killed part-way: {paid_at_kill} paid when killed, {after_kill} just after"
    );
    eprintln!("SIGKILL with {after_kill}/{N} settled");

    // A new worker: the orphaned jobs come back after missed heartbeats.
    let _worker2 = stack.worker(&env).await;
    let all = wait_until(Duration::from_secs(45), || async {
        paid_payments(&pool).await == N as i64
            && count(
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
        paid_payments(&pool).await
    );
    // A little longer for any duplicate delivery to show itself.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    assert_eq!(paid_payments(&pool).await, N as i64, "PAID payments");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM payments").await,
        N as i64
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM webhook_events").await,
        N as i64,
        "one event per notification"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM webhook_events \
             WHERE settled_at IS NOT NULL AND settlement_error IS NULL"
        )
        .await,
        N as i64,
        "every event settled, none refused"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        N as i64,
        "settle audit rows"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT target_id) FROM audit_logs WHERE action = 'payment.settle'"
        )
        .await,
        N as i64,
        "exactly one settle audit row per order"
    );
    assert_eq!(
        count(
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
            Some(tests::month_after(start)),
            Some(end),
            "one month, not extended twice ({})",
            s.user_id
        );
    }
    eprintln!("took {:?}", started.elapsed());
}
