//! What a renewal's payment does when it settles, against the real api and
//! worker binaries, PostgreSQL and Redis, provider_b's notifications signed
//! as DOKU documents them; paid periods are moved by SQL (the database's
//! clock decides) and the scheduler ticks every second:
//!
//! * a paid renewal extends its plan a month from the period end and is
//!   `paid`; a second payment of it is honoured as time, audited
//!   `renewal.duplicate` and counted in `billing_renewals_total`;
//! * a renewal paid after an upgrade never moves the plan back: it buys time
//!   on the plan in force at that plan's rate;
//! * `change` makes the next renewal bill another plan (shown in
//!   `/api/me`); paid before the period end it is a scheduled phase that
//!   the loop begins at the old end, for the month paid;
//! * the embedded mode (SQLite, its own queue) renews too.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::entities::{
    payments::PaymentStatus,
    renewals::{self, RenewalStatus},
    subscriptions::SubscriptionStatus,
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use serde_json::{json, Value};
use tests::{
    audit_trail, client, connect_db, free_user, hs256_token, me, month_after, move_period, pay,
    payment_row, pending_plan_payment, session_claims, settle, user_token, wait_payment_status,
    wait_until, EnvMap, Proc, Reply, Stack,
};
use uuid::Uuid;

const JWT: &str = "renewal-pay-jwt-secret-0123456789abcdef0123456789";
const SERVICE: &str = "renewal-pay-service-role-0123456789abcdef0123";
const METRICS: &str = "renewal-pay-metrics-token-0123456789abcdef";
fn env(stack: &Stack) -> EnvMap {
    stack
        .session_env(JWT, SERVICE)
        .with("SCHEDULER_TICK_SECS", "1")
        .with("METRICS_TOKEN", METRICS)
}

async fn renewal(db: &DatabaseConnection, id: Uuid) -> renewals::Model {
    renewals::Entity::find_by_id(id)
        .one(db)
        .await
        .unwrap()
        .expect("renewal")
}

/// Waits for the open renewal of `user` that the scheduler offers for the
/// period ending `end`.
async fn offered(db: &DatabaseConnection, user: Uuid, end: DateTime<Utc>) -> renewals::Model {
    tests::poll_until(
        Duration::from_secs(30),
        || async {
            renewals::Entity::find()
                .filter(renewals::Column::UserId.eq(user))
                .filter(renewals::Column::PeriodEnd.eq(end))
                .filter(renewals::Column::Status.eq(RenewalStatus::Open))
                .one(db)
                .await
                .unwrap()
        },
        Option::is_some,
    )
    .await
    .expect("the scheduler offers a renewal")
}

/// A PENDING payment made through renewal `r`'s pay link (the row the link
/// creates; the link itself is tested in `renewal.rs`).
async fn renewal_payment(
    pool: &sea_orm::sqlx::PgPool,
    db: &DatabaseConnection,
    r: &renewals::Model,
) -> String {
    let order = pending_plan_payment(db, r.user_id, &r.plan, r.amount, "provider_b").await;
    sea_orm::sqlx::query("UPDATE payments SET renewal_id = $2 WHERE order_id = $1")
        .bind(&order)
        .bind(r.id)
        .execute(pool)
        .await
        .expect("link the payment to its renewal");
    order
}

