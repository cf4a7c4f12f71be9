//! Plan changes against the real api (with its worker), PostgreSQL, Redis
//! and an SMTP sink, provider_b's notifications signed as DOKU documents
//! them; paid periods are moved by SQL and the database's clock decides:
//!
//! * a payment for another plan carries the unused time of the plan in force
//!   at the ratio of what it was worth to the new plan's price, rounded down
//!   to the second; the grant is stored on the payment and the subscription
//!   ends one calendar month after `paid_at` plus the carried time (down and
//!   up, asserted to the microsecond from the stored rows);
//! * a refund of the payment that changed plan gives the carried value back:
//!   the old plan and its period end return;
//! * `GET /api/payments/quote` answers what the settlement then grants (to
//!   the microsecond for a same-plan payment; a plan change paid a moment
//!   later carries that moment less), and the receipt says it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tests::{
    client, connect_db, free_user, hs256_token, move_period, pay, payment_row, refund,
    session_claims, Proc, Reply, SmtpSink, Stack,
};
use uuid::Uuid;
use worker::mailer::billing::human_duration;

const SECRET: &str = "plan-change-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-plan-change-key-0123456789";
const DAY: i64 = 86_400;

async fn start(stack: &Stack, sink: &SmtpSink) -> Proc {
    let env = stack
        .session_env(SECRET, SERVICE_KEY)
        .with("SMTP_URL", sink.url());
    stack.api_with_worker(&env).await
}

async fn quote(api: &Proc, user: Option<Uuid>, plan: Option<&str>) -> Reply {
    let mut url = api.url("/api/payments/quote");
    if let Some(p) = plan {
        url = format!("{url}?plan={p}");
    }
    let mut req = client().get(url);
    if let Some(u) = user {
        req = req.bearer_auth(hs256_token(
            SECRET.as_bytes(),
            &session_claims(&u.to_string(), Some(&format!("{u}@example.com"))),
        ));
    }
    Reply::send(req).await
}

fn at(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("a UTC time: {v}"))
}

