//! Late payments, refunds and chargebacks against the real api and worker,
//! PostgreSQL and Redis, with provider_a's status API faked over HTTP
//! ([`ProviderAStatusApi`]) and provider_b's notifications signed with the
//! `Signature` header as DOKU documents them:
//!
//! * a verified PAID report for a payment already EXPIRED or FAILED makes it
//!   PAID (the customer paid) with an `audit_logs` row `late_payment`;
//! * a verified refund or chargeback of the whole amount (provider_a's
//!   `partial_` forms included once they cover it) makes the payment
//!   REFUNDED and takes back the period it bought: the subscription ends
//!   where it would have without that payment, FREE at once if nothing else
//!   was paid; a partial refund changes nothing;
//! * a refund or chargeback notice the status API does not confirm changes
//!   nothing (`payment.unconfirmed`), and neither does a confirmation given
//!   for a payment that moved before it was settled.

use std::time::Duration;

use chrono::Utc;
use entity::{
    billing::payment::{
        provider_a_signature, provider_b_check_word, provider_b_signature, ProviderBRequest,
    },
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
        webhook_events,
    },
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, QueryFilter,
    Set,
};
use serde_json::{json, Value};
use tests::{
    client, connect_db, pending_payment, pending_payment_at, wait_until, EnvMap, Proc,
    ProviderAStatusApi, Reply, Stack,
};
use uuid::Uuid;

const A_KEY: &str = "SB-Mid-server-refund-tests";
const B_CLIENT: &str = "BRN-0001-REFUNDS";
const B_SECRET: &str = "SK-refund-tests-secret";
const B_PATH: &str = "/api/webhooks/provider_b";

fn env(stack: &Stack, status: &wiremock::MockServer) -> EnvMap {
    stack
        .env()
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status.uri())
        .with("PROVIDER_B_CLIENT_ID", B_CLIENT)
        .with("PROVIDER_B_SECRET_KEY", B_SECRET)
}

/// A provider_a notification as Midtrans documents it, with `extra` fields.
fn a_notice(order_id: &str, status: &str, extra: Value) -> Vec<u8> {
    let mut v = json!({
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": status,
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": "200",
        "signature_key": provider_a_signature(order_id, "200", "99000.00", A_KEY),
        "payment_type": "credit_card",
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": "99000.00",
        "fraud_status": "accept",
        "currency": "IDR",
    });
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::to_vec(&v).unwrap()
}

/// A provider_b notification as DOKU documents it, with its headers.
fn b_notice(order_id: &str, status: &str) -> (Vec<u8>, Vec<(&'static str, String)>) {
    let word = provider_b_check_word(B_CLIENT, order_id, "99000", status, B_SECRET);
    let request_id = Uuid::new_v4().to_string();
    let body = format!(
        r#"{{"service":{{"id":"VIRTUAL_ACCOUNT"}},"acquirer":{{"id":"BCA"}},"channel":{{"id":"VIRTUAL_ACCOUNT_BCA"}},"order":{{"invoice_number":"{order_id}","amount":99000}},"transaction":{{"status":"{status}","date":"2026-11-23T10:00:00Z","original_request_id":"req-{order_id}"}},"security":{{"check_word":"{word}"}}}}"#
    );
    let ts = "2026-11-23T10:00:01Z";
    let sig = provider_b_signature(
        B_SECRET,
        &ProviderBRequest {
            client_id: B_CLIENT,
            request_id: &request_id,
            timestamp: ts,
            target: B_PATH,
            body: Some(body.as_bytes()),
        },
    );
    let headers = vec![
        ("client-id", B_CLIENT.to_string()),
        ("request-id", request_id),
        ("request-timestamp", ts.to_string()),
        ("signature", sig),
    ];
    (body.into_bytes(), headers)
}

async fn post(api: &Proc, path: &str, body: Vec<u8>, headers: &[(&str, String)]) -> Reply {
    let mut req = client()
        .post(api.url(path))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = Reply::send(req).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"received": true}), "{}", r.text);
    r
}

async fn payment(db: &DatabaseConnection, order_id: &str) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

async fn set_status(db: &DatabaseConnection, order_id: &str, status: PaymentStatus) {
    let mut am = payment(db, order_id).await.into_active_model();
    am.status = Set(status);
    am.update(db).await.unwrap();
}

