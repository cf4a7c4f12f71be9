//! Billing fixtures written straight into a test's PostgreSQL database (the
//! schema the api's migrations made): a user on FREE, a payment, an event.

use chrono::{DateTime, Utc};
use entity::billing::payment::provider_a_signature;
use entity::entities::{
    payments::{self, PaymentStatus},
    subscriptions::{self, SubscriptionStatus},
    users, webhook_events,
};
use sea_orm::EntityTrait;
use sea_orm::{ActiveModelTrait, Database, DatabaseConnection, Set};
use serde_json::json;
use uuid::Uuid;

use crate::Stack;

/// A SeaORM connection to the stack's database (after the api migrated it).
pub async fn connect_db(stack: &Stack) -> DatabaseConnection {
    Database::connect(&stack.db.url)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", stack.db.url))
}

/// `BILLING_TIME_ZONE`'s default, in which grants count their months.
pub const BILLING_ZONE: chrono_tz::Tz = chrono_tz::Asia::Jakarta;

/// `n` calendar months after `t` as a customer in [`BILLING_ZONE`] counts
/// them: the same local day (clamped to the month's last day, counted from
/// `t`'s own day, so 31 January + 2 is 31 March) and local time. Computed
/// with chrono on the local time, apart from the product's own calendar.
pub fn months_after(t: DateTime<Utc>, n: u32) -> DateTime<Utc> {
    use chrono::TimeZone;
    let local = t.with_timezone(&BILLING_ZONE).naive_local();
    let later = local
        .checked_add_months(chrono::Months::new(n))
        .expect("a real date");
    BILLING_ZONE
        .from_local_datetime(&later)
        .earliest()
        .expect("Jakarta has no clock changes")
        .with_timezone(&Utc)
}

/// One calendar month after `t` ([`months_after`]).
pub fn month_after(t: DateTime<Utc>) -> DateTime<Utc> {
    months_after(t, 1)
}

/// The FREE subscription row first sight gives `user` at `now`.
fn free_subscription(user: Uuid, now: DateTime<Utc>) -> subscriptions::ActiveModel {
    subscriptions::ActiveModel {
        user_id: Set(user),
        plan: Set("FREE".into()),
        status: Set(SubscriptionStatus::Active),
        cancel_at_period_end: Set(false),
        current_period_start: Set(None),
        current_period_end: Set(None),
        canceled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        renewal_plan: Set(None),
        renewal_plan_price: Set(None),
        billing_anchor_day: Set(None),
        billing_anchor_time: Set(None),
        past_due_at: Set(None),
        grace_ends_at: Set(None),
        price_notice_plan: Set(None),
        price_notice_amount: Set(None),
        price_notice_at: Set(None),
        scheduled_plan: Set(None),
        scheduled_payment_id: Set(None),
    }
}

/// A new user with the FREE subscription first sight gives; answers its id.
pub async fn free_user(db: &DatabaseConnection) -> Uuid {
    let user = Uuid::new_v4();
    let now = Utc::now();
    users::ActiveModel {
        id: Set(user),
        email: Set(Some(format!("{user}@example.com"))),
        created_at: Set(now),
    }
    .insert(db)
    .await
    .expect("insert user");
    free_subscription(user, now)
        .insert(db)
        .await
        .expect("insert subscription");
    user
}

/// A PENDING payment of PRO (99,000 IDR) for `user` with `provider`,
/// created at `created_at`; answers its order id.
pub async fn pending_payment_at(
    db: &DatabaseConnection,
    user: Uuid,
    provider: &str,
    created_at: DateTime<Utc>,
) -> String {
    let order_id = entity::billing::payment::new_order_id("ORD", created_at);
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set("PRO".into()),
        amount: Set(99_000),
        currency: Set("IDR".into()),
        provider: Set(provider.into()),
        status: Set(PaymentStatus::Pending),
        checkout_token: Set(None),
        payment_url: Set(None),
        provider_reference: Set(None),
        paid_at: Set(None),
        idempotency_key: Set(None),
        reconciled_at: Set(None),
        created_at: Set(created_at),
        updated_at: Set(created_at),
        ..Default::default()
    }
    .insert(db)
    .await
    .expect("insert payment");
    order_id
}

