//! Reconciliation against the real worker binary, PostgreSQL and Redis, with
//! the providers' status APIs faked over HTTP (wiremock) with their documented
//! answers: a payment whose notification never came is settled from the
//! provider's status (audit source `status_check`); answers that cannot be
//! trusted (forged signature, unknown order, another amount) change nothing;
//! a payment is asked about at most once per `PAYMENT_RECONCILE_AFTER_SECS`;
//! a payment past `PAYMENT_EXPIRE_AFTER_SECS` is asked about before it
//! expires, and expires only on an answer that it is not paid.

use std::time::Duration;

use base64::Engine as _;
use chrono::{Duration as Span, Utc};
use entity::{
    billing::payment::{provider_a_signature, provider_b_signature, ProviderBRequest},
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
        subscriptions::{self, SubscriptionStatus},
    },
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, QueryFilter,
    Set,
};
use serde_json::{json, Value};
use tests::{connect_db, free_user, pending_payment_at, wait_until, EnvMap, Stack};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

const A_KEY: &str = "SB-Mid-server-reconcile-tests";
const B_CLIENT: &str = "BRN-0001-RECONCILE";
const B_SECRET: &str = "SK-reconcile-tests-secret";
/// `PAYMENT_RECONCILE_AFTER_SECS` in these tests.
const RECONCILE_AFTER: i64 = 600;

/// Ticks every second; status checks after 10 minutes; both providers
/// configured against `fake`.
fn env(stack: &Stack, fake: &MockServer) -> EnvMap {
    stack
        .env()
        .with("SCHEDULER_TICK_SECS", "1")
        .with("PAYMENT_RECONCILE_AFTER_SECS", RECONCILE_AFTER.to_string())
        .with("PAYMENT_EXPIRE_AFTER_SECS", "86400")
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", fake.uri())
        .with("PROVIDER_B_CLIENT_ID", B_CLIENT)
        .with("PROVIDER_B_SECRET_KEY", B_SECRET)
        .with("PROVIDER_B_BASE_URL", fake.uri())
}

/// provider_a's Get Transaction Status answer as Midtrans documents it,
/// signed with `key`.
fn a_status(order_id: &str, status: &str, amount: &str, key: &str) -> Value {
    json!({
        "status_code": "200",
        "status_message": "Success, transaction is found",
        "transaction_id": Uuid::new_v4().to_string(),
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": amount,
        "currency": "IDR",
        "payment_type": "bank_transfer",
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": status,
        "settlement_time": "2026-11-23 10:05:00",
        "fraud_status": "accept",
        "va_numbers": [{"bank": "bca", "va_number": "9888800000000000"}],
        "signature_key": provider_a_signature(order_id, "200", amount, key),
    })
}

/// provider_b's Check Status answer as DOKU documents it.
fn b_status(invoice: &str, status: &str, amount: i64) -> Value {
    json!({
        "order": {"invoice_number": invoice, "amount": amount},
        "transaction": {
            "status": status,
            "date": "2026-11-23T10:05:00Z",
            "original_request_id": Uuid::new_v4().to_string(),
        },
        "service": {"id": "VIRTUAL_ACCOUNT"},
        "acquirer": {"id": "BCA"},
        "channel": {"id": "VIRTUAL_ACCOUNT_BCA"},
        "virtual_account_info": {"virtual_account_number": "1900600000000046"},
    })
}

fn a_path(order: &str) -> String {
    format!("/v2/{order}/status")
}

fn b_path(order: &str) -> String {
    format!("/orders/v1/status/{order}")
}

async fn answer(fake: &MockServer, p: &str, status: u16, body: Value) {
    Mock::given(method("GET"))
        .and(path(p))
        .respond_with(ResponseTemplate::new(status).set_body_json(body))
        .mount(fake)
        .await;
}

async fn requests_to(fake: &MockServer, p: &str) -> Vec<Request> {
    fake.received_requests()
        .await
        .expect("request recording on")
        .into_iter()
        .filter(|r| r.url.path() == p)
        .collect()
}

fn header<'r>(r: &'r Request, name: &str) -> Option<&'r str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