async fn wait_status(db: &DatabaseConnection, order_id: &str, status: PaymentStatus) {
    let ok = wait_until(Duration::from_secs(30), || async {
        payment(db, order_id).await.status == status
    })
    .await;
    assert!(
        ok,
        "{order_id} is {:?}, not {status:?}",
        payment(db, order_id).await.status
    );
}

/// Waits until `n` events of the order are settled.
async fn wait_settled(db: &DatabaseConnection, order_id: &str, n: usize) {
    let ok = wait_until(Duration::from_secs(30), || async {
        webhook_events::Entity::find()
            .filter(webhook_events::Column::OrderId.eq(order_id))
            .filter(webhook_events::Column::SettledAt.is_not_null())
            .all(db)
            .await
            .unwrap()
            .len()
            == n
    })
    .await;
    assert!(ok, "{n} events of {order_id} settled");
}

async fn actions(db: &DatabaseConnection, target: &str) -> Vec<String> {
    let mut rows = audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(target))
        .all(db)
        .await
        .unwrap();
    rows.sort_by_key(|a| a.created_at);
    rows.into_iter().map(|a| a.action).collect()
}

/// The customer paid after the payment expired (or failed): they get what
/// they paid for, and the audit trail says it was late.
#[tokio::test(flavor = "multi_thread")]
async fn a_verified_paid_report_for_an_expired_or_failed_payment_pays_late() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;

    let (user_a, order_a) = pending_payment(&db, "provider_a").await;
    set_status(&db, &order_a, PaymentStatus::Expired).await;
    status.set(&order_a, "settlement");
    post(
        &api,
        "/api/webhooks/provider_a",
        a_notice(&order_a, "settlement", json!({})),
        &[],
    )
    .await;
    wait_status(&db, &order_a, PaymentStatus::Paid).await;
    assert_eq!(actions(&db, &order_a).await, vec!["late_payment"]);
    assert_eq!(tests::subscription_row(&db, user_a).await.plan, "PRO");

    let (user_b, order_b) = pending_payment(&db, "provider_b").await;
    set_status(&db, &order_b, PaymentStatus::Failed).await;
    let (body, headers) = b_notice(&order_b, "SUCCESS");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &order_b, PaymentStatus::Paid).await;
    assert_eq!(actions(&db, &order_b).await, vec!["late_payment"]);
    assert_eq!(tests::subscription_row(&db, user_b).await.plan, "PRO");
}

/// provider_a: a partial refund leaves the payment PAID; once the refunds
/// cover the whole amount the payment is REFUNDED and the only period it
/// bought is gone: FREE at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_provider_a_refund_takes_back_the_period() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;
    assert_eq!(tests::subscription_row(&db, user).await.plan, "PRO");

    let part = json!({"refund_amount": "1000.00", "refund_chargeback_id": 1});
    status.set_with(&order, "partial_refund", part.clone());
    post(&api, path, a_notice(&order, "partial_refund", part), &[]).await;
    wait_settled(&db, &order, 2).await;
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Paid);
    assert_eq!(tests::subscription_row(&db, user).await.plan, "PRO");

    let whole = json!({"refund_amount": "99000.00", "refund_chargeback_id": 2});
    status.set_with(&order, "partial_refund", whole.clone());
    post(&api, path, a_notice(&order, "partial_refund", whole), &[]).await;
    wait_status(&db, &order, PaymentStatus::Refunded).await;
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!(sub.plan, "FREE", "nothing else was paid: FREE at once");
    assert_eq!(sub.current_period_end, None);
    assert_eq!(
        actions(&db, &order).await,
        vec!["payment.settle", "payment.settle"]
    );
    assert_eq!(
        actions(&db, &user.to_string()).await,
        vec!["subscription.take_back"]
    );
}

