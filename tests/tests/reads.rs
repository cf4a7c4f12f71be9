//! The read API: `GET /api/plans` (public, ETag), `GET /api/me`,
//! `GET /api/payments[/{order_id}]` (own only) and the admin lists
//! `GET /api/admin/users` and `GET /api/admin/audit-logs`: pages of
//! `{items, next_cursor}`, a malformed cursor is 400 naming it, personal
//! reads are `Cache-Control: private, no-store`.

use std::collections::HashSet;

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{json, Value};
use tests::{
    client, connect_db, free_user, hs256_token, pay, pending_payment_at, refund, session_claims,
    Reply, Stack,
};
use uuid::Uuid;

const JWT: &str = "reads-jwt-secret-0123456789abcdef0123456789";
const SERVICE: &str = "reads-service-role-0123456789abcdef0123";

fn token(user: Uuid, email: &str) -> String {
    hs256_token(
        JWT.as_bytes(),
        &session_claims(&user.to_string(), Some(email)),
    )
}

async fn get_auth(url: &str, token: &str) -> Reply {
    Reply::send(client().get(url).bearer_auth(token)).await
}

fn assert_private(r: &Reply) {
    assert_eq!(
        r.header("cache-control"),
        Some("private, no-store"),
        "{:?}",
        r.headers
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plans_are_public_with_an_etag() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let r = tests::get(&api.url("/api/plans")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["currency"], "IDR");
    let plans = r.json["plans"].as_array().unwrap();
    let ids: Vec<&str> = plans.iter().map(|p| p["id"].as_str().unwrap()).collect();
    for id in ["FREE", "PRO"] {
        assert!(ids.contains(&id), "{ids:?}");
    }
    for p in plans {
        for f in ["name", "price", "purchasable", "ai_requests_per_5min"] {
            assert!(!p[f].is_null(), "{f}: {p}");
        }
        assert!(p.get("ai_tokens_per_month").is_some(), "{p}");
    }
    let free = plans.iter().find(|p| p["id"] == "FREE").unwrap();
    assert_eq!(free["purchasable"], false);
    let etag = r.header("etag").expect("an ETag").to_string();

    let again = Reply::send(
        client()
            .get(api.url("/api/plans"))
            .header("if-none-match", &etag),
    )
    .await;
    assert_eq!(again.status, 304, "{}", again.text);
    assert!(again.text.is_empty());
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    let weak = Reply::send(
        client()
            .get(api.url("/api/plans"))
            .header("if-none-match", format!("\"nope\", W/{etag}")),
    )
    .await;
    assert_eq!(weak.status, 304);
    let other = Reply::send(
        client()
            .get(api.url("/api/plans"))
            .header("if-none-match", "\"stale\""),
    )
    .await;
    assert_eq!(other.status, 200);
    assert_eq!(other.json, r.json);
}

#[tokio::test(flavor = "multi_thread")]
async fn me_shows_plan_subscription_and_ai_usage() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.session_env(JWT, SERVICE)).await;
    let user = Uuid::new_v4();
    let t = token(user, "me@example.com");

    let r = get_auth(&api.url("/api/me"), &t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_private(&r);
    let b = &r.json;
    assert_eq!(b["id"], user.to_string());
    assert_eq!(b["email"], "me@example.com");
    assert_eq!(b["role"], "member");
    assert_eq!(b["profile"]["full_name"], Value::Null);
    assert_eq!(b["subscription"]["plan"], "FREE");
    assert_eq!(b["subscription"]["status"], "active");
    assert_eq!(b["subscription"]["current_period_end"], Value::Null);
    assert_eq!(b["subscription"]["cancel_at_period_end"], false);
    assert_eq!(b["ai_usage"]["tokens_used"], 0);
    let limit = b["ai_usage"]["tokens_limit"]
        .as_u64()
        .expect("FREE has a quota");
    assert_eq!(b["ai_usage"]["tokens_remaining"], limit);
    assert!(b["ai_usage"]["requests_per_5min"].as_u64().unwrap() >= 1);
    assert!(b["ai_usage"]["resets_at"].as_str().unwrap().contains('T'));

    // A saved profile shows at once (this process wrote it).
    let r = Reply::send(
        client()
            .post(api.url("/api/profile"))
            .bearer_auth(&t)
            .json(&json!({"full_name": "Me Myself"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = get_auth(&api.url("/api/me"), &t).await;
    assert_eq!(r.json["profile"]["full_name"], "Me Myself", "{}", r.text);

    // A PRO subscription and recorded AI usage, written by other processes
    // (the worker's settlement and usage recording; here SQL), show up on
    // this api and on another one that has the account in memory: each
    // drops it when PostgreSQL notifies the change.
    let other = stack.api(&stack.session_env(JWT, SERVICE)).await;
    let r = get_auth(&other.url("/api/me"), &t).await;
    assert_eq!(r.json["profile"]["full_name"], "Me Myself", "{}", r.text);
    let pool = stack.db.pool().await;
    let end = Utc::now() + ChronoDuration::days(30);
    sqlx_exec(
        &pool,
        "UPDATE subscriptions SET plan = 'PRO', current_period_end = $2, cancel_at_period_end = true WHERE user_id = $1",
        user,
        end,
    )
    .await;
    insert_usage(&pool, user, 100, 23).await;
    for a in [&api, &other] {
        let url = a.url("/api/me");
        let r = tests::poll_until(
            std::time::Duration::from_secs(30),
            || get_auth(&url, &t),
            |r: &Reply| {
                r.json["subscription"]["plan"] == "PRO" && r.json["ai_usage"]["tokens_used"] == 123
            },
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let b = &r.json;
        assert_eq!(b["profile"]["full_name"], "Me Myself");
        assert_eq!(b["subscription"]["plan"], "PRO", "{b}");
        assert_eq!(b["subscription"]["status"], "cancel_at_period_end");
        assert_eq!(b["subscription"]["cancel_at_period_end"], true);
        assert!(b["subscription"]["current_period_end"].is_string(), "{b}");
        assert_eq!(b["ai_usage"]["tokens_used"], 123, "{b}");
        let pro_limit = b["ai_usage"]["tokens_limit"].as_u64().unwrap();
        assert_eq!(b["ai_usage"]["tokens_remaining"], pro_limit - 123);
    }

    // A second usage row: only the usage moves.
    insert_usage(&pool, user, 7, 0).await;
    assert!(
        tests::wait_until(std::time::Duration::from_secs(30), || async {
            get_auth(&other.url("/api/me"), &t).await.json["ai_usage"]["tokens_used"] == 130
        })
        .await,
        "the second usage row never showed"
    );

    // No token: 401.
    let r = tests::get(&api.url("/api/me")).await;
    r.assert_problem(401, None, None);
}

/// Records AI usage of `user` now, as the worker's usage job does.
async fn insert_usage(pool: &sqlx::PgPool, user: Uuid, input: i32, output: i32) {
    sqlx::query(
        "INSERT INTO ai_usage (id, user_id, provider, model, route, input_tokens, output_tokens, aborted, estimated, created_at) \
         VALUES ($1, $2, 'openai', 'm', 'chat', $3, $4, false, false, now())",
    )
    .bind(Uuid::new_v4())
    .bind(user)
    .bind(input)
    .bind(output)
    .execute(pool)
    .await
    .expect("insert usage");
}

async fn sqlx_exec(pool: &sqlx::PgPool, sql: &'static str, user: Uuid, at: chrono::DateTime<Utc>) {
    sqlx::query(sql)
        .bind(user)
        .bind(at)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

use sea_orm::sqlx;

#[tokio::test(flavor = "multi_thread")]
async fn payments_are_own_newest_first_and_paged() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.session_env(JWT, SERVICE)).await;
    let db = connect_db(&stack).await;
    let me = free_user(&db).await;
    let other = free_user(&db).await;
    let base = Utc::now() - ChronoDuration::hours(1);
    let mut mine = Vec::new();
    for i in 0..5 {
        // Two of them at the same instant: the id breaks the tie.
        let at = base + ChronoDuration::seconds(i.min(3));
        mine.push((at, pending_payment_at(&db, me, "provider_b", at).await));
    }
    let theirs = pending_payment_at(&db, other, "provider_b", base).await;
    let t = token(me, &format!("{me}@example.com"));

    let r = get_auth(&api.url("/api/payments"), &t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_private(&r);
    assert_eq!(r.json["items"].as_array().unwrap().len(), 5);
    assert_eq!(r.json["next_cursor"], Value::Null, "{}", r.text);
    let first = &r.json["items"][0];
    for f in [
        "order_id",
        "plan",
        "amount",
        "currency",
        "provider",
        "status",
        "created_at",
    ] {
        assert!(!first[f].is_null(), "{f}: {first}");
    }
    assert_eq!(first["status"], "PENDING");
    let times: Vec<&str> = r.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["created_at"].as_str().unwrap())
        .collect();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted, "newest first");

    // Pages of 2: every payment once, none of the other user's.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => api.url(&format!("/api/payments?limit=2&cursor={c}")),
            None => api.url("/api/payments?limit=2"),
        };
        let r = get_auth(&url, &t).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let items = r.json["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        seen.extend(
            items
                .iter()
                .map(|p| p["order_id"].as_str().unwrap().to_string()),
        );
        match r.json["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), 5);
    assert!(!seen.contains(&theirs));

    // One payment: mine 200, theirs 404 as an unknown one.
    let (_, order) = &mine[0];
    let r = get_auth(&api.url(&format!("/api/payments/{order}")), &t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_private(&r);
    assert_eq!(r.json["order_id"], order.as_str());
    assert_eq!(r.json["paid_at"], Value::Null);
    let r = get_auth(&api.url(&format!("/api/payments/{theirs}")), &t).await;
    r.assert_problem(404, Some("unknown_order"), None);
    let r = get_auth(&api.url("/api/payments/ORD-0-NOPE"), &t).await;
    r.assert_problem(404, Some("unknown_order"), None);

    // An empty cursor is the first page.
    let first = get_auth(&api.url("/api/payments?limit=2"), &t).await;
    let empty = get_auth(&api.url("/api/payments?limit=2&cursor="), &t).await;
    assert_eq!(empty.status, 200, "{}", empty.text);
    assert_eq!(empty.json, first.json);

    // Malformed cursor and limits: 400 naming them.
    for bad in [
        "nope",
        "MTIz",
        "01JD5X9Q6Z8K4M2N7P3R5T1V9W",
        "1.0000000000000000000000000000000A",
    ] {
        let r = get_auth(&api.url(&format!("/api/payments?cursor={bad}")), &t).await;
        r.assert_problem(400, None, Some("cursor"));
    }
    for bad in ["0", "101"] {
        let r = get_auth(&api.url(&format!("/api/payments?limit={bad}")), &t).await;
        r.assert_problem(400, None, Some("limit"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_lists_users_and_audit_logs() {
    let stack = Stack::new().await;
    let boss = Uuid::new_v4();
    let env = stack
        .session_env(JWT, SERVICE)
        .with("ADMIN_USER_IDS", boss.to_string());
    let api = stack.api(&env).await;
    let boss_t = token(boss, "boss@example.com");
    // First sight of the admin.
    let r = get_auth(&api.url("/api/me"), &boss_t).await;
    assert_eq!(r.json["role"], "admin", "{}", r.text);

    let db = connect_db(&stack).await;
    let mut users = Vec::new();
    for _ in 0..3 {
        users.push(free_user(&db).await);
    }
    // A member is refused.
    let member_t = token(users[0], &format!("{}@example.com", users[0]));
    for path in ["/api/admin/users", "/api/admin/audit-logs"] {
        let r = get_auth(&api.url(path), &member_t).await;
        r.assert_problem(403, Some("forbidden"), None);
    }

    let r = get_auth(&api.url("/api/admin/users?limit=2"), &boss_t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_private(&r);
    assert_eq!(r.json["items"].as_array().unwrap().len(), 2);
    let next = r.json["next_cursor"]
        .as_str()
        .expect("more users")
        .to_string();
    let r2 = get_auth(
        &api.url(&format!("/api/admin/users?limit=2&cursor={next}")),
        &boss_t,
    )
    .await;
    assert_eq!(r2.status, 200, "{}", r2.text);
    let total =
        r.json["items"].as_array().unwrap().len() + r2.json["items"].as_array().unwrap().len();
    assert_eq!(total, 4, "three members and the admin");
    assert_eq!(r2.json["next_cursor"], Value::Null);

    // Search by email (ignoring case), with role and plan.
    let needle = users[1].to_string()[..13].to_uppercase();
    let r = get_auth(
        &api.url(&format!("/api/admin/users?query={needle}")),
        &boss_t,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let items = r.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", r.text);
    assert_eq!(items[0]["id"], users[1].to_string());
    assert_eq!(items[0]["role"], "member");
    assert_eq!(items[0]["plan"], "FREE");
    let r = get_auth(&api.url("/api/admin/users?query=%25"), &boss_t).await;
    assert_eq!(
        r.json["items"].as_array().unwrap().len(),
        0,
        "% is literal: {}",
        r.text
    );
    let r = get_auth(&api.url("/api/admin/users?query=boss"), &boss_t).await;
    assert_eq!(r.json["items"][0]["role"], "admin", "{}", r.text);

    // Role changes write audit rows; the list filters by actor and action.
    for u in &users[..2] {
        let r = Reply::send(
            client()
                .post(api.url("/api/admin/users/role"))
                .bearer_auth(&boss_t)
                .json(&json!({"user_id": u, "role": "admin"})),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = get_auth(
        &api.url(&format!(
            "/api/admin/audit-logs?actor={boss}&action=role.change&limit=1"
        )),
        &boss_t,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_private(&r);
    let items = r.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["target_id"], users[1].to_string(), "newest first");
    assert_eq!(items[0]["actor_id"], boss.to_string());
    let next = r.json["next_cursor"]
        .as_str()
        .expect("a second row")
        .to_string();
    let r = get_auth(
        &api.url(&format!(
            "/api/admin/audit-logs?actor={boss}&action=role.change&limit=1&cursor={next}"
        )),
        &boss_t,
    )
    .await;
    assert_eq!(r.json["items"][0]["target_id"], users[0].to_string());
    assert_eq!(r.json["next_cursor"], Value::Null);
    let r = get_auth(
        &api.url(&format!("/api/admin/audit-logs?actor={}", Uuid::new_v4())),
        &boss_t,
    )
    .await;
    assert_eq!(r.json["items"], json!([]));

    let r = get_auth(&api.url("/api/admin/audit-logs?actor=nope"), &boss_t).await;
    r.assert_problem(400, None, Some("actor"));
    let r = get_auth(&api.url("/api/admin/audit-logs?cursor=%21%21"), &boss_t).await;
    r.assert_problem(400, None, Some("cursor"));
    let r = get_auth(&api.url("/api/admin/users?cursor=x"), &boss_t).await;
    r.assert_problem(400, None, Some("cursor"));

    // The grant by ADMIN_USER_IDS at first sight is audited: one
    // `role.grant` row by the system, naming the setting.
    let r = get_auth(&api.url("/api/admin/audit-logs?action=role.grant"), &boss_t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let items = r.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", r.text);
    assert_eq!(items[0]["target_type"], "user", "{}", r.text);
    assert_eq!(items[0]["target_id"], boss.to_string(), "{}", r.text);
    assert_eq!(items[0]["actor_id"], Value::Null, "{}", r.text);
    assert_eq!(items[0]["new_value"]["role"], "admin", "{}", r.text);
    assert_eq!(items[0]["new_value"]["by"], "admin_user_ids", "{}", r.text);
    // Seen again, the admin is not granted (nor audited) twice.
    let r = get_auth(&api.url("/api/me"), &boss_t).await;
    assert_eq!(r.json["role"], "admin", "{}", r.text);
    let r = get_auth(
        &api.url("/api/admin/audit-logs?action=role.grant&cursor="),
        &boss_t,
    )
    .await;
    assert_eq!(
        r.json["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_follow_the_write_gates() {
    let stack = Stack::new().await;
    let env = stack
        .session_env(JWT, SERVICE)
        .with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false")
        .with("NEXT_PUBLIC_ENABLE_ADMIN", "false");
    let api = stack.api(&env).await;
    let t = token(Uuid::new_v4(), "gate@example.com");
    for path in [
        "/api/payments",
        "/api/payments/ORD-1-X",
        "/api/admin/users",
        "/api/admin/audit-logs",
    ] {
        let r = get_auth(&api.url(path), &t).await;
        r.assert_problem(503, Some("feature_disabled"), None);
    }
    let r = get_auth(&api.url("/api/me"), &t).await;
    assert_eq!(r.status, 200, "/api/me needs auth only: {}", r.text);
    let r = tests::get(&api.url("/api/plans")).await;
    assert_eq!(r.status, 200);
}

/// Every payment ever paid has a numbered receipt with its money figures,
/// shown on `GET /api/payments/{order_id}` and in the list; a refund shows
/// on it (what went back, and the seconds it took from the period).
#[tokio::test(flavor = "multi_thread")]
async fn a_paid_payment_has_a_numbered_receipt_and_a_refund_shows_on_it() {
    let stack = Stack::new().await;
    let api = stack
        .api_with_worker(&stack.session_env(JWT, SERVICE))
        .await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let t = token(user, "receipts@example.com");
    let receipt = |order: &str| {
        let url = api.url(&format!("/api/payments/{order}"));
        let t = t.clone();
        async move {
            let r = get_auth(&url, &t).await;
            assert_eq!(r.status, 200, "{}", r.text);
            r.json["receipt"].clone()
        }
    };
    let pending = tests::pending_plan_payment(&db, user, "PRO", 99_000, "provider_b").await;
    assert_eq!(
        receipt(&pending).await,
        Value::Null,
        "no receipt before it is paid"
    );
    tests::settle(&api, &db, &pending, 99_000).await;
    let pro = receipt(&pending).await;
    assert_eq!(pro["plan"], "PRO", "{pro}");
    assert_eq!(pro["amount"], 99_000);
    assert_eq!(pro["carried_in_value"], 0);
    assert_eq!(pro["refunded_amount"], 0);

    // A plan change: its receipt states the PRO value carried into it.
    let basic_order = pay(&api, &db, user, "BASIC", 49_000).await;
    let basic = receipt(&basic_order).await;
    assert!(
        basic["number"].as_i64().unwrap() > pro["number"].as_i64().unwrap(),
        "numbered in the order paid: {pro} then {basic}"
    );
    assert_eq!(basic["plan"], "BASIC");
    let carried = basic["carried_in_value"].as_i64().unwrap();
    assert!((98_000..=99_000).contains(&carried), "{basic}");

    // Refunded: what went back and the time it took, on the same receipt.
    refund(&api, &db, &basic_order, 49_000).await;
    let refunded = receipt(&basic_order).await;
    assert_eq!(refunded["number"], basic["number"]);
    assert_eq!(refunded["refunded_amount"], 49_000);
    assert!(
        refunded["taken_back_seconds"].as_i64().unwrap() > 0,
        "{refunded}"
    );
    let list = get_auth(&api.url("/api/payments"), &t).await;
    assert_eq!(list.json["items"][0]["receipt"], refunded, "{}", list.text);
}
