//! `POST /api/payments` against the real api, PostgreSQL and Redis, with both
//! payment providers faked over HTTP (wiremock) as their protocols document
//! them: the request each provider receives (path, auth, the HMAC signature
//! and Digest recomputed here), the answers, the `PENDING` row; every provider
//! failure → 502 and a `FAILED` row; `Idempotency-Key` replays; the gates,
//! the plan check and the per-user rate limit.

use std::time::Duration;

use base64::Engine as _;
use entity::{
    billing::payment::{provider_b_digest, provider_b_signature, ProviderBRequest},
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
    },
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};
use tests::{client, connect_db, hs256_token, session_claims, EnvMap, Proc, Reply, Stack};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const SECRET: &str = "checkout-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const A_KEY: &str = "SB-Mid-server-checkout-tests";
const B_CLIENT: &str = "BRN-0001-CHECKOUT";
const B_SECRET: &str = "SK-checkout-tests-secret";
const APP_URL: &str = "https://app.example.test";
const PRO_PRICE: i64 = 99000;

fn env_a(stack: &Stack, base: &str) -> EnvMap {
    stack
        .session_env(SECRET, SERVICE_KEY)
        .with("APP_URL", APP_URL)
        .with("PAYMENT_PROVIDER", "provider_a")
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_BASE_URL", base)
        .with("PROVIDER_TIMEOUT_MS", "300")
        .with("PROVIDER_CONNECT_TIMEOUT_MS", "200")
}

fn env_b(stack: &Stack, base: &str) -> EnvMap {
    stack
        .session_env(SECRET, SERVICE_KEY)
        .with("APP_URL", APP_URL)
        .with("PAYMENT_PROVIDER", "provider_b")
        .with("PROVIDER_B_CLIENT_ID", B_CLIENT)
        .with("PROVIDER_B_SECRET_KEY", B_SECRET)
        .with("PROVIDER_B_BASE_URL", base)
        .with("PROVIDER_TIMEOUT_MS", "300")
        .with("PROVIDER_CONNECT_TIMEOUT_MS", "200")
}

fn token(user: Uuid) -> String {
    hs256_token(
        SECRET.as_bytes(),
        &session_claims(
            &user.to_string(),
            Some(&format!("u{}@example.com", &user.simple().to_string()[..8])),
        ),
    )
}

async fn pay(api: &Proc, user: Option<Uuid>, body: Value, key: Option<&str>) -> Reply {
    let mut req = client()
        .post(api.url("/api/payments"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(u) = user {
        req = req.bearer_auth(token(u));
    }
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
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

async fn rows_of(db: &DatabaseConnection, user: Uuid) -> Vec<payments::Model> {
    payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
}

/// The quote of a first checkout (the user is on FREE): the payment's plan
/// and amount, a calendar month from the payment's creation, nothing
/// carried.
fn assert_fresh_quote(quote: &Value, p: &payments::Model) {
    let start = p.created_at;
    let end = tests::month_after(start);
    let at = |v: &Value| {
        v.as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|| panic!("a UTC time: {quote}"))
    };
    assert_eq!(quote["plan"], p.plan.as_str(), "{quote}");
    assert_eq!(quote["amount"], p.amount, "{quote}");
    assert_eq!(quote["currency"], "IDR", "{quote}");
    assert_eq!(quote["carried_seconds"], 0, "{quote}");
    assert_eq!(at(&quote["period_start"]), start, "{quote}");
    assert_eq!(at(&quote["period_end"]), end, "{quote}");
}

/// provider_a's documented answer: 201 `{token, redirect_url}`.
fn a_created(token: &str) -> ResponseTemplate {
    ResponseTemplate::new(201).set_body_json(json!({
        "token": token,
        "redirect_url": format!("https://app.sandbox.midtrans.com/snap/v4/redirection/{token}"),
    }))
}

/// provider_b's documented answer: 200 with `response.payment.url`.
fn b_created(url: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "message": ["SUCCESS"],
        "response": {
            "order": {"amount": "99000", "invoice_number": "x", "currency": "IDR", "session_id": "s1"},
            "payment": {
                "payment_method_types": ["VIRTUAL_ACCOUNT_BCA"],
                "payment_due_date": 60,
                "token_id": "tok-1",
                "url": url,
                "expired_date": "20261124100000",
            },
            "uuid": 123456789,
            "headers": {"request_id": "r", "signature": "s", "date": "d", "client_id": B_CLIENT},
        }
    }))
}