async fn payment(db: &DatabaseConnection, order: &str) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

async fn audits(db: &DatabaseConnection, order: &str) -> Vec<audit_logs::Model> {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(order))
        .all(db)
        .await
        .unwrap()
}

/// A PENDING PRO payment of a new FREE user, created 20 minutes ago (past
/// the reconciliation delay, long before expiry).
async fn old_pending(db: &DatabaseConnection, provider: &str) -> (Uuid, String) {
    let user = free_user(db).await;
    let order = pending_payment_at(db, user, provider, Utc::now() - Span::minutes(20)).await;
    (user, order)
}

async fn wait_paid(db: &DatabaseConnection, order: &str) {
    let paid = wait_until(Duration::from_secs(30), || async {
        payment(db, order).await.status == PaymentStatus::Paid
    })
    .await;
    assert!(
        paid,
        "reconciliation did not settle {order} as PAID in 30 s"
    );
}

async fn assert_activated(db: &DatabaseConnection, user: Uuid, order: &str) {
    let sub = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sub.plan, "PRO");
    assert_eq!(sub.status, SubscriptionStatus::Active);
    let (start, end) = (
        sub.current_period_start.unwrap(),
        sub.current_period_end.unwrap(),
    );
    assert!(
        (28..=31).contains(&(end - start).num_days()),
        "{start} → {end}"
    );
    let rows = audits(db, order).await;
    assert_eq!(rows.len(), 1, "one audit row: {rows:?}");
    let new = rows[0].new_value.as_ref().unwrap();
    assert_eq!(new["source"], "status_check");
    assert_eq!(new["status"], "PAID");
    assert_eq!(rows[0].action, "payment.settle");
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_a_payment_without_webhook_is_settled_from_its_status() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake);
    let _api = stack.api(&env).await; // migrates
    let db = connect_db(&stack).await;
    let (user, order) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&order),
        200,
        a_status(&order, "settlement", "99000.00", A_KEY),
    )
    .await;

    let _worker = stack.worker(&env).await;
    wait_paid(&db, &order).await;
    assert_activated(&db, user, &order).await;

    let reqs = requests_to(&fake, &a_path(&order)).await;
    assert_eq!(reqs.len(), 1, "asked once");
    assert_eq!(reqs[0].method.as_str(), "GET");
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{A_KEY}:"))
    );
    assert_eq!(header(&reqs[0], "authorization"), Some(basic.as_str()));
    assert!(payment(&db, &order).await.reconciled_at.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_b_payment_without_webhook_is_settled_from_its_status() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake);
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let (user, order) = old_pending(&db, "provider_b").await;
    answer(
        &fake,
        &b_path(&order),
        200,
        b_status(&order, "SUCCESS", 99_000),
    )
    .await;

    let _worker = stack.worker(&env).await;
    wait_paid(&db, &order).await;
    assert_activated(&db, user, &order).await;

    let reqs = requests_to(&fake, &b_path(&order)).await;
    assert_eq!(reqs.len(), 1, "asked once");
    let r = &reqs[0];
    assert_eq!(r.method.as_str(), "GET");
    assert!(r.body.is_empty(), "no body");
    assert_eq!(header(r, "client-id"), Some(B_CLIENT));
    let request_id = header(r, "request-id").expect("Request-Id");
    Uuid::parse_str(request_id).expect("Request-Id is a UUID");
    let ts = header(r, "request-timestamp").expect("Request-Timestamp");
    chrono::NaiveDateTime::parse_from_str(ts, "%Y-%m-%dT%H:%M:%SZ")
        .unwrap_or_else(|e| panic!("Request-Timestamp {ts:?}: {e}"));
    assert!(header(r, "digest").is_none(), "no Digest header");
    // The signature the test recomputes: Request-Target the path, no Digest line.
    let expected = provider_b_signature(
        B_SECRET,
        &ProviderBRequest {
            client_id: B_CLIENT,
            request_id,
            timestamp: ts,
            target: &b_path(&order),
            body: None,
        },
    );
    assert_eq!(header(r, "signature"), Some(expected.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn untrustworthy_status_answers_change_nothing() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake);
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;

    // Signed with another server key.
    let (forged_user, forged) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&forged),
        200,
        a_status(&forged, "settlement", "99000.00", "another-server-key"),
    )
    .await;
    // Unknown to provider_a: HTTP 404 with Midtrans's body.
    let (_, unknown_a) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&unknown_a),
        404,
        json!({"status_code": "404", "status_message": "Transaction doesn't exist."}),
    )
    .await;
    // Unknown to provider_a, said with HTTP 200 and status_code "404".
    let (_, unknown_a200) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&unknown_a200),
        200,
        json!({"status_code": "404", "status_message": "Transaction doesn't exist."}),
    )
    .await;
    // Correctly signed, but not the stored amount.
    let (_, wrong_amount) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&wrong_amount),
        200,
        a_status(&wrong_amount, "settlement", "1000.00", A_KEY),
    )
    .await;
    // Unknown to provider_b; and provider_b reporting another amount.
    let (_, unknown_b) = old_pending(&db, "provider_b").await;
    answer(
        &fake,
        &b_path(&unknown_b),
        404,
        json!({"error": {"message": "Order not found"}}),
    )
    .await;
    let (_, wrong_b) = old_pending(&db, "provider_b").await;
    answer(
        &fake,
        &b_path(&wrong_b),
        200,
        b_status(&wrong_b, "SUCCESS", 1_000),
    )
    .await;

    let cases = [
        ("forged", a_path(&forged), forged.clone()),
        ("unknown (HTTP 404)", a_path(&unknown_a), unknown_a),
        (
            "unknown (status_code 404)",
            a_path(&unknown_a200),
            unknown_a200,
        ),
        ("wrong amount", a_path(&wrong_amount), wrong_amount),
        ("unknown to provider_b", b_path(&unknown_b), unknown_b),
        ("provider_b wrong amount", b_path(&wrong_b), wrong_b),
    ];
    let worker = stack.worker(&env).await;
    let asked = wait_until(Duration::from_secs(30), || async {
        for (_, p, _) in &cases {
            if requests_to(&fake, p).await.is_empty() {
                return false;
            }
        }
        true
    })
    .await;
    assert!(asked, "every payment was asked about");
    // Let the jobs finish with what they learnt, and a few more ticks pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (label, p, order) in &cases {
        assert_eq!(
            payment(&db, order).await.status,
            PaymentStatus::Pending,
            "{label}: stays PENDING"
        );
        assert!(audits(&db, order).await.is_empty(), "{label}: no audit row");
        assert_eq!(
            requests_to(&fake, p).await.len(),
            1,
            "{label}: asked once in the period"
        );
    }
    let sub = subscriptions::Entity::find_by_id(forged_user)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sub.plan, "FREE", "the forged answer activated nothing");
    let log = worker.stderr();
    assert!(
        log.contains("signature_key does not verify"),
        "the forged answer is logged"
    );
    assert!(
        log.contains("differs from the stored one"),
        "the amount mismatch is logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payment_is_asked_about_at_most_once_per_period_even_with_two_workers() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake);
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;

    // The provider still says `pending`.
    let (_, order) = old_pending(&db, "provider_a").await;
    answer(
        &fake,
        &a_path(&order),
        200,
        a_status(&order, "pending", "99000.00", A_KEY),
    )
    .await;
    // Created a minute ago: not due yet. Two days ago: left to expiry.
    let user = free_user(&db).await;
    let fresh = pending_payment_at(&db, user, "provider_a", Utc::now() - Span::minutes(1)).await;
    let ancient = pending_payment_at(&db, user, "provider_a", Utc::now() - Span::days(2)).await;

    let _w1 = stack.worker(&env).await;
    let _w2 = stack.worker(&env).await;
    let asked = wait_until(Duration::from_secs(30), || async {
        !requests_to(&fake, &a_path(&order)).await.is_empty()
    })
    .await;
    assert!(asked, "the due payment was asked about");
    // Five more ticks of two workers: no second question in the period.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(requests_to(&fake, &a_path(&order)).await.len(), 1);
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
    assert!(requests_to(&fake, &a_path(&fresh)).await.is_empty());
    assert_eq!(
        payment(&db, &ancient).await.status,
        PaymentStatus::Expired,
        "past PAYMENT_EXPIRE_AFTER_SECS: expired once the provider said it does not know it"
    );
    assert_eq!(
        requests_to(&fake, &a_path(&ancient)).await.len(),
        1,
        "asked once before it expired"
    );

    // Once the last check is a period old, the next tick asks again (once).
    let mut am = payment(&db, &order).await.into_active_model();
    am.reconciled_at = Set(Some(Utc::now() - Span::seconds(RECONCILE_AFTER + 60)));
    am.update(&db).await.unwrap();
    let again = wait_until(Duration::from_secs(30), || async {
        requests_to(&fake, &a_path(&order)).await.len() >= 2
    })
    .await;
    assert!(again, "asked again after the period");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(requests_to(&fake, &a_path(&order)).await.len(), 2);
    assert!(
        audits(&db, &order).await.is_empty(),
        "pending → pending: no change"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_api_failure_is_retried_and_then_settles() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake).with("JOB_RETRY_BASE_SECS", "1");
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let (user, order) = old_pending(&db, "provider_a").await;
    // First a 503, then the signed answer.
    Mock::given(method("GET"))
        .and(path(a_path(&order)))
        .respond_with(ResponseTemplate::new(503).set_body_string("maintenance"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&fake)
        .await;
    answer(
        &fake,
        &a_path(&order),
        200,
        a_status(&order, "settlement", "99000.00", A_KEY),
    )
    .await;

    let _worker = stack.worker(&env).await;
    wait_paid(&db, &order).await;
    assert_activated(&db, user, &order).await;
    assert_eq!(
        requests_to(&fake, &a_path(&order)).await.len(),
        2,
        "the 503, then the retry"
    );
}

/// Payments past `PAYMENT_EXPIRE_AFTER_SECS`: each is asked about first. Paid
/// at the provider → PAID, not EXPIRED; still pending or unknown there →
/// EXPIRED; the provider unreachable → still PENDING.
#[tokio::test(flavor = "multi_thread")]
async fn a_payment_past_expiry_is_asked_about_before_it_expires() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let env = env(&stack, &fake)
        .with("PAYMENT_EXPIRE_AFTER_SECS", "3600")
        .with("JOB_RETRY_BASE_SECS", "1");
    let _api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let two_hours_ago = Utc::now() - Span::hours(2);
    let paid = pending_payment_at(&db, user, "provider_a", two_hours_ago).await;
    let pending = pending_payment_at(&db, user, "provider_a", two_hours_ago).await;
    let unknown = pending_payment_at(&db, user, "provider_a", two_hours_ago).await;
    let unreachable = pending_payment_at(&db, user, "provider_b", two_hours_ago).await;
    answer(
        &fake,
        &a_path(&paid),
        200,
        a_status(&paid, "settlement", "99000.00", A_KEY),
    )
    .await;
    answer(
        &fake,
        &a_path(&pending),
        200,
        a_status(&pending, "pending", "99000.00", A_KEY),
    )
    .await;
    Mock::given(method("GET"))
        .and(path(b_path(&unreachable)))
        .respond_with(ResponseTemplate::new(503).set_body_string("maintenance"))
        .mount(&fake)
        .await;

    let _worker = stack.worker(&env).await;
    wait_paid(&db, &paid).await;
    assert_activated(&db, user, &paid).await;
    let expired = wait_until(Duration::from_secs(30), || async {
        payment(&db, &pending).await.status == PaymentStatus::Expired
            && payment(&db, &unknown).await.status == PaymentStatus::Expired
    })
    .await;
    assert!(expired, "not paid at the provider: expired");
    assert_eq!(requests_to(&fake, &a_path(&unknown)).await.len(), 1);
    let retried = wait_until(Duration::from_secs(30), || async {
        requests_to(&fake, &b_path(&unreachable)).await.len() >= 2
    })
    .await;
    assert!(retried, "the unreachable provider was asked again");
    assert_eq!(
        payment(&db, &unreachable).await.status,
        PaymentStatus::Pending,
        "no answer from the provider: still PENDING"
    );
}