/// A user on FREE with a PENDING payment of PRO created now.
pub async fn pending_payment(db: &DatabaseConnection, provider: &str) -> (Uuid, String) {
    let user = free_user(db).await;
    let order = pending_payment_at(db, user, provider, Utc::now()).await;
    (user, order)
}

/// A webhook event recorded at `received_at` and never settled (its job
/// lost), reporting `status` for `order_id`.
pub async fn unsettled_event(
    db: &DatabaseConnection,
    provider: &str,
    order_id: &str,
    status: &str,
    received_at: DateTime<Utc>,
) -> Uuid {
    let id = Uuid::new_v4();
    webhook_events::ActiveModel {
        id: Set(id),
        provider: Set(provider.into()),
        dedupe_key: Set(format!("{order_id}:{status}:{id}")),
        order_id: Set(order_id.into()),
        provider_status: Set(status.into()),
        payload: Set(serde_json::json!({})),
        received_at: Set(received_at),
        settled_at: Set(None),
        settlement_error: Set(None),
    }
    .insert(db)
    .await
    .expect("insert event");
    id
}

/// provider_a's "Get Transaction Status" (`GET /v2/{order_id}/status`),
/// faked over HTTP with the answer Midtrans documents, signed with the
/// server key: what the settlement job asks before a notification may
/// change a payment, and what the expiry check asks. Each order answers the
/// status set for it ([`ProviderAStatusApi::set`]); an order without one is
/// unknown (HTTP 404 with `status_code` `"404"`, as the API answers); while
/// [`ProviderAStatusApi::set_down`] is on, every question gets a 503.
#[derive(Clone)]
pub struct ProviderAStatusApi {
    key: String,
    answers: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, serde_json::Value>>>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While true, questions wait (at most 30 s) before being answered.
    held: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ProviderAStatusApi {
    /// Starts the fake on its own port; `key` is `PROVIDER_A_SERVER_KEY`.
    /// Give its [`wiremock::MockServer::uri`] as `PROVIDER_A_API_BASE_URL`.
    pub async fn start(key: &str) -> (wiremock::MockServer, Self) {
        let fake = ProviderAStatusApi {
            key: key.to_string(),
            answers: Default::default(),
            down: Default::default(),
            held: Default::default(),
            asked: Default::default(),
        };
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::method("GET"))
            .and(wiremock::matchers::path_regex(r"^/v2/[^/]+/status$"))
            .respond_with(fake.clone())
            .mount(&server)
            .await;
        (server, fake)
    }

    /// From now on `order_id` answers `transaction_status` for 99,000.00.
    pub fn set(&self, order_id: &str, transaction_status: &str) {
        self.set_with(order_id, transaction_status, serde_json::json!({}));
    }

