//! The dead-letter queue end to end: a mail the email API refuses is
//! dead-lettered, listed by `worker dead-letters`, redriven by
//! `worker dead-letters redrive` once the API accepts it again, and delivered
//! exactly once with its original idempotency key; expired dead letters are
//! purged. On PostgreSQL + Redis and on the embedded SQLite queue.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{plans_file, post_json, random_ip, EnvMap, Proc, Stack, TempDir, CONTACT_EMAIL};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

async fn email_requests(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording on")
}

fn idempotency_key(r: &Request) -> String {
    r.headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The email API refuses the first request (400, permanent) and accepts the rest.
async fn refusing_once() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(
            ResponseTemplate::new(400).set_body_json(
                json!({"name": "validation_error", "message": "domain not verified"}),
            ),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"})))
        .with_priority(2)
        .mount(&server)
        .await;
    server
}

/// Posts a contact message, waits for it to be dead-lettered, redrives it
/// with `worker dead-letters redrive <id>`, and checks the single delivery.
/// `run` runs a `worker` command with the deployment's environment.
async fn dead_letter_then_redrive<F, Fut>(api: &Proc, server: &MockServer, run: F)
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = (std::process::ExitStatus, String, String)>,
{
    let body =
        json!({"name": "Redrive Rita", "email": "rita@example.org", "message": "second chance"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Dead-lettered at once (a 400 is permanent), listed with its error.
    let list = || run(vec!["dead-letters".into(), "email".into()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let (status, out, err) = list().await;
        assert!(status.success(), "worker dead-letters failed: {err}");
        let listed = json_lines(&out);
        if !listed.is_empty() {
            break listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was dead-lettered; api stderr:\n{}",
            api.stderr()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(listed.len(), 1, "{listed:?}");
    let dl = &listed[0];
    assert!(
        dl["last_error"].as_str().unwrap_or("").contains("400"),
        "the last error names the 400: {dl}"
    );
    let id = dl["id"].as_str().expect("id").to_string();
    let key = dl["idempotency_key"]
        .as_str()
        .expect("idempotency_key")
        .to_string();
    assert_eq!(email_requests(server).await.len(), 1);
    assert_eq!(idempotency_key(&email_requests(server).await[0]), key);

    // Redrive it now that the API accepts it.
    let (status, out, err) = run(vec!["dead-letters".into(), "redrive".into(), id.clone()]).await;
    assert!(status.success(), "redrive failed: {err}");
    let moved = json_lines(&out);
    assert_eq!(moved.len(), 1, "{out}");
    assert_eq!(moved[0]["id"], id.as_str());

    let ok = tests::wait_until(Duration::from_secs(30), || async {
        email_requests(server).await.len() >= 2
    })
    .await;
    assert!(
        ok,
        "the redriven job was not sent; api stderr:\n{}",
        api.stderr()
    );
    // Delivered once: nothing more arrives (no retry is pending and the
    // dead-letter queue is empty).
    let (status, out, _) = list().await;
    assert!(status.success());
    assert!(json_lines(&out).is_empty(), "still dead-lettered: {out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = email_requests(server).await;
    assert_eq!(reqs.len(), 2, "one refused attempt and one delivery");
    assert_eq!(
        idempotency_key(&reqs[1]),
        key,
        "the redriven job keeps its idempotency key"
    );
    let sent: Value = reqs[1].body_json().expect("JSON body");
    assert!(
        sent["text"]
            .as_str()
            .unwrap_or("")
            .contains("second chance"),
        "{sent}"
    );

    // Redriving an id that is not a dead letter fails and says so.
    let (status, _, err) = run(vec![
        "dead-letters".into(),
        "redrive".into(),
        "01NOTADEADLETTER000000000".into(),
    ])
    .await;
    assert!(!status.success(), "redrive of an unknown id succeeded");
    assert!(err.contains("01NOTADEADLETTER000000000"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_dead_letter_is_redriven_and_delivered_once() {
    let stack = Stack::new().await;
    let server = refusing_once().await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    dead_letter_then_redrive(&api, &server, |args| {
        let env = env.clone();
        let stack = &stack;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            stack.run_worker_command(&env, &args).await
        }
    })
    .await;
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_dead_letter_is_redriven_and_delivered_once() {
    let dir = TempDir::new();
    let server = refusing_once().await;
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("EMAIL_FROM", tests::EMAIL_FROM)
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri());
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    dead_letter_then_redrive(&api, &server, |args| {
        let env = env.clone();
        let dir = dir.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p = Proc::spawn("worker", &args, &env, &dir);
            let status = p
                .wait_exit(Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("worker {args:?} did not finish: {}", p.stderr()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            (status, p.stdout(), p.stderr())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_dead_letters_are_purged() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(422).set_body_string("no"))
        .mount(&server)
        .await;
    let env = stack
        .env()
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("DEAD_LETTER_RETENTION_SECS", "2")
        .with("VACUUM_INTERVAL_SECS", "1");
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    let body = json!({"name": "Purge Paul", "email": "paul@example.org", "message": "gone soon"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);

    worker
        .wait_stderr("rejected permanently", Duration::from_secs(30))
        .await;
    worker
        .wait_stderr("purged expired dead letters", Duration::from_secs(30))
        .await;
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
    assert_eq!(
        stack.redis.count("HLEN", "email:data").await,
        stack.redis.count("SCARD", "email:done").await,
        "the purged job's payload (with the sender's PII) is gone"
    );
}

/// The session secret of the admin-route test (HS256, as the auth platform signs).
const ADMIN_SECRET: &str = "dead-letter-admin-jwt-secret-0123456789abcdef";

fn bearer(user: uuid::Uuid, email: &str) -> String {
    tests::hs256_token(
        ADMIN_SECRET.as_bytes(),
        &tests::session_claims(&user.to_string(), Some(email)),
    )
}

async fn admin_get(api: &Proc, path: &str, token: Option<&str>) -> tests::Reply {
    let mut req = tests::client().get(api.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    tests::Reply::send(req).await
}

async fn admin_post(api: &Proc, path: &str, token: &str, body: &Value) -> tests::Reply {
    tests::Reply::send(
        tests::client()
            .post(api.url(path))
            .bearer_auth(token)
            .json(body),
    )
    .await
}

/// The email API answers every request with `status`.
async fn email_api_answers(server: &MockServer, status: u16) {
    server.reset().await;
    let body = if status == 200 {
        json!({"id": "email_ok"})
    } else {
        json!({"name": "validation_error", "message": "domain not verified"})
    };
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(status).set_body_json(body))
        .mount(server)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_lists_redacted_dead_letters_and_redrives_one_delivered_once() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    email_api_answers(&server, 400).await;
    let env = stack
        .session_env(ADMIN_SECRET, "service-role-test-key-0123456789abcdef")
        .with("ADMIN_EMAILS", "boss@example.com")
        .with("AUTH_TRUST_EMAIL_CLAIM", "true")
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let (admin, member) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let admin_tok = bearer(admin, "boss@example.com");
    let member_tok = bearer(member, "member@example.com");

    // A contact message and an identity mail, both refused (400: permanent).
    let body = json!({"name": "Admin Ada", "email": "ada@example.org", "message": "redrive me"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let source: std::collections::HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    let queues = worker::Queues::connect(&settings).await.expect("queue");
    let auth_mail = worker::jobs::SendAuthEmail {
        kind: entity::identity::otp::MailKind::Magiclink,
        from: tests::EMAIL_FROM.into(),
        to: "ada@example.org".into(),
        token: "482913".into(),
        token_hash: "pkce_0f3a9c2b7e".into(),
        confirmation_url: "http://127.0.0.1/auth/v1/verify?token=pkce_0f3a9c2b7e&type=magiclink"
            .into(),
        redirect_to: "http://127.0.0.1/".into(),
        site_url: "http://127.0.0.1".into(),
        request_id: None,
        account_email: None,
        new_email: None,
    };
    queues
        .push(worker::Job::SendAuthEmail(auth_mail))
        .await
        .expect("push the identity mail");

    let listed = tests::wait_until(Duration::from_secs(30), || async {
        stack.redis.count("SCARD", "email:dead").await == 2
    })
    .await;
    assert!(listed, "two dead letters; api stderr:\n{}", api.stderr());
    assert_eq!(email_requests(&server).await.len(), 2);

    // Admins only: 401 without a session, 403 for a member.
    let list = "/api/admin/dead-letters?queue=email";
    admin_get(&api, list, None)
        .await
        .assert_problem(401, None, None);
    admin_get(&api, list, Some(&member_tok))
        .await
        .assert_problem(403, Some("forbidden"), None);
    admin_get(
        &api,
        &format!("{list}&cursor=not-a-cursor"),
        Some(&admin_tok),
    )
    .await
    .assert_problem(400, None, Some("cursor"));
    admin_get(&api, &format!("{list}&limit=101"), Some(&admin_tok))
        .await
        .assert_problem(400, None, Some("limit"));

    // The listing, one per page; the identity mail's secrets never leave.
    let first = admin_get(&api, &format!("{list}&limit=1"), Some(&admin_tok)).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["items"].as_array().map(Vec::len), Some(1));
    let cursor = first.json["next_cursor"].as_str().expect("a next page");
    let second = admin_get(
        &api,
        &format!("{list}&limit=1&cursor={cursor}"),
        Some(&admin_tok),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text);
    assert_eq!(
        second.json.get("next_cursor"),
        Some(&Value::Null),
        "the last page says `null`, as every list does: {}",
        second.text
    );
    // An empty cursor is the first page; a cursor that is not a job id, in
    // upper-case Crockford base32 as ids are given, is 400.
    let empty = admin_get(&api, &format!("{list}&limit=1&cursor="), Some(&admin_tok)).await;
    assert_eq!(empty.status, 200, "{}", empty.text);
    assert_eq!(empty.json["items"], first.json["items"], "{}", empty.text);
    admin_get(
        &api,
        &format!("{list}&cursor={}", cursor.to_lowercase()),
        Some(&admin_tok),
    )
    .await
    .assert_problem(400, None, Some("cursor"));
    let all = admin_get(&api, list, Some(&admin_tok)).await;
    assert_eq!(all.status, 200, "{}", all.text);
    let items = all.json["items"].as_array().expect("items").clone();
    assert_eq!(items.len(), 2, "{}", all.text);
    assert_eq!(items[0]["id"], first.json["items"][0]["id"]);
    assert_eq!(items[1]["id"], second.json["items"][0]["id"]);
    for secret in ["482913", "pkce_0f3a9c2b7e"] {
        assert!(!all.text.contains(secret), "{secret} left: {}", all.text);
    }
    let by_type = |t: &str| {
        items
            .iter()
            .find(|i| i["job_type"] == t)
            .unwrap_or_else(|| panic!("no {t} in {items:?}"))
            .clone()
    };
    let auth_item = by_type("send_auth_email");
    assert_eq!(auth_item["payload"]["token"], "[redacted]");
    assert_eq!(auth_item["payload"]["token_hash"], "[redacted]");
    assert_eq!(auth_item["payload"]["confirmation_url"], "[redacted]");
    assert_eq!(auth_item["payload"]["to"], "ada@example.org");
    let contact = by_type("send_email");
    assert_eq!(contact["queue"], "email");
    assert!(contact["attempts"].as_u64().is_some(), "{contact}");
    assert!(
        contact["last_error"].as_str().unwrap_or("").contains("400"),
        "{contact}"
    );
    assert!(
        contact["payload"].to_string().contains("redrive me"),
        "{contact}"
    );
    let contact_id = contact["id"].as_str().expect("id").to_string();

    // Redrive: admins only, one of ids or all, unknown ids refused whole.
    let redrive = "/api/admin/dead-letters/redrive";
    let one = json!({"queue": "email", "ids": [contact_id]});
    admin_post(&api, redrive, &member_tok, &one)
        .await
        .assert_problem(403, Some("forbidden"), None);
    admin_post(&api, redrive, &admin_tok, &json!({"queue": "email"}))
        .await
        .assert_problem(400, None, Some("ids"));
    // Exactly one of `{all: true}` and `{ids}` (the schema's `oneOf`).
    for body in [
        json!({"queue": "email", "all": false}),
        json!({"queue": "email", "ids": [contact_id], "all": false}),
        json!({"queue": "email", "ids": [contact_id], "all": true}),
    ] {
        admin_post(&api, redrive, &admin_tok, &body)
            .await
            .assert_problem(400, None, Some("all"));
    }
    admin_post(
        &api,
        redrive,
        &admin_tok,
        &json!({"queue": "email", "ids": []}),
    )
    .await
    .assert_problem(400, None, Some("ids"));
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 2);
    admin_post(
        &api,
        redrive,
        &admin_tok,
        &json!({"queue": "email", "ids": [contact_id, "01NOTADEADLETTER000000000"]}),
    )
    .await
    .assert_problem(404, Some("unknown_dead_letter"), None);
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 2);

    // The cause is fixed; the admin redrives the contact message.
    email_api_answers(&server, 200).await;
    let r = admin_post(&api, redrive, &admin_tok, &one).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["redriven"].as_array().map(Vec::len),
        Some(1),
        "{}",
        r.text
    );
    assert_eq!(r.json["redriven"][0]["id"], contact_id.as_str());

    let sent = tests::wait_until(Duration::from_secs(30), || async {
        !email_requests(&server).await.is_empty()
    })
    .await;
    assert!(
        sent,
        "the redriven job was not sent; api stderr:\n{}",
        api.stderr()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = email_requests(&server).await;
    assert_eq!(reqs.len(), 1, "delivered exactly once");
    assert_eq!(
        idempotency_key(&reqs[0]),
        contact["idempotency_key"].as_str().expect("key"),
        "the redriven job keeps its idempotency key"
    );
    let left = admin_get(&api, list, Some(&admin_tok)).await;
    assert_eq!(left.json["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(left.json["items"][0]["job_type"], "send_auth_email");

    // One audit row for the redrive, naming the actor and the ids.
    let pool = stack.db.pool().await;
    let rows: Vec<(Option<uuid::Uuid>, String, Value)> = sqlx_rows(&pool).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, Some(admin));
    assert_eq!(rows[0].1, "email");
    assert_eq!(rows[0].2, json!({"ids": [contact_id]}));
    pool.close().await;
}

async fn sqlx_rows(pool: &sea_orm::sqlx::PgPool) -> Vec<(Option<uuid::Uuid>, String, Value)> {
    sea_orm::sqlx::query_as(
        "SELECT actor_id, target_id, new_value FROM audit_logs \
         WHERE action = 'dead_letter.redrive' ORDER BY created_at",
    )
    .fetch_all(pool)
    .await
    .expect("audit rows")
}

/// The admin routes and the queue gauges on the embedded SQLite queue
/// (`api --with-worker`, no PostgreSQL, no Redis).
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_admin_route_lists_and_redrives_and_metrics_count_the_dead() {
    let dir = TempDir::new();
    let server = MockServer::start().await;
    email_api_answers(&server, 400).await;
    let token = "metrics-token-for-the-tests-0123456789abcdef";
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("EMAIL_FROM", tests::EMAIL_FROM)
        .with("EMAIL_PROVIDER_API_KEY", "re_dl")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("NEXT_PUBLIC_BACKEND_URL", "http://127.0.0.1:9")
        .with("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY", "pk_test_dummy")
        .with(
            "BACKEND_SERVICE_ROLE_KEY",
            "service-role-test-key-0123456789abcdef",
        )
        .with("BACKEND_JWT_SECRET", ADMIN_SECRET)
        .with("ADMIN_EMAILS", "boss@example.com")
        .with("AUTH_TRUST_EMAIL_CLAIM", "true")
        .with("METRICS_TOKEN", token);
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let admin_tok = bearer(uuid::Uuid::new_v4(), "boss@example.com");
    let body = json!({"name": "Lite Lou", "email": "lou@example.org", "message": "embedded"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "{}", r.text);

    let list = "/api/admin/dead-letters?queue=email";
    let listed = tests::wait_until(Duration::from_secs(30), || async {
        let r = admin_get(&api, list, Some(&admin_tok)).await;
        r.json["items"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    assert!(listed, "not dead-lettered; api stderr:\n{}", api.stderr());
    let items = admin_get(&api, list, Some(&admin_tok)).await.json["items"]
        .as_array()
        .cloned()
        .expect("items");
    assert_eq!(items[0]["job_type"], "send_email");
    let id = items[0]["id"].as_str().expect("id").to_string();

    let m = tests::Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(token)).await;
    assert_eq!(m.status, 200, "{}", m.text);
    assert!(
        m.text.contains("queue_dead{queue=\"email\"} 1"),
        "{}",
        m.text
    );
    assert!(
        m.text.contains("queue_waiting{queue=\"email\"} 0"),
        "{}",
        m.text
    );

    email_api_answers(&server, 200).await;
    let r = admin_post(
        &api,
        "/api/admin/dead-letters/redrive",
        &admin_tok,
        &json!({"queue": "email", "all": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["redriven"][0]["id"], id.as_str(), "{}", r.text);
    let sent = tests::wait_until(Duration::from_secs(30), || async {
        !email_requests(&server).await.is_empty()
    })
    .await;
    assert!(sent, "not sent; api stderr:\n{}", api.stderr());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        email_requests(&server).await.len(),
        1,
        "delivered exactly once"
    );
    let left = admin_get(&api, list, Some(&admin_tok)).await;
    assert_eq!(left.json["items"], json!([]), "{}", left.text);
}