/// `billing_renewals_total{outcome}` on the worker's `/metrics`.
async fn renewals_counted(base: &str, outcome: &str) -> Option<f64> {
    let r = Reply::send(client().get(format!("{base}/metrics")).bearer_auth(METRICS)).await;
    let series = format!("billing_renewals_total{{outcome=\"{outcome}\"}} ");
    r.text
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paid_renewal_extends_a_month_and_a_second_payment_of_it_is_time_audited_as_duplicate() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let worker = stack
        .worker(&env.clone().with("WORKER_HTTP_PORT", "0"))
        .await;
    let base = tests::worker_http(&worker).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let first = pay(&api, &db, user, "PRO", 99_000).await;
    let (_, end) = move_period(&pool, &first, 28, 2).await;
    let r = offered(&db, user, end).await;
    assert_eq!((r.plan.as_str(), r.amount), ("PRO", 99_000));
    // Two checkouts of the one renewal, both paid.
    let a = renewal_payment(&pool, &db, &r).await;
    let b = renewal_payment(&pool, &db, &r).await;

    settle(&api, &db, &a, 99_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "PRO");
    assert_eq!(s.status, SubscriptionStatus::Active);
    assert_eq!(
        s.current_period_end,
        Some(month_after(end)),
        "a month from the old end"
    );
    assert_eq!(renewal(&db, r.id).await.status, RenewalStatus::Paid);
    let m = me(&api, JWT, user).await;
    assert_eq!(m["subscription"]["renewal"], Value::Null, "{m}");
    assert_eq!(audit_trail(&db, &a, "renewal.duplicate").await.len(), 0);

    settle(&api, &db, &b, 99_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        s.current_period_end,
        Some(tests::months_after(end, 2)),
        "the second payment is honoured as another month"
    );
    let dup = audit_trail(&db, &b, "renewal.duplicate").await;
    assert_eq!(dup.len(), 1, "one duplicate audit row");
    assert_eq!(
        dup[0].new_value.as_ref().unwrap()["renewal_id"],
        json!(r.id)
    );
    let pb = payment_row(&db, &b).await;
    assert_eq!(pb.grant_plan.as_deref(), Some("PRO"));
    assert_eq!(pb.grant_start, Some(month_after(end)));

    for (outcome, want) in [("paid", 1.0), ("duplicate", 1.0)] {
        let ok = wait_until(Duration::from_secs(10), || async {
            renewals_counted(&base, outcome).await == Some(want)
        })
        .await;
        assert!(
            ok,
            "billing_renewals_total{{outcome={outcome}}}: {:?}",
            renewals_counted(&base, outcome).await
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_paid_after_an_upgrade_does_not_move_the_plan_back() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let basic = pay(&api, &db, user, "BASIC", 49_000).await;
    let (_, end) = move_period(&pool, &basic, 28, 2).await;
    let r = offered(&db, user, end).await;
    assert_eq!((r.plan.as_str(), r.amount), ("BASIC", 49_000));
    // The customer opens the renewal's checkout, then upgrades instead.
    let late = renewal_payment(&pool, &db, &r).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    assert_eq!(
        renewal(&db, r.id).await.status,
        RenewalStatus::Void,
        "the upgrade moved plan and period end: the renewal is void"
    );
    let upgraded = tests::subscription_row(&db, user).await;
    assert_eq!(upgraded.plan, "PRO");
    let pro_end = upgraded.current_period_end.unwrap();

    // Then the old BASIC checkout is paid after all.
    settle(&api, &db, &late, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "PRO", "a renewal never moves the plan back");
    // 49,000 buys time of PRO at the rate of its stored grant: 99,000 for
    // its own month (carried time excluded), rounded down to the second.
    let p = payment_row(&db, &pro).await;
    let us = |d: chrono::Duration| i128::from(d.num_microseconds().unwrap());
    let own = us(p.grant_end.unwrap() - p.grant_start.unwrap())
        - i128::from(p.carried_seconds.unwrap()) * 1_000_000;
    let secs = (49_000 * own / 99_000 / 1_000_000) as i64;
    assert_eq!(
        s.current_period_end,
        Some(pro_end + chrono::Duration::seconds(secs))
    );
    let l = payment_row(&db, &late).await;
    assert_eq!(l.grant_plan.as_deref(), Some("PRO"));
    assert_eq!(l.grant_start, Some(pro_end));
    let settle_row = audit_trail(&db, &late, "payment.settle").await;
    assert_eq!(settle_row.len(), 1);
    assert_eq!(
        settle_row[0].new_value.as_ref().unwrap()["renewal"],
        "outdated"
    );
}

async fn post_subscription(api: &Proc, user: Uuid, body: Value) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/subscription"))
            .bearer_auth(user_token(JWT, user))
            .json(&body),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn change_bills_the_next_renewal_at_another_plan_and_paid_early_it_runs_from_the_old_end() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    let (_, end) = move_period(&pool, &pro, 28, 2).await;
    let first = offered(&db, user, end).await;
    assert_eq!(first.plan, "PRO");

    // Bad requests name the field.
    for bad in [
        json!({"action": "change"}),
        json!({"action": "change", "plan": "FREE"}),
        json!({"action": "change", "plan": "GOLD"}),
        json!({"action": "cancel", "plan": "BASIC"}),
    ] {
        let r = post_subscription(&api, user, bad.clone()).await;
        r.assert_problem(400, Some("invalid_plan"), Some("plan"));
    }
    assert_eq!(renewal(&db, first.id).await.status, RenewalStatus::Open);

    let r = post_subscription(&api, user, json!({"action": "change", "plan": "BASIC"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["renewal_plan"], "BASIC");
    assert_eq!(r.json["status"], "active");
    assert_eq!(renewal(&db, first.id).await.status, RenewalStatus::Void);
    // The plan in force does not change now; the next renewal bills BASIC.
    let m = me(&api, JWT, user).await;
    assert_eq!(m["subscription"]["plan"], "PRO", "{m}");
    assert_eq!(m["subscription"]["renewal_plan"], "BASIC");
    assert_eq!(m["subscription"]["renewal"]["plan"], "BASIC");
    assert_eq!(m["subscription"]["renewal"]["amount"], 49_000);
    let next = offered(&db, user, end).await;
    assert_eq!((next.plan.as_str(), next.amount), ("BASIC", 49_000));

    // Paid before the period end, it is a phase: PRO runs on until its end,
    // then BASIC for the month paid (Stripe's change at period end).
    let order = renewal_payment(&pool, &db, &next).await;
    settle(&api, &db, &order, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end)));
    assert_eq!(s.scheduled_plan.as_deref(), Some("BASIC"));
    assert_eq!(s.renewal_plan, None, "the choice is spent");
    assert_eq!(renewal(&db, next.id).await.status, RenewalStatus::Paid);
    let p = payment_row(&db, &order).await;
    assert_eq!(p.grant_from_plan.as_deref(), Some("PRO"));
    assert_eq!(p.grant_start, Some(end), "the phase starts at the old end");
    let length = p.grant_end.unwrap() - end;
    assert_eq!(p.grant_end, Some(month_after(end)), "one month of BASIC");
    assert_eq!(p.carried_seconds, Some(0), "nothing carried: PRO runs out");
    let m = me(&api, JWT, user).await;
    assert_eq!(m["subscription"]["plan"], "PRO", "{m}");
    assert_eq!(
        m["subscription"]["scheduled_change"]["plan"], "BASIC",
        "{m}"
    );
    assert_eq!(
        m["subscription"]["scheduled_change"]["starts_at"]
            .as_str()
            .and_then(|t| t.parse::<DateTime<Utc>>().ok()),
        Some(end)
    );
    assert_eq!(
        m["subscription"]["renewal"],
        Value::Null,
        "nothing more to pay"
    );

    // The period ends: the loop's next tick begins the phase, never telling
    // it past due.
    let (ended,): (DateTime<Utc>,) = sea_orm::sqlx::query_as(
        "UPDATE subscriptions SET current_period_end = clock_timestamp() - interval '1 second' \
         WHERE user_id = $1 RETURNING current_period_end",
    )
    .bind(user)
    .fetch_one(&pool)
    .await
    .expect("end the period");
    let switched = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.plan == "BASIC"
    })
    .await;
    assert!(switched, "the phase began");
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.status, SubscriptionStatus::Active);
    assert_eq!(s.past_due_at, None, "never past due");
    assert_eq!(s.scheduled_plan, None);
    assert_eq!(s.current_period_start, Some(ended));
    assert_eq!(s.current_period_end, Some(ended + length), "the month paid");
    let p = payment_row(&db, &order).await;
    assert_eq!(
        (p.grant_start, p.grant_end),
        (Some(ended), Some(ended + length))
    );

    // Choosing the current plan undoes a choice.
    let r = post_subscription(&api, user, json!({"action": "change", "plan": "PRO"})).await;
    assert_eq!(r.json["renewal_plan"], "PRO");
    let r = post_subscription(&api, user, json!({"action": "change", "plan": "BASIC"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["renewal_plan"], Value::Null);
    assert_eq!(tests::subscription_row(&db, user).await.renewal_plan, None);
    // Each choice is audited, the caller as the actor: BASIC, then PRO
    // (after the payment switched to BASIC), then BASIC again.
    let changes = audit_trail(&db, &user.to_string(), "subscription.change").await;
    let chosen: Vec<_> = changes
        .iter()
        .map(|a| a.new_value.as_ref().unwrap()["renewal_plan"].clone())
        .collect();
    assert_eq!(chosen, [json!("BASIC"), json!("PRO"), Value::Null]);
    assert!(changes.iter().all(|a| a.actor_id == Some(user)));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_mode_renews_too() {
    use sea_orm::{ActiveModelTrait, IntoActiveModel, Set};
    let dir = tests::TempDir::new();
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", tests::plans_file().display().to_string())
        .with_other_features_configured()
        .with("SCHEDULER_TICK_SECS", "1");
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let jwt = "jwt-secret-dummy-0123456789abcdef0123456789";
    let user = Uuid::new_v4();
    let t = hs256_token(
        jwt.as_bytes(),
        &session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    );
    // First sight creates the account (FREE).
    let r = Reply::send(client().get(api.url("/api/me")).bearer_auth(&t)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let db = sea_orm::Database::connect(format!(
        "sqlite:{}?mode=rw",
        dir.path().join("data/app.db").display()
    ))
    .await
    .expect("the embedded database");
    // A PRO period ending in two days.
    let end = chrono::SubsecRound::trunc_subsecs(Utc::now() + chrono::Duration::days(2), 6);
    let mut s = tests::subscription_row(&db, user).await.into_active_model();
    s.plan = Set("PRO".into());
    s.current_period_start = Set(Some(Utc::now() - chrono::Duration::days(28)));
    s.current_period_end = Set(Some(end));
    s.update(&db).await.unwrap();
    let r = offered(&db, user, end).await;
    assert_eq!((r.plan.as_str(), r.amount), ("PRO", 99_000));
    let m = Reply::send(client().get(api.url("/api/me")).bearer_auth(&t)).await;
    // The session cache may hold the FREE account a moment: ask until it shows.
    let shown = wait_until(Duration::from_secs(30), || async {
        let m = Reply::send(client().get(api.url("/api/me")).bearer_auth(&t)).await;
        m.json["subscription"]["renewal"]["plan"] == "PRO"
    })
    .await;
    assert!(shown, "{}", m.text);

    // Its payment, notified by provider_b, renews a month from the end.
    let order = pending_plan_payment(&db, user, "PRO", 99_000, "provider_b").await;
    let mut p = payment_row(&db, &order).await.into_active_model();
    p.renewal_id = Set(Some(r.id));
    p.update(&db).await.unwrap();
    tests::send_provider_b_notice(
        &api,
        "client-dummy",
        "secret-dummy",
        &order,
        99_000,
        "SUCCESS",
    )
    .await;
    wait_payment_status(&db, &order, PaymentStatus::Paid).await;
    assert_eq!(renewal(&db, r.id).await.status, RenewalStatus::Paid);
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "PRO");
    assert_eq!(s.current_period_end, Some(month_after(r.period_end)));
}

/// Sets what went back of `order` by a partial refund the provider
/// confirmed (the figure settlement records from the status API).
async fn partly_refunded(pool: &sea_orm::sqlx::PgPool, order: &str, amount: i64) {
    sea_orm::sqlx::query("UPDATE payments SET refunded_amount = $2 WHERE order_id = $1")
        .bind(order)
        .bind(amount)
        .execute(pool)
        .await
        .expect("record the partial refund");
}

/// The checkout of a renewal for `cheaper` (at `price`), opened after
/// `change`, then left behind by a `change` back to the plan in force: the
/// renewal is void, its checkout still payable. Answers its order id.
async fn stale_cheaper_checkout(
    api: &Proc,
    db: &DatabaseConnection,
    pool: &sea_orm::sqlx::PgPool,
    user: Uuid,
    end: DateTime<Utc>,
    (cheaper, price): (&str, i64),
    in_force: &str,
) -> String {
    let r = post_subscription(api, user, json!({"action": "change", "plan": cheaper})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let next = offered(db, user, end).await;
    assert_eq!((next.plan.as_str(), next.amount), (cheaper, price));
    let order = renewal_payment(pool, db, &next).await;
    let r = post_subscription(api, user, json!({"action": "change", "plan": in_force})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(renewal(db, next.id).await.status, RenewalStatus::Void);
    order
}

/// The seconds `amount` buys of a plan sold at `price` for the grant of
/// `order` (its own month, carried time excluded), rounded down.
async fn bought(db: &DatabaseConnection, order: &str, amount: i64, price: i64) -> i64 {
    let p = payment_row(db, order).await;
    let us = |d: chrono::Duration| i128::from(d.num_microseconds().unwrap());
    let own = us(p.grant_end.unwrap() - p.grant_start.unwrap())
        - i128::from(p.carried_seconds.unwrap_or(0)) * 1_000_000;
    (i128::from(amount) * own / i128::from(price) / 1_000_000) as i64
}

/// A partial refund lowers what the customer paid, not the price of the
/// plan: an outdated renewal's money buys time of the plan in force at the
/// price it was sold at (a partial refund of 98,999 once made 49,000 buy
/// thousands of years of PRO).
#[tokio::test(flavor = "multi_thread")]
async fn a_partial_refund_does_not_make_an_outdated_renewal_buy_more_time() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    let (_, end) = move_period(&pool, &pro, 28, 2).await;
    offered(&db, user, end).await;
    let stale = stale_cheaper_checkout(&api, &db, &pool, user, end, ("BASIC", 49_000), "PRO").await;
    partly_refunded(&pool, &pro, 98_999).await;

    settle(&api, &db, &stale, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "PRO");
    let secs = bought(&db, &pro, 49_000, 99_000).await;
    assert!((1_250_000..1_300_000).contains(&secs), "{secs}");
    assert_eq!(
        s.current_period_end,
        Some(end + chrono::Duration::seconds(secs)),
        "49,000 buys 49/99 of a PRO month"
    );
}

/// In its grace, the whole refund of the payment that bought the period's
/// end ends the grace (FREE at once, audited): no plan stays in force with
/// no payment behind it. An outdated cheaper renewal's checkout paid then
/// buys its own plan's month from the payment, never a month of the dear
/// plan.
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_in_grace_ends_it_and_an_outdated_cheaper_renewal_then_buys_its_own_plan() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let ultimate = pay(&api, &db, user, "ULTIMATE", 299_000).await;
    let (_, end) = move_period(&pool, &ultimate, 28, 2).await;
    offered(&db, user, end).await;
    let stale =
        stale_cheaper_checkout(&api, &db, &pool, user, end, ("BASIC", 49_000), "ULTIMATE").await;
    // The period ends unpaid: grace.
    let (_, end) = move_period(&pool, &ultimate, 31, 0).await;
    let in_grace = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.status == SubscriptionStatus::PastDue
    })
    .await;
    assert!(in_grace, "{:?}", tests::subscription_row(&db, user).await);
    // The ULTIMATE payment is refunded: its month was the period's, so the
    // grace ends.
    tests::send_provider_b_notice(
        &api,
        tests::B_CLIENT,
        tests::B_SECRET,
        &ultimate,
        299_000,
        "REFUNDED",
    )
    .await;
    wait_payment_status(&db, &ultimate, PaymentStatus::Refunded).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.status, s.current_period_end),
        ("FREE", SubscriptionStatus::Active, None),
        "the grace ended with the refund"
    );
    assert_eq!(
        audit_trail(&db, &user.to_string(), "subscription.take_back")
            .await
            .len(),
        1
    );
    assert!(end < Utc::now());

    settle(&api, &db, &stale, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    let p = payment_row(&db, &stale).await;
    assert_eq!(s.plan, "BASIC", "never a month of ULTIMATE for 49,000");
    assert_eq!(
        s.current_period_end,
        Some(month_after(p.paid_at.unwrap())),
        "a BASIC month from the payment"
    );
}

