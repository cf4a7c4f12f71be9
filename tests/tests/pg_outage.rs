//! PostgreSQL outages get the strictness Redis ones get: with PostgreSQL gone
//! (refused connections: the server is down; a black hole or a partition:
//! only timeouts end them) every route family answers a 503 `database_unavailable` that
//! its OpenAPI description documents (for `/auth/v1`, in the platform's own
//! error format), never a 500 and never a 200 for something not stored; what
//! was refused during the outage left nothing behind, and the same request
//! succeeds once PostgreSQL is back. A job running when PostgreSQL goes away
//! is retried, not dead-lettered, and completes after.
//!
//! The binaries reach PostgreSQL through a [`TcpProxy`]; the test reads the
//! database directly.

use std::time::Duration;

use chrono::{Duration as Span, Utc};
use entity::{
    billing::payment::provider_a_signature,
    entities::payments::{self, PaymentStatus},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};
use tests::{
    client, connect_db, free_user, get, hs256_token, pending_payment, pending_payment_at,
    post_json, random_ip, reqwest, session_claims, wait_until, EnvMap, Proc, ProxyMode, Reply,
    SmtpSink, Stack, TcpProxy,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

/// The shapes of an outage: refused connections (the server is down), a
/// black hole (new connections hang), a partition (open connections go
/// silent mid-statement too).
const OUTAGES: [ProxyMode; 3] = [ProxyMode::Refuse, ProxyMode::Blackhole, ProxyMode::Freeze];

const SECRET: &str = "pg-outage-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const A_KEY: &str = "SB-Mid-server-pg-outage-tests";

/// A proxy in front of the stack's PostgreSQL.
async fn pg_proxy(stack: &Stack) -> TcpProxy {
    TcpProxy::start(&tests::host_port(&stack.db.url)).await
}

/// `env` with PostgreSQL reached through `proxy` and a 1 s bound per call.
fn through(env: EnvMap, stack: &Stack, proxy: &TcpProxy) -> EnvMap {
    env.with("DATABASE_URL", stack.db.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "1000")
}

/// A 503 `database_unavailable` problem (never a 500).
fn assert_db_503(r: &Reply, what: &str, mode: ProxyMode, api: &Proc) {
    if let Err(e) = r.check_problem(Some(503), Some("database_unavailable"), None) {
        panic!(
            "{what} with PostgreSQL {mode:?}: {e}; api stderr (tail):\n{}",
            tests::tail(&api.stderr(), 3000)
        );
    }
}

/// The OpenAPI document's 503 answer of `method path` names `database_unavailable`.
async fn assert_documented(api: &Proc, method: &str, route: &str) {
    let spec = get(&api.url("/api/openapi.json")).await;
    assert_eq!(spec.status, 200);
    let desc = spec.json["paths"][route][method]["responses"]["503"]["description"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} {route}: no 503 in the OpenAPI document"))
        .to_string();
    assert!(
        desc.contains("database_unavailable"),
        "{method} {route}: the 503 does not document database_unavailable: {desc}"
    );
}

/// A PostgreSQL slow to open connections at start (the first is quick,
/// every later one takes 700 ms, as on a loaded host) does not stop an api
/// whose per-request bound is 200 ms: it applies its migrations on a pool of
/// its own, bounded for startup, then waits for its request pool, which
/// connects once connections are quick again (after 4 s). It exited with
/// "applying migrations: pool timed out" when the migrations ran on the
/// request pool under the request bound.
#[tokio::test(flavor = "multi_thread")]
async fn an_api_with_a_short_request_bound_still_migrates_behind_a_slow_postgres() {
    let stack = Stack::new().await;
    let proxy = std::sync::Arc::new(pg_proxy(&stack).await);
    proxy.delay_connects(1, Duration::from_millis(700));
    let env = through(stack.env(), &stack, &proxy)
        .with("DEPENDENCY_TIMEOUT_MS", "200")
        .with("MIGRATE_ON_START", "true");
    let quick_again = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            proxy.delay_connects(0, Duration::ZERO);
        }
    });
    let api = stack.api(&env).await;
    quick_again.await.unwrap();
    let email = format!("slow-{}@example.com", Uuid::new_v4().simple());
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": email}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn waitlist_is_503_while_postgres_is_down_and_stores_after() {
    let stack = Stack::new().await;
    let proxy = pg_proxy(&stack).await;
    let api = stack.api(&through(stack.env(), &stack, &proxy)).await;
    let db = connect_db(&stack).await;
    assert_documented(&api, "post", "/api/waitlist").await;
    for mode in OUTAGES {
        let email = format!("{mode:?}-{}@example.com", Uuid::new_v4().simple()).to_lowercase();
        proxy.set(mode);
        let r = post_json(
            &api.url("/api/waitlist"),
            &random_ip(),
            &json!({"email": email}),
        )
        .await;
        assert_db_503(&r, "POST /api/waitlist", mode, &api);
        proxy.on();
        // Nothing was stored: the same sign-up is a first one (not 409).
        let r = post_json(
            &api.url("/api/waitlist"),
            &random_ip(),
            &json!({"email": email}),
        )
        .await;
        assert_eq!(r.status, 200, "after the {mode:?} outage: {}", r.text);
        let rows = entity::entities::waitlist::Entity::find()
            .filter(entity::entities::waitlist::Column::Email.eq(email.as_str()))
            .count(&db)
            .await
            .unwrap();
        assert_eq!(rows, 1, "{email}");
    }
}