    /// Like [`Self::set`], with `extra` fields merged into the answer (e.g.
    /// `refund_amount` of a partial refund).
    pub fn set_with(&self, order_id: &str, transaction_status: &str, extra: serde_json::Value) {
        let amount = "99000.00";
        let mut v = serde_json::json!({
            "status_code": "200",
            "status_message": "Success, transaction is found",
            "transaction_id": Uuid::new_v4().to_string(),
            "order_id": order_id,
            "merchant_id": "G000000000",
            "gross_amount": amount,
            "currency": "IDR",
            "payment_type": "bank_transfer",
            "transaction_time": "2026-11-23 10:00:00",
            "transaction_status": transaction_status,
            "fraud_status": "accept",
            "va_numbers": [{"bank": "bca", "va_number": "9888800000000000"}],
            "signature_key": entity::billing::payment::provider_a_signature(order_id, "200", amount, &self.key),
        });
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            v.extend(extra.clone());
        }
        self.answers.lock().unwrap().insert(order_id.to_string(), v);
    }

    /// While `down`, every question is answered 503.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// While held, a question waits (at most 30 s) until [`Self::hold`]
    /// `false` lets it be answered: a window in which the test changes what
    /// the asker read before asking.
    pub fn hold(&self, held: bool) {
        let (lock, cv) = &*self.held;
        *lock.lock().unwrap() = held;
        cv.notify_all();
    }

    /// How many questions have arrived (answered or held).
    pub fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl wiremock::Respond for ProviderAStatusApi {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        {
            // wiremock serves each mock server from its own thread.
            let (lock, cv) = &*self.held;
            let held = lock.lock().unwrap();
            let _ = cv
                .wait_timeout_while(held, std::time::Duration::from_secs(30), |h| *h)
                .unwrap();
        }
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return wiremock::ResponseTemplate::new(503).set_body_string("maintenance");
        }
        let order = req
            .url
            .path()
            .trim_start_matches("/v2/")
            .trim_end_matches("/status");
        match self.answers.lock().unwrap().get(order) {
            Some(v) => wiremock::ResponseTemplate::new(200).set_body_json(v),
            None => wiremock::ResponseTemplate::new(404).set_body_json(serde_json::json!({
                "status_code": "404",
                "status_message": "Transaction doesn't exist.",
                "id": Uuid::new_v4().to_string(),
            })),
        }
    }
}

/// `n` FREE users, each with one PENDING PRO payment of 99,000 IDR
/// (provider_a), inserted in three statements; answers the order ids.
pub async fn pending_pro_payments(db: &DatabaseConnection, n: usize) -> Vec<String> {
    let now = Utc::now();
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    let orders: Vec<String> = (0..n)
        .map(|_| entity::billing::payment::new_order_id("ORD", now))
        .collect();
    users::Entity::insert_many(ids.iter().map(|&id| users::ActiveModel {
        id: Set(id),
        email: Set(Some(format!("{id}@example.com"))),
        created_at: Set(now),
    }))
    .exec(db)
    .await
    .expect("insert users");
    subscriptions::Entity::insert_many(ids.iter().map(|&id| free_subscription(id, now)))
        .exec(db)
        .await
        .expect("insert subscriptions");
    payments::Entity::insert_many(ids.iter().zip(&orders).map(|(&user, order)| {
        payments::ActiveModel {
            id: Set(Uuid::new_v4()),
            order_id: Set(order.clone()),
            user_id: Set(user),
            plan: Set("PRO".into()),
            amount: Set(99_000),
            currency: Set("IDR".into()),
            provider: Set("provider_a".into()),
            status: Set(PaymentStatus::Pending),
            checkout_token: Set(None),
            payment_url: Set(None),
            provider_reference: Set(None),
            paid_at: Set(None),
            idempotency_key: Set(None),
            reconciled_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
    }))
    .exec(db)
    .await
    .expect("insert payments");
    orders
}

/// A provider_a `settlement` notification for one of
/// [`pending_pro_payments`], as Midtrans documents it, signed with
/// `server_key`.
pub fn provider_a_settlement(order_id: &str, server_key: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": "settlement",
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": "200",
        "signature_key": provider_a_signature(order_id, "200", "99000.00", server_key),
        "payment_type": "bank_transfer",
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": "99000.00",
        "fraud_status": "accept",
        "currency": "IDR",
    }))
    .unwrap()
}

