//! The renewal loop's pages under load, against the real worker binary,
//! PostgreSQL and Redis, as an operator with many subscriptions coming due
//! would see it: a page of rows whose batch job still waits in the queue is
//! not queued again by the next ticks (the queue holds one job per page, not
//! one per page and tick); a page whose job was lost is queued again once its
//! claim's lease (`RENEWAL_CLAIM_SECS`) is over; every subscription gets one renewal and
//! the reminder already due with it, once.

use std::time::Duration;

use entity::entities::renewals::{self, RenewalStatus};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter,
};
use tests::{connect_db, more_ticks, ticks, wait_until, EnvMap, Stack};

/// Subscriptions seeded: two full pages of 500 and one of 100.
const SUBS: u64 = 1_100;
const PAGES: u64 = 3;

fn env(stack: &Stack) -> EnvMap {
    stack
        .session_env(
            "renewal-pages-jwt-0123456789abcdef0123456789",
            "renewal-pages-service-role-0123456789abcdef",
        )
        .with("SCHEDULER_TICK_SECS", "1")
        // A lease no run outlasts: the test ends it itself, by moving the
        // claims back past it on the database's clock.
        .with("RENEWAL_CLAIM_SECS", "3600")
        // Every tick logs "scheduler tick", idle ones too.
        .with("RUST_LOG", "info,worker::scheduler=debug")
}

/// `n` users with an email and a paid PRO subscription ending two days (and
/// a second per user) from now by the database's clock: each is due for its
/// renewal, with the 3-day reminder (the latest offset past) due too.
async fn seed(db: &DatabaseConnection, n: u64) {
    for sql in [
        format!(
            "INSERT INTO users (id, email, created_at) \
             SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(u), 12, '0'))::uuid, \
                    'pages' || u || '@example.com', now() - interval '1 month' \
             FROM generate_series(1, {n}) u"
        ),
        format!(
            "INSERT INTO subscriptions (user_id, plan, status, cancel_at_period_end, \
                 current_period_start, current_period_end, created_at, updated_at) \
             SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(u), 12, '0'))::uuid, 'PRO', 'active', false, \
                    now() - interval '28 days', now() + interval '2 days' + interval '1 second' * u, \
                    now() - interval '1 month', now() - interval '1 month' \
             FROM generate_series(1, {n}) u"
        ),
    ] {
        db.execute_unprepared(&sql).await.expect("seed");
    }
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    use sea_orm::{FromQueryResult, JsonValue, Statement};
    let row = JsonValue::find_by_statement(Statement::from_string(db.get_database_backend(), sql))
        .one(db)
        .await
        .expect("count")
        .expect("a row");
    row["n"].as_i64().unwrap_or_else(|| panic!("{sql}: {row}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_waiting_in_the_queue_is_queued_once_and_a_lost_one_again_after_its_lease() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    seed(&db, SUBS).await;
    // Waiting jobs: due ones in the list, the rest (a push lands there first,
    // until a worker serving the queue promotes it) in the sorted set.
    let queued = || async {
        stack.redis.count("LLEN", "settlement:active").await
            + stack.redis.count("ZCARD", "settlement:scheduled").await
    };

    // A worker that runs the scheduler but serves only the email queue: the
    // renewal pages it queues wait on the settlement queue.
    let scheduler = stack
        .worker(&env.clone().with("WORKER_QUEUES", "email"))
        .await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            queued().await >= PAGES
        })
        .await,
        "the pages are queued; stderr:\n{}",
        scheduler.stderr()
    );
    more_ticks(&[&scheduler], 4).await;
    assert_eq!(
        queued().await,
        PAGES,
        "one job per page while the jobs wait, not one per page and tick"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) AS n FROM renewal_claims WHERE step = 'create'"
        )
        .await,
        SUBS as i64
    );

    // The jobs are lost (as if the queue's keys were wiped): after the lease
    // the rows still due are queued again, once.
    let mut c = stack.redis.conn().await;
    let _: () = redis::cmd("DEL")
        .arg(stack.redis.key("settlement:active"))
        .arg(stack.redis.key("settlement:scheduled"))
        .query_async(&mut c)
        .await
        .expect("DEL");
    more_ticks(&[&scheduler], 2).await;
    assert_eq!(queued().await, 0, "not before the lease is over");
    db.execute_unprepared(
        "UPDATE renewal_claims SET claimed_at = claimed_at - interval '3601 seconds'",
    )
    .await
    .expect("end the lease");
    assert!(
        wait_until(Duration::from_secs(60), || async {
            queued().await >= PAGES
        })
        .await,
        "the lost pages are queued again after their lease"
    );
    more_ticks(&[&scheduler], 3).await;
    assert_eq!(queued().await, PAGES, "once again, not once per tick");

    // A worker serving the settlement queue runs them: one renewal each,
    // with its reminder queued in the same transaction.
    let _runner = stack
        .worker(&env.clone().with("WORKER_QUEUES", "settlement"))
        .await;
    let open = || async {
        renewals::Entity::find()
            .filter(renewals::Column::Status.eq(RenewalStatus::Open))
            .count(&db)
            .await
            .unwrap()
    };
    assert!(
        wait_until(Duration::from_secs(60), || async { open().await >= SUBS }).await,
        "every subscription gets its renewal"
    );
    let reminders = "SELECT count(*) AS n FROM billing_mails WHERE kind = 'renewal_reminder'";
    assert_eq!(
        count(&db, reminders).await,
        SUBS as i64,
        "the reminder due comes with the renewal"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) AS n FROM renewals WHERE next_reminder_at IS NULL OR \
             next_reminder_at <> period_end - interval '1 day'"
        )
        .await,
        0,
        "the next reminder is the 1-day one"
    );
    more_ticks(&[&scheduler], 3).await;
    assert_eq!(open().await, SUBS, "nothing created twice");
    assert_eq!(
        count(&db, "SELECT count(*) AS n FROM renewals").await,
        SUBS as i64
    );
    assert_eq!(
        count(&db, reminders).await,
        SUBS as i64,
        "no reminder twice"
    );
    assert!(
        wait_until(Duration::from_secs(30), || async { queued().await == 0 }).await,
        "the queue drains"
    );
}

