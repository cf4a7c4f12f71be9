//! The renewal loop against the real api and worker binaries, PostgreSQL and
//! Redis: period ends are moved by SQL (the database's clock decides), the
//! scheduler ticks every second. One open renewal per subscription and
//! period end under two workers' concurrent ticks, shown in `GET /api/me`;
//! grace keeps the plan (and its AI limits) then lapses to FREE; a
//! cancelling subscription lapses at its end; the pay link creates one
//! checkout, reuses it, replaces it only after it expired unpaid, and
//! refuses forged and outlived tokens; reminders go once per offset, only
//! the latest due, saying the time left.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use chrono::{Duration as Span, Utc};
use entity::entities::{
    audit_logs,
    payments::{self, PaymentStatus},
    renewals::{self, RenewalStatus},
    subscriptions::{self, SubscriptionStatus},
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel,
    PaginatorTrait, QueryFilter, Set,
};
use serde_json::{json, Value};
use tests::{
    client, connect_db, free_user, me, more_ticks, user_token, wait_until, EnvMap, Reply, Stack,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path, path_regex},
    Mock, MockServer, ResponseTemplate,
};

const JWT: &str = "renewal-jwt-secret-0123456789abcdef0123456789";
const SERVICE: &str = "renewal-service-role-0123456789abcdef0123";
const APP_URL: &str = "https://app.example.test";

fn env(stack: &Stack) -> EnvMap {
    stack
        .session_env(JWT, SERVICE)
        .with("APP_URL", APP_URL)
        .with("SCHEDULER_TICK_SECS", "1")
        .with("PROVIDER_TIMEOUT_MS", "2000")
}

/// A user on `plan` whose paid period ends `ends_in` from now.
async fn paid_user(db: &DatabaseConnection, plan: &str, ends_in: Span) -> Uuid {
    let user = free_user(db).await;
    set_subscription(db, user, |s| {
        s.plan = Set(plan.into());
        s.current_period_start = Set(Some(Utc::now() - Span::days(20)));
        s.current_period_end = Set(Some(Utc::now() + ends_in));
    })
    .await;
    user
}

async fn set_subscription(
    db: &DatabaseConnection,
    user: Uuid,
    f: impl FnOnce(&mut subscriptions::ActiveModel),
) {
    let mut s = tests::subscription_row(db, user).await.into_active_model();
    f(&mut s);
    s.update(db).await.unwrap();
}

async fn renewals_of(db: &DatabaseConnection, user: Uuid) -> Vec<renewals::Model> {
    renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
}

async fn audits(db: &DatabaseConnection, user: Uuid, action: &str) -> u64 {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(user.to_string()))
        .filter(audit_logs::Column::Action.eq(action))
        .count(db)
        .await
        .unwrap()
}

