//! The renewal loop while payments are switched off or not ready, against
//! the real api and worker binaries on PostgreSQL and Redis; paid periods
//! and graces are moved by SQL (the database's clock decides) and the
//! scheduler ticks every second:
//!
//! * the loop waits: nothing is offered, told or lapsed but a cancelling
//!   plan, which owes nothing;
//! * once payments are back, a period that ended meanwhile is told past due
//!   first with its whole grace;
//! * a grace that was running when the loop paused is extended by the
//!   pause's length (`renewal_pauses`), so nobody loses time they could not
//!   pay in.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::entities::{renewal_pauses, renewals, subscriptions::SubscriptionStatus};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use tests::{
    audit_trail, client, connect_db, free_user, me, more_ticks, move_period, pay, poll_until,
    wait_until, EnvMap, Reply, Stack,
};

const JWT: &str = "renewal-pause-jwt-secret-0123456789abcdef0123456789";
const SERVICE: &str = "renewal-pause-service-role-0123456789abcdef0123";

fn env(stack: &Stack) -> EnvMap {
    stack
        .session_env(JWT, SERVICE)
        .with("SCHEDULER_TICK_SECS", "1")
        // Every tick logs "scheduler tick", idle ones too (counted).
        .with("RUST_LOG", "info,worker::scheduler=debug")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_renewal_loop_waits_while_payments_are_off() {
    let stack = Stack::new().await;
    // No grace: a period that ended lapses at the next pass.
    let on = env(&stack).with("RENEWAL_GRACE_SECS", "0");
    let off = on.clone().with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false");
    let api = stack.api(&off).await;
    let health = Reply::send(client().get(api.url("/api/health"))).await;
    assert_eq!(health.json["renewals"], "paused", "{}", health.text);
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    // Webhooks are taken while payments are off: the payment settles.
    let worker = stack.worker(&off).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    // Its period ended a day ago, unpaid; three paused passes after that
    // (counted from the move, so none from before it count).
    move_period(&pool, &pro, 31, -1).await;
    let paused_passes = || worker.stderr().matches("renewal loop paused").count();
    let before = paused_passes();
    let paused = wait_until(Duration::from_secs(30), || async {
        paused_passes() >= before + 3
    })
    .await;
    assert!(paused, "worker stderr:\n{}", worker.stderr());
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.status),
        ("PRO", SubscriptionStatus::Active)
    );
    assert_eq!(
        renewals::Entity::find()
            .filter(renewals::Column::UserId.eq(user))
            .count(&db)
            .await
            .unwrap(),
        0
    );
    drop(worker);

    // Payments back: the loop resumes and the period lapses.
    let _worker = stack.worker(&on).await;
    let lapsed = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.plan == "FREE"
    })
    .await;
    assert!(lapsed, "{:?}", tests::subscription_row(&db, user).await);
    assert_eq!(
        audit_trail(&db, &user.to_string(), "subscription.expire")
            .await
            .len(),
        1
    );
}

/// Grace always warns, and a pause gives nothing away: while payments are
/// off a cancelling PRO lapses at its end (it owes nothing), and a PRO that
/// ended unpaid keeps its plan untold; once they are back, a period that
/// ended four days ago (grace three) is told past due with its pay link and
/// gets its whole grace from that notice, instead of lapsing unwarned.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_neither_keeps_a_cancelled_plan_nor_lapses_one_untold() {
    let stack = Stack::new().await;
    let on = env(&stack).with("RENEWAL_GRACE_SECS", "259200");
    let off = on.clone().with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false");
    let api = stack.api(&off).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let owing = free_user(&db).await;
    let cancelling = free_user(&db).await;
    let worker = stack.worker(&off).await;
    let pro = pay(&api, &db, owing, "PRO", 99_000).await;
    move_period(&pool, &pro, 31, -4).await;
    let pro = pay(&api, &db, cancelling, "PRO", 99_000).await;
    move_period(&pool, &pro, 31, 0).await;
    sea_orm::sqlx::query("UPDATE subscriptions SET cancel_at_period_end = true WHERE user_id = $1")
        .bind(cancelling)
        .execute(&pool)
        .await
        .expect("cancel at period end");

    let lapsed = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, cancelling).await.plan == "FREE"
    })
    .await;
    assert!(lapsed, "paused, a cancelling plan still lapses at its end");
    more_ticks(&[&worker], 3).await;
    let s = tests::subscription_row(&db, owing).await;
    assert_eq!(
        (s.plan.as_str(), s.status),
        ("PRO", SubscriptionStatus::Active)
    );
    assert_eq!(s.grace_ends_at, None, "not told while paused");
    drop(worker);

    // Payments back: told past due first, with a pay link, and the whole
    // grace from the notice.
    let worker = stack.worker(&on).await;
    let told = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, owing).await.status == SubscriptionStatus::PastDue
    })
    .await;
    assert!(told, "{:?}", tests::subscription_row(&db, owing).await);
    let s = tests::subscription_row(&db, owing).await;
    let (at, ends) = (s.past_due_at.unwrap(), s.grace_ends_at.unwrap());
    assert_eq!(ends - at, chrono::Duration::days(3), "{s:?}");
    assert!(
        at > s.current_period_end.unwrap() + chrono::Duration::days(4)
            - chrono::Duration::minutes(1)
    );
    let notice = audit_trail(&db, &owing.to_string(), "subscription.past_due").await;
    assert_eq!(notice.len(), 1);
    assert!(me(&api, JWT, owing).await["subscription"]["renewal"]["pay_url"].is_string());
    // Ticks later it still runs its grace.
    more_ticks(&[&worker], 3).await;
    let s = tests::subscription_row(&db, owing).await;
    assert_eq!(
        (s.plan.as_str(), s.status),
        ("PRO", SubscriptionStatus::PastDue)
    );
    assert!(audit_trail(&db, &owing.to_string(), "subscription.expire")
        .await
        .is_empty());
}

