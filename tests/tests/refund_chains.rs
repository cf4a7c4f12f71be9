//! Refunds and plan changes chained, against the real api (with its worker),
//! PostgreSQL and Redis, provider_b's notifications signed as DOKU documents
//! them; each test is an attack (or a customer's loss) found by a red team:
//!
//! * two refunds down a chain (PRO → BASIC → BASIC again, then the BASIC
//!   change and the PRO payment refunded) leave only the time still paid
//!   for, not the PRO value carried into a refunded payment;
//! * a second plan change (PRO → BASIC → PRO) carries the first payment's
//!   value on too: no paid value is lost;
//! * a refund of the first payment after two changes takes its share back
//!   from the plan in force;
//! * a refund notice for a payment that never became PAID takes nothing;
//! * a refund of a payment whose carried time is spent takes nothing from a
//!   later, separately paid month.

use chrono::Utc;
use entity::entities::audit_logs;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use tests::{
    connect_db, free_user, month_after, move_period, pay, payment_row, pending_plan_payment,
    refund, Proc, Stack,
};

const SECRET: &str = "refund-chain-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-refund-chain-key-0123456789";
const DAY: i64 = 86_400;

async fn start(stack: &Stack) -> Proc {
    let env = stack.session_env(SECRET, SERVICE_KEY);
    stack.api_with_worker(&env).await
}

