//! Payment-provider webhooks against the real api and worker, PostgreSQL and
//! Redis: signed notifications of both providers settle the payment once,
//! repeats answer `duplicate: true`, forged or foreign ones change nothing.
//! provider_a's notices only count once its status API (faked over HTTP,
//! [`ProviderAStatusApi`]) confirms them; provider_b's need the `Signature`
//! header. Late payments, refunds and chargebacks are in `refunds.rs`.

use std::time::Duration;

use entity::{
    billing::payment::{
        provider_a_signature, provider_b_check_word, provider_b_signature, ProviderBRequest,
    },
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
        subscriptions::{self, SubscriptionStatus},
        webhook_events,
    },
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};
use tests::{
    client, connect_db, pending_payment, wait_until, EnvMap, Proc, ProviderAStatusApi, Reply, Stack,
};
use uuid::Uuid;

const A_KEY: &str = "SB-Mid-server-webhook-tests";
const B_CLIENT: &str = "BRN-0001-TEST";
const B_SECRET: &str = "SK-webhook-tests-secret";

/// Both providers configured; provider_a's status API is `status`.
fn env(stack: &Stack, status: &wiremock::MockServer) -> EnvMap {
    stack
        .env()
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status.uri())
        .with("PROVIDER_B_CLIENT_ID", B_CLIENT)
        .with("PROVIDER_B_SECRET_KEY", B_SECRET)
        .with("JOB_RETRY_BASE_SECS", "1")
}

/// A provider_a notification as Midtrans documents it, signed with `key`.
fn a_notification(order_id: &str, status: &str, amount: &str, key: &str) -> Value {
    a_notification_coded(order_id, status, "200", amount, key)
}

/// A provider_a notification with `status_code`, signed with `key`.
fn a_notification_coded(
    order_id: &str,
    status: &str,
    status_code: &str,
    amount: &str,
    key: &str,
) -> Value {
    json!({
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": status,
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": status_code,
        "signature_key": provider_a_signature(order_id, status_code, amount, key),
        "payment_type": "bank_transfer",
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": amount,
        "fraud_status": "accept",
        "currency": "IDR",
        "va_numbers": [{"va_number": "9888800000000000", "bank": "bca"}],
    })
}

async fn post_raw(api: &Proc, path: &str, body: Vec<u8>, headers: &[(&str, String)]) -> Reply {
    let mut req = client()
        .post(api.url(path))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    Reply::send(req).await
}

async fn payment(db: &DatabaseConnection, order_id: &str) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

async fn counts(db: &DatabaseConnection, order_id: &str) -> (u64, u64) {
    let events = webhook_events::Entity::find()
        .filter(webhook_events::Column::OrderId.eq(order_id))
        .count(db)
        .await
        .unwrap();
    let audits = audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(order_id))
        .count(db)
        .await
        .unwrap();
    (events, audits)
}

