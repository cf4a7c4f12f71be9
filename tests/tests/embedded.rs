//! The embedded default: no `DATABASE_URL`, no `REDIS_URL`; `api --with-worker`
//! keeps data and queue in SQLite files under `data/` and still delivers mail.

use std::time::Duration;

use serde_json::json;
use tests::{get, plans_file, EnvMap, Proc, Reply, SmtpSink, TempDir, EMAIL_FROM};

/// What a newcomer sets: an SMTP relay and a sender. Nothing else.
fn embedded_env(sink: &SmtpSink) -> EnvMap {
    EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("SMTP_URL", sink.url())
        .with("EMAIL_FROM", EMAIL_FROM)
}

async fn post(api: &Proc, path: &str, body: serde_json::Value) -> Reply {
    Reply::send(tests::client().post(api.url(path)).json(&body)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_and_waitlist_work_with_nothing_installed() {
    let dir = TempDir::new();
    let sink = SmtpSink::start().await;
    let env = embedded_env(&sink);
    let mut api = Proc::api(&env, &["--with-worker"], dir.path()).await;

    let r = post(
        &api,
        "/api/contact",
        json!({"name": "Embedded Ed", "email": "ed@example.org", "message": "hello from sqlite"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"success": true}));
    let mails = sink.wait_for(1, Duration::from_secs(30)).await;
    let m = &mails[0];
    assert_eq!(
        m.envelope_to,
        vec![EMAIL_FROM.to_string()],
        "no CONTACT_EMAIL: the inbox is EMAIL_FROM"
    );
    assert!(
        m.header("reply-to")
            .unwrap_or_default()
            .contains("ed@example.org"),
        "{}",
        m.data
    );
    assert!(
        m.header("subject")
            .unwrap_or_default()
            .contains("Embedded Ed"),
        "{}",
        m.data
    );
    assert!(m.body().contains("hello from sqlite"), "{}", m.data);

    let r = post(
        &api,
        "/api/waitlist",
        json!({"email": "first@example.org", "name": "First"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = post(
        &api,
        "/api/waitlist",
        json!({"email": " FIRST@example.org "}),
    )
    .await;
    r.assert_problem(409, Some("already_registered"), None);

    assert!(
        dir.path().join("data/app.db").exists(),
        "data/app.db not created"
    );
    assert!(
        dir.path().join("data/queue.db").exists(),
        "data/queue.db not created"
    );

    // Data survives a restart.
    api.term();
    let status = api.wait_exit(Duration::from_secs(20)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "api did not stop cleanly on SIGTERM: {status:?}; stderr:\n{}",
        api.stderr()
    );
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    let r = post(&api, "/api/waitlist", json!({"email": "first@example.org"})).await;
    r.assert_problem(409, Some("already_registered"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn embedded_health_and_in_process_rate_limit() {
    let dir = TempDir::new();
    let sink = SmtpSink::start().await;
    let env = embedded_env(&sink).with_other_features_off();
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;

    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.status, 200, "{}", h.text);
    assert_eq!(h.json["database"]["ok"], true);
    assert_eq!(h.json["queue"]["ok"], true);
    assert_eq!(h.json["queue"]["backend"], "sqlite");

    for i in 0..5 {
        let r = post(
            &api,
            "/api/waitlist",
            json!({"email": format!("e{i}@example.org")}),
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
        assert_eq!(r.header_u64("x-ratelimit-remaining"), 4 - i);
    }
    let r = post(&api, "/api/waitlist", json!({"email": "e5@example.org"})).await;
    r.assert_problem(429, Some("rate_limited"), None);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    let retry = r.header_u64("retry-after");
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");
    assert!(r.header("x-ratelimit-reset").is_some());
}

/// Nothing configured at all (no transport, no sender, no database, no Redis):
/// contact is ready and each message lands as one `.eml` file in
/// `$DATA_DIR/outbox`, named after the job id; health says `outbox`.
#[tokio::test(flavor = "multi_thread")]
async fn contact_with_nothing_configured_goes_to_the_outbox() {
    let dir = TempDir::new();
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string());
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;

    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.json["email_transport"], "outbox", "{}", h.text);
    assert_eq!(h.json["features"]["contact"]["enabled"], true, "{}", h.text);
    assert_eq!(h.json["checks"]["email_provider"], false, "{}", h.text);

    let r = post(
        &api,
        "/api/contact",
        json!({"name": "Outbox Olga", "email": "olga@example.org", "message": "kept on disk"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let outbox = dir.path().join("data/outbox");
    let eml_files = || -> Vec<std::path::PathBuf> {
        match std::fs::read_dir(&outbox) {
            Ok(rd) => rd
                .map(|e| e.expect("outbox entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "eml"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => panic!("cannot list {}: {e}", outbox.display()),
        }
    };
    assert!(
        tests::wait_until(Duration::from_secs(30), || async {
            !eml_files().is_empty()
        })
        .await,
        "no .eml in {}; api stderr:\n{}",
        outbox.display(),
        api.stderr()
    );
    let files = eml_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let raw = std::fs::read_to_string(&files[0]).expect("read the .eml");
    let raw = raw.replace("\r\n", "\n");
    assert!(raw.contains("From: noreply@localhost"), "{raw}");
    assert!(
        raw.contains("To: noreply@localhost"),
        "no CONTACT_EMAIL: the inbox is the sender\n{raw}"
    );
    assert!(raw.contains("Reply-To: olga@example.org"), "{raw}");
    assert!(raw.contains("Outbox Olga"), "{raw}");
    assert!(raw.contains("kept on disk"), "{raw}");
    let stem = files[0].file_stem().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        stem.len(),
        26,
        "file named after the job id (a ULID): {stem}"
    );
    assert!(
        api.stderr().contains(&files[0].display().to_string())
            || api.stderr().contains(&format!("{stem}.eml")),
        "the path is logged; stderr:\n{}",
        api.stderr()
    );
}
