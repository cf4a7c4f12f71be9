//! CORS (`CORS_ALLOWED_ORIGINS`): a page on a listed origin may call `/api`,
//! `/auth/v1` and `/storage/v1`; any other origin gets the normal answer
//! without CORS headers; the payment webhooks never take part; unset = no
//! CORS at all.

use reqwest::Method;
use serde_json::json;
use tests::{client, random_ip, Reply, Stack};

const APP: &str = "http://app.example.test:5173";
const OTHER: &str = "https://evil.example.test";

async fn preflight(url: &str, origin: &str, method: &str, headers: &str) -> Reply {
    Reply::send(
        client()
            .request(Method::OPTIONS, url)
            .header("origin", origin)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", headers),
    )
    .await
}

fn list(r: &Reply, name: &str) -> Vec<String> {
    r.headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect()
}

fn varies_on_origin(r: &Reply) -> bool {
    list(r, "vary").iter().any(|v| v == "origin")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listed_origin_gets_preflights_and_exposed_headers() {
    let stack = Stack::new().await;
    let env = stack.env().with(
        "CORS_ALLOWED_ORIGINS",
        format!("https://other.example.test, {APP}"),
    );
    let api = stack.api(&env).await;
    let asked = "authorization,content-type,idempotency-key,apikey,x-client-info,x-supabase-api-version,x-upsert";

    for (path, method) in [
        ("/api/contact", "POST"),
        ("/api/payments", "POST"),
        ("/api/health", "GET"),
        ("/auth/v1/signup", "POST"),
        ("/auth/v1/token", "POST"),
        ("/storage/v1/object/upload/sign/avatars/x/avatar", "PUT"),
    ] {
        let r = preflight(&api.url(path), APP, method, asked).await;
        assert!(
            r.status == 200 || r.status == 204,
            "{path}: {} {:?}",
            r.status,
            r.headers
        );
        assert_eq!(r.header("access-control-allow-origin"), Some(APP), "{path}");
        let methods = list(&r, "access-control-allow-methods");
        for m in ["get", "post", "put", "patch", "delete"] {
            assert!(methods.contains(&m.to_string()), "{path}: {methods:?}");
        }
        let headers = list(&r, "access-control-allow-headers");
        for h in asked.split(',') {
            assert!(
                headers.contains(&h.to_string()),
                "{path}: {h} in {headers:?}"
            );
        }
        assert!(varies_on_origin(&r), "{path}: {:?}", r.headers);
        assert_eq!(r.header("access-control-allow-credentials"), None);
    }

    // The actual request: the answer as usual, readable by the page.
    let r = Reply::send(
        client()
            .post(api.url("/api/waitlist"))
            .header("origin", APP)
            .header("x-forwarded-for", random_ip())
            .json(&json!({"email": "cors@example.com"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(varies_on_origin(&r), "{:?}", r.headers);
    let exposed = list(&r, "access-control-expose-headers");
    for h in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
        "x-request-id",
        "idempotent-replayed",
        "etag",
        "x-supabase-api-version",
    ] {
        assert!(exposed.contains(&h.to_string()), "{h} in {exposed:?}");
    }

    // Errors are readable too (a problem from /auth/v1).
    let r = Reply::send(
        client()
            .post(api.url("/auth/v1/token?grant_type=password"))
            .header("origin", APP)
            .json(&json!({"email": "nobody@example.com", "password": "wrong-password"})),
    )
    .await;
    assert!(r.status.is_client_error(), "{} {}", r.status, r.text);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
}

#[tokio::test(flavor = "multi_thread")]
async fn other_origins_and_the_webhooks_get_no_cors_headers() {
    let stack = Stack::new().await;
    let env = stack.env().with("CORS_ALLOWED_ORIGINS", APP);
    let api = stack.api(&env).await;

    // An unlisted origin: the normal answer, no CORS headers (not poem's 403).
    let r = Reply::send(
        client()
            .post(api.url("/api/waitlist"))
            .header("origin", OTHER)
            .header("x-forwarded-for", random_ip())
            .json(&json!({"email": "other@example.com"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert!(varies_on_origin(&r), "{:?}", r.headers);

    let r = preflight(&api.url("/api/contact"), OTHER, "POST", "content-type").await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        None,
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("access-control-allow-methods"), None);

    // Same origin as the API, and a near-miss of the listed one.
    for origin in [
        api.url(""),
        format!("{APP}/"),
        "http://app.example.test".into(),
    ] {
        let r = preflight(&api.url("/api/contact"), &origin, "POST", "content-type").await;
        assert_eq!(
            r.header("access-control-allow-origin"),
            None,
            "{origin}: {:?}",
            r.headers
        );
    }

    // The payment webhooks: never CORS, even for a listed origin.
    for path in ["/api/webhooks/provider_a", "/api/webhooks/provider_b"] {
        let r = preflight(&api.url(path), APP, "POST", "content-type").await;
        assert_eq!(r.header("access-control-allow-origin"), None, "{path}");
        let r = Reply::send(
            client()
                .post(api.url(path))
                .header("origin", APP)
                .json(&json!({})),
        )
        .await;
        assert_eq!(r.header("access-control-allow-origin"), None, "{path}");
    }

    // Outside the scope: metrics and the cookie confirmation.
    for path in ["/auth/confirm", "/metrics"] {
        let r = preflight(&api.url(path), APP, "GET", "authorization").await;
        assert_eq!(r.header("access-control-allow-origin"), None, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unset_means_no_cors_at_all() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let r = preflight(&api.url("/api/contact"), APP, "POST", "content-type").await;
    assert_eq!(r.status, 405, "as before: {}", r.text);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = Reply::send(client().get(api.url("/api/health")).header("origin", APP)).await;
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert!(!varies_on_origin(&r), "{:?}", r.headers);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_list_stops_the_process() {
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with("CORS_ALLOWED_ORIGINS", "https://app.example.com/path");
    let mut p = tests::Proc::spawn("api", &[], &env, stack.dir.path());
    let status = p
        .wait_exit(std::time::Duration::from_secs(30))
        .await
        .expect("the api stops at start");
    assert!(!status.success());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        p.stderr().contains("CORS_ALLOWED_ORIGINS"),
        "{}",
        p.stderr()
    );
}
