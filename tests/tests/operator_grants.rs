//! Operator grants (`POST /api/admin/subscriptions/grant`) through the real
//! api and worker on PostgreSQL and Redis: an admin gives a plan until a
//! date at zero value, audited with the reason; a member is refused; a
//! paying customer's period of the same plan is extended and a refund of
//! their payment leaves the given time; a period of another plan is never
//! replaced.

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};
use tests::{
    audit_trail, client, connect_db, db_now, free_user, me, pay, payment_row, refund,
    subscription_row, user_token, Proc, Reply, Stack,
};
use uuid::Uuid;

const SECRET: &str = "operator-grant-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-operator-grant-key-0123456789";

async fn start(stack: &Stack, boss: Uuid) -> Proc {
    let env = stack
        .session_env(SECRET, SERVICE_KEY)
        .with("ADMIN_USER_IDS", boss.to_string());
    stack.api_with_worker(&env).await
}

async fn give(api: &Proc, actor: Uuid, body: Value) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/admin/subscriptions/grant"))
            .bearer_auth(user_token(SECRET, actor))
            .json(&body),
    )
    .await
}

fn at(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("a time: {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_gives_a_free_customer_a_plan_until_a_date_audited() {
    let stack = Stack::new().await;
    let boss = Uuid::new_v4();
    let api = start(&stack, boss).await;
    // The admin is seen once (the configured grant of the role).
    assert_eq!(me(&api, SECRET, boss).await["role"], "admin");
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let customer = free_user(&db).await;
    let until = db_now(&pool).await + Duration::days(10);

    // A member may not give.
    let member = free_user(&db).await;
    let body =
        json!({"user_id": customer, "plan": "PRO", "until": until, "reason": "outage credit"});
    give(&api, member, body.clone())
        .await
        .assert_problem(403, Some("forbidden"), None);
    // Bad input names its field.
    let past = db_now(&pool).await - Duration::minutes(1);
    give(
        &api,
        boss,
        json!({"user_id": customer, "plan": "PRO", "until": past, "reason": "x"}),
    )
    .await
    .assert_problem(400, Some("invalid_until"), Some("until"));
    give(
        &api,
        boss,
        json!({"user_id": customer, "plan": "FREE", "until": until, "reason": "x"}),
    )
    .await
    .assert_problem(400, Some("invalid_plan"), Some("plan"));
    give(
        &api,
        boss,
        json!({"user_id": customer, "plan": "PRO", "until": until, "reason": ""}),
    )
    .await
    .assert_problem(400, None, Some("reason"));
    give(
        &api,
        boss,
        json!({"user_id": Uuid::new_v4(), "plan": "PRO", "until": until, "reason": "x"}),
    )
    .await
    .assert_problem(404, Some("unknown_user"), None);
    assert_eq!(subscription_row(&db, customer).await.plan, "FREE");

    let r = give(&api, boss, body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["plan"], "PRO");
    assert_eq!(r.json["extended"], false);
    assert_eq!(at(&r.json["current_period_end"]), until);
    let given = r.json["given_seconds"].as_i64().unwrap();
    assert!((10 * 86_400 - 60..=10 * 86_400).contains(&given), "{given}");

    // What the customer's frontend shows: PRO until the date, set to end
    // there (no renewal is offered for time nobody paid).
    let shown = me(&api, SECRET, customer).await;
    assert_eq!(shown["subscription"]["plan"], "PRO", "{shown}");
    assert_eq!(shown["subscription"]["status"], "cancel_at_period_end");
    assert_eq!(at(&shown["subscription"]["current_period_end"]), until);

    let trail = audit_trail(&db, &customer.to_string(), "subscription.operator_grant").await;
    assert_eq!(
        trail.len(),
        1,
        "one audited grant, none for the refused calls"
    );
    assert_eq!(trail[0].actor_id, Some(boss));
    let new = trail[0].new_value.clone().unwrap();
    assert_eq!(new["reason"], "outage credit");
    assert_eq!(new["value"], 0);
    assert_eq!(new["plan"], "PRO");
    assert_eq!(trail[0].old_value.clone().unwrap()["plan"], "FREE");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_extends_a_paying_customers_period_and_a_refund_leaves_it() {
    let stack = Stack::new().await;
    let boss = Uuid::new_v4();
    let api = start(&stack, boss).await;
    assert_eq!(me(&api, SECRET, boss).await["role"], "admin");
    let db = connect_db(&stack).await;
    let pool = stack.db.pool().await;
    let customer = free_user(&db).await;
    let order = pay(&api, &db, customer, "BASIC", 49_000).await;
    let end = subscription_row(&db, customer)
        .await
        .current_period_end
        .unwrap();

    // Another plan never replaces what the customer paid for.
    give(&api, boss, json!({"user_id": customer, "plan": "PRO", "until": end + Duration::days(7), "reason": "x"}))
        .await
        .assert_problem(409, Some("plan_running"), None);
    // Nothing to give before the paid end.
    give(&api, boss, json!({"user_id": customer, "plan": "BASIC", "until": end - Duration::hours(1), "reason": "x"}))
        .await
        .assert_problem(409, Some("not_later"), None);
    assert_eq!(
        subscription_row(&db, customer).await.current_period_end,
        Some(end)
    );

    let until = end + Duration::days(7);
    let r = give(
        &api,
        boss,
        json!({"user_id": customer, "plan": "BASIC", "until": until, "reason": "a week on us"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["extended"], true);
    assert_eq!(r.json["given_seconds"], 7 * 86_400);
    let s = subscription_row(&db, customer).await;
    assert_eq!(
        (s.plan.as_str(), s.current_period_end),
        ("BASIC", Some(until))
    );
    assert!(
        !s.cancel_at_period_end,
        "the paying customer's renewals go on"
    );

    // The payment is refunded: it takes back what it bought that is still
    // to come, and the given week stays.
    let grant_end = payment_row(&db, &order).await.grant_end.unwrap();
    refund(&api, &db, &order, 49_000).await;
    let now = db_now(&pool).await;
    let s = subscription_row(&db, customer).await;
    assert_eq!(s.plan, "BASIC", "the given week of BASIC runs");
    let left = s.current_period_end.unwrap() - now;
    assert!(
        left <= Duration::days(7) && left > Duration::days(7) - Duration::minutes(1),
        "{left:?} left of the given week (the paid month ended at {grant_end})"
    );
}