/// provider_a: the refund figure of a partial-refund notice is not covered
/// by its signature, so a partial refund is recorded only when the status
/// API states the same total: an edited notice (the payment still settled
/// there) or an overstated one records nothing, and does not make the
/// genuine notice with that figure a duplicate; a genuine one records it.
#[tokio::test(flavor = "multi_thread")]
async fn a_partial_refund_is_recorded_only_as_the_status_api_states_it() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;
    let refunded = || async { payment(&db, &order).await.refunded_amount };

    // Edited: a genuine `settlement` notice re-labelled, its signature intact.
    let big = json!({"refund_amount": "98999.00", "refund_chargeback_id": 1});
    post(
        &api,
        path,
        a_notice(&order, "partial_refund", big.clone()),
        &[],
    )
    .await;
    wait_settled(&db, &order, 2).await;
    assert_eq!(refunded().await, 0);
    // Overstated: the API states 1,000 refunded.
    status.set_with(
        &order,
        "partial_refund",
        json!({"refund_amount": "1000.00"}),
    );
    post(
        &api,
        path,
        a_notice(&order, "partial_refund", big.clone()),
        &[],
    )
    .await;
    wait_settled(&db, &order, 3).await;
    assert_eq!(refunded().await, 0);
    assert_eq!(
        actions(&db, &order).await,
        vec![
            "payment.settle",
            "payment.unconfirmed",
            "payment.unconfirmed"
        ]
    );
    // Genuine: 1,000, then 98,999 in all (the figure the edits used).
    let small = json!({"refund_amount": "1000.00", "refund_chargeback_id": 1});
    post(&api, path, a_notice(&order, "partial_refund", small), &[]).await;
    wait_settled(&db, &order, 4).await;
    assert_eq!(refunded().await, 1_000);
    status.set_with(&order, "partial_refund", big.clone());
    post(&api, path, a_notice(&order, "partial_refund", big), &[]).await;
    wait_settled(&db, &order, 5).await;
    let p = payment(&db, &order).await;
    assert_eq!((p.status, p.refunded_amount), (PaymentStatus::Paid, 98_999));
}

/// provider_a: each notice of a refund or chargeback series is its own
/// event however it states the total (`chargeback_amount`, `refunds[]`): the
/// second partial chargeback, covering the whole amount, is not taken for a
/// repeat of the first, and the payment is REFUNDED.
#[tokio::test(flavor = "multi_thread")]
async fn a_series_of_partial_chargebacks_is_not_taken_for_repeats() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;

    for (n, total) in [(2, "20000.00"), (3, "99000.00")] {
        let figures = json!({"chargeback_amount": total});
        status.set_with(&order, "partial_chargeback", figures.clone());
        post(
            &api,
            path,
            a_notice(&order, "partial_chargeback", figures),
            &[],
        )
        .await;
        wait_settled(&db, &order, n).await;
    }
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Refunded);
    assert_eq!(tests::subscription_row(&db, user).await.plan, "FREE");
}

/// provider_a: an edited copy of a notice, recorded first and waiting for
/// the status API, does not make the genuine notice with the same status and
/// total a repeat; the same edited body again is a repeat.
#[tokio::test(flavor = "multi_thread")]
async fn an_edited_notice_waiting_for_confirmation_does_not_swallow_the_genuine_one() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    // Retries after the status API is back come within a second, well
    // inside the wait below.
    let api = stack
        .api_with_worker(&env(&stack, &status_api).with("JOB_RETRY_BASE_SECS", "1"))
        .await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;

    status.set_down(true);
    let edited = a_notice(
        &order,
        "partial_refund",
        json!({"refund_amount": "60000.00", "refunds": [{"refund_amount": "60000.00"}]}),
    );
    post(&api, path, edited.clone(), &[]).await;
    // The provider refunds 60,000 and notifies: recorded, not a repeat.
    let genuine = json!({"refund_amount": "60000.00"});
    status.set_with(&order, "partial_refund", genuine.clone());
    post(&api, path, a_notice(&order, "partial_refund", genuine), &[]).await;
    status.set_down(false);
    wait_settled(&db, &order, 3).await;
    let p = payment(&db, &order).await;
    assert_eq!((p.status, p.refunded_amount), (PaymentStatus::Paid, 60_000));
    // Replaying the edited body, or more edited copies of it (the signature
    // does not cover `transaction_id`), is a repeat, not another question
    // to the status API: nothing is recorded, so nothing is queued to ask.
    let asked = status.asked();
    let events = || async {
        webhook_events::Entity::find()
            .filter(webhook_events::Column::OrderId.eq(order.as_str()))
            .all(&db)
            .await
            .unwrap()
            .len()
    };
    let recorded = events().await;
    let copies = (0..5).map(|i| {
        a_notice(
            &order,
            "partial_refund",
            json!({"refund_amount": "60000.00", "refunds": [{"refund_amount": "60000.00"}], "copy": i}),
        )
    });
    for body in std::iter::once(edited).chain(copies) {
        let r = Reply::send(
            client()
                .post(api.url(path))
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        assert_eq!(
            r.json,
            json!({"received": true, "duplicate": true}),
            "{}",
            r.text
        );
    }
    assert_eq!(events().await, recorded, "no copy was recorded");
    assert_eq!(status.asked(), asked, "no more status questions");
}