/// The one `bigint` `sql` answers.
pub async fn count(pool: &sea_orm::sqlx::PgPool, sql: &'static str) -> i64 {
    sea_orm::sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// How many payments are PAID.
pub async fn paid_payments(pool: &sea_orm::sqlx::PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM payments WHERE status = 'PAID'").await
}

/// A PENDING payment of `plan` for `amount` IDR by `user` with `provider`,
/// created now; answers its order id.
pub async fn pending_plan_payment(
    db: &DatabaseConnection,
    user: Uuid,
    plan: &str,
    amount: i64,
    provider: &str,
) -> String {
    let now = Utc::now();
    let order_id = entity::billing::payment::new_order_id("ORD", now);
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set(plan.into()),
        amount: Set(amount),
        currency: Set("IDR".into()),
        provider: Set(provider.into()),
        status: Set(PaymentStatus::Pending),
        checkout_token: Set(None),
        payment_url: Set(None),
        provider_reference: Set(None),
        paid_at: Set(None),
        idempotency_key: Set(None),
        reconciled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    }
    .insert(db)
    .await
    .expect("insert payment");
    order_id
}

/// A provider_b notification as DOKU documents it (`check_word` over
/// `amount` and `status`, the `Signature` header over the exact body for the
/// webhook path `target`), with the headers to send it with.
pub fn provider_b_notice(
    client_id: &str,
    secret: &str,
    target: &str,
    order_id: &str,
    amount: i64,
    status: &str,
) -> (Vec<u8>, Vec<(&'static str, String)>) {
    let word = entity::billing::payment::provider_b_check_word(
        client_id,
        order_id,
        &amount.to_string(),
        status,
        secret,
    );
    let request_id = Uuid::new_v4().to_string();
    let body = format!(
        r#"{{"service":{{"id":"VIRTUAL_ACCOUNT"}},"acquirer":{{"id":"BCA"}},"channel":{{"id":"VIRTUAL_ACCOUNT_BCA"}},"order":{{"invoice_number":"{order_id}","amount":{amount}}},"transaction":{{"status":"{status}","date":"2026-11-23T10:00:00Z","original_request_id":"req-{order_id}"}},"security":{{"check_word":"{word}"}}}}"#
    );
    let ts = "2026-11-23T10:00:01Z";
    let sig = entity::billing::payment::provider_b_signature(
        secret,
        &entity::billing::payment::ProviderBRequest {
            client_id,
            request_id: &request_id,
            timestamp: ts,
            target,
            body: Some(body.as_bytes()),
        },
    );
    let headers = vec![
        ("client-id", client_id.to_string()),
        ("request-id", request_id),
        ("request-timestamp", ts.to_string()),
        ("signature", sig),
    ];
    (body.into_bytes(), headers)
}

/// The payment row of `order_id`.
pub async fn payment_row(db: &DatabaseConnection, order_id: &str) -> payments::Model {
    use sea_orm::{ColumnTrait, QueryFilter};
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

/// Waits (30 s at most) until payment `order_id` has `status`.
pub async fn wait_payment_status(db: &DatabaseConnection, order_id: &str, status: PaymentStatus) {
    let ok = crate::wait_until(std::time::Duration::from_secs(30), || async {
        payment_row(db, order_id).await.status == status
    })
    .await;
    assert!(
        ok,
        "{order_id} is {:?}, not {status:?}",
        payment_row(db, order_id).await.status
    );
}

/// Moves the paid period of `order` (its stored grant and the
/// subscription) to `[now − used_days, now + left_days]` by the database's
/// clock; answers (start, end).
pub async fn move_period(
    pool: &sea_orm::sqlx::PgPool,
    order: &str,
    used_days: i64,
    left_days: i64,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let (start, end): (DateTime<Utc>, DateTime<Utc>) = sea_orm::sqlx::query_as(
        "WITH t AS (SELECT clock_timestamp() AS now) \
         UPDATE payments SET grant_start = t.now - make_interval(days => $2::int), \
                             grant_end = t.now + make_interval(days => $3::int) \
         FROM t WHERE order_id = $1 RETURNING grant_start, grant_end",
    )
    .bind(order)
    .bind(used_days as i32)
    .bind(left_days as i32)
    .fetch_one(pool)
    .await
    .expect("move the grant");
    sea_orm::sqlx::query(
        "UPDATE subscriptions SET current_period_start = $2, current_period_end = $3 \
         WHERE user_id = (SELECT user_id FROM payments WHERE order_id = $1)",
    )
    .bind(order)
    .bind(start)
    .bind(end)
    .execute(pool)
    .await
    .expect("move the subscription");
    (start, end)
}

/// Delivers provider_b's notice of `status` for `order_id` at `amount`
/// ([`provider_b_notice`], signed with `client_id` and `secret`) to the
/// api's webhook; asserts 200 and answers the webhook's JSON.
pub async fn send_provider_b_notice(
    api: &crate::Proc,
    client_id: &str,
    secret: &str,
    order_id: &str,
    amount: i64,
    status: &str,
) -> serde_json::Value {
    const PATH: &str = "/api/webhooks/provider_b";
    let (body, headers) = provider_b_notice(client_id, secret, PATH, order_id, amount, status);
    let mut req = crate::client()
        .post(api.url(PATH))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let r = crate::Reply::send(req).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json
}

/// The subscription row of `user`.
pub async fn subscription_row(db: &DatabaseConnection, user: Uuid) -> subscriptions::Model {
    subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription")
}

/// provider_b's client id that [`Stack::session_env`] configures.
pub const B_CLIENT: &str = "client-test";
/// provider_b's secret key that [`Stack::session_env`] configures.
pub const B_SECRET: &str = "secret-test";

/// A session token of `user` (address `{user}@example.com`), signed HS256
/// with `jwt_secret` as the auth platform signs it.
pub fn user_token(jwt_secret: &str, user: Uuid) -> String {
    crate::hs256_token(
        jwt_secret.as_bytes(),
        &crate::session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    )
}

/// `GET /api/me` as `user` (see [`user_token`]): asserts 200, answers the JSON.
pub async fn me(api: &crate::Proc, jwt_secret: &str, user: Uuid) -> serde_json::Value {
    let r = crate::Reply::send(
        crate::client()
            .get(api.url("/api/me"))
            .bearer_auth(user_token(jwt_secret, user)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json
}

/// Sends provider_b's SUCCESS notice for `order` (with the credentials of
/// [`Stack::session_env`]) and waits until the payment is PAID.
pub async fn settle(api: &crate::Proc, db: &DatabaseConnection, order: &str, amount: i64) {
    send_provider_b_notice(api, B_CLIENT, B_SECRET, order, amount, "SUCCESS").await;
    wait_payment_status(db, order, PaymentStatus::Paid).await;
}

/// Pays `plan` at `amount` for `user`: a checkout's PENDING provider_b
/// payment row, settled by its notice ([`settle`]). Answers the order id.
pub async fn pay(
    api: &crate::Proc,
    db: &DatabaseConnection,
    user: Uuid,
    plan: &str,
    amount: i64,
) -> String {
    let order = pending_plan_payment(db, user, plan, amount, "provider_b").await;
    settle(api, db, &order, amount).await;
    order
}

/// Sends provider_b's REFUND notice for `order` at `amount` and waits until
/// the payment is REFUNDED.
pub async fn refund(api: &crate::Proc, db: &DatabaseConnection, order: &str, amount: i64) {
    send_provider_b_notice(api, B_CLIENT, B_SECRET, order, amount, "REFUND").await;
    wait_payment_status(db, order, PaymentStatus::Refunded).await;
}

/// The audit rows of `action` on `target`, oldest first.
pub async fn audit_trail(
    db: &DatabaseConnection,
    target: &str,
    action: &str,
) -> Vec<entity::entities::audit_logs::Model> {
    use entity::entities::audit_logs;
    use sea_orm::{ColumnTrait, QueryFilter, QueryOrder};
    audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(target))
        .filter(audit_logs::Column::Action.eq(action))
        .order_by_asc(audit_logs::Column::CreatedAt)
        .all(db)
        .await
        .unwrap()
}