async fn wait_paid(db: &DatabaseConnection, order_id: &str) {
    let paid = wait_until(Duration::from_secs(30), || async {
        payment(db, order_id).await.status == PaymentStatus::Paid
    })
    .await;
    assert!(paid, "the payment was not settled as PAID within 30 s");
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_a_settlement_pays_once_whatever_is_repeated() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    let body =
        serde_json::to_vec(&a_notification(&order, "settlement", "99000.00", A_KEY)).unwrap();

    let r = post_raw(&api, "/api/webhooks/provider_a", body.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"received": true}));
    wait_paid(&db, &order).await;
    let sub = subscriptions::Entity::find_by_id(user)
        .one(&db)
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

    // The same notification 50 times at once: duplicates, nothing more.
    let repeats = (0..50).map(|_| post_raw(&api, "/api/webhooks/provider_a", body.clone(), &[]));
    for r in futures::future::join_all(repeats).await {
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json, json!({"received": true, "duplicate": true}));
    }
    // A late `pending` does not regress the payment.
    let late = serde_json::to_vec(&a_notification(&order, "pending", "99000.00", A_KEY)).unwrap();
    let r = post_raw(&api, "/api/webhooks/provider_a", late, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let settled_late = wait_until(Duration::from_secs(30), || async {
        webhook_events::Entity::find()
            .filter(webhook_events::Column::OrderId.eq(order.as_str()))
            .filter(webhook_events::Column::SettledAt.is_not_null())
            .count(&db)
            .await
            .unwrap()
            == 2
    })
    .await;
    assert!(
        settled_late,
        "the late event was settled (refused) by the worker"
    );
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Paid);
    assert_eq!(
        counts(&db, &order).await,
        (2, 1),
        "two events, one audit row"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_a_refusals_change_nothing() {
    let stack = Stack::new().await;
    let (status_api, _) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_a").await;
    let path = "/api/webhooks/provider_a";
    let good = a_notification(&order, "settlement", "99000.00", A_KEY);

    let mut forged = good.clone();
    forged["signature_key"] = json!("0".repeat(128));
    let mut truncated = good.clone();
    truncated["signature_key"] = json!(good["signature_key"].as_str().unwrap()[..64].to_string());
    let wrong_key = a_notification(&order, "settlement", "99000.00", "another-server-key");
    let mut tampered_amount = good.clone();
    tampered_amount["gross_amount"] = json!("1.00");
    let mut unsigned = good.clone();
    unsigned.as_object_mut().unwrap().remove("signature_key");
    for (label, body) in [
        ("forged", forged),
        ("truncated", truncated),
        ("wrong key", wrong_key),
        ("tampered amount", tampered_amount),
        ("unsigned", unsigned),
    ] {
        let r = post_raw(&api, path, serde_json::to_vec(&body).unwrap(), &[]).await;
        r.check_problem(Some(401), Some("invalid_signature"), None)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
    }

    // Signed, but for an amount that is not the payment's: 400, nothing recorded.
    let other_amount = a_notification(&order, "settlement", "1000.00", A_KEY);
    post_raw(&api, path, serde_json::to_vec(&other_amount).unwrap(), &[])
        .await
        .assert_problem(400, Some("amount_mismatch"), None);
    // Unknown order: 404.
    let unknown = a_notification("ORD-1-NOSUCHID", "settlement", "99000.00", A_KEY);
    post_raw(&api, path, serde_json::to_vec(&unknown).unwrap(), &[])
        .await
        .assert_problem(404, Some("unknown_order"), None);
    // Not JSON, not an object, a signed but undefined status.
    post_raw(&api, path, b"not json".to_vec(), &[])
        .await
        .assert_problem(400, None, Some("body"));
    post_raw(&api, path, b"[1,2,3]".to_vec(), &[])
        .await
        .assert_problem(400, None, Some("body"));
    let odd = a_notification(&order, "teleported", "99000.00", A_KEY);
    post_raw(&api, path, serde_json::to_vec(&odd).unwrap(), &[])
        .await
        .assert_problem(400, Some("invalid_payload"), Some("transaction_status"));
    // Oversized.
    let mut big = good.clone();
    big["padding"] = json!("x".repeat(70 * 1024));
    let r = post_raw(&api, path, serde_json::to_vec(&big).unwrap(), &[]).await;
    assert_eq!(r.status, 413, "{}", r.text);

    // Nothing was recorded, so nothing can be settled later either.
    assert_eq!(counts(&db, &order).await, (0, 0));
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
}

/// provider_b notification text with the amount written as `amount_text`.
fn b_notification(order_id: &str, status: &str, amount_text: &str) -> String {
    let word = provider_b_check_word(B_CLIENT, order_id, amount_text, status, B_SECRET);
    format!(
        r#"{{"service":{{"id":"VIRTUAL_ACCOUNT"}},"acquirer":{{"id":"BCA"}},"channel":{{"id":"VIRTUAL_ACCOUNT_BCA"}},"order":{{"invoice_number":"{order_id}","amount":{amount_text}}},"virtual_account_info":{{"virtual_account_number":"1900600000000001"}},"transaction":{{"status":"{status}","date":"2026-11-23T10:00:00Z","original_request_id":"req-{order_id}"}},"security":{{"check_word":"{word}"}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_b_success_pays_and_a_bad_signature_header_is_refused() {
    let stack = Stack::new().await;
    let (status_api, _) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_b").await;
    let path = "/api/webhooks/provider_b";
    let body = b_notification(&order, "SUCCESS", "99000");

    // A valid check_word with a Signature header that does not verify: 401.
    let headers = |sig: String| {
        vec![
            ("client-id", B_CLIENT.to_string()),
            ("request-id", "notif-1".to_string()),
            ("request-timestamp", "2026-11-23T10:00:01Z".to_string()),
            ("signature", sig),
        ]
    };
    let bad = headers("HMACSHA256=AAAA".into());
    post_raw(&api, path, body.clone().into_bytes(), &bad)
        .await
        .assert_problem(401, Some("invalid_signature"), None);
    // Tampered status: the check_word no longer verifies.
    let tampered = b_notification(&order, "FAILED", "99000").replace("FAILED", "SUCCESS");
    post_raw(&api, path, tampered.into_bytes(), &[])
        .await
        .assert_problem(401, Some("invalid_signature"), None);
    // A valid check_word alone does not sign the body: the Signature header
    // is required.
    post_raw(&api, path, body.clone().into_bytes(), &[])
        .await
        .assert_problem(401, Some("invalid_signature"), None);
    assert_eq!(counts(&db, &order).await, (0, 0));

    // With a correct Signature header (HMAC over this path and the body).
    let sig = provider_b_signature(
        B_SECRET,
        &ProviderBRequest {
            client_id: B_CLIENT,
            request_id: "notif-1",
            timestamp: "2026-11-23T10:00:01Z",
            target: path,
            body: Some(body.as_bytes()),
        },
    );
    let r = post_raw(&api, path, body.clone().into_bytes(), &headers(sig)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"received": true}));
    wait_paid(&db, &order).await;
    assert_eq!(counts(&db, &order).await, (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn unconfigured_providers_answer_503() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    for path in ["/api/webhooks/provider_a", "/api/webhooks/provider_b"] {
        post_raw(&api, path, b"{}".to_vec(), &[])
            .await
            .assert_problem(503, Some("not_configured"), None);
    }
}

/// Redis down when a notification arrives: 503 and nothing recorded, so the
/// provider's retry once Redis is back is a first delivery that settles.
#[tokio::test(flavor = "multi_thread")]
async fn a_notification_that_cannot_be_queued_is_503_and_its_retry_settles() {
    let stack = Stack::new().await;
    let proxy = tests::TcpProxy::start(&tests::host_port(&stack.redis.url)).await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let env = env(&stack, &status_api)
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "500");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    let body =
        serde_json::to_vec(&a_notification(&order, "settlement", "99000.00", A_KEY)).unwrap();

    proxy.set(tests::ProxyMode::Refuse);
    post_raw(&api, "/api/webhooks/provider_a", body.clone(), &[])
        .await
        .assert_problem(503, Some("queue_unavailable"), None);
    assert_eq!(counts(&db, &order).await, (0, 0), "the record was undone");

    proxy.set(tests::ProxyMode::Forward);
    let _worker = stack.worker(&env).await;
    let r = post_raw(&api, "/api/webhooks/provider_a", body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"received": true}),
        "the retry is a first delivery"
    );
    wait_paid(&db, &order).await;
    assert_eq!(counts(&db, &order).await, (1, 1));
}