/// Two workers tick: each due subscription gets one open renewal for its
/// period end, shown in `GET /api/me`, and the page of due rows is queued
/// once. (That only one worker runs each tick is the tick lock's own test,
/// `the_tick_lock_admits_one_worker_per_tick` in the worker's tests; one
/// renewal per period end holds here with or without it, by the table's
/// unique key.)
#[tokio::test(flavor = "multi_thread")]
async fn one_open_renewal_per_period_under_two_workers_shown_in_me() {
    let stack = Stack::new().await;
    // Every tick logs "scheduler tick", idle ones too (counted below).
    let env = env(&stack).with("RUST_LOG", "info,worker::scheduler=debug");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;

    // Due within the week (the largest reminder offset): renewed.
    let mut due = Vec::new();
    for i in 0..40 {
        due.push(paid_user(&db, "PRO", Span::days(2) + Span::minutes(i)).await);
    }
    // Not renewed: due in a month, cancelling, FREE.
    let later = paid_user(&db, "PRO", Span::days(30)).await;
    let cancelling = paid_user(&db, "PRO", Span::days(2)).await;
    set_subscription(&db, cancelling, |s| s.cancel_at_period_end = Set(true)).await;
    let free = free_user(&db).await;

    let _w1 = stack.worker(&env).await;
    let _w2 = stack.worker(&env).await;
    let all_open = wait_until(Duration::from_secs(60), || async {
        renewals::Entity::find()
            .filter(renewals::Column::Status.eq(RenewalStatus::Open))
            .count(&db)
            .await
            .unwrap()
            >= due.len() as u64
    })
    .await;
    assert!(all_open, "every due subscription got its renewal");
    // Six more ticks (counted, not slept; one worker takes each tick's
    // lock): nothing is created twice.
    more_ticks(&[&_w1, &_w2], 6).await;
    // The 40 rows are one page, queued once by the two schedulers together
    // (the page's claim holds it while its batch job waits): a page queued
    // again by a later tick would be counted here.
    let pages_queued: u64 = [&_w1, &_w2]
        .iter()
        .flat_map(|w| {
            w.stderr()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|l| l["renewal_batches"].as_u64())
                .collect::<Vec<_>>()
        })
        .sum();
    assert_eq!(pages_queued, 1, "renewal pages queued by both workers");
    for &user in &due {
        let rs = renewals_of(&db, user).await;
        assert_eq!(rs.len(), 1, "one renewal for {user}: {rs:?}");
        let sub = tests::subscription_row(&db, user).await;
        assert_eq!(rs[0].status, RenewalStatus::Open);
        assert_eq!(Some(rs[0].period_end), sub.current_period_end);
        assert_eq!((rs[0].plan.as_str(), rs[0].amount), ("PRO", 99_000));
        assert_eq!(rs[0].currency, "IDR");
    }
    for user in [later, cancelling, free] {
        assert!(renewals_of(&db, user).await.is_empty(), "{user}");
    }
    // No payment row until someone opens the link.
    assert_eq!(payments::Entity::find().count(&db).await.unwrap(), 0);

    let m = me(&api, JWT, due[0]).await;
    let r = &m["subscription"]["renewal"];
    assert_eq!(r["plan"], "PRO", "{m}");
    assert_eq!(r["amount"], 99_000);
    assert_eq!(r["currency"], "IDR");
    let due_at: chrono::DateTime<Utc> = r["due_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        Some(due_at),
        tests::subscription_row(&db, due[0])
            .await
            .current_period_end
    );
    let pay_url = r["pay_url"].as_str().expect("a pay link");
    assert!(pay_url.contains("/api/payments/pay/"), "{pay_url}");
    assert!(me(&api, JWT, later).await["subscription"]["renewal"].is_null());
    assert!(me(&api, JWT, free).await["subscription"]["renewal"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_keeps_the_plan_and_its_ai_limits_then_lapses_to_free() {
    let stack = Stack::new().await;
    let env = env(&stack).with("RENEWAL_GRACE_SECS", "3600");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    // Ended unpaid a minute ago: in grace.
    let user = paid_user(&db, "PRO", -Span::minutes(1)).await;
    // Cancelling and ended: lapses at once, no grace.
    let cancelling = paid_user(&db, "PRO", -Span::minutes(1)).await;
    set_subscription(&db, cancelling, |s| s.cancel_at_period_end = Set(true)).await;

    let _worker = stack.worker(&env).await;
    let in_grace = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.status == SubscriptionStatus::PastDue
            && tests::subscription_row(&db, cancelling).await.plan == "FREE"
    })
    .await;
    assert!(in_grace, "past_due, and the cancelling one lapsed");
    assert_eq!(audits(&db, user, "subscription.past_due").await, 1);
    assert_eq!(audits(&db, cancelling, "subscription.expire").await, 1);
    assert_eq!(audits(&db, cancelling, "subscription.past_due").await, 0);

    let m = me(&api, JWT, user).await;
    assert_eq!(m["subscription"]["plan"], "PRO", "{m}");
    assert_eq!(m["subscription"]["status"], "past_due");
    // PRO's own AI limits, as the catalogue states them; FREE's after.
    let catalogue = entity::base::plans::Catalogue::load(&tests::plans_file()).expect("plans");
    let limit_of = |plan: &str| json!(catalogue.get(plan).expect(plan).ai_tokens_per_month);
    assert_ne!(limit_of("PRO"), limit_of("FREE"));
    assert_eq!(
        m["ai_usage"]["tokens_limit"],
        limit_of("PRO"),
        "grace keeps PRO's AI limits: {m}"
    );
    let free_m = me(&api, JWT, cancelling).await;
    assert_eq!(free_m["subscription"]["plan"], "FREE");
    assert_eq!(free_m["ai_usage"]["tokens_limit"], limit_of("FREE"));
    // The link still works in grace: a renewal is offered for the ended
    // period (also when the subscription came into range after its end).
    let offered = wait_until(Duration::from_secs(30), || async {
        !me(&api, JWT, user).await["subscription"]["renewal"].is_null()
    })
    .await;
    assert!(offered, "{}", me(&api, JWT, user).await);
    // Cancel is allowed in grace (and lapses at once: the end has passed).
    let r = Reply::send(
        client()
            .post(api.url("/api/subscription"))
            .bearer_auth(user_token(JWT, user))
            .json(&json!({"action": "cancel"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let lapsed = wait_until(Duration::from_secs(30), || async {
        tests::subscription_row(&db, user).await.plan == "FREE"
    })
    .await;
    assert!(lapsed);
    let renewals = renewals_of(&db, user).await;
    assert!(
        !renewals.is_empty() && renewals.iter().all(|r| r.status == RenewalStatus::Void),
        "the offered renewal is void: {renewals:?}"
    );
    assert_eq!(audits(&db, user, "subscription.expire").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_ends_then_free_once() {
    let stack = Stack::new().await;
    let env = env(&stack)
        .with("RENEWAL_GRACE_SECS", "3600")
        // Every tick logs "scheduler tick", idle ones too (counted below).
        .with("RUST_LOG", "info,worker::scheduler=debug");
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = paid_user(&db, "PRO", -Span::minutes(1)).await;
    let _w1 = stack.worker(&env).await;
    let _w2 = stack.worker(&env).await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            tests::subscription_row(&db, user).await.status == SubscriptionStatus::PastDue
        })
        .await
    );
    // The grace runs an hour from the past-due notice.
    let s = tests::subscription_row(&db, user).await;
    let (told, ends) = (s.past_due_at.unwrap(), s.grace_ends_at.unwrap());
    assert_eq!(ends - told, Span::hours(1), "{s:?}");
    assert!(told > s.current_period_end.unwrap(), "{s:?}");
    // The grace passes (by the database's clock): back to FREE, once.
    time_passes(&db, user, Span::hours(2)).await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            tests::subscription_row(&db, user).await.plan == "FREE"
        })
        .await
    );
    // Six more ticks (counted, not slept): expired once.
    more_ticks(&[&_w1, &_w2], 6).await;
    assert_eq!(audits(&db, user, "subscription.expire").await, 1);
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.status, s.current_period_end),
        (SubscriptionStatus::Active, None)
    );
}