fn session_token(user: Uuid) -> String {
    hs256_token(
        SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some(&format!("{user}@example.com"))),
    )
}

async fn checkout(api: &Proc, user: Uuid) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/payments"))
            .bearer_auth(session_token(user))
            .json(&json!({"plan": "PRO"})),
    )
    .await
}

async fn payments_of(db: &DatabaseConnection, user: Uuid) -> Vec<payments::Model> {
    payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn checkout_is_503_while_postgres_is_down_and_never_answers_a_token_it_did_not_store() {
    let stack = Stack::new().await;
    let fake = MockServer::start().await;
    // provider_a's Snap answer, 1.5 s late (time to cut PostgreSQL mid-call).
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(
                    json!({"token": "snap-token", "redirect_url": "https://pay.example/snap"}),
                )
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&fake)
        .await;
    let proxy = pg_proxy(&stack).await;
    let env = stack
        .session_env(SECRET, SERVICE_KEY)
        .with("PAYMENT_PROVIDER", "provider_a")
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_BASE_URL", fake.uri())
        .with("PROVIDER_TIMEOUT_MS", "5000");
    let api = stack.api(&through(env, &stack, &proxy)).await;
    let db = connect_db(&stack).await;
    assert_documented(&api, "post", "/api/payments").await;
    let provider_calls = || async { fake.received_requests().await.unwrap().len() };

    // A user seen before the outage, and one never seen.
    let known = Uuid::new_v4();
    let r = checkout(&api, known).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for mode in OUTAGES {
        proxy.set(mode);
        for (who, user) in [("known", known), ("new", Uuid::new_v4())] {
            let r = checkout(&api, user).await;
            assert_db_503(&r, &format!("POST /api/payments ({who} user)"), mode, &api);
        }
        proxy.on();
    }
    assert_eq!(
        provider_calls().await,
        1,
        "the provider was asked during the outage"
    );
    assert_eq!(payments_of(&db, known).await.len(), 1);

    // PostgreSQL goes while the provider is being asked: the token cannot be
    // stored, so it is not answered either.
    let call = {
        let api_url = api.url("/api/payments");
        tokio::spawn(async move {
            Reply::send(
                client()
                    .post(api_url)
                    .bearer_auth(session_token(known))
                    .json(&json!({"plan": "PRO"})),
            )
            .await
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), || async {
            provider_calls().await == 2
        })
        .await,
        "the second checkout never reached the provider"
    );
    proxy.set(ProxyMode::Refuse);
    let r = call.await.unwrap();
    assert_db_503(
        &r,
        "POST /api/payments (PostgreSQL lost mid-call)",
        ProxyMode::Refuse,
        &api,
    );
    proxy.on();
    let rows = payments_of(&db, known).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .filter(|p| p.checkout_token.is_none())
            .all(|p| p.status == PaymentStatus::Pending),
        "{rows:?}"
    );

    // Back: a checkout answers its token and stores it.
    let r = checkout(&api, known).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let order = r.json["orderId"].as_str().unwrap();
    let stored = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order))
        .one(&db)
        .await
        .unwrap()
        .expect("the answered payment's row");
    assert_eq!(stored.checkout_token.as_deref(), Some("snap-token"));
}

/// A provider_a notification as Midtrans documents it.
fn a_notification(order_id: &str, status: &str) -> Value {
    json!({
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": status,
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": "200",
        "signature_key": provider_a_signature(order_id, "200", "99000.00", A_KEY),
        "payment_type": "bank_transfer",
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": "99000.00",
        "fraud_status": "accept",
        "currency": "IDR",
    })
}