/// A provider that hangs up while its notification is being queued (here:
/// Redis frozen, the client gives up after 300 ms) does not leave the event
/// recorded but unqueued: the record-then-enqueue step finishes on its own,
/// undoes the record when the queue does not answer, and the provider's retry
/// is a first delivery that settles at once (the sweep is a day away).
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_hanging_up_mid_enqueue_leaves_no_event_behind() {
    let stack = Stack::new().await;
    let proxy = tests::TcpProxy::start(&tests::host_port(&stack.redis.url)).await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let env = env(&stack, &status_api)
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "1500")
        .with("SETTLEMENT_SWEEP_AFTER_SECS", "86400");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    let body =
        serde_json::to_vec(&a_notification(&order, "settlement", "99000.00", A_KEY)).unwrap();

    proxy.set(tests::ProxyMode::Freeze);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let sent = impatient
        .post(api.url("/api/webhooks/provider_a"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    assert!(
        sent.is_err(),
        "the client was meant to give up first: {sent:?}"
    );
    assert_eq!(
        counts(&db, &order).await,
        (1, 0),
        "recorded, waiting for the frozen queue (DEPENDENCY_TIMEOUT_MS = 1.5 s)"
    );
    let undone = wait_until(Duration::from_secs(15), || async {
        counts(&db, &order).await == (0, 0)
    })
    .await;
    assert!(
        undone,
        "the event recorded for the abandoned request was neither queued nor undone: {:?}",
        counts(&db, &order).await
    );

    proxy.set(tests::ProxyMode::Forward);
    let _worker = stack.worker(&env).await;
    let r = post_raw(&api, "/api/webhooks/provider_a", body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"received": true}),
        "the retry is a first delivery"
    );
    wait_paid(&db, &order).await;
    assert_eq!(counts(&db, &order).await, (1, 1));
}

