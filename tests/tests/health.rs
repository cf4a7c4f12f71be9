//! `GET /api/health`: the truth about configuration, PostgreSQL and Redis, and
//! never a hang when a dependency is gone (outages through a [`TcpProxy`]).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::{get, host_port, post_json, random_ip, EnvMap, ProxyMode, Reply, Stack, TcpProxy};

const FEATURES: [&str; 7] = [
    "auth", "waitlist", "contact", "billing", "payments", "admin", "ai",
];

fn configured(env: EnvMap) -> EnvMap {
    env.with_other_features_configured()
        .with("SMTP_URL", "smtp://127.0.0.1:9")
}

fn assert_shape(h: &Reply) {
    let b = &h.json;
    assert!(
        h.header("content-type")
            .unwrap_or("")
            .starts_with("application/json"),
        "{:?}",
        h.headers
    );
    assert!(h.header("x-request-id").is_some());
    assert!(b["status"].is_string(), "{b}");
    let ts = b["timestamp"]
        .as_str()
        .unwrap_or_else(|| panic!("timestamp: {b}"));
    assert!(
        ts.len() >= 20 && ts.contains('T'),
        "timestamp {ts:?} is not RFC 3339"
    );
    assert!(
        matches!(
            b["payment_provider"].as_str(),
            Some("provider_a" | "provider_b")
        ),
        "{b}"
    );
    for c in ["backend_public", "backend_service_role", "email_provider"] {
        assert!(b["checks"][c].is_boolean(), "checks.{c}: {b}");
    }
    for p in ["database", "queue"] {
        assert!(b[p]["ok"].is_boolean(), "{p}.ok: {b}");
        assert!(b[p]["latency_ms"].is_number(), "{p}.latency_ms: {b}");
    }
    assert!(b["queue"]["backend"].is_string(), "queue.backend: {b}");
    for f in FEATURES {
        let e = &b["features"][f];
        assert!(e["enabled"].is_boolean(), "features.{f}: {b}");
        assert!(e["disabled_by_flag"].is_boolean(), "features.{f}: {b}");
        assert!(e["missing_env"].is_array(), "features.{f}: {b}");
        assert!(e["message"].is_string(), "features.{f}: {b}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn healthy_when_everything_is_configured() {
    let stack = Stack::new().await;
    let api = stack.api(&configured(stack.env())).await;
    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.status, 200, "{}", h.text);
    assert_shape(&h);
    let b = &h.json;
    assert_eq!(b["status"], "ok");
    assert_eq!(b["payment_provider"], "provider_b", "the default provider");
    assert_eq!(
        b["checks"],
        json!({"backend_public": true, "backend_service_role": true, "email_provider": true})
    );
    assert_eq!(b["database"]["ok"], true);
    assert_eq!(b["queue"]["ok"], true);
    assert_eq!(b["queue"]["backend"], "redis");
    for f in FEATURES {
        let e = &b["features"][f];
        assert_eq!(e["enabled"], true, "features.{f}: {e}");
        assert_eq!(e["disabled_by_flag"], false, "features.{f}: {e}");
        assert_eq!(e["missing_env"], json!([]), "features.{f}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn degraded_and_names_what_is_missing_when_nothing_is_configured() {
    let stack = Stack::new().await;
    // The external auth platform, not configured (the built-in provider,
    // the default without one, needs nothing: see tests/tests/identity.rs).
    let api = stack
        .api(
            &stack
                .env()
                .without("EMAIL_FROM")
                .with("AUTH_PROVIDER", "external"),
        )
        .await;
    let h = get(&api.url("/api/health")).await;
    assert_eq!(h.status, 503, "{}", h.text);
    assert_shape(&h);
    let b = &h.json;
    assert_eq!(b["status"], "degraded");
    assert_eq!(b["database"]["ok"], true, "the database is fine: {b}");
    assert_eq!(b["queue"]["ok"], true, "the queue is fine: {b}");
    assert_eq!(
        b["checks"],
        json!({"backend_public": false, "backend_service_role": false, "email_provider": false})
    );
    let missing = |f: &str| -> Vec<String> {
        b["features"][f]["missing_env"]
            .as_array()
            .unwrap_or_else(|| panic!("features.{f}.missing_env: {b}"))
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let has = |f: &str, vars: &[&str]| {
        let m = missing(f);
        for v in vars {
            assert!(
                m.iter().any(|x| x == v),
                "features.{f}.missing_env lacks {v}: {m:?}"
            );
        }
        assert_eq!(b["features"][f]["enabled"], false, "features.{f}");
        assert_eq!(b["features"][f]["disabled_by_flag"], false, "features.{f}");
    };
    has(
        "auth",
        &[
            "NEXT_PUBLIC_BACKEND_URL",
            "NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY",
        ],
    );
    has("contact", &["EMAIL_PROVIDER_API_KEY", "EMAIL_FROM"]);
    has("billing", &["BACKEND_SERVICE_ROLE_KEY"]);
    has(
        "payments",
        &[
            "BACKEND_SERVICE_ROLE_KEY",
            "PROVIDER_B_CLIENT_ID",
            "PROVIDER_B_SECRET_KEY",
        ],
    );
    has("admin", &["BACKEND_SERVICE_ROLE_KEY"]);
    has("ai", &["OPENAI_API_KEY"]);
    assert_eq!(
        b["features"]["waitlist"]["enabled"], true,
        "waitlist needs nothing: {b}"
    );
}

#[derive(Clone, Copy, Debug)]
enum Dep {
    Postgres,
    Redis,
}

/// Health through an outage of `dep` (proxy in `mode`) and back.
async fn outage(dep: Dep, mode: ProxyMode) {
    let stack = Stack::new().await;
    let (target, var) = match dep {
        Dep::Postgres => (host_port(&stack.db.url), "DATABASE_URL"),
        Dep::Redis => (host_port(&stack.redis.url), "REDIS_URL"),
    };
    let proxy = TcpProxy::start(&target).await;
    let via = match dep {
        Dep::Postgres => stack.db.url_via(proxy.addr),
        Dep::Redis => stack.redis.url_via(proxy.addr),
    };
    // Default DEPENDENCY_TIMEOUT_MS (2 s).
    let env = configured(stack.env()).with(var, via);
    let api = stack.api(&env).await;
    let health = api.url("/api/health");

    let h = get(&health).await;
    assert_eq!(h.status, 200, "before the outage: {}", h.text);
    // Open pooled connections through the proxy before cutting it.
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": "before@example.com"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    proxy.set(mode);
    let (down_key, up_key) = match dep {
        Dep::Postgres => ("database", "queue"),
        Dep::Redis => ("queue", "database"),
    };
    let started = Instant::now();
    let mut last: Option<Reply> = None;
    while started.elapsed() < Duration::from_secs(15) {
        let h = Reply::try_send(
            tests::client()
                .get(&health)
                .timeout(Duration::from_secs(10)),
        )
        .await;
        let h = h.unwrap_or_else(|e| {
            panic!(
                "{dep:?} {mode:?}: health request failed (hung or reset) after {:?}: {e}",
                started.elapsed()
            )
        });
        assert!(
            h.elapsed < Duration::from_secs(5),
            "{dep:?} {mode:?}: health took {:?} (must stay < 5 s)",
            h.elapsed
        );
        let done = h.status == 503;
        last = Some(h);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let h = last.expect("at least one health answer");
    assert_eq!(
        h.status, 503,
        "{dep:?} {mode:?}: health never reported the outage within 15 s: {}",
        h.text
    );
    assert_eq!(h.json["status"], "degraded", "{}", h.text);
    assert_eq!(h.json[down_key]["ok"], false, "{}", h.text);
    assert_eq!(
        h.json[up_key]["ok"], true,
        "the other dependency is fine: {}",
        h.text
    );

    // The public routes answer quickly (5xx problem), they do not hang.
    let (route, body) = match dep {
        Dep::Postgres => ("/api/waitlist", json!({"email": "during@example.com"})),
        Dep::Redis => (
            "/api/contact",
            json!({"name": "Ann", "email": "ann@example.com", "message": "hi"}),
        ),
    };
    for _ in 0..2 {
        let req = tests::client()
            .post(api.url(route))
            .header("x-forwarded-for", random_ip())
            .json(&body)
            .timeout(Duration::from_secs(10));
        let r = Reply::try_send(req)
            .await
            .unwrap_or_else(|e| panic!("{dep:?} {mode:?}: {route} failed: {e}"));
        assert!(
            r.elapsed < Duration::from_secs(5),
            "{dep:?} {mode:?}: {route} took {:?}",
            r.elapsed
        );
        assert!(
            r.status.is_server_error(),
            "{dep:?} {mode:?}: {route} during the outage answered {} {}",
            r.status,
            r.text
        );
        assert!(
            r.header("content-type")
                .unwrap_or("")
                .starts_with("application/problem+json"),
            "{}",
            r.text
        );
        if matches!(dep, Dep::Redis) {
            assert_eq!(r.status, 503, "queue unavailable is a 503: {}", r.text);
        }
    }

    proxy.on();
    let last = std::sync::Mutex::new(String::new());
    let back = tests::wait_until(Duration::from_secs(20), || async {
        let h = get(&health).await;
        *last.lock().unwrap() = format!("{} {}", h.status, h.text);
        h.status == 200
    })
    .await;
    assert!(
        back,
        "{dep:?} {mode:?}: health not 200 within 20 s after recovery: {}",
        last.lock().unwrap()
    );
    let r = post_json(
        &api.url(route),
        &random_ip(),
        &match dep {
            Dep::Postgres => json!({"email": "after@example.com"}),
            Dep::Redis => body.clone(),
        },
    )
    .await;
    assert_eq!(
        r.status, 200,
        "{dep:?} {mode:?}: {route} after recovery: {}",
        r.text
    );
    let _: &Value = &r.json;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_blackholed_then_back() {
    outage(Dep::Postgres, ProxyMode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_refusing_then_back() {
    outage(Dep::Postgres, ProxyMode::Refuse).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_blackholed_then_back() {
    outage(Dep::Redis, ProxyMode::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_refusing_then_back() {
    outage(Dep::Redis, ProxyMode::Refuse).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_frozen_then_back() {
    outage(Dep::Postgres, ProxyMode::Freeze).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_frozen_then_back() {
    outage(Dep::Redis, ProxyMode::Freeze).await;
}

/// The API reference pages (Scalar at `/api/docs`, Swagger UI at
/// `/api/swagger`) embed the very document `/api/openapi.json` serves.
#[tokio::test(flavor = "multi_thread")]
async fn reference_pages_show_the_served_document() {
    let stack = Stack::new().await;
    let api = stack.api(&configured(stack.env())).await;
    let doc = get(&api.url("/api/openapi.json")).await;
    assert_eq!(doc.status, 200);
    assert!(doc.text.len() > 10_000, "{}", doc.text.len());
    for (path, marker) in [
        ("/api/docs", "api-reference"),
        ("/api/swagger", "SwaggerUIBundle"),
    ] {
        let page = get(&api.url(path)).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(
            page.header("content-type")
                .unwrap_or("")
                .starts_with("text/html"),
            "{path}: {:?}",
            page.headers
        );
        assert!(page.text.contains(marker), "{path}");
        assert!(
            page.text.contains(&doc.text),
            "{path} embeds the served document"
        );
    }
}
