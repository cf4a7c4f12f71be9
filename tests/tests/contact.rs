//! `POST /api/contact` end to end: api and worker as separate processes on
//! PostgreSQL + Redis, delivering to a real SMTP server or a fake email API.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{post_json, random_ip, SmtpSink, Stack, CONTACT_EMAIL, EMAIL_FROM};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

fn assert_rate_headers(r: &tests::Reply) {
    for h in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(
            r.header(h).is_some(),
            "{h} missing on {}: {:?}",
            r.status,
            r.headers
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_message_arrives_at_a_real_smtp_server() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
        .with("JOB_RETRY_BASE_SECS", "1");
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["email_transport"], "smtp", "{}", h.text);

    let body = json!({
        "name": "Ann Lee",
        "email": "ann.lee@example.org",
        "message": "Do you offer annual billing?\nThanks, Ann",
    });
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "body: {}", r.text);
    assert_eq!(r.json, json!({"success": true}));
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json"));
    assert!(r.header("x-request-id").is_some());
    assert_rate_headers(&r);

    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let m = &mails[0];
    assert_eq!(m.envelope_from, EMAIL_FROM, "MAIL FROM");
    assert_eq!(m.envelope_to, vec![CONTACT_EMAIL.to_string()], "RCPT TO");
    let to = m.header("to").expect("To header");
    assert!(to.contains(CONTACT_EMAIL), "To: {to}");
    let from = m.header("from").expect("From header");
    assert!(from.contains(EMAIL_FROM), "From: {from}");
    let reply_to = m.header("reply-to").expect("Reply-To header");
    assert!(
        reply_to.contains("ann.lee@example.org"),
        "Reply-To: {reply_to}"
    );
    let subject = m.header("subject").expect("Subject header");
    assert!(subject.contains("Ann Lee"), "Subject: {subject}");
    let text = m.body().replace("\r\n", "\n");
    assert!(
        text.contains("Do you offer annual billing?\nThanks, Ann"),
        "body: {text}"
    );
    assert!(
        text.contains("ann.lee@example.org"),
        "body lacks the sender's email: {text}"
    );

    // Delivered once, not repeatedly.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.count(), 1, "the message was delivered more than once");
}

#[tokio::test(flavor = "multi_thread")]
async fn header_injection_through_the_name_adds_no_recipient() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("CONTACT_EMAIL", CONTACT_EMAIL);
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;

    let body = json!({
        "name": "Eve\r\nBcc: victim@example.net",
        "email": "eve@example.org",
        "message": "hello",
    });
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    if r.status == 400 {
        r.assert_problem(400, None, Some("name"));
        return;
    }
    assert_eq!(
        r.status, 200,
        "expected 400 or a harmless 200; body: {}",
        r.text
    );
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let m = &mails[0];
    assert_eq!(m.envelope_to, vec![CONTACT_EMAIL.to_string()], "RCPT TO");
    assert!(
        m.header_all("bcc").is_empty(),
        "an injected Bcc header: {}",
        m.data
    );
    assert!(
        m.header_all("cc").is_empty(),
        "an injected Cc header: {}",
        m.data
    );
}

/// Retries back off from 1 s here (default 10 s): a spurious retry would land
/// within the "nothing more arrives" waits of these tests.
async fn email_api_env(stack: &Stack, server: &MockServer) -> tests::EnvMap {
    stack
        .env()
        .with("JOB_RETRY_BASE_SECS", "1")
        .with("EMAIL_PROVIDER_API_KEY", "re_test_key_123")
        .with("EMAIL_PROVIDER_BASE_URL", server.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL)
}