async fn settled_events(db: &DatabaseConnection, order_id: &str) -> Vec<webhook_events::Model> {
    webhook_events::Entity::find()
        .filter(webhook_events::Column::OrderId.eq(order_id))
        .filter(webhook_events::Column::SettledAt.is_not_null())
        .all(db)
        .await
        .unwrap()
}

async fn audit_actions(db: &DatabaseConnection, order_id: &str) -> Vec<String> {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(order_id))
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.action)
        .collect()
}

/// The attack: provider_a's signature covers `order_id`, `status_code` and
/// `gross_amount`, not `transaction_status`. A validly signed `pending`
/// notice (`status_code` 201) edited to `settlement` must not pay; nor a
/// `settlement` notice the status API does not confirm. Each is settled as
/// unconfirmed with an audit row, and the payment stays PENDING.
#[tokio::test(flavor = "multi_thread")]
async fn an_edited_or_unconfirmed_provider_a_notice_does_not_pay() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "pending");
    let path = "/api/webhooks/provider_a";

    // Signed as the provider signed its `pending` notice (status_code 201),
    // transaction_status edited to `settlement`.
    let mut edited = a_notification_coded(&order, "pending", "201", "99000.00", A_KEY);
    edited["transaction_status"] = json!("settlement");
    let r = post_raw(&api, path, serde_json::to_vec(&edited).unwrap(), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A `settlement` notice with status_code 200 that the status API (still
    // `pending`) does not confirm.
    let unconfirmed = a_notification(&order, "settlement", "99000.00", A_KEY);
    let r = post_raw(&api, path, serde_json::to_vec(&unconfirmed).unwrap(), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);

    let settled = wait_until(Duration::from_secs(30), || async {
        settled_events(&db, &order).await.len() == 2
    })
    .await;
    assert!(settled, "both notices were settled by the worker");
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
    let sub = subscriptions::Entity::find_by_id(user)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sub.plan, "FREE", "nothing was granted");
    for e in settled_events(&db, &order).await {
        assert!(
            e.settlement_error
                .as_deref()
                .is_some_and(|m| m.starts_with("unconfirmed")),
            "{:?}",
            e.settlement_error
        );
    }
    assert_eq!(
        audit_actions(&db, &order).await,
        vec!["payment.unconfirmed", "payment.unconfirmed"]
    );
    assert_eq!(
        status_api
            .received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.url.path() == format!("/v2/{order}/status"))
            .count(),
        1,
        "the status_code 201 notice was refused without asking; the other was asked about"
    );
}

/// While the status API cannot be reached, a provider_a notice is not
/// applied: its settlement job is retried, and pays once the API confirms.
#[tokio::test(flavor = "multi_thread")]
async fn a_notice_waits_for_the_status_api_and_then_pays() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    status.set_down(true);
    let body =
        serde_json::to_vec(&a_notification(&order, "settlement", "99000.00", A_KEY)).unwrap();
    let r = post_raw(&api, "/api/webhooks/provider_a", body, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);

    let asked_twice = wait_until(Duration::from_secs(30), || async {
        status_api.received_requests().await.unwrap().len() >= 2
    })
    .await;
    assert!(asked_twice, "the job retried while the status API was down");
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
    assert!(settled_events(&db, &order).await.is_empty());

    status.set_down(false);
    wait_paid(&db, &order).await;
    assert_eq!(audit_actions(&db, &order).await, vec!["payment.settle"]);
}