/// provider_a's Get Transaction Status answer, signed.
fn a_status(order_id: &str, status: &str) -> Value {
    json!({
        "status_code": "200",
        "status_message": "Success, transaction is found",
        "transaction_id": Uuid::new_v4().to_string(),
        "order_id": order_id,
        "merchant_id": "G000000000",
        "gross_amount": "99000.00",
        "currency": "IDR",
        "payment_type": "bank_transfer",
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": status,
        "settlement_time": "2026-11-23 10:05:00",
        "fraud_status": "accept",
        "signature_key": provider_a_signature(order_id, "200", "99000.00", A_KEY),
    })
}

async fn payment(db: &DatabaseConnection, order: &str) -> payments::Model {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order))
        .one(db)
        .await
        .unwrap()
        .expect("payment row")
}

async fn events_of(db: &DatabaseConnection, order: &str) -> u64 {
    entity::entities::webhook_events::Entity::find()
        .filter(entity::entities::webhook_events::Column::OrderId.eq(order))
        .count(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_are_503_while_postgres_is_down_and_the_retry_settles() {
    let stack = Stack::new().await;
    let status_api = MockServer::start().await;
    let proxy = pg_proxy(&stack).await;
    let env = stack
        .env()
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status_api.uri());
    let api = stack.api(&through(env.clone(), &stack, &proxy)).await;
    let db = connect_db(&stack).await;
    assert_documented(&api, "post", "/api/webhooks/provider_a").await;
    let (_, order) = pending_payment(&db, "provider_a").await;
    Mock::given(method("GET"))
        .and(path(format!("/v2/{order}/status")))
        .respond_with(ResponseTemplate::new(200).set_body_json(a_status(&order, "settlement")))
        .mount(&status_api)
        .await;
    let body = serde_json::to_vec(&a_notification(&order, "settlement")).unwrap();
    let notify = || {
        Reply::send(
            client()
                .post(api.url("/api/webhooks/provider_a"))
                .header("content-type", "application/json")
                .body(body.clone()),
        )
    };
    for mode in OUTAGES {
        proxy.set(mode);
        let r = notify().await;
        assert_db_503(&r, "POST /api/webhooks/provider_a", mode, &api);
        proxy.on();
    }
    assert_eq!(events_of(&db, &order).await, 0, "an event was recorded");

    // The provider's retry after the outage is a first delivery and settles.
    let r = notify().await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"received": true}));
    let _worker = stack.worker(&env).await;
    let paid = wait_until(Duration::from_secs(30), || async {
        payment(&db, &order).await.status == PaymentStatus::Paid
    })
    .await;
    assert!(
        paid,
        "the notification retried after the outage did not settle"
    );
}

const PASSWORD: &str = "correct horse battery";

/// `POST /auth/v1<route>`; with `new_format`, the API version header that
/// selects the platform's newer error shape.
async fn auth_post(api: &Proc, route: &str, body: &Value, new_format: bool) -> Reply {
    auth_call(
        api,
        reqwest::Method::POST,
        route,
        Some(body),
        None,
        new_format,
    )
    .await
}

async fn auth_call(
    api: &Proc,
    method: reqwest::Method,
    route: &str,
    body: Option<&Value>,
    bearer: Option<&str>,
    new_format: bool,
) -> Reply {
    let mut req = client()
        .request(method, api.url(&format!("/auth/v1{route}")))
        .header("x-forwarded-for", random_ip());
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    if new_format {
        req = req.header("x-supabase-api-version", "2024-01-01");
    }
    Reply::send(req).await
}

/// One `/auth/v1` call: what it is, method, route, body, bearer token.
type AuthCall<'a> = (
    &'a str,
    reqwest::Method,
    String,
    Option<Value>,
    Option<&'a str>,
);

/// The platform's 503 in either of its formats.
fn assert_auth_503(r: &Reply, what: &str, new_format: bool, mode: ProxyMode, api: &Proc) {
    let ok = r.status == 503
        && r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
        && if new_format {
            r.json["code"] == "database_unavailable" && r.json["message"].is_string()
        } else {
            r.json["code"] == 503
                && r.json["error_code"] == "database_unavailable"
                && r.json["msg"].is_string()
        };
    assert!(
        ok,
        "{what} with PostgreSQL {mode:?} (new format: {new_format}): status {}, body {}; api stderr (tail):\n{}",
        r.status,
        r.text,
        tests::tail(&api.stderr(), 3000)
    );
}