/// provider_a: edited copies of a notice that the status API does not
/// confirm (their bodies differ in what the signature does not cover) are
/// recorded four times at most, the first and three beside it, then
/// answered as repeats: each one recorded costs a status-API question.
#[tokio::test(flavor = "multi_thread")]
async fn edited_copies_of_an_unconfirmed_notice_are_bounded() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    let (_, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;
    let asked = status.asked();

    let mut recorded = 0;
    for i in 0..10 {
        let body = a_notice(
            &order,
            "partial_refund",
            json!({"refund_amount": "50000.00", "copy": i}),
        );
        let r = Reply::send(
            client()
                .post(api.url(path))
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        if r.json.get("duplicate").is_none() {
            recorded += 1;
        }
    }
    assert_eq!(recorded, 4, "the first and three beside it");
    wait_settled(&db, &order, 5).await;
    assert_eq!(status.asked() - asked, 4, "one status question each");
    assert_eq!(payment(&db, &order).await.refunded_amount, 0);
}

/// provider_b: of two chained PRO months, refunding the second ends the
/// subscription where the first ended; refunding the first too leaves FREE.
#[tokio::test(flavor = "multi_thread")]
async fn provider_b_refunds_take_back_each_period() {
    let stack = Stack::new().await;
    let (status_api, _) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (user, first) = pending_payment(&db, "provider_b").await;
    let (body, headers) = b_notice(&first, "SUCCESS");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &first, PaymentStatus::Paid).await;
    let first_end = tests::subscription_row(&db, user)
        .await
        .current_period_end
        .unwrap();

    let second = pending_payment_at(&db, user, "provider_b", Utc::now()).await;
    let (body, headers) = b_notice(&second, "SUCCESS");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &second, PaymentStatus::Paid).await;
    let renewed = tests::subscription_row(&db, user).await;
    assert_eq!(
        renewed.current_period_end,
        Some(tests::months_after(
            tests::payment_row(&db, &first).await.paid_at.unwrap(),
            2
        )),
        "the renewal extended the period by the month anchored on the first payment"
    );

    let (body, headers) = b_notice(&second, "REFUND");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &second, PaymentStatus::Refunded).await;
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!(sub.plan, "PRO");
    assert_eq!(
        sub.current_period_end,
        Some(first_end),
        "back to where it would have ended without the refunded payment"
    );

    let (body, headers) = b_notice(&first, "REFUND");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &first, PaymentStatus::Refunded).await;
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!(sub.plan, "FREE");
    assert_eq!(sub.current_period_end, None);
    assert_eq!(
        actions(&db, &user.to_string()).await,
        vec!["subscription.take_back", "subscription.take_back"]
    );
}

/// provider_a's whole `refund` and `chargeback` (not the `partial_` forms),
/// each confirmed by the status API, make the payment REFUNDED through the
/// webhook and the worker, and take back the only period it bought.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_a_refund_and_a_chargeback_take_back_the_period() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    for back in ["refund", "chargeback"] {
        let (user, order) = pending_payment(&db, "provider_a").await;
        status.set(&order, "settlement");
        post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
        wait_status(&db, &order, PaymentStatus::Paid).await;
        assert_eq!(
            tests::subscription_row(&db, user).await.plan,
            "PRO",
            "{back}"
        );

        status.set(&order, back);
        post(&api, path, a_notice(&order, back, json!({})), &[]).await;
        wait_status(&db, &order, PaymentStatus::Refunded).await;
        let sub = tests::subscription_row(&db, user).await;
        assert_eq!(sub.plan, "FREE", "{back}: nothing else was paid");
        assert_eq!(sub.current_period_end, None, "{back}");
        assert_eq!(
            actions(&db, &order).await,
            vec!["payment.settle", "payment.settle"],
            "{back}"
        );
        assert_eq!(
            actions(&db, &user.to_string()).await,
            vec!["subscription.take_back"],
            "{back}"
        );
    }
}