/// A PRO renewal offered two days before its end, then paid `days_late`
/// days after that end with nobody ticking since (the scheduler stopped,
/// then a worker whose next tick is an hour away): the subscription still
/// `active`, as between ticks or while the loop is paused.
struct LateRenewal {
    _stack: Stack,
    _api: Proc,
    _worker: Proc,
    db: DatabaseConnection,
    user: Uuid,
    renewal: renewals::Model,
    order: String,
    /// The period end the renewal was for (moved back `days_late` days).
    end: DateTime<Utc>,
}

impl LateRenewal {
    async fn paid(days_late: i64) -> Self {
        let stack = Stack::new().await;
        let env = env(&stack);
        let api = stack.api(&env).await;
        let db = connect_db(&stack).await;
        let pool = stack.db.pool().await;
        let user = free_user(&db).await;
        let worker = stack.worker(&env).await;
        let pro = pay(&api, &db, user, "PRO", 99_000).await;
        let (_, end) = move_period(&pool, &pro, 28, 2).await;
        let renewal = offered(&db, user, end).await;
        let order = renewal_payment(&pool, &db, &renewal).await;
        drop(worker);
        let (_, end) = move_period(&pool, &pro, 30 + days_late, -days_late).await;
        sea_orm::sqlx::query("UPDATE renewals SET period_end = $2 WHERE id = $1")
            .bind(renewal.id)
            .bind(end)
            .execute(&pool)
            .await
            .unwrap();
        let worker = stack
            .worker(&env.clone().with("SCHEDULER_TICK_SECS", "3600"))
            .await;
        settle(&api, &db, &order, 99_000).await;
        LateRenewal {
            _stack: stack,
            _api: api,
            _worker: worker,
            db,
            user,
            renewal,
            order,
            end,
        }
    }
}