/// provider_b's checkout answer with a page unique to each call.
struct Pages(Arc<AtomicUsize>);

impl wiremock::Respond for Pages {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        ResponseTemplate::new(200).set_body_json(json!({
            "message": ["SUCCESS"],
            "response": {
                "order": {"amount": "99000", "invoice_number": "x", "currency": "IDR", "session_id": "s1"},
                "payment": {
                    "payment_method_types": ["VIRTUAL_ACCOUNT_BCA"],
                    "payment_due_date": 60,
                    "token_id": format!("tok-{n}"),
                    "url": format!("https://pay.example.test/checkout/{n}"),
                    "expired_date": "20261124100000",
                },
                "uuid": 123456789,
                "headers": {"request_id": "r", "signature": "s", "date": "d", "client_id": "client-test"},
            }
        }))
    }
}

async fn click(url: &str) -> Reply {
    Reply::send(tests::no_redirects().get(url)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pay_link_reuses_its_checkout_replaces_it_only_after_expiry_refuses_forgeries() {
    let stack = Stack::new().await;
    let provider = MockServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    Mock::given(method("POST"))
        .and(path("/checkout/v1/payment"))
        .respond_with(Pages(calls.clone()))
        .mount(&provider)
        .await;
    // The status API does not know the orders: an expired checkout is unpaid.
    Mock::given(method("GET"))
        .and(path_regex(r"^/orders/v1/status/.+$"))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({"error": "not found"})))
        .mount(&provider)
        .await;
    let env = env(&stack).with("PROVIDER_B_BASE_URL", provider.uri());
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = paid_user(&db, "PRO", Span::days(2)).await;
    let worker = stack.worker(&env).await;
    let renewal = tests::poll_until(
        Duration::from_secs(30),
        || async { renewals_of(&db, user).await.pop() },
        Option::is_some,
    )
    .await
    .expect("a renewal");
    drop(worker);
    let m = me(&api, JWT, user).await;
    let link = m["subscription"]["renewal"]["pay_url"]
        .as_str()
        .expect("pay_url")
        .to_string();
    // The link names the api the test talks to.
    let link = format!(
        "{}{}",
        api.url(""),
        &link[link.find("/api/payments/pay/").unwrap()..]
    );

    // First click: one payment, one provider checkout, 303 to its page.
    let r = click(&link).await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(
        r.header("location"),
        Some("https://pay.example.test/checkout/1")
    );
    // Repeated clicks (a mail scanner, the customer): the same checkout.
    for _ in 0..3 {
        let r = click(&link).await;
        assert_eq!(
            r.header("location"),
            Some("https://pay.example.test/checkout/1")
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let rows = payments::Entity::find()
        .filter(payments::Column::RenewalId.eq(renewal.id))
        .all(&db)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, PaymentStatus::Pending);
    assert_eq!((rows[0].plan.as_str(), rows[0].amount), ("PRO", 99_000));
    // The payment attempt is in the user's list.
    let list = Reply::send(
        client()
            .get(api.url("/api/payments"))
            .bearer_auth(user_token(JWT, user)),
    )
    .await;
    assert_eq!(list.json["items"][0]["order_id"], rows[0].order_id.as_str());

    // The checkout's provider expiry passes (a day by default): the provider
    // says it is unpaid, it becomes EXPIRED, and the click gets a new one.
    let mut old = rows[0].clone().into_active_model();
    old.created_at = Set(Utc::now() - Span::days(2));
    old.update(&db).await.unwrap();
    let r = click(&link).await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(
        r.header("location"),
        Some("https://pay.example.test/checkout/2")
    );
    let old = payments::Entity::find_by_id(rows[0].id)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.status, PaymentStatus::Expired);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Forged or unknown tokens: a problem answer, never a checkout.
    let forged = format!("{}x", &link[..link.len() - 1]);
    let tail = link.rsplit('/').next().unwrap();
    let other_id = format!(
        "{}/api/payments/pay/{}.{}",
        api.url(""),
        Uuid::now_v7().simple(),
        tail.split_once('.').unwrap().1
    );
    for bad in [forged, other_id, api.url("/api/payments/pay/nonsense")] {
        let r = click(&bad).await;
        assert_eq!(r.status, 404, "{bad}: {}", r.text);
        r.assert_problem(404, Some("invalid_link"), None);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Outlived: the grace (3 days by default from the past-due notice)
    // ended before the click.
    let end = Utc::now() - Span::days(4);
    set_subscription(&db, user, |s| {
        s.current_period_end = Set(Some(end));
        s.status = Set(SubscriptionStatus::PastDue);
        s.past_due_at = Set(Some(end + Span::minutes(1)));
        s.grace_ends_at = Set(Some(end + Span::minutes(1) + Span::days(3)));
    })
    .await;
    let mut r2 = renewal.clone().into_active_model();
    r2.period_end = Set(end);
    r2.update(&db).await.unwrap();
    let r = click(&link).await;
    r.assert_problem(404, Some("link_expired"), None);

    // A closed renewal: 303 to the billing page saying so.
    let mut r3 = renewal.into_active_model();
    r3.status = Set(RenewalStatus::Void);
    r3.update(&db).await.unwrap();
    let r = click(&link).await;
    assert_eq!(r.status, 303);
    assert_eq!(
        r.header("location"),
        Some(format!("{APP_URL}/billing?renewal=void").as_str())
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Moves every time of `user`'s subscription (its period end and grace)
/// and renewals `by` earlier (as if that much time had passed), in one
/// transaction.
async fn time_passes(db: &DatabaseConnection, user: Uuid, by: Span) {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let secs = by.num_seconds();
    // One transaction: a tick between the two statements would see the
    // period moved and its renewal not.
    let txn = db.begin().await.unwrap();
    for sql in [
        format!(
            "UPDATE subscriptions SET current_period_end = current_period_end - make_interval(secs => {secs}), \
             past_due_at = past_due_at - make_interval(secs => {secs}), \
             grace_ends_at = grace_ends_at - make_interval(secs => {secs}) WHERE user_id = '{user}'"
        ),
        format!(
            "UPDATE renewals SET period_end = period_end - make_interval(secs => {secs}), \
             next_reminder_at = next_reminder_at - make_interval(secs => {secs}) WHERE user_id = '{user}'"
        ),
    ] {
        txn.execute_unprepared(&sql).await.unwrap();
    }
    txn.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn reminders_go_once_per_offset_only_the_latest_due_and_say_the_time_left() {
    let stack = Stack::new().await;
    let sink = tests::SmtpSink::start().await;
    // Reminders 7, 3 and 1 days before the end (the default).
    let env = env(&stack)
        .with("SMTP_URL", sink.url())
        // Every tick logs "scheduler tick", idle ones too.
        .with("RUST_LOG", "info,worker::scheduler=debug");
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    // Comes into range with 2.5 days left: the 7- and 3-day reminders are
    // both past; only the 3-day one (the latest due) is sent, once.
    let user = paid_user(&db, "PRO", Span::hours(60)).await;
    let worker = stack.worker(&env).await;
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let subject = mails[0].header("subject").unwrap_or_default();
    assert!(subject.contains("renews in 2 days"), "{subject}");
    assert_eq!(
        mails[0].header("to").as_deref(),
        Some(format!("{user}@example.com").as_str())
    );
    // Several more ticks send nothing more.
    more_ticks(&[&worker], 3).await;
    assert_eq!(sink.count(), 1, "one reminder per offset");

    // Two days pass: 12 hours left, the 1-day reminder is due, once.
    time_passes(&db, user, Span::days(2)).await;
    let mails = sink.wait_for(2, Duration::from_secs(30)).await;
    let subject = mails[1].header("subject").unwrap_or_default();
    assert!(
        subject.contains("renews in 11 hours") || subject.contains("renews in 12 hours"),
        "{subject}"
    );
    more_ticks(&[&worker], 3).await;
    assert_eq!(
        sink.count(),
        2,
        "no reminder twice, none after the last offset"
    );
    let renewal = renewals_of(&db, user).await.pop().expect("a renewal");
    assert_eq!(renewal.next_reminder_at, None, "no offset left");
    assert_eq!(renewals_of(&db, user).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_gone_from_the_catalogue_gets_no_renewal_and_one_mail() {
    let stack = Stack::new().await;
    let sink = tests::SmtpSink::start().await;
    let env = env(&stack)
        .with("SMTP_URL", sink.url())
        .with("RUST_LOG", "info,worker::scheduler=debug");
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    // A plan sold once, no longer in the catalogue, ending in two days.
    let user = paid_user(&db, "LEGACY", Span::days(2)).await;
    let worker = stack.worker(&env).await;
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let subject = mails[0].header("subject").unwrap_or_default();
    assert!(
        subject.contains("LEGACY plan cannot be renewed"),
        "{subject}"
    );
    assert!(mails[0].body().contains("/billing"), "{}", mails[0].body());
    more_ticks(&[&worker], 3).await;
    assert_eq!(sink.count(), 1, "told once per period");
    assert!(
        renewals_of(&db, user).await.is_empty(),
        "no renewal can be priced"
    );
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.status),
        ("LEGACY", SubscriptionStatus::Active)
    );
}