fn us(d: chrono::Duration) -> i128 {
    i128::from(d.num_microseconds().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_refunds_down_a_chain_leave_only_the_time_still_paid_for() {
    let stack = Stack::new().await;
    let api = start(&stack).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let p1 = pay(&api, &db, user, "PRO", 99_000).await;
    let p2 = pay(&api, &db, user, "BASIC", 49_000).await;
    let p3 = pay(&api, &db, user, "BASIC", 49_000).await;
    let b2 = payment_row(&db, &p2).await;
    let carried = b2.carried_seconds.unwrap();
    assert!(carried > 50 * DAY, "PRO carried into BASIC: {carried} s");
    let own2 = b2.grant_end.unwrap() - b2.grant_start.unwrap() - chrono::Duration::seconds(carried);
    let b3 = payment_row(&db, &p3).await;
    assert_eq!(b3.grant_start, b2.grant_end, "a same-plan extension");

    // The plan change is charged back, then the PRO payment it carried.
    refund(&api, &db, &p2, 49_000).await;
    refund(&api, &db, &p1, 99_000).await;

    // 148,000 back, 49,000 kept: P3's month is what is left, not P3's
    // month plus PRO's carried ~2 months. The carried PRO time runs first
    // in P2's grant, so what of it ran before P1's refund was used and
    // stays spent: the end is P3's own month from P2's start, plus at most
    // the time since P2 was paid (whole seconds, a started one counted).
    let spent = Utc::now() - b2.grant_start.unwrap();
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "BASIC");
    let floor = b3.grant_end.unwrap() - own2 - chrono::Duration::seconds(carried);
    let end = s.current_period_end.unwrap();
    assert!(
        end >= floor && end - floor <= spent,
        "P3's own month from P2's start ({floor}), plus the carried time used \
         since P2 was paid ({spent:?}): the end is {end}"
    );
    let left = s.current_period_end.unwrap() - Utc::now();
    assert!(left < chrono::Duration::days(32), "{left:?} left");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_plan_change_carries_the_first_payments_value_too() {
    let stack = Stack::new().await;
    let api = start(&stack).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let _p1 = pay(&api, &db, user, "PRO", 99_000).await;
    let p2 = pay(&api, &db, user, "BASIC", 49_000).await;
    let p4 = pay(&api, &db, user, "PRO", 99_000).await;
    let b2 = payment_row(&db, &p2).await;
    let b4 = payment_row(&db, &p4).await;
    let paid_at = b4.grant_start.unwrap();
    // BASIC is worth 49,000 over its own month; the PRO time carried into
    // it was priced at that rate, so all of its unused period carries.
    let own2 = us(b2.grant_end.unwrap() - b2.grant_start.unwrap())
        - i128::from(b2.carried_seconds.unwrap()) * 1_000_000;
    let unused = us(b2.grant_end.unwrap() - paid_at);
    let month = us(month_after(paid_at) - paid_at);
    let want = (49_000 * unused * month / (own2 * 99_000) / 1_000_000) as i64;
    assert_eq!(b4.carried_seconds, Some(want));
    // 247,000 paid, moments apart: about 2.5 months of PRO in all.
    let total = b4.grant_end.unwrap() - paid_at;
    assert!(
        total > chrono::Duration::days(73),
        "PRO for {} days after paying 247,000",
        total.num_days()
    );
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("PRO", b4.grant_end)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refunding_the_first_payment_after_two_changes_takes_its_share_from_the_plan_in_force() {
    let stack = Stack::new().await;
    let api = start(&stack).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let p1 = pay(&api, &db, user, "PRO", 99_000).await;
    let _p2 = pay(&api, &db, user, "BASIC", 49_000).await;
    let p4 = pay(&api, &db, user, "PRO", 99_000).await;
    let before = tests::subscription_row(&db, user)
        .await
        .current_period_end
        .unwrap();
    refund(&api, &db, &p1, 99_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(s.plan, "PRO");
    // P1's 99,000, unused when it carried on twice, buys about a month of
    // PRO: that much comes off the end, no more than was carried.
    let back = before - s.current_period_end.unwrap();
    assert!(
        back > chrono::Duration::days(29) && back <= chrono::Duration::days(31),
        "{back:?} taken back"
    );
    let b4 = payment_row(&db, &p4).await;
    assert_eq!(b4.grant_end, s.current_period_end);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refund_notice_for_a_payment_never_paid_takes_nothing_back() {
    let stack = Stack::new().await;
    let api = start(&stack).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let p1 = pay(&api, &db, user, "PRO", 99_000).await;
    let (_, end) = move_period(&pool, &p1, 1, 29).await;
    // A second checkout, still pending, is reported refunded.
    let p2 = pending_plan_payment(&db, user, "PRO", 99_000, "provider_b").await;
    refund(&api, &db, &p2, 99_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("PRO", Some(end)),
        "the paid month stays"
    );
    let take_backs = audit_logs::Entity::find()
        .filter(audit_logs::Column::Action.eq("subscription.take_back"))
        .filter(audit_logs::Column::TargetId.eq(user.to_string()))
        .count(&db)
        .await
        .unwrap();
    assert_eq!(take_backs, 0);
}

/// A refund of an old payment whose carried time is spent takes nothing
/// from a later, separately paid month: PRO, then BASIC with PRO's carry,
/// that BASIC period over, BASIC paid again; a whole refund of the first
/// PRO payment once moved the new month's end back by the whole carry (21
/// paid days lost).
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_whose_carry_is_spent_takes_nothing_from_a_later_paid_month() {
    let stack = Stack::new().await;
    let api = start(&stack).await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    let p1 = pay(&api, &db, user, "PRO", 99_000).await;
    let p2 = pay(&api, &db, user, "BASIC", 49_000).await;
    assert!(payment_row(&db, &p2).await.carried_seconds.unwrap() > 50 * DAY);
    // The BASIC period (with the carry) ended yesterday; BASIC is paid again.
    move_period(&pool, &p2, 40, -1).await;
    let p3 = pay(&api, &db, user, "BASIC", 49_000).await;
    let paid = payment_row(&db, &p3).await;
    let end = tests::subscription_row(&db, user).await.current_period_end;
    assert_eq!(end, paid.grant_end, "the new month is in force");

    refund(&api, &db, &p1, 99_000).await;
    let s = tests::subscription_row(&db, user).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("BASIC", end),
        "the later month keeps all its time"
    );
}
