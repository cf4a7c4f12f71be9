//! A renewal that no longer renews has its open checkout ended at the
//! provider, against the real api and worker binaries, PostgreSQL, Redis and
//! a fake Midtrans (provider_a) speaking its documented Snap, Expire
//! Transaction and status answers: the customer who cancels cannot go on to
//! pay a renewal that buys nothing they asked for, and one who paid first
//! keeps what they paid for.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{Duration as Span, Utc};
use entity::entities::{
    payments::{self, PaymentStatus},
    renewals::{self, RenewalStatus},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, QueryFilter, Set};
use serde_json::json;
use tests::{client, connect_db, free_user, poll_until, user_token, EnvMap, Proc, Reply, Stack};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path, path_regex},
    Mock, MockServer, Request, ResponseTemplate,
};

const JWT: &str = "renewal-expire-jwt-0123456789abcdef0123456789";
const SERVICE: &str = "renewal-expire-service-role-0123456789abcdef";
const KEY: &str = "SB-Mid-server-renewal-expire";
const APP_URL: &str = "https://app.example.test";

fn env(stack: &Stack, fake: &MockServer) -> EnvMap {
    stack
        .session_env(JWT, SERVICE)
        .with("APP_URL", APP_URL)
        .with("SCHEDULER_TICK_SECS", "1")
        .with("PAYMENT_PROVIDER", "provider_a")
        .with("PROVIDER_A_SERVER_KEY", KEY)
        .with("PROVIDER_A_BASE_URL", fake.uri())
        .with("PROVIDER_A_API_BASE_URL", fake.uri())
        .with("PROVIDER_TIMEOUT_MS", "2000")
}

/// A PRO subscriber whose period ends in two days, with the open renewal
/// the worker offers; answers the user and the pay link (on `api`).
async fn renewing_user(db: &DatabaseConnection, api: &Proc) -> (Uuid, String) {
    let user = free_user(db).await;
    let mut s = tests::subscription_row(db, user).await.into_active_model();
    s.plan = Set("PRO".into());
    s.current_period_start = Set(Some(Utc::now() - Span::days(28)));
    s.current_period_end = Set(Some(Utc::now() + Span::days(2)));
    sea_orm::ActiveModelTrait::update(s, db).await.unwrap();
    let m = poll_until(
        Duration::from_secs(30),
        || async {
            Reply::send(
                client()
                    .get(api.url("/api/me"))
                    .bearer_auth(user_token(JWT, user)),
            )
            .await
            .json
        },
        |m| m["subscription"]["renewal"]["pay_url"].is_string(),
    )
    .await;
    let link = m["subscription"]["renewal"]["pay_url"].as_str().unwrap();
    let link = format!(
        "{}{}",
        api.url(""),
        &link[link.find("/api/payments/pay/").unwrap()..]
    );
    (user, link)
}

/// Clicks the pay link (no redirect followed); answers the `PENDING`
/// payment it created.
async fn open_checkout(db: &DatabaseConnection, user: Uuid, link: &str) -> payments::Model {
    let r = Reply::send(tests::no_redirects().get(link)).await;
    assert_eq!(r.status, 303, "{}", r.text);
    let p = payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .one(db)
        .await
        .unwrap()
        .expect("the link's payment");
    assert_eq!(p.status, PaymentStatus::Pending);
    assert_eq!(p.provider, "provider_a");
    p
}

async fn cancel(api: &Proc, user: Uuid) {
    let r = Reply::send(
        client()
            .post(api.url("/api/subscription"))
            .bearer_auth(user_token(JWT, user))
            .json(&json!({"action": "cancel"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn payment_status(db: &DatabaseConnection, id: Uuid) -> PaymentStatus {
    payments::Entity::find_by_id(id)
        .one(db)
        .await
        .unwrap()
        .unwrap()
        .status
}

/// The Expire Transaction calls `fake` received for `order_id`.
async fn expire_calls(fake: &MockServer, order_id: &str) -> Vec<Request> {
    fake.received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST" && r.url.path() == format!("/v2/{order_id}/expire"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_renewals_open_checkout_is_expired_at_the_provider_and_a_paid_one_honoured() {
    let stack = Stack::new().await;
    let (fake, status) = tests::ProviderAStatusApi::start(KEY).await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({
            "token": "snap-token",
            "redirect_url": "https://app.sandbox.midtrans.com/snap/v4/redirection/snap-token",
        })))
        .mount(&fake)
        .await;
    let env = env(&stack, &fake);
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let _worker = stack.worker(&env).await;

    // Midtrans answers 407 (expired), or 412 for an order already paid.
    let paid: Arc<Mutex<HashSet<String>>> = Arc::default();
    let paid_orders = paid.clone();
    Mock::given(method("POST"))
        .and(path_regex(r"^/v2/[^/]+/expire$"))
        .respond_with(move |req: &Request| {
            let order = req.url.path().split('/').nth(2).unwrap().to_string();
            let code = if paid_orders.lock().unwrap().contains(&order) {
                "412"
            } else {
                "407"
            };
            ResponseTemplate::new(200).set_body_json(json!({
                "status_code": code,
                "status_message": if code == "407" {
                    "Success, transaction has expired"
                } else {
                    "Merchant cannot modify the status of the transaction"
                },
                "order_id": order,
            }))
        })
        .mount(&fake)
        .await;
    let (user, link) = renewing_user(&db, &api).await;
    let pay = open_checkout(&db, user, &link).await;
    status.set(&pay.order_id, "expire");
    cancel(&api, user).await;
    assert!(
        tests::wait_until(Duration::from_secs(30), || async {
            payment_status(&db, pay.id).await == PaymentStatus::Expired
        })
        .await,
        "the checkout is expired at the provider, then here"
    );
    let calls = expire_calls(&fake, &pay.order_id).await;
    assert_eq!(calls.len(), 1, "one Expire Transaction call");
    use base64::Engine as _;
    assert_eq!(
        calls[0].headers.get("authorization").unwrap(),
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{KEY}:"))
        )
        .as_str()
    );
    let r = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, RenewalStatus::Void);
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!(sub.plan, "PRO", "the paid period runs to its end");
    assert!(sub.cancel_at_period_end);

    // Paid before the cancel reached the provider (its notification not
    // come yet): Midtrans refuses to expire it, and the payment is honoured
    // as time on the plan in force.
    let (user, link) = renewing_user(&db, &api).await;
    let end = tests::subscription_row(&db, user)
        .await
        .current_period_end
        .unwrap();
    let pay = open_checkout(&db, user, &link).await;
    paid.lock().unwrap().insert(pay.order_id.clone());
    status.set(&pay.order_id, "settlement");
    cancel(&api, user).await;
    assert!(
        tests::wait_until(Duration::from_secs(30), || async {
            payment_status(&db, pay.id).await == PaymentStatus::Paid
        })
        .await,
        "the payment the provider holds is settled PAID"
    );
    assert_eq!(expire_calls(&fake, &pay.order_id).await.len(), 1);
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!(sub.plan, "PRO");
    let new_end = sub.current_period_end.unwrap();
    assert!(
        new_end >= end + Span::days(28),
        "a month more for the money: {end} → {new_end}"
    );
}