/// The carry of the rule, recomputed from stored times: `value` over the
/// grant's `[start, end]`, unused from `paid_at`, to a month of `price` from
/// `paid_at`, in microseconds, rounded down to the second.
fn expected_carry(
    value: i64,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    paid_at: DateTime<Utc>,
    price: i64,
) -> i64 {
    let us = |d: chrono::Duration| i128::from(d.num_microseconds().unwrap());
    let month = us(tests::month_after(paid_at) - paid_at);
    let carried_us =
        i128::from(value) * us(end - paid_at) * month / (us(end - start) * i128::from(price));
    (carried_us / 1_000_000) as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_downgrade_carries_exactly_and_its_refund_gives_the_old_plan_back() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;

    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    // 20 of 30 days used, 10 left.
    let (pro_start, pro_end) = move_period(&pool, &pro, 20, 10).await;

    let q = quote(&api, Some(user), Some("BASIC")).await;
    assert_eq!(q.status, 200, "{}", q.text);
    let basic = pay(&api, &db, user, "BASIC", 49_000).await;

    let b = payment_row(&db, &basic).await;
    let paid_at = b.paid_at.expect("paid_at");
    let carried = expected_carry(99_000, pro_start, pro_end, paid_at, 49_000);
    assert!(
        (20 * DAY..21 * DAY).contains(&carried),
        "10 days of PRO are worth about 20.2 days of BASIC: {carried} s"
    );
    assert_eq!(b.carried_seconds, Some(carried));
    let us = |d: chrono::Duration| i128::from(d.num_microseconds().unwrap());
    let value = 99_000 * us(pro_end - paid_at) / us(pro_end - pro_start);
    assert_eq!(b.carried_value, Some(value as i64), "a third of 99,000");
    assert!((32_990..=33_000).contains(&value), "{value}");
    assert_eq!(b.grant_plan.as_deref(), Some("BASIC"));
    assert_eq!(b.grant_from_plan.as_deref(), Some("PRO"));
    assert_eq!(b.grant_from_end, Some(pro_end));
    assert_eq!(b.grant_start, Some(paid_at));
    let end = tests::month_after(paid_at) + chrono::Duration::seconds(carried);
    assert_eq!(b.grant_end, Some(end));
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("BASIC", Some(end))
    );
    assert_eq!(payment_row(&db, &pro).await.carried_into, Some(b.id));

    // The quote a moment before: same plan, amount and month; paid that
    // moment later, the period starts that much later and carries the
    // unused time of that moment less.
    assert_eq!(q.json["plan"], "BASIC");
    assert_eq!(q.json["amount"], 49_000);
    assert_eq!(q.json["currency"], "IDR");
    let quoted_at = at(&q.json["period_start"]);
    assert!(quoted_at <= paid_at);
    let quoted_carry = q.json["carried_seconds"].as_i64().unwrap();
    assert_eq!(
        quoted_carry,
        expected_carry(99_000, pro_start, pro_end, quoted_at, 49_000)
    );
    assert!(quoted_carry >= carried);
    let lag = (paid_at - quoted_at).num_seconds() + 1;
    assert!(
        quoted_carry - carried <= 3 * lag,
        "{quoted_carry} vs {carried}"
    );

    // The receipt says what the stored grant says.
    let mails = sink.wait_for(2, Duration::from_secs(30)).await;
    let receipt = mails
        .iter()
        .find(|m| m.part("text/plain").contains(&basic))
        .expect("the BASIC receipt");
    let text = receipt.part("text/plain");
    assert!(
        text.contains(&format!(
            "Carried over: {} of unused time from your Pro plan",
            human_duration(carried)
        )),
        "{text}"
    );

    // Refunded: the month goes, the carried value returns to PRO, whose
    // period end comes back.
    refund(&api, &db, &basic, 49_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("PRO", Some(pro_end))
    );
    assert_eq!(s.current_period_start, Some(pro_start));
    assert_eq!(
        payment_row(&db, &pro).await.carried_into,
        None,
        "PRO runs again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_carries_exactly_and_a_same_plan_quote_is_the_receipt() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;

    let basic = pay(&api, &db, user, "BASIC", 49_000).await;
    let (b_start, b_end) = move_period(&pool, &basic, 10, 20).await;
    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    let p = payment_row(&db, &pro).await;
    let paid_at = p.paid_at.unwrap();
    let carried = expected_carry(49_000, b_start, b_end, paid_at, 99_000);
    assert!(
        (9 * DAY..11 * DAY).contains(&carried),
        "20 days of BASIC are worth about 10 days of PRO: {carried} s"
    );
    assert_eq!(p.carried_seconds, Some(carried));
    let end = tests::month_after(paid_at) + chrono::Duration::seconds(carried);
    assert_eq!(p.grant_end, Some(end));
    let s = tests::subscription_row(&db, user).await;
    assert_eq!((s.plan.as_str(), s.current_period_end), ("PRO", Some(end)));

    // Another month of the plan in force: the quote is the receipt.
    let q = quote(&api, Some(user), Some("PRO")).await;
    assert_eq!(q.status, 200, "{}", q.text);
    assert_eq!(at(&q.json["period_start"]), end);
    assert_eq!(at(&q.json["period_end"]), tests::month_after(end));
    assert_eq!(q.json["carried_seconds"], 0);
    let again = pay(&api, &db, user, "PRO", 99_000).await;
    let r = payment_row(&db, &again).await;
    assert_eq!(r.grant_start, Some(at(&q.json["period_start"])));
    assert_eq!(r.grant_end, Some(at(&q.json["period_end"])));
    assert_eq!(r.carried_seconds, Some(0));
    assert_eq!(r.grant_from_plan, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quote_refuses_what_cannot_be_bought() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    quote(&api, None, Some("PRO"))
        .await
        .assert_problem(401, None, None);
    for plan in [None, Some("FREE"), Some("GOLD")] {
        quote(&api, Some(user), plan)
            .await
            .assert_problem(400, Some("invalid_plan"), Some("plan"));
    }
    // Outside the documented 1–32 characters: refused by the schema.
    for plan in ["", &"P".repeat(33)] {
        quote(&api, Some(user), Some(plan)).await.assert_problem(
            400,
            Some("invalid_parameter"),
            Some("plan"),
        );
    }
    let q = quote(&api, Some(user), Some("ULTIMATE")).await;
    assert_eq!(q.status, 200, "{}", q.text);
    assert_eq!(q.json["amount"], 299_000);
    assert_eq!(q.json["carried_seconds"], 0);
}

/// In its renewal grace (`past_due`: the period ended unpaid, the plan is
/// kept) a payment extends from the old end, whichever plan it buys, so the
/// grace days are paid for and not given on top; the quotes say the same
/// beforehand (another plan's once started at the payment: the grace days
/// were free).
#[tokio::test(flavor = "multi_thread")]
async fn paid_in_grace_extends_from_the_old_end() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;

    let first = pay(&api, &db, user, "PRO", 99_000).await;
    // The period ended two days ago, unpaid: in grace.
    let (_, old_end) = move_period(&pool, &first, 28, -2).await;
    sea_orm::sqlx::query("UPDATE subscriptions SET status = 'past_due' WHERE user_id = $1")
        .bind(user)
        .execute(&pool)
        .await
        .expect("into grace");

    let month_after = tests::month_after(old_end);
    for plan in ["BASIC", "ULTIMATE"] {
        let q = quote(&api, Some(user), Some(plan)).await;
        assert_eq!(q.status, 200, "{}", q.text);
        assert_eq!(at(&q.json["period_start"]), old_end, "{plan}: {}", q.text);
        assert_eq!(at(&q.json["period_end"]), month_after, "{plan}: {}", q.text);
        assert_eq!(q.json["carried_seconds"], 0, "{plan}: {}", q.text);
    }
    let q = quote(&api, Some(user), Some("PRO")).await;
    assert_eq!(q.status, 200, "{}", q.text);
    assert_eq!(at(&q.json["period_start"]), old_end, "{}", q.text);
    assert_eq!(at(&q.json["period_end"]), month_after, "{}", q.text);

    let renewal = pay(&api, &db, user, "PRO", 99_000).await;
    let r = payment_row(&db, &renewal).await;
    assert_eq!(
        (r.grant_start, r.grant_end, r.carried_seconds),
        (Some(old_end), Some(month_after), Some(0))
    );
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.status.as_str(), s.current_period_end),
        ("PRO", "active", Some(month_after))
    );
}