/// The one row of `user`, after a 502: FAILED with an audit row.
async fn assert_failed(db: &DatabaseConnection, user: Uuid) {
    let rows = rows_of(db, user).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, PaymentStatus::Failed);
    assert!(rows[0].checkout_token.is_none() && rows[0].payment_url.is_none());
    let audits = audit_logs::Entity::find()
        .filter(audit_logs::Column::TargetId.eq(&rows[0].order_id))
        .filter(audit_logs::Column::Action.eq(entity::base::audit::ACTION_CHECKOUT_FAILED))
        .count(db)
        .await
        .unwrap();
    assert_eq!(audits, 1);
}

fn assert_provider_error(r: &Reply, secret_bits: &[&str]) {
    r.assert_problem(502, Some("provider_error"), None);
    for s in secret_bits {
        assert!(
            !r.text.contains(s),
            "the provider's body leaked: {}",
            r.text
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_a_checkout_sends_the_snap_request_and_answers_the_token() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-token-1"))
        .mount(&fake)
        .await;
    let api = stack.api(&env_a(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();

    let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let order_id = r.json["orderId"].as_str().expect("orderId").to_string();
    let mut answer = r.json.clone();
    let quote = answer
        .as_object_mut()
        .and_then(|o| o.remove("quote"))
        .expect("the answer carries its quote");
    assert_eq!(
        answer,
        json!({"provider": "provider_a", "token": "snap-token-1", "orderId": order_id})
    );
    assert_fresh_quote(&quote, &payment(&db, &order_id).await);
    assert!(
        entity::billing::payment::is_order_id("ORD", &order_id),
        "{order_id}"
    );
    assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 4);
    assert!(r.header("idempotent-replayed").is_none());

    let received = fake.received_requests().await.unwrap();
    assert_eq!(received.len(), 1);
    let req = &received[0];
    let expected_auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{A_KEY}:"))
    );
    assert_eq!(
        req.headers.get("authorization").unwrap(),
        expected_auth.as_str()
    );
    assert_eq!(req.headers.get("accept").unwrap(), "application/json");
    assert!(req
        .headers
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["transaction_details"]["order_id"], order_id.as_str());
    assert_eq!(body["transaction_details"]["gross_amount"], PRO_PRICE);
    assert_eq!(body["item_details"][0]["id"], "PRO");
    assert_eq!(body["item_details"][0]["price"], PRO_PRICE);
    assert_eq!(body["item_details"][0]["quantity"], 1);
    assert!(body["customer_details"]["email"].is_string());
    assert_eq!(
        body["callbacks"]["finish"],
        format!("{APP_URL}/billing?order_id={order_id}").as_str()
    );

    let row = payment(&db, &order_id).await;
    // The provider is told our expiry: from the payment's creation, the
    // whole minutes of PAYMENT_EXPIRE_AFTER_SECS (default one day).
    assert_eq!(
        body["expiry"],
        json!({
            "start_time": row.created_at.format("%Y-%m-%d %H:%M:%S +0000").to_string(),
            "unit": "minutes",
            "duration": 1440,
        })
    );
    assert_eq!(row.status, PaymentStatus::Pending);
    assert_eq!(row.user_id, user);
    assert_eq!(row.plan, "PRO");
    assert_eq!(row.amount, PRO_PRICE);
    assert_eq!(row.currency, "IDR");
    assert_eq!(row.provider, "provider_a");
    assert_eq!(row.checkout_token.as_deref(), Some("snap-token-1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_b_checkout_is_signed_over_the_exact_body_and_answers_the_url() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let pay_url = "https://sandbox.doku.com/checkout-link-v2/abc123";
    Mock::given(method("POST"))
        .and(path("/checkout/v1/payment"))
        .respond_with(b_created(pay_url))
        .mount(&fake)
        .await;
    let api = stack.api(&env_b(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();

    let r = pay(&api, Some(user), json!({"plan": "ULTIMATE"}), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let order_id = r.json["orderId"].as_str().expect("orderId").to_string();
    let mut answer = r.json.clone();
    let quote = answer
        .as_object_mut()
        .and_then(|o| o.remove("quote"))
        .expect("the answer carries its quote");
    assert_eq!(
        answer,
        json!({"provider": "provider_b", "payment_url": pay_url, "orderId": order_id})
    );
    assert_fresh_quote(&quote, &payment(&db, &order_id).await);

    let received = fake.received_requests().await.unwrap();
    assert_eq!(received.len(), 1);
    let req = &received[0];
    let h = |k: &str| req.headers.get(k).unwrap().to_str().unwrap().to_string();
    assert_eq!(h("client-id"), B_CLIENT);
    let (rid, ts) = (h("request-id"), h("request-timestamp"));
    assert!(Uuid::parse_str(&rid).is_ok(), "{rid}");
    assert!(
        chrono::NaiveDateTime::parse_from_str(&ts, "%Y-%m-%dT%H:%M:%SZ").is_ok(),
        "{ts}"
    );
    // Recompute the Digest of the bytes received and the HMAC over the components.
    let digest = base64::engine::general_purpose::STANDARD.encode(sha256(&req.body));
    assert_eq!(digest, provider_b_digest(&req.body));
    let expected = provider_b_signature(
        B_SECRET,
        &ProviderBRequest {
            client_id: B_CLIENT,
            request_id: &rid,
            timestamp: &ts,
            target: "/checkout/v1/payment",
            body: Some(&req.body),
        },
    );
    assert_eq!(h("signature"), expected);

    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["order"]["invoice_number"], order_id.as_str());
    assert_eq!(body["order"]["amount"], 299000);
    assert_eq!(body["order"]["currency"], "IDR");
    assert_eq!(
        body["order"]["callback_url"],
        format!("{APP_URL}/billing?order_id={order_id}").as_str()
    );
    assert_eq!(body["payment"]["payment_due_date"], 1440);
    assert!(body["customer"]["email"].is_string());

    let row = payment(&db, &order_id).await;
    assert_eq!(row.status, PaymentStatus::Pending);
    assert_eq!(row.provider, "provider_b");
    assert_eq!(row.amount, 299000);
    assert_eq!(row.payment_url.as_deref(), Some(pay_url));
}

/// An independent SHA-256 (FIPS 180-4), so the test does not trust `entity`'s
/// Digest to check `entity`'s Digest.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, v) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_failures_answer_502_and_fail_the_payment() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let api = stack.api(&env_a(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;

    // HTTP 500 with a body that must not leak; a 500 is not retried.
    fake.reset().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(
            ResponseTemplate::new(500)
                .set_body_json(json!({"error_messages": ["internal secret-500"]})),
        )
        .mount(&fake)
        .await;
    let user = Uuid::new_v4();
    let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
    assert_provider_error(&r, &["secret-500"]);
    assert_eq!(
        fake.received_requests().await.unwrap().len(),
        1,
        "a 500 is not retried"
    );
    assert_failed(&db, user).await;

    // Slower than PROVIDER_TIMEOUT_MS (300 ms): 502 soon after the bound.
    fake.reset().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("late-token").set_delay(Duration::from_secs(2)))
        .mount(&fake)
        .await;
    let user = Uuid::new_v4();
    let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
    assert_provider_error(&r, &["late-token"]);
    assert!(r.elapsed < Duration::from_millis(1800), "{:?}", r.elapsed);
    assert_eq!(
        fake.received_requests().await.unwrap().len(),
        1,
        "a timeout is not retried"
    );
    assert_failed(&db, user).await;

    // Undocumented answers: `{}`, an empty token, HTML.
    for (i, answer) in [
        ResponseTemplate::new(201).set_body_json(json!({})),
        ResponseTemplate::new(201).set_body_json(json!({"token": "", "redirect_url": "x"})),
        ResponseTemplate::new(200).set_body_raw(
            "<html><body>secret-html maintenance</body></html>",
            "text/html",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        fake.reset().await;
        Mock::given(method("POST"))
            .and(path("/snap/v1/transactions"))
            .respond_with(answer)
            .mount(&fake)
            .await;
        let user = Uuid::new_v4();
        let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
        assert_eq!(r.status, 502, "answer {i}: {}", r.text);
        assert_provider_error(&r, &["secret-html"]);
        assert_failed(&db, user).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_b_undocumented_answers_are_502() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    let api = stack.api(&env_b(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    for (i, answer) in [
        ResponseTemplate::new(200).set_body_json(json!({})),
        ResponseTemplate::new(200).set_body_json(
            json!({"message": ["SUCCESS"], "response": {"payment": {"url": "javascript:alert(1)"}}}),
        ),
        ResponseTemplate::new(400).set_body_json(
            json!({"message": ["secret-b invalid signature"]}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        fake.reset().await;
        Mock::given(method("POST"))
            .and(path("/checkout/v1/payment"))
            .respond_with(answer)
            .mount(&fake)
            .await;
        let user = Uuid::new_v4();
        let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
        assert_eq!(r.status, 502, "answer {i}: {}", r.text);
        assert_provider_error(&r, &["secret-b", "javascript"]);
        assert_eq!(fake.received_requests().await.unwrap().len(), 1);
        assert_failed(&db, user).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_down_is_502_and_fails_the_payment() {
    let stack = Stack::new().await;
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // The FAILED mark is written before the answer, bounded by
    // DEPENDENCY_TIMEOUT_MS: a loaded machine must not cut it short here.
    let env = env_b(&stack, &format!("http://{closed}")).with("DEPENDENCY_TIMEOUT_MS", "30000");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    // A 502 (not the client's 30 s timeout): the refused connection ended
    // the checkout.
    let r = pay(&api, Some(user), json!({"plan": "BASIC"}), None).await;
    assert_provider_error(&r, &[]);
    assert_failed(&db, user).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_key_replays_the_first_answer() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-once"))
        .mount(&fake)
        .await;
    let api = stack.api(&env_a(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();

    let first = pay(&api, Some(user), json!({"plan": "PRO"}), Some("key-1")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(first.header("idempotent-replayed").is_none());
    let again = pay(&api, Some(user), json!({"plan": "PRO"}), Some("key-1")).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json, first.json);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
    assert_eq!(rows_of(&db, user).await.len(), 1);

    // Same key, another plan: 422, nothing new.
    let other = pay(&api, Some(user), json!({"plan": "BASIC"}), Some("key-1")).await;
    other.assert_problem(422, Some("idempotency_key_reused"), None);
    assert_eq!(rows_of(&db, user).await.len(), 1);
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);

    // The same key of another user is that user's own.
    let someone = Uuid::new_v4();
    let r = pay(&api, Some(someone), json!({"plan": "PRO"}), Some("key-1")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_ne!(r.json["orderId"], first.json["orderId"]);

    // No key: two requests, two payments.
    let u2 = Uuid::new_v4();
    let a = pay(&api, Some(u2), json!({"plan": "PRO"}), None).await;
    let b = pay(&api, Some(u2), json!({"plan": "PRO"}), None).await;
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    assert_ne!(a.json["orderId"], b.json["orderId"]);
    assert_eq!(rows_of(&db, u2).await.len(), 2);

    // A key bound to a FAILED checkout answers the same 502 again.
    fake.reset().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&fake)
        .await;
    let u3 = Uuid::new_v4();
    let f1 = pay(&api, Some(u3), json!({"plan": "PRO"}), Some("key-f")).await;
    f1.assert_problem(502, Some("provider_error"), None);
    let f2 = pay(&api, Some(u3), json!({"plan": "PRO"}), Some("key-f")).await;
    f2.assert_problem(502, Some("provider_error"), None);
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
    assert_eq!(rows_of(&db, u3).await.len(), 1);

    // Concurrent requests with one key: one payment, one provider call.
    fake.reset().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-race").set_delay(Duration::from_millis(100)))
        .mount(&fake)
        .await;
    let u4 = Uuid::new_v4();
    let replies = futures::future::join_all(
        (0..4).map(|_| pay(&api, Some(u4), json!({"plan": "PRO"}), Some("key-race"))),
    )
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 409),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200), "{statuses:?}");
    for r in replies.iter().filter(|r| r.status == 409) {
        r.assert_problem(409, Some("idempotency_in_progress"), None);
    }
    assert_eq!(rows_of(&db, u4).await.len(), 1);
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gates_and_rate_limit() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-gates"))
        .mount(&fake)
        .await;
    let env = env_a(&stack, &fake.uri());
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;

    // Not logged in: 401.
    let r = pay(&api, None, json!({"plan": "PRO"}), None).await;
    r.assert_problem(401, Some("missing_token"), None);

    // FREE, unknown, empty, too long, wrong type: 400 naming `plan`.
    let user = Uuid::new_v4();
    for plan in ["FREE", "GOLD", "pro"] {
        let r = pay(&api, Some(user), json!({ "plan": plan }), None).await;
        r.assert_problem(400, Some("invalid_plan"), Some("plan"));
    }
    for body in [
        json!({"plan": ""}),
        json!({"plan": "X".repeat(33)}),
        json!({"plan": 5}),
        json!({}),
    ] {
        let r = pay(&api, Some(Uuid::new_v4()), body.clone(), None).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        assert_eq!(r.json["field"], "plan", "{body}: {}", r.text);
    }
    let r = pay(
        &api,
        Some(Uuid::new_v4()),
        json!({"plan": "PRO", "amount": 1}),
        None,
    )
    .await;
    r.assert_problem(400, Some("unknown_field"), Some("amount"));

    // A bad Idempotency-Key: 400 naming it.
    for key in ["has space", &"k".repeat(256)] {
        let r = pay(
            &api,
            Some(Uuid::new_v4()),
            json!({"plan": "PRO"}),
            Some(key),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert_eq!(r.json["field"], "Idempotency-Key", "{}", r.text);
    }
    assert_eq!(fake.received_requests().await.unwrap().len(), 0);
    assert_eq!(
        payments::Entity::find().count(&db).await.unwrap(),
        0,
        "bad requests create nothing"
    );

    // Rate limit: the user above made 3 requests; 2 more pass, the 6th is 429.
    for _ in 0..2 {
        let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = pay(&api, Some(user), json!({"plan": "PRO"}), None).await;
    r.assert_problem(429, Some("rate_limited"), None);
    assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    assert!(r.header_u64("x-ratelimit-reset") > 0);
    let retry = r.header_u64("retry-after");
    assert!(retry > 0 && retry <= 15 * 60, "{retry}");
    assert_eq!(rows_of(&db, user).await.len(), 2);
    // Another user is not limited by this one.
    let r = pay(&api, Some(Uuid::new_v4()), json!({"plan": "PRO"}), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    drop(api);

    // Payments switched off: 503 before the token is looked at.
    let api = stack
        .api(&env.clone().with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false"))
        .await;
    let r = pay(&api, None, json!({"plan": "PRO"}), None).await;
    r.assert_problem(503, Some("feature_disabled"), None);
    drop(api);

    // The selected provider's key missing: 503 naming it.
    let api = stack.api(&env.without("PROVIDER_A_SERVER_KEY")).await;
    let r = pay(&api, Some(Uuid::new_v4()), json!({"plan": "PRO"}), None).await;
    r.assert_problem(503, Some("not_configured"), None);
    assert!(r.text.contains("PROVIDER_A_SERVER_KEY"), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_hanging_up_mid_checkout_does_not_strand_the_payment() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-after-hangup").set_delay(Duration::from_millis(1500)))
        .mount(&fake)
        .await;
    // The provider answers within the (here longer) provider timeout.
    let env = env_a(&stack, &fake.uri()).with("PROVIDER_TIMEOUT_MS", "5000");
    let api = stack.api(&env).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();

    // The client gives up while the provider is still answering: once the
    // provider has the request (not after a fixed time, which a loaded
    // machine may not reach), the client drops the connection.
    let request = client()
        .post(api.url("/api/payments"))
        .bearer_auth(token(user))
        .header("content-type", "application/json")
        .header("Idempotency-Key", "hangup-1")
        .body(json!({"plan": "PRO"}).to_string())
        .send();
    let in_flight = tokio::spawn(request);
    let reached = tests::wait_until(Duration::from_secs(10), || async {
        !fake
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    assert!(reached, "the checkout never reached the provider");
    assert!(!in_flight.is_finished(), "the provider answered too early");
    in_flight.abort();
    assert!(in_flight.await.is_err_and(|e| e.is_cancelled()));

    // The checkout still completes and is stored.
    let stored = tests::wait_until(Duration::from_secs(30), || async {
        rows_of(&db, user)
            .await
            .first()
            .is_some_and(|p| p.checkout_token.as_deref() == Some("snap-after-hangup"))
    })
    .await;
    assert!(stored, "{:?}", rows_of(&db, user).await);
    let again = pay(&api, Some(user), json!({"plan": "PRO"}), Some("hangup-1")).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["token"], "snap-after-hangup");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
    assert_eq!(rows_of(&db, user).await[0].status, PaymentStatus::Pending);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_older_than_24_hours_starts_a_new_payment() {
    use sea_orm::{ActiveModelTrait, IntoActiveModel, Set};
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-fresh"))
        .mount(&fake)
        .await;
    let api = stack.api(&env_a(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    // A payment with key "old-key" made 25 h ago (for another plan, even).
    let user = tests::free_user(&db).await;
    let old_order = tests::pending_payment_at(
        &db,
        user,
        "provider_a",
        chrono::Utc::now() - chrono::Duration::hours(25),
    )
    .await;
    let mut old = payment(&db, &old_order).await.into_active_model();
    old.idempotency_key = Set(Some("old-key".into()));
    old.plan = Set("BASIC".into());
    old.update(&db).await.unwrap();

    let r = pay(&api, Some(user), json!({"plan": "PRO"}), Some("old-key")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("idempotent-replayed").is_none());
    let new_order = r.json["orderId"].as_str().unwrap().to_string();
    assert_ne!(new_order, old_order);
    // The key moved to the new payment; the old one keeps its history.
    assert_eq!(payment(&db, &old_order).await.idempotency_key, None);
    assert_eq!(
        payment(&db, &new_order).await.idempotency_key.as_deref(),
        Some("old-key")
    );
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
    // Within 24 h of the new one, the key replays it.
    let again = pay(&api, Some(user), json!({"plan": "PRO"}), Some("old-key")).await;
    assert_eq!(again.json["orderId"], new_order.as_str());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
}

/// A replay of an `Idempotency-Key` whose payment has expired answers 409
/// `payment_expired`, never the dead token.
#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_of_an_expired_payment_answers_409() {
    use sea_orm::{ActiveModelTrait, IntoActiveModel, Set};
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(a_created("snap-dead"))
        .mount(&fake)
        .await;
    let api = stack.api(&env_a(&stack, &fake.uri())).await;
    let db = connect_db(&stack).await;
    let user = Uuid::new_v4();
    let first = pay(&api, Some(user), json!({"plan": "PRO"}), Some("key-exp")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let order_id = first.json["orderId"].as_str().unwrap().to_string();
    let mut row = payment(&db, &order_id).await.into_active_model();
    row.status = Set(PaymentStatus::Expired);
    row.update(&db).await.unwrap();

    let again = pay(&api, Some(user), json!({"plan": "PRO"}), Some("key-exp")).await;
    again.assert_problem(409, Some("payment_expired"), None);
    assert!(!again.text.contains("snap-dead"), "{}", again.text);
    assert_eq!(fake.received_requests().await.unwrap().len(), 1);
}

/// The served OpenAPI document lists the plans of the catalogue in force
/// (`PLANS_FILE`) as the enum of `plan`.
#[tokio::test(flavor = "multi_thread")]
async fn the_served_document_lists_the_plans_in_force() {
    let stack = Stack::new().await;
    let plans = stack.dir.path().join("plans.toml");
    let text = std::fs::read_to_string(tests::plans_file())
        .unwrap()
        .replace("\"ULTIMATE\"", "\"TEAM\"");
    std::fs::write(&plans, text).unwrap();
    let api = stack
        .api(&env_a(&stack, "http://127.0.0.1:9").with("PLANS_FILE", plans.display().to_string()))
        .await;
    let r = Reply::send(client().get(api.url("/api/openapi.json"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["components"]["schemas"]["PaymentRequest"]["properties"]["plan"]["enum"],
        json!(["BASIC", "PRO", "TEAM"])
    );
}