/// A renewal paid after its period end, before the scheduler marked the
/// subscription `past_due` (between ticks, or while the loop is paused),
/// continues from the old end: the days since are paid for, not free.
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_paid_after_its_end_before_past_due_continues_from_the_old_end() {
    let late = LateRenewal::paid(2).await;
    let (db, r, end, user) = (&late.db, &late.renewal, late.end, late.user);
    assert_eq!(renewal(db, r.id).await.status, RenewalStatus::Paid);
    let s = tests::subscription_row(db, user).await;
    assert_eq!(
        s.current_period_end,
        Some(month_after(end)),
        "a month from the old end, not from the payment"
    );
}

/// A settlement that moved the period end while the renewal was being
/// offered leaves that renewal open for the old end; its next reminder
/// voids it instead of asking the customer to pay for a period already paid.
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_left_open_by_a_race_is_voided_not_reminded() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    let (_, end) = move_period(&pool, &pro, 28, 2).await;
    let r = offered(&db, user, end).await;
    let reminders = || async {
        tests::count(
            &pool,
            "SELECT count(*) FROM billing_mails WHERE kind = 'renewal_reminder'",
        )
        .await
    };
    assert_eq!(reminders().await, 1, "the reminder due came with the offer");
    // As if a payment had moved the end by a month while the offer was made
    // (the offer now holds the subscription's lock, so the test writes the
    // outcome of the race), and the 1-day reminder came due.
    sea_orm::sqlx::query(
        "UPDATE subscriptions SET current_period_end = current_period_end + interval '30 days' \
         WHERE user_id = $1",
    )
    .bind(user)
    .execute(&pool)
    .await
    .unwrap();
    sea_orm::sqlx::query("UPDATE renewals SET next_reminder_at = now() WHERE id = $1")
        .bind(r.id)
        .execute(&pool)
        .await
        .unwrap();
    let voided = wait_until(Duration::from_secs(30), || async {
        renewal(&db, r.id).await.status == RenewalStatus::Void
    })
    .await;
    assert!(voided, "worker stderr:\n{}", worker.stderr());
    assert_eq!(
        reminders().await,
        1,
        "no reminder for a period already paid"
    );
}