/// A validly signed refund or chargeback notice that the status API does
/// not confirm (it still reports the payment settled) changes nothing: the
/// payment stays PAID, the plan stays, and the audit trail says
/// `payment.unconfirmed`.
#[tokio::test(flavor = "multi_thread")]
async fn a_refund_or_chargeback_the_status_api_does_not_confirm_is_refused() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";
    for back in ["refund", "chargeback"] {
        let (user, order) = pending_payment(&db, "provider_a").await;
        status.set(&order, "settlement");
        post(&api, path, a_notice(&order, "settlement", json!({})), &[]).await;
        wait_status(&db, &order, PaymentStatus::Paid).await;

        // The provider still reports `settlement`.
        post(&api, path, a_notice(&order, back, json!({})), &[]).await;
        wait_settled(&db, &order, 2).await;
        assert_eq!(
            payment(&db, &order).await.status,
            PaymentStatus::Paid,
            "{back}"
        );
        assert_eq!(
            tests::subscription_row(&db, user).await.plan,
            "PRO",
            "{back}"
        );
        assert_eq!(
            actions(&db, &order).await,
            vec!["payment.settle", "payment.unconfirmed"],
            "{back}"
        );
        assert!(
            actions(&db, &user.to_string()).await.is_empty(),
            "{back}: nothing taken back"
        );
    }
}

/// The confirmation and the settlement read the payment at different times:
/// a payment that moved after the status API was asked (here FAILED, as a
/// `deny` settled meanwhile would leave it) is not moved on the strength of
/// a confirmation given for the row as it was: the event is settled as
/// unconfirmed.
#[tokio::test(flavor = "multi_thread")]
async fn a_payment_that_changed_while_the_status_api_was_asked_is_not_settled() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "settlement");
    status.hold(true);
    post(
        &api,
        "/api/webhooks/provider_a",
        a_notice(&order, "settlement", json!({})),
        &[],
    )
    .await;
    let asked = wait_until(Duration::from_secs(30), || async { status.asked() >= 1 }).await;
    assert!(asked, "the settlement job never asked the status API");
    set_status(&db, &order, PaymentStatus::Failed).await;
    status.hold(false);
    wait_settled(&db, &order, 1).await;
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Failed);
    assert_eq!(tests::subscription_row(&db, user).await.plan, "FREE");
    assert_eq!(actions(&db, &order).await, vec!["payment.unconfirmed"]);
}

/// A reversal of a paid payment is its refund (red team, release binaries:
/// both kept the month): provider_a's `cancel` after a `capture` (Midtrans
/// voids a captured card payment before settlement, the money released),
/// confirmed by the status API, and provider_b's `REVERSED` after `SUCCESS`
/// make the payment REFUNDED and take back the period it bought. A `cancel`
/// of a payment still pending stays a failure.
#[tokio::test(flavor = "multi_thread")]
async fn a_reversal_of_a_paid_payment_takes_back_its_period() {
    let stack = Stack::new().await;
    let (status_api, status) = ProviderAStatusApi::start(A_KEY).await;
    let api = stack.api_with_worker(&env(&stack, &status_api)).await;
    let db = connect_db(&stack).await;
    let path = "/api/webhooks/provider_a";

    let (user, order) = pending_payment(&db, "provider_a").await;
    status.set(&order, "capture");
    post(&api, path, a_notice(&order, "capture", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Paid).await;
    assert_eq!(tests::subscription_row(&db, user).await.plan, "PRO");
    status.set(&order, "cancel");
    post(&api, path, a_notice(&order, "cancel", json!({})), &[]).await;
    wait_status(&db, &order, PaymentStatus::Refunded).await;
    let sub = tests::subscription_row(&db, user).await;
    assert_eq!((sub.plan.as_str(), sub.current_period_end), ("FREE", None));
    assert_eq!(
        actions(&db, &user.to_string()).await,
        vec!["subscription.take_back"]
    );

    let (user_b, paid) = pending_payment(&db, "provider_b").await;
    let (body, headers) = b_notice(&paid, "SUCCESS");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &paid, PaymentStatus::Paid).await;
    let (body, headers) = b_notice(&paid, "REVERSED");
    post(&api, B_PATH, body, &headers).await;
    wait_status(&db, &paid, PaymentStatus::Refunded).await;
    assert_eq!(tests::subscription_row(&db, user_b).await.plan, "FREE");

    let (_, pending) = pending_payment(&db, "provider_a").await;
    status.set(&pending, "cancel");
    post(&api, path, a_notice(&pending, "cancel", json!({})), &[]).await;
    wait_status(&db, &pending, PaymentStatus::Failed).await;
}