async fn email_requests(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording on")
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_message_reaches_the_http_email_api() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_1"})))
        .mount(&server)
        .await;
    let env = email_api_env(&stack, &server).await;
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["email_transport"], "api", "{}", h.text);

    let body = json!({"name": "Budi Santoso", "email": "budi@example.id", "message": "Halo, ada paket tahunan?"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "body: {}", r.text);
    assert_eq!(r.json, json!({"success": true}));

    let ok = tests::wait_until(Duration::from_secs(30), || async {
        !email_requests(&server).await.is_empty()
    })
    .await;
    assert!(ok, "the email API received nothing");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reqs = email_requests(&server).await;
    assert_eq!(
        reqs.len(),
        1,
        "expected exactly one call; got {}",
        reqs.len()
    );
    let req = &reqs[0];
    assert_eq!(req.method.as_str(), "POST");
    assert_eq!(req.url.path(), "/emails");
    let auth = req
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert_eq!(auth, "Bearer re_test_key_123");
    let idem = req
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(!idem.trim().is_empty(), "Idempotency-Key missing");
    let ct = req
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(ct.starts_with("application/json"), "content-type {ct}");
    let sent: Value = req.body_json().expect("JSON body");
    assert_eq!(sent["to"], json!([CONTACT_EMAIL]), "to: {sent}");
    assert_eq!(sent["from"], EMAIL_FROM, "from: {sent}");
    assert_eq!(sent["reply_to"], "budi@example.id", "reply_to: {sent}");
    let subject = sent["subject"].as_str().unwrap_or("");
    assert!(subject.contains("Budi Santoso"), "subject: {sent}");
    let text = sent["text"].as_str().unwrap_or("");
    assert!(text.contains("Halo, ada paket tahunan?"), "text: {sent}");
    assert!(
        text.contains("budi@example.id"),
        "text lacks the sender's email: {sent}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn email_api_rejection_is_dead_lettered_and_not_retried() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(
            ResponseTemplate::new(422)
                .set_body_json(json!({"name": "validation_error", "message": "bad to"})),
        )
        .mount(&server)
        .await;
    let env = email_api_env(&stack, &server).await;
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;

    let body =
        json!({"name": "Dead Letter", "email": "dl@example.org", "message": "will be rejected"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "body: {}", r.text);

    let dead = stack.redis.key("email:dead");
    let ok = tests::wait_until(Duration::from_secs(30), || async {
        stack.redis.count("SCARD", "email:dead").await == 1
    })
    .await;
    assert!(ok, "the rejected job did not reach {dead}");
    // Not retried: no further calls over the next seconds (retries back off 1 s, 2 s, …).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        email_requests(&server).await.len(),
        1,
        "a 422 must not be retried"
    );
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 1);
    assert_eq!(
        stack.redis.count("LLEN", "email:active").await,
        0,
        "job still active"
    );
    assert_eq!(
        stack.redis.count("ZCARD", "email:scheduled").await,
        0,
        "job still scheduled for retry"
    );

    // The operator's view.
    let (status, out, err) = stack
        .run_worker_command(&env, &["dead-letters", "email"])
        .await;
    assert!(status.success(), "worker dead-letters failed: {err}");
    let lines: Vec<Value> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 1, "dead-letters output:\n{out}");
    let dl = &lines[0];
    for k in ["id", "queue", "attempts", "last_error", "job"] {
        assert!(dl.get(k).is_some(), "dead letter lacks {k}: {dl}");
    }
    assert!(
        dl["queue"].as_str().unwrap_or("").ends_with("email"),
        "{dl}"
    );
    assert!(
        dl["last_error"].as_str().unwrap_or("").contains("422"),
        "last_error should name the 422: {dl}"
    );
    assert!(
        dl["job"].to_string().contains("dl@example.org"),
        "job payload: {dl}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn email_api_5xx_is_retried_until_it_succeeds() {
    let stack = Stack::new().await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(503).set_body_string("try later"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"})))
        .mount(&server)
        .await;
    let env = email_api_env(&stack, &server).await;
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;

    let body =
        json!({"name": "Retry Me", "email": "retry@example.org", "message": "third time lucky"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "body: {}", r.text);

    let ok = tests::wait_until(Duration::from_secs(45), || async {
        email_requests(&server).await.len() >= 3
    })
    .await;
    let reqs = email_requests(&server).await;
    assert!(
        ok,
        "expected 2 failed attempts and a successful third; got {} requests",
        reqs.len()
    );
    // Each failed attempt was acknowledged with its retry scheduled; after the
    // 200 nothing is left waiting.
    let ok = tests::wait_until(Duration::from_secs(10), || async {
        stack.redis.count("SCARD", "email:done").await == 3
            && stack.redis.count("ZCARD", "email:scheduled").await == 0
            && stack.redis.count("LLEN", "email:active").await == 0
    })
    .await;
    assert!(ok, "the attempts are not all finished after the 200");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = email_requests(&server).await;
    assert_eq!(reqs.len(), 3, "no call after the successful one");
    let keys: Vec<_> = reqs
        .iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert!(!keys[0].is_empty(), "Idempotency-Key missing");
    assert!(
        keys.iter().all(|k| k == &keys[0]),
        "retries must reuse the Idempotency-Key: {keys:?}"
    );
    assert_eq!(stack.redis.count("SCARD", "email:dead").await, 0);
}

/// `EMAIL_FROM` and `CONTACT_EMAIL` in the `Name <addr>` form every email
/// service uses: accepted at start, used as-is in the headers, the bare
/// address on the SMTP envelope.
#[tokio::test(flavor = "multi_thread")]
async fn display_name_sender_and_inbox_are_used_as_is() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("EMAIL_FROM", "Example Site <site@example.com>")
        .with("CONTACT_EMAIL", "\"Team, Support\" <inbox@example.com>");
    let api = stack.api(&env).await;
    let _worker = stack.worker(&env).await;
    let body = json!({"name": "Named", "email": "named@example.org", "message": "display names"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 200, "body: {}", r.text);
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let m = &mails[0];
    assert_eq!(m.envelope_from, EMAIL_FROM, "MAIL FROM is the bare address");
    assert_eq!(m.envelope_to, vec![CONTACT_EMAIL.to_string()], "RCPT TO");
    let from = m.header("from").expect("From header");
    assert!(
        from.contains("Example Site") && from.contains("<site@example.com>"),
        "From: {from}"
    );
    let to = m.header("to").expect("To header");
    assert!(
        to.contains("Team, Support") && to.contains("<inbox@example.com>"),
        "To: {to}"
    );
}

/// Start-up refusals that name the variable: a malformed mailbox, and SMTP
/// credentials that would cross the network in clear.
#[tokio::test(flavor = "multi_thread")]
async fn bad_sender_or_clear_text_smtp_credentials_stop_both_binaries() {
    let stack = Stack::new().await;
    for (var, value) in [
        ("EMAIL_FROM", "Example Site <site@example.com"),
        ("CONTACT_EMAIL", "Team <not-an-address>"),
        ("SMTP_URL", "smtp://user:secret@mail.example.com:25"),
    ] {
        let env = stack.env().with(var, value);
        for bin in ["api", "worker"] {
            let mut p = tests::Proc::spawn(bin, &[], &env, stack.dir.path());
            let status = p.wait_exit(Duration::from_secs(20)).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let status = status
                .unwrap_or_else(|| panic!("{bin} kept running with {var}={value}: {}", p.stderr()));
            assert!(!status.success(), "{bin} accepted {var}={value}");
            assert!(
                p.stderr().contains(var),
                "{bin}: the error must name {var}; stderr:\n{}",
                p.stderr()
            );
            assert!(!p.stderr().contains("secret"), "the password is not echoed");
        }
    }
}

/// Production (PostgreSQL + Redis) without a transport: no outbox fallback;
/// contact is not ready and health says `none`.
#[tokio::test(flavor = "multi_thread")]
async fn production_without_a_transport_has_no_outbox() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["email_transport"], "none", "{}", h.text);
    assert_eq!(
        h.json["features"]["contact"]["enabled"], false,
        "{}",
        h.text
    );
    let body = json!({"name": "Nobody", "email": "n@example.org", "message": "no transport"});
    let r = post_json(&api.url("/api/contact"), &random_ip(), &body).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(
        !stack.dir.path().join("data/outbox").exists(),
        "production must not write an outbox"
    );
}