/// The `token_hash` of the link in mail number `n` (1-based).
async fn token_hash_of_mail(sink: &SmtpSink, n: usize) -> String {
    let mails = sink.wait_for(n, Duration::from_secs(30)).await;
    let text = mails[n - 1].searchable();
    let i = text.find("token=").expect("a link with token= in the mail");
    let rest = &text[i + 6..];
    let end = rest.find(['&', '"', '\r', '\n', ' ']).unwrap_or(rest.len());
    rest[..end].to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_v1_is_503_in_the_platforms_format_while_postgres_is_down() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let proxy = pg_proxy(&stack).await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("APP_URL", "https://app.example.com")
        .with("AUTH_RATE_LIMIT_PER_5MIN", "100000")
        .with("AUTH_RATE_LIMIT_REFRESH_PER_5MIN", "100000");
    let api = stack.api(&through(env.clone(), &stack, &proxy)).await;
    let _worker = stack.worker(&env).await;
    let spec = get(&api.url("/api/openapi.json")).await;
    for route in [
        "/auth/v1/token",
        "/auth/v1/signup",
        "/auth/v1/verify",
        "/auth/v1/logout",
    ] {
        let documented = spec.json["paths"][route]["post"]["responses"]["503"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            documented.contains("database_unavailable"),
            "{route}: {documented}"
        );
    }

    // Ann signs up and confirms; Bob signs up and keeps his link for later.
    let ann = "ann@example.com";
    let r = auth_post(
        &api,
        "/signup",
        &json!({"email": ann, "password": PASSWORD}),
        true,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let hash = token_hash_of_mail(&sink, 1).await;
    let r = auth_post(
        &api,
        "/verify",
        &json!({"type": "signup", "token_hash": hash}),
        true,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let password = json!({"email": ann, "password": PASSWORD});
    let r = auth_post(&api, "/token?grant_type=password", &password, true).await;
    assert_eq!(r.status, 200, "sign-in before the outage: {}", r.text);
    let access = r.json["access_token"].as_str().unwrap().to_string();
    let refresh = r.json["refresh_token"].as_str().unwrap().to_string();
    let bob = "bob@example.com";
    let r = auth_post(
        &api,
        "/signup",
        &json!({"email": bob, "password": PASSWORD}),
        true,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let bob_hash = token_hash_of_mail(&sink, 2).await;
    let post = reqwest::Method::POST;

    for mode in OUTAGES {
        proxy.set(mode);
        let newcomer = format!("new-{mode:?}@example.com").to_lowercase();
        let calls: Vec<AuthCall> = vec![
            (
                "password sign-in",
                post.clone(),
                "/token?grant_type=password".into(),
                Some(password.clone()),
                None,
            ),
            (
                "refresh",
                post.clone(),
                "/token?grant_type=refresh_token".into(),
                Some(json!({"refresh_token": refresh})),
                None,
            ),
            (
                "sign-up",
                post.clone(),
                "/signup".into(),
                Some(json!({"email": newcomer, "password": PASSWORD})),
                None,
            ),
            (
                "confirmation",
                post.clone(),
                "/verify".into(),
                Some(json!({"type": "signup", "token_hash": bob_hash})),
                None,
            ),
            (
                "magic link",
                post.clone(),
                "/otp".into(),
                Some(json!({"email": ann})),
                None,
            ),
            (
                "recovery",
                post.clone(),
                "/recover".into(),
                Some(json!({"email": ann})),
                None,
            ),
            (
                "resend",
                post.clone(),
                "/resend".into(),
                Some(json!({"type": "signup", "email": bob})),
                None,
            ),
            (
                "user update",
                reqwest::Method::PUT,
                "/user".into(),
                Some(json!({"data": {"plan": "x"}})),
                Some(access.as_str()),
            ),
            (
                "sign-out",
                post.clone(),
                "/logout".into(),
                None,
                Some(access.as_str()),
            ),
        ];
        for (what, method, route, body, bearer) in &calls {
            let r = auth_call(&api, method.clone(), route, body.as_ref(), *bearer, true).await;
            assert_auth_503(&r, what, true, mode, &api);
        }
        // The older error format (no API version header).
        let r = auth_post(&api, "/token?grant_type=password", &password, false).await;
        assert_auth_503(&r, "password sign-in", false, mode, &api);
        // The confirmation link says the server failed, not that the link is bad.
        let link = tests::no_redirects()
            .get(api.url(&format!("/auth/v1/verify?type=signup&token={bob_hash}")))
            .send()
            .await
            .unwrap();
        let location = link
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(
            link.status() == 303
                && location.contains("error=server_error")
                && location.contains("error_code=database_unavailable"),
            "confirmation link with PostgreSQL {mode:?}: {} {location}",
            link.status()
        );
        // The signed-in user: from the cache, or a 503, never a 500.
        let r = auth_call(
            &api,
            reqwest::Method::GET,
            "/user",
            None,
            Some(&access),
            true,
        )
        .await;
        if r.status != 200 {
            assert_auth_503(&r, "GET /user", true, mode, &api);
        }
        proxy.on();
        // Nothing was written: the newcomer's sign-up is a first one.
        let r = auth_post(
            &api,
            "/signup",
            &json!({"email": newcomer, "password": PASSWORD}),
            true,
        )
        .await;
        assert_eq!(
            r.status, 200,
            "sign-up after the {mode:?} outage: {}",
            r.text
        );
    }
    // Nothing was revoked or used up during the outage.
    let r = auth_post(
        &api,
        "/token?grant_type=refresh_token",
        &json!({"refresh_token": refresh}),
        true,
    )
    .await;
    assert_eq!(
        r.status, 200,
        "the refresh token after the outage: {}",
        r.text
    );
    let r = auth_post(
        &api,
        "/verify",
        &json!({"type": "signup", "token_hash": bob_hash}),
        true,
    )
    .await;
    assert_eq!(r.status, 200, "Bob's link after the outage: {}", r.text);
}

/// A reconciliation job asks the provider (2 s), PostgreSQL goes away before
/// it writes the answer, and comes back 6 s later: the job is retried (not
/// dead-lettered) and the payment is settled once.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_running_when_postgres_goes_away_is_retried_and_completes() {
    let stack = Stack::new().await;
    let status_api = MockServer::start().await;
    let proxy = pg_proxy(&stack).await;
    let env = stack
        .env()
        .with("SCHEDULER_TICK_SECS", "1")
        .with("PAYMENT_RECONCILE_AFTER_SECS", "600")
        .with("PAYMENT_EXPIRE_AFTER_SECS", "86400")
        .with("JOB_RETRY_BASE_SECS", "1")
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_API_BASE_URL", status_api.uri());
    let _api = stack.api(&env).await; // migrates
    let db = connect_db(&stack).await;
    let user = free_user(&db).await;
    let order = pending_payment_at(&db, user, "provider_a", Utc::now() - Span::minutes(20)).await;
    Mock::given(method("GET"))
        .and(path(format!("/v2/{order}/status")))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(a_status(&order, "settlement"))
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&status_api)
        .await;

    let worker = stack
        .worker(&through(env.clone(), &stack, &proxy).with("DEPENDENCY_TIMEOUT_MS", "2000"))
        .await;
    let asked = wait_until(Duration::from_secs(30), || async {
        !status_api.received_requests().await.unwrap().is_empty()
    })
    .await;
    assert!(
        asked,
        "no reconciliation started; worker stderr:\n{}",
        worker.stderr()
    );
    proxy.set(ProxyMode::Refuse);
    let failed = wait_until(Duration::from_secs(15), || async {
        worker.stderr().contains("job failed; retry scheduled")
    })
    .await;
    assert!(
        failed,
        "the job cut off from PostgreSQL was not scheduled for a retry; worker stderr:\n{}",
        tests::tail(&worker.stderr(), 4000)
    );
    assert_eq!(payment(&db, &order).await.status, PaymentStatus::Pending);
    tokio::time::sleep(Duration::from_secs(6)).await;
    proxy.on();

    let paid = wait_until(Duration::from_secs(60), || async {
        payment(&db, &order).await.status == PaymentStatus::Paid
    })
    .await;
    assert!(
        paid,
        "the job did not complete after PostgreSQL came back; worker stderr:\n{}",
        tests::tail(&worker.stderr(), 4000)
    );
    let q = queues(&stack).await;
    let dead = q
        .dead_letters(worker::QueueName::Settlement, 100)
        .await
        .expect("dead letters");
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    let audits = entity::entities::audit_logs::Entity::find()
        .filter(entity::entities::audit_logs::Column::TargetId.eq(order.as_str()))
        .count(&db)
        .await
        .unwrap();
    assert_eq!(audits, 1, "settled once");
}

/// The queues as the binaries see them.
async fn queues(stack: &Stack) -> worker::Queues {
    let source: std::collections::HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    worker::Queues::connect(&settings).await.expect("queues")
}