/// A plan in force with no payment behind it (set by an operator, or from
/// before grants were stored) is priced by the amount stored on its
/// renewal: an outdated cheaper renewal's money buys its share of that
/// plan, never a whole month of it (the cheapest plan once bought a full
/// ULTIMATE month, again and again).
#[tokio::test(flavor = "multi_thread")]
async fn an_outdated_cheaper_renewal_buys_its_share_of_a_plan_no_payment_priced() {
    let stack = Stack::new().await;
    let env = env(&stack);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    // ULTIMATE with no payment behind it, two days left.
    let (end,): (DateTime<Utc>,) = sea_orm::sqlx::query_as(
        "UPDATE subscriptions SET plan = 'ULTIMATE', status = 'active', \
         current_period_start = clock_timestamp() - interval '28 days', \
         current_period_end = clock_timestamp() + interval '2 days' \
         WHERE user_id = $1 RETURNING current_period_end",
    )
    .bind(user)
    .fetch_one(&pool)
    .await
    .expect("an operator's plan");
    let first = offered(&db, user, end).await;
    assert_eq!((first.plan.as_str(), first.amount), ("ULTIMATE", 299_000));
    let stale =
        stale_cheaper_checkout(&api, &db, &pool, user, end, ("BASIC", 49_000), "ULTIMATE").await;

    settle(&api, &db, &stale, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "ULTIMATE");
    let month = (month_after(end) - end).num_microseconds().unwrap();
    let secs = (i128::from(49_000) * i128::from(month) / 299_000 / 1_000_000) as i64;
    assert_eq!(
        s.current_period_end,
        Some(end + chrono::Duration::seconds(secs)),
        "49,000 buys 49/299 of an ULTIMATE month at its renewal's stored price"
    );
}

/// A payment never buys a period already over: a renewal paid more than a
/// month after its period ended (the loop paused, nobody ticked) starts at
/// `paid_at`, not at the old end (a receipt once stated "31 October to 30
/// November", paid 5 December, and the loop then lapsed it).
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_paid_a_month_after_its_end_buys_a_month_from_the_payment() {
    let late = LateRenewal::paid(35).await;
    let (db, order, user) = (&late.db, &late.order, late.user);
    let p = payment_row(db, order).await;
    let paid_at = p.paid_at.expect("paid");
    assert_eq!(p.grant_start, Some(paid_at), "from the payment");
    assert_eq!(p.grant_end, Some(month_after(paid_at)));
    let s = tests::subscription_row(db, user).await;
    assert_eq!(s.current_period_end, Some(month_after(paid_at)));
}