/// A pause does not eat a running grace: a PRO told past due keeps its
/// plan while payments are off and, once they are back, its grace ends as
/// much later as the pause lasted (by the database's times of the pause),
/// and it lapses only then.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_extends_a_running_grace_by_its_length() {
    let stack = Stack::new().await;
    let on = env(&stack).with("RENEWAL_GRACE_SECS", "259200");
    let off = on.clone().with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false");
    let api = stack.api(&on).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let worker = stack.worker(&on).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    move_period(&pool, &pro, 31, -1).await;
    let told = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.status == SubscriptionStatus::PastDue
    })
    .await;
    assert!(told, "{:?}", tests::subscription_row(&db, user).await);
    drop(worker);

    // Payments off: the first paused tick records the pause.
    let worker = stack.worker(&off).await;
    let pause = poll_until(
        Duration::from_secs(30),
        || async { renewal_pauses::Entity::find().one(&db).await.unwrap() },
        Option::is_some,
    )
    .await
    .expect("the pause is recorded");
    assert_eq!((pause.open, pause.ended_at), (Some(true), None));
    // The grace had six seconds left when the pause began; it ends while
    // the loop waits, and the plan stays.
    let grace_end: DateTime<Utc> = pause.started_at + chrono::Duration::seconds(6);
    sea_orm::sqlx::query("UPDATE subscriptions SET grace_ends_at = $2 WHERE user_id = $1")
        .bind(user)
        .bind(grace_end)
        .execute(&pool)
        .await
        .expect("the grace's end");
    let past = wait_until(Duration::from_secs(60), || async {
        tests::db_now(&pool).await > grace_end + chrono::Duration::seconds(1)
    })
    .await;
    assert!(past);
    more_ticks(&[&worker], 2).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.status, s.grace_ends_at),
        ("PRO", SubscriptionStatus::PastDue, Some(grace_end))
    );
    drop(worker);

    // Payments back: the pause ends and the grace moves by its length.
    let worker = stack.worker(&on).await;
    let pause = poll_until(
        Duration::from_secs(30),
        || async {
            renewal_pauses::Entity::find_by_id(pause.id)
                .one(&db)
                .await
                .unwrap()
                .expect("the pause")
        },
        |p| p.ended_at.is_some(),
    )
    .await;
    assert_eq!(pause.open, None);
    let lasted = pause.ended_at.unwrap() - pause.started_at;
    assert!(lasted > chrono::Duration::seconds(7), "{lasted}");
    let s = tests::subscription_row(&db, user).await;
    let extended = grace_end + lasted;
    assert_eq!(s.grace_ends_at, Some(extended), "{s:?}");
    assert_eq!(
        (s.plan.as_str(), s.status),
        ("PRO", SubscriptionStatus::PastDue)
    );
    assert!(me(&api, JWT, user).await["subscription"]["renewal"]["pay_url"].is_string());
    assert!(audit_trail(&db, &user.to_string(), "subscription.expire")
        .await
        .is_empty());

    // It lapses once the extended grace is over, not before.
    let lapsed = wait_until(Duration::from_secs(60), || async {
        tests::subscription_row(&db, user).await.plan == "FREE"
    })
    .await;
    assert!(lapsed, "{:?}", tests::subscription_row(&db, user).await);
    let expired = audit_trail(&db, &user.to_string(), "subscription.expire").await;
    assert_eq!(expired.len(), 1);
    assert!(
        expired[0].created_at >= extended,
        "{expired:?} before {extended}"
    );
    assert_eq!(
        renewal_pauses::Entity::find().count(&db).await.unwrap(),
        1,
        "one pause, closed once"
    );
    drop(worker);
}
