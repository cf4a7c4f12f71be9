//! Feature toggles (`NEXT_PUBLIC_ENABLE_*`) and readiness gates: 503 on the
//! route, the reason in health.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{get, post_json, random_ip, EnvMap, Proc, Stack};

const TOGGLES: [(&str, &[&str]); 6] = [
    ("NEXT_PUBLIC_ENABLE_AUTH", &["auth"]),
    ("NEXT_PUBLIC_ENABLE_WAITLIST", &["waitlist"]),
    ("NEXT_PUBLIC_ENABLE_CONTACT", &["contact"]),
    ("NEXT_PUBLIC_ENABLE_PAYMENTS", &["billing", "payments"]),
    ("NEXT_PUBLIC_ENABLE_ADMIN", &["admin"]),
    ("NEXT_PUBLIC_ENABLE_AI", &["ai"]),
];
const FEATURES: [&str; 7] = [
    "auth", "waitlist", "contact", "billing", "payments", "admin", "ai",
];

fn configured(stack: &Stack) -> EnvMap {
    stack
        .env()
        .with_other_features_configured()
        .with("SMTP_URL", "smtp://127.0.0.1:9")
}

fn contact_body() -> Value {
    json!({"name": "Ann", "email": "ann@example.com", "message": "hello"})
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_off_answers_503_and_health_says_disabled_by_flag() {
    let stack = Stack::new().await;
    let api = stack
        .api(&configured(&stack).with("NEXT_PUBLIC_ENABLE_CONTACT", "false"))
        .await;
    let r = post_json(&api.url("/api/contact"), &random_ip(), &contact_body()).await;
    r.assert_problem(503, Some("feature_disabled"), None);
    let queued = stack.redis.count("ZCARD", "email:scheduled").await
        + stack.redis.count("LLEN", "email:active").await;
    assert_eq!(queued, 0, "nothing queued");

    let h = get(&api.url("/api/health")).await;
    let c = &h.json["features"]["contact"];
    assert_eq!(c["enabled"], false, "{c}");
    assert_eq!(c["disabled_by_flag"], true, "{c}");
    // A feature switched off on purpose does not degrade health.
    assert_eq!(h.status, 200, "health: {}", h.text);
    assert_eq!(h.json["status"], "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn waitlist_off_answers_503_and_health_says_disabled_by_flag() {
    let stack = Stack::new().await;
    let api = stack
        .api(&configured(&stack).with("NEXT_PUBLIC_ENABLE_WAITLIST", "off"))
        .await;
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": "w@example.com"}),
    )
    .await;
    r.assert_problem(503, Some("feature_disabled"), None);

    let h = get(&api.url("/api/health")).await;
    let w = &h.json["features"]["waitlist"];
    assert_eq!(w["enabled"], false, "{w}");
    assert_eq!(w["disabled_by_flag"], true, "{w}");
    assert_eq!(h.status, 200, "health: {}", h.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_toggle_switches_off_exactly_its_features() {
    let stack = Stack::new().await;
    let mut failures = Vec::new();
    for (toggle, features) in TOGGLES {
        let api = stack.api(&configured(&stack).with(toggle, "false")).await;
        let h = get(&api.url("/api/health")).await;
        if h.status != 200 {
            failures.push(format!(
                "{toggle}=false: health {} (a disabled feature must not degrade health): {}",
                h.status, h.text
            ));
        }
        for f in FEATURES {
            let entry = &h.json["features"][f];
            let off = features.contains(&f);
            let expected_missing: Vec<Value> = vec![];
            if entry["disabled_by_flag"] != off
                || entry["enabled"] != !off
                || entry["missing_env"] != json!(expected_missing)
            {
                failures.push(format!("{toggle}=false: features.{f} = {entry}"));
            }
            if !entry["message"].is_string() {
                failures.push(format!(
                    "{toggle}=false: features.{f} lacks message: {entry}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn toggle_spellings() {
    let stack = Stack::new().await;
    let mut failures = Vec::new();
    for (value, enabled) in [
        ("0", false),
        ("no", false),
        ("OFF", false),
        ("False", false),
        ("1", true),
        ("yes", true),
        ("On", true),
        ("TRUE", true),
    ] {
        let api = stack
            .api(&configured(&stack).with("NEXT_PUBLIC_ENABLE_CONTACT", value))
            .await;
        let h = get(&api.url("/api/health")).await;
        let c = &h.json["features"]["contact"];
        if c["enabled"] != enabled || c["disabled_by_flag"] != !enabled {
            failures.push(format!("NEXT_PUBLIC_ENABLE_CONTACT={value:?}: {c}"));
        }
        let r = post_json(&api.url("/api/contact"), &random_ip(), &contact_body()).await;
        let expected = if enabled { 200 } else { 503 };
        if r.status != expected {
            failures.push(format!(
                "NEXT_PUBLIC_ENABLE_CONTACT={value:?}: contact answered {} {}",
                r.status, r.text
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_toggle_stops_the_api_naming_the_variable() {
    let stack = Stack::new().await;
    let env = configured(&stack).with("NEXT_PUBLIC_ENABLE_AI", "maybe");
    let mut p = Proc::spawn("api", &[], &env, stack.dir.path());
    let status = p.wait_exit(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = status.unwrap_or_else(|| {
        panic!(
            "api kept running with a malformed toggle; stderr:\n{}",
            p.stderr()
        )
    });
    assert!(
        !status.success(),
        "api exited successfully with a malformed toggle"
    );
    assert!(
        p.stderr().contains("NEXT_PUBLIC_ENABLE_AI"),
        "the error must name the variable; stderr:\n{}",
        p.stderr()
    );
    assert!(!p.stdout().contains("api listening"), "it must not serve");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_email_transport_is_503_not_configured_and_missing_env() {
    let stack = Stack::new().await;
    // Everything else ready; no SMTP_URL, no EMAIL_PROVIDER_API_KEY.
    let api = stack
        .api(&stack.env().with_other_features_configured())
        .await;
    let r = post_json(&api.url("/api/contact"), &random_ip(), &contact_body()).await;
    r.assert_problem(503, Some("not_configured"), None);

    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.status, 503, "an enabled feature is not ready: {}", h.text);
    assert_eq!(h.json["status"], "degraded");
    let c = &h.json["features"]["contact"];
    assert_eq!(c["enabled"], false, "{c}");
    assert_eq!(c["disabled_by_flag"], false, "{c}");
    let missing: Vec<&str> = c["missing_env"]
        .as_array()
        .expect("missing_env array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        missing.contains(&"EMAIL_PROVIDER_API_KEY"),
        "missing_env: {missing:?}"
    );
    assert!(
        !missing.contains(&"EMAIL_FROM"),
        "EMAIL_FROM is set: {missing:?}"
    );
    assert_eq!(h.json["checks"]["email_provider"], false);
    // Waitlist is unaffected.
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": "ok@example.com"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_sender_is_503_not_configured_and_missing_env() {
    let stack = Stack::new().await;
    let env = configured(&stack).without("EMAIL_FROM");
    let api = stack.api(&env).await;
    let r = post_json(&api.url("/api/contact"), &random_ip(), &contact_body()).await;
    r.assert_problem(503, Some("not_configured"), None);
    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.status, 503, "{}", h.text);
    let c = &h.json["features"]["contact"];
    assert_eq!(c["missing_env"], json!(["EMAIL_FROM"]), "{c}");
    assert_eq!(
        h.json["checks"]["email_provider"], true,
        "a transport is configured"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_key_without_sender_lists_both_missing() {
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with_other_features_configured()
        .without("EMAIL_FROM");
    let api = stack.api(&env).await;
    let h = get(&api.url("/api/health")).await;
    let missing = &h.json["features"]["contact"]["missing_env"];
    assert_eq!(
        *missing,
        json!(["EMAIL_PROVIDER_API_KEY", "EMAIL_FROM"]),
        "{}",
        h.text
    );
}
