//! The billing anchor against the real api (with its worker) and
//! PostgreSQL, as a customer renewing month after month would see it: a
//! period anchored on the 31st ends on the last day of a shorter month and
//! on the 31st again after it (Stripe's `billing_cycle_anchor`), counted in
//! `BILLING_TIME_ZONE` (Asia/Jakarta by default: 03:00 on the 31st there is
//! the 30th in UTC, which a UTC calendar would anchor on); the quote says
//! each end before it is paid; a plan change with a carry re-anchors.

use chrono::{DateTime, Datelike, Months, NaiveDate, TimeZone, Utc};
use tests::{
    client, connect_db, free_user, months_after, pay, payment_row, user_token, Proc, Reply, Stack,
    BILLING_ZONE,
};
use uuid::Uuid;

const JWT: &str = "billing-anchor-jwt-secret-0123456789abcdef0123";
const SERVICE: &str = "billing-anchor-service-role-0123456789abcdef";
async fn quote_end(api: &Proc, user: Uuid, plan: &str) -> DateTime<Utc> {
    let token = user_token(JWT, user);
    let q = Reply::send(
        client()
            .get(api.url(&format!("/api/payments/quote?plan={plan}")))
            .bearer_auth(token),
    )
    .await;
    assert_eq!(q.status, 200, "{}", q.text);
    q.json["period_end"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("a period end: {}", q.text))
}

/// 03:00 in Jakarta on the 31st of the first month with 31 days that
/// starts after today: far enough ahead that no payment below is late.
fn next_31st() -> DateTime<Utc> {
    let today = Utc::now().with_timezone(&BILLING_ZONE).date_naive();
    let mut first = NaiveDate::from_ymd_opt(today.year(), today.month(), 1).unwrap();
    loop {
        first = first.checked_add_months(Months::new(1)).unwrap();
        if let Some(d) = first.with_day(31) {
            return BILLING_ZONE
                .from_local_datetime(&d.and_hms_opt(3, 0, 0).unwrap())
                .unwrap()
                .with_timezone(&Utc);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn renewals_end_on_the_anchor_day_clamped_and_restored() {
    let stack = Stack::new().await;
    let api = stack
        .api_with_worker(&stack.session_env(JWT, SERVICE))
        .await;
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let user = free_user(&db).await;
    // PRO until the 31st (set as an operator's or an older row would be,
    // with no anchor stored: the end itself is the anchor).
    let end = next_31st();
    assert_eq!(end.day(), 30, "the 31st in Jakarta is the 30th in UTC");
    sea_orm::sqlx::query(
        "UPDATE subscriptions SET plan = 'PRO', current_period_start = $2 - interval '1 month', \
         current_period_end = $2 WHERE user_id = $1",
    )
    .bind(user)
    .bind(end)
    .execute(&pool)
    .await
    .expect("PRO until the 31st");

    // Three renewals: one of the next two months is shorter than 31 days,
    // and the month after it has 31 again.
    let mut ends = vec![];
    for k in 1..=3 {
        let want = months_after(end, k);
        assert_eq!(quote_end(&api, user, "PRO").await, want, "quote {k}");
        let order = pay(&api, &db, user, "PRO", 99_000).await;
        let p = payment_row(&db, &order).await;
        assert_eq!(p.grant_end, Some(want), "renewal {k}");
        let s = tests::subscription_row(&db, user).await;
        assert_eq!(s.current_period_end, Some(want), "renewal {k}");
        assert_eq!(s.billing_anchor_day, Some(31));
        ends.push(want.with_timezone(&BILLING_ZONE).day());
    }
    let short = ends.iter().position(|d| *d < 31);
    assert!(
        short.is_some_and(|i| ends[i + 1..].contains(&31)),
        "clamped to a shorter month, then the 31st again: {ends:?}"
    );

    // BASIC bought now carries PRO's unused months: the new period ends a
    // month from the payment plus the carry, and is anchored on that end.
    let order = pay(&api, &db, user, "BASIC", 49_000).await;
    let p = payment_row(&db, &order).await;
    assert!(p.carried_seconds.unwrap_or(0) > 0, "{p:?}");
    let new_end = p.grant_end.unwrap();
    let s = tests::subscription_row(&db, user).await;
    let local = new_end.with_timezone(&BILLING_ZONE);
    assert_eq!(
        (s.billing_anchor_day, s.billing_anchor_time),
        (Some(local.day() as i16), Some(local.naive_local().time()))
    );
    assert_eq!(
        quote_end(&api, user, "BASIC").await,
        months_after(new_end, 1)
    );
}