/// The attack: buy PRO, change to BASIC (PRO's unused month is carried into
/// BASIC as about two more months), then have the PRO payment refunded or
/// charged back. The money goes back, so the time it bought goes too: the
/// carried share leaves BASIC's period and its stored grant, and BASIC keeps
/// only the month its own payment bought.
#[tokio::test(flavor = "multi_thread")]
async fn refunding_a_grant_carried_into_another_plan_takes_the_carried_time_back() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;

    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    move_period(&pool, &pro, 0, 30).await;
    let basic = pay(&api, &db, user, "BASIC", 49_000).await;
    let b = payment_row(&db, &basic).await;
    let paid_at = b.paid_at.unwrap();
    let own_month = tests::month_after(paid_at);
    let carried = b.carried_seconds.unwrap();
    assert!(
        carried > 50 * DAY,
        "PRO's month carried into BASIC: {carried} s"
    );
    assert_eq!(
        tests::subscription_row(&db, user).await.current_period_end,
        Some(own_month + chrono::Duration::seconds(carried))
    );

    refund(&api, &db, &pro, 99_000).await;

    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("BASIC", Some(own_month)),
        "BASIC keeps its own month only"
    );
    let b = payment_row(&db, &basic).await;
    assert_eq!((b.carried_seconds, b.grant_end), (Some(0), Some(own_month)));
}

/// The attack, continued: after the PRO payment carried into BASIC is
/// refunded, the BASIC payment is refunded too. Nothing was paid for PRO
/// any more, so PRO does not come back: with both payments refunded the
/// account is on FREE.
#[tokio::test(flavor = "multi_thread")]
async fn refunding_both_sides_of_a_plan_change_leaves_nothing_paid() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = start(&stack, &sink).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;

    let pro = pay(&api, &db, user, "PRO", 99_000).await;
    move_period(&pool, &pro, 0, 30).await;
    let basic = pay(&api, &db, user, "BASIC", 49_000).await;
    for (order, amount) in [(&pro, 99_000), (&basic, 49_000)] {
        refund(&api, &db, order, amount).await;
    }
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("FREE", None),
        "both payments refunded: nothing paid remains"
    );
}