/// A renewal voided by `cancel` is offered again at the first ticks after
/// `resume`, not held back by the claim that queued the first offer.
#[tokio::test(flavor = "multi_thread")]
async fn resume_is_offered_a_renewal_at_the_next_ticks() {
    use tests::{client, hs256_token, session_claims, Reply};
    let jwt = "renewal-pages-jwt-0123456789abcdef0123456789";
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    seed(&db, 1).await;
    let user: uuid::Uuid = "00000000-0000-4000-a000-000000000001".parse().unwrap();
    let worker = stack.worker(&env).await;
    let open = || async {
        renewals::Entity::find()
            .filter(renewals::Column::UserId.eq(user))
            .filter(renewals::Column::Status.eq(RenewalStatus::Open))
            .count(&db)
            .await
            .unwrap()
    };
    assert!(wait_until(Duration::from_secs(30), || async { open().await == 1 }).await);
    let token = hs256_token(
        jwt.as_bytes(),
        &session_claims(&user.to_string(), Some("pages1@example.com")),
    );
    for action in ["cancel", "resume"] {
        let r = Reply::send(
            client()
                .post(api.url("/api/subscription"))
                .bearer_auth(&token)
                .json(&serde_json::json!({ "action": action })),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        if action == "cancel" {
            // Read before the resume (a tick after it may offer again).
            assert_eq!(open().await, 0, "cancel voided it");
        }
    }
    let seen = ticks(&worker);
    assert!(
        wait_until(Duration::from_secs(30), || async { open().await == 1 }).await,
        "offered again"
    );
    assert!(
        ticks(&worker) <= seen + 3,
        "within three ticks of resume, not a lease (eight ticks) later"
    );
}

/// A page queued while payments were on, run by a worker whose payments are
/// off (switched off since, or a mixed deployment), changes nothing: the
/// loop waits, and the page's claims are given back so that it is queued
/// again once payments are on.
#[tokio::test(flavor = "multi_thread")]
async fn a_page_run_while_payments_are_off_changes_nothing_and_gives_its_claims_back() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    seed(&db, 10).await;
    let queued = || async {
        stack.redis.count("LLEN", "settlement:active").await
            + stack.redis.count("ZCARD", "settlement:scheduled").await
    };
    let claims = "SELECT count(*) AS n FROM renewal_claims WHERE step = 'create'";
    // Queued by a worker that does not run the settlement queue.
    let scheduler = stack
        .worker(&env.clone().with("WORKER_QUEUES", "email"))
        .await;
    assert!(
        wait_until(Duration::from_secs(30), || async { queued().await >= 1 }).await,
        "the page is queued"
    );
    drop(scheduler);
    assert_eq!(count(&db, claims).await, 10);
    // Run by a worker whose payments are off.
    let runner = stack
        .worker(
            &env.clone()
                .with("WORKER_QUEUES", "settlement")
                .with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false"),
        )
        .await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            queued().await == 0 && count(&db, claims).await == 0
        })
        .await,
        "the page ran and gave its claims back; stderr:\n{}",
        runner.stderr()
    );
    assert!(runner.stderr().contains("renewal batch skipped"));
    assert_eq!(count(&db, "SELECT count(*) AS n FROM renewals").await, 0);
}
