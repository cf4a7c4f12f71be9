//! `GET /auth/confirm` against the real `api`, PostgreSQL and Redis: the
//! email-link (`token_hash` + `type`) and PKCE (`code` + the verifier cookie
//! `@supabase/ssr` writes) flows against a fake external auth platform
//! (wiremock, the platform's documented payloads), the error redirect (auth
//! off, missing parameters, the platform refusing, down or slow), `next`
//! never leaving the app's origin, the session cookie pair working on a
//! logged-in route, and the cross-site rule for cookie-authenticated writes.

use std::time::{Duration, Instant};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use serde_json::{json, Value};
use tests::{hs256_token, reqwest, session_claims, EnvMap, Proc, Reply, Stack};
use uuid::Uuid;
use wiremock::{
    matchers::{body_json, header, method, path, query_param},
    Mock, MockServer, ResponseTemplate,
};

const SECRET: &str = "confirm-test-secret-0123456789abcdef0123456789";
const SERVICE_ROLE: &str = "service-role-confirm-0123456789abcdef";
const APP: &str = "https://app.example.com";
const PUBLISHABLE: &str = "sb_publishable_confirm_test";
/// A verifier as auth-js makes it: 112 hex characters.
const VERIFIER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// External-platform mode: the platform at `platform`, sessions HS256 with
/// [`SECRET`], `APP_URL` = [`APP`].
fn external_env(stack: &Stack, platform: &str) -> EnvMap {
    stack
        .session_env(SECRET, SERVICE_ROLE)
        .with("NEXT_PUBLIC_BACKEND_URL", platform)
        .with("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY", PUBLISHABLE)
        .with("APP_URL", APP)
}

/// The platform's session JSON for a fresh user, its access token signed
/// with [`SECRET`] (so this backend's session check accepts it).
fn platform_session(user: Uuid, email: &str) -> Value {
    let token = hs256_token(
        SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some(email)),
    );
    let now = tests::unix_now();
    json!({
        "access_token": token,
        "token_type": "bearer",
        "expires_in": 3600,
        "expires_at": now + 3600,
        "refresh_token": "v2rfrsh0k3n",
        "user": {
            "id": user, "aud": "authenticated", "role": "authenticated", "email": email,
            "email_confirmed_at": "2026-11-23T10:00:00Z", "app_metadata": {"provider": "email", "providers": ["email"]},
            "user_metadata": {}, "identities": [], "created_at": "2026-11-23T10:00:00Z",
            "updated_at": "2026-11-23T10:00:00Z", "is_anonymous": false
        }
    })
}

/// The external provider chosen, but no platform configured.
fn not_configured_env(stack: &Stack) -> EnvMap {
    stack
        .env()
        .with("APP_URL", APP)
        .with("AUTH_PROVIDER", "external")
}

async fn get(api: &Proc, path_and_query: &str, cookie: Option<&str>) -> Reply {
    let mut req = tests::no_redirects().get(api.url(path_and_query));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    Reply::send(req).await
}

fn location(r: &Reply) -> reqwest::Url {
    assert_eq!(
        r.status.as_u16(),
        303,
        "expected 303; got {} {}",
        r.status,
        r.text
    );
    let l = r
        .header("location")
        .unwrap_or_else(|| panic!("no Location: {:?}", r.headers));
    reqwest::Url::parse(l).unwrap_or_else(|e| panic!("Location {l:?} is not absolute: {e}"))
}

fn set_cookies(r: &Reply) -> Vec<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().expect("ascii").to_string())
        .collect()
}

/// The value of cookie `name` among `Set-Cookie` headers, with its attributes.
fn cookie<'a>(cookies: &'a [String], name: &str) -> Option<&'a str> {
    cookies
        .iter()
        .map(String::as_str)
        .find(|c| c.starts_with(&format!("{name}=")))
}

fn cookie_value(set_cookie: &str) -> &str {
    set_cookie
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
}

/// Asserts a redirect to the app's error page; answers (error, error_code).
fn assert_error_page(r: &Reply) -> (String, String) {
    let url = location(r);
    assert_eq!(url.origin().ascii_serialization(), APP, "{url}");
    assert_eq!(url.path(), "/auth/error", "{url}");
    let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
    let error = q
        .get("error")
        .cloned()
        .unwrap_or_else(|| panic!("no error in {url}"));
    assert!(!error.is_empty());
    assert!(
        set_cookies(r)
            .iter()
            .all(|c| !c.starts_with("sb-access-token=")),
        "{:?}",
        r.headers
    );
    (error, q.get("error_code").cloned().unwrap_or_default())
}

/// The access token cookie of a success answer, checked attribute by attribute.
fn assert_session_cookies(r: &Reply, expected_access: &str) -> String {
    let cookies = set_cookies(r);
    let access = cookie(&cookies, "sb-access-token").unwrap_or_else(|| panic!("{cookies:?}"));
    let refresh = cookie(&cookies, "sb-refresh-token").unwrap_or_else(|| panic!("{cookies:?}"));
    for c in [access, refresh] {
        for attr in ["Path=/", "HttpOnly", "SameSite=Lax", "Secure"] {
            assert!(c.split("; ").any(|a| a == attr), "{attr} missing in {c}");
        }
    }
    assert!(access.contains("Max-Age=3600"), "{access}");
    assert!(refresh.contains("Max-Age="), "{refresh}");
    assert_eq!(cookie_value(access), expected_access);
    assert_eq!(cookie_value(refresh), "v2rfrsh0k3n");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    cookie_value(access).to_string()
}

async fn save_profile(api: &Proc, cookie: &str, origin: Option<&str>, name: &str) -> Reply {
    let mut req = tests::no_redirects()
        .post(api.url("/api/profile"))
        .header("cookie", cookie)
        .json(&json!({ "full_name": name }));
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    Reply::send(req).await
}

#[tokio::test(flavor = "multi_thread")]
async fn email_link_through_the_external_platform_sets_the_session_cookies() {
    let stack = Stack::new().await;
    let platform = MockServer::start().await;
    let user = Uuid::new_v4();
    let session = platform_session(user, "ann@example.com");
    Mock::given(method("POST"))
        .and(path("/auth/v1/verify"))
        .and(header("apikey", PUBLISHABLE))
        .and(body_json(
            json!({"type": "signup", "token_hash": "pkce_0a1b2c3d4e5f"}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(&session))
        .expect(1)
        .mount(&platform)
        .await;
    let api = stack.api(&external_env(&stack, &platform.uri())).await;

    let r = get(
        &api,
        "/auth/confirm?token_hash=pkce_0a1b2c3d4e5f&type=signup&next=/dashboard%3Ftab%3D1",
        None,
    )
    .await;
    assert_eq!(
        location(&r).as_str(),
        "https://app.example.com/dashboard?tab=1"
    );
    let access = assert_session_cookies(&r, session["access_token"].as_str().unwrap());

    // The cookie is a session on logged-in routes, for the user the platform named.
    let saved = save_profile(&api, &format!("sb-access-token={access}"), Some(APP), "Ann").await;
    assert_eq!(saved.status.as_u16(), 200, "{}", saved.text);
    assert_eq!(saved.json["profile"]["full_name"], "Ann");
    let pool = stack.db.pool().await;
    let (name,): (Option<String>,) =
        sea_orm::sqlx::query_as("SELECT full_name FROM profiles WHERE user_id = $1")
            .bind(user)
            .fetch_one(&pool)
            .await
            .expect("profile row");
    assert_eq!(name.as_deref(), Some("Ann"));
}

#[tokio::test(flavor = "multi_thread")]
async fn pkce_code_uses_the_verifier_cookie_of_the_auth_client() {
    let stack = Stack::new().await;
    let platform = MockServer::start().await;
    let user = Uuid::new_v4();
    let session = platform_session(user, "bo@example.com");
    Mock::given(method("POST"))
        .and(path("/auth/v1/token"))
        .and(query_param("grant_type", "pkce"))
        .and(header("apikey", PUBLISHABLE))
        .and(body_json(
            json!({"auth_code": "c0de-1234", "code_verifier": VERIFIER}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(&session))
        .expect(2)
        .mount(&platform)
        .await;
    let api = stack.api(&external_env(&stack, &platform.uri())).await;

    // @supabase/ssr's default encoding: `base64-` + base64url(JSON string);
    // storage key `sb-<first label of the auth URL's host>-auth-token`.
    let name = "sb-127-auth-token-code-verifier";
    let encoded = format!(
        "base64-{}",
        URL_SAFE_NO_PAD.encode(format!("\"{VERIFIER}\""))
    );
    let r = get(
        &api,
        "/auth/confirm?code=c0de-1234&next=/welcome",
        Some(&format!("theme=dark; {name}={encoded}")),
    )
    .await;
    assert_eq!(location(&r).as_str(), "https://app.example.com/welcome");
    assert_session_cookies(&r, session["access_token"].as_str().unwrap());
    // The single-use verifier cookie is expired.
    let cookies = set_cookies(&r);
    let expired = cookie(&cookies, name).unwrap_or_else(|| panic!("{cookies:?}"));
    assert!(
        expired.contains("Max-Age=0") && expired.contains("Path=/"),
        "{expired}"
    );

    // A recovery flow's verifier (`…/recovery`), raw (percent-encoded JSON) encoding.
    let raw = format!("%22{VERIFIER}%2Frecovery%22");
    let r = get(
        &api,
        "/auth/confirm?code=c0de-1234&next=/auth/update-password",
        Some(&format!("{name}={raw}")),
    )
    .await;
    assert_eq!(location(&r).path(), "/auth/update-password");

    // No verifier cookie: the error page, and the platform is not asked.
    let r = get(&api, "/auth/confirm?code=c0de-1234", Some("theme=dark")).await;
    let (error, code) = assert_error_page(&r);
    assert_eq!(code, "code_verifier_missing", "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn platform_refusals_and_outages_land_on_the_error_page() {
    let stack = Stack::new().await;
    let platform = MockServer::start().await;
    // Legacy error format.
    Mock::given(method("POST"))
        .and(path("/auth/v1/verify"))
        .and(body_json(
            json!({"type": "magiclink", "token_hash": "used"}),
        ))
        .respond_with(ResponseTemplate::new(403).set_body_json(json!({
            "code": 403, "error_code": "otp_expired", "msg": "Email link is invalid or has expired"
        })))
        .mount(&platform)
        .await;
    // 2024-01-01 format.
    Mock::given(method("POST"))
        .and(path("/auth/v1/token"))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({
            "code": "flow_state_not_found", "message": "invalid flow state, no valid flow state found"
        })))
        .mount(&platform)
        .await;
    Mock::given(method("POST"))
        .and(path("/auth/v1/verify"))
        .and(body_json(json!({"type": "recovery", "token_hash": "boom"})))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream stack trace"))
        .mount(&platform)
        .await;
    Mock::given(method("POST"))
        .and(path("/auth/v1/verify"))
        .and(body_json(json!({"type": "invite", "token_hash": "slow"})))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&platform)
        .await;
    let api = stack.api(&external_env(&stack, &platform.uri())).await;

    let r = get(
        &api,
        "/auth/confirm?token_hash=used&type=magiclink&next=/x",
        None,
    )
    .await;
    assert_eq!(
        assert_error_page(&r),
        (
            "Email link is invalid or has expired".into(),
            "otp_expired".into()
        )
    );

    let verifier = format!("sb-127-auth-token-code-verifier=%22{VERIFIER}%22");
    let r = get(&api, "/auth/confirm?code=nope", Some(&verifier)).await;
    let (error, code) = assert_error_page(&r);
    assert_eq!(code, "flow_state_not_found");
    assert_eq!(error, "invalid flow state, no valid flow state found");

    // A platform failure never leaks its body.
    let r = get(&api, "/auth/confirm?token_hash=boom&type=recovery", None).await;
    let (error, code) = assert_error_page(&r);
    assert_eq!(code, "auth_unavailable");
    assert!(!error.contains("stack"), "{error}");

    // A hanging platform is given a bounded time.
    let t = Instant::now();
    let r = get(&api, "/auth/confirm?token_hash=slow&type=invite", None).await;
    assert_eq!(assert_error_page(&r).1, "auth_unavailable");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // An unreachable platform.
    drop(api);
    let env = external_env(&stack, "http://127.0.0.1:9");
    let api = stack.api(&env).await;
    let r = get(&api, "/auth/confirm?token_hash=any&type=email", None).await;
    assert_eq!(assert_error_page(&r).1, "auth_unavailable");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_unknown_parameters_and_auth_off_land_on_the_error_page() {
    let stack = Stack::new().await;
    let platform = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(platform_session(Uuid::new_v4(), "x@example.com")),
        )
        .expect(0)
        .mount(&platform)
        .await;
    let env = external_env(&stack, &platform.uri());
    let api = stack.api(&env).await;
    for q in [
        "",
        "?next=/dashboard",
        "?token_hash=abc",
        "?type=signup",
        "?token_hash=abc&type=sms",
        "?token_hash=abc&type=",
        "?token_hash=&type=signup",
        "?code=",
    ] {
        let r = get(&api, &format!("/auth/confirm{q}"), None).await;
        let (error, code) = assert_error_page(&r);
        assert_eq!(code, "validation_failed", "{q}: {error}");
    }
    drop(api);

    // Auth switched off by its toggle.
    let api = stack
        .api(&env.clone().with("NEXT_PUBLIC_ENABLE_AUTH", "false"))
        .await;
    let r = get(
        &api,
        "/auth/confirm?token_hash=abc&type=signup&next=/dashboard",
        None,
    )
    .await;
    assert_eq!(assert_error_page(&r).1, "auth_disabled");
    drop(api);

    // Auth not configured: no provider at all.
    let api = stack.api(&not_configured_env(&stack)).await;
    let r = get(&api, "/auth/confirm?token_hash=abc&type=signup", None).await;
    assert_eq!(assert_error_page(&r).1, "auth_not_configured");
}

#[tokio::test(flavor = "multi_thread")]
async fn next_never_leaves_the_app_origin() {
    let stack = Stack::new().await;
    let platform = MockServer::start().await;
    let session = platform_session(Uuid::new_v4(), "eve@example.com");
    Mock::given(method("POST"))
        .and(path("/auth/v1/verify"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&session))
        .mount(&platform)
        .await;
    let api = stack.api(&external_env(&stack, &platform.uri())).await;
    for (i, evil) in [
        "https://evil.example",
        "https%3A%2F%2Fevil.example%2F",
        "//evil.example",
        "%2F%2Fevil.example",
        "/\\evil.example",
        "%2F%5Cevil.example",
        "/%5Cevil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "javascript%3Aalert(1)",
        "JaVaScRiPt:alert(document.cookie)",
        "https://app.example.com@evil.example/",
        "https://app.example.com.evil.example/",
        "http://app.example.com/",
        "///evil.example",
        "/%0d%0aSet-Cookie:%20x=1",
        "%09/evil.example",
    ]
    .iter()
    .enumerate()
    {
        let r = Reply::send(
            tests::no_redirects()
                .get(api.url(&format!(
                    "/auth/confirm?token_hash=t{i}&type=email&next={evil}"
                )))
                .header("x-forwarded-for", format!("10.9.0.{i}")),
        )
        .await;
        let url = location(&r);
        assert_eq!(url.origin().ascii_serialization(), APP, "{evil} -> {url}");
        assert_eq!(url.host_str(), Some("app.example.com"), "{evil} -> {url}");
        assert!(
            r.header("location")
                .unwrap()
                .starts_with("https://app.example.com/"),
            "{evil}"
        );
        assert!(
            set_cookies(&r).iter().all(|c| !c.starts_with("x=")),
            "{evil}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cookie_sessions_refuse_cross_site_writes() {
    let stack = Stack::new().await;
    let api = stack.api(&external_env(&stack, "http://127.0.0.1:9")).await;
    let user = Uuid::new_v4();
    let token = hs256_token(
        SECRET.as_bytes(),
        &session_claims(&user.to_string(), Some("cy@example.com")),
    );
    let jar = format!("theme=dark; sb-access-token={token}; sb-refresh-token=r");

    // Same origin, or no Origin at all (SameSite=Lax already kept the cookie
    // off cross-site subrequests): accepted.
    let r = save_profile(&api, &jar, Some(APP), "Cy").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let r = save_profile(&api, &jar, None, "Cy").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);

    // Another origin, `null`, a sibling scheme or port: refused before any write.
    for origin in [
        "https://evil.example",
        "null",
        "http://app.example.com",
        "https://app.example.com:8443",
    ] {
        let r = save_profile(&api, &jar, Some(origin), "Mallory").await;
        r.assert_problem(401, Some("cross_site_cookie"), None);
    }
    // No Origin but the browser says cross-site.
    let r = Reply::send(
        tests::no_redirects()
            .post(api.url("/api/profile"))
            .header("cookie", &jar)
            .header("sec-fetch-site", "cross-site")
            .json(&json!({"full_name": "Mallory"})),
    )
    .await;
    r.assert_problem(401, Some("cross_site_cookie"), None);

    // A bearer header is not ambient authority: any Origin is fine.
    let r = Reply::send(
        tests::no_redirects()
            .post(api.url("/api/profile"))
            .bearer_auth(&token)
            .header("origin", "https://evil.example")
            .json(&json!({"full_name": "Cy2"})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);

    // An invalid cookie token is a 401 like an invalid header token.
    let r = save_profile(&api, "sb-access-token=not.a.jwt", Some(APP), "x").await;
    r.assert_problem(401, None, None);
    // No cookie and no header: still `missing_token`.
    let r = save_profile(&api, "theme=dark", Some(APP), "x").await;
    r.assert_problem(401, Some("missing_token"), None);

    let pool = stack.db.pool().await;
    let (name,): (Option<String>,) =
        sea_orm::sqlx::query_as("SELECT full_name FROM profiles WHERE user_id = $1")
            .bind(user)
            .fetch_one(&pool)
            .await
            .expect("profile row");
    assert_eq!(name.as_deref(), Some("Cy2"));
}

// ---------------------------------------------------------------------------
// The built-in identity provider
// ---------------------------------------------------------------------------

/// The built-in provider (no external platform configured): api + worker +
/// SMTP sink, `APP_URL` = [`APP`], server-side writes armed.
async fn built_in(stack: &Stack) -> (Proc, Proc, tests::SmtpSink) {
    let sink = tests::SmtpSink::start().await;
    let env = stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("APP_URL", APP)
        .with("BACKEND_SERVICE_ROLE_KEY", SERVICE_ROLE)
        .with("JOB_RETRY_BASE_SECS", "1")
        .with("AUTH_RATE_LIMIT_PER_5MIN", "100000");
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    (api, worker, sink)
}

/// Mail number `n` (1-based) as text, quoted-printable soft breaks undone.
async fn mail(sink: &tests::SmtpSink, n: usize) -> String {
    let mails = sink.wait_for(n, Duration::from_secs(30)).await;
    mails[n - 1].searchable()
}

/// The `token=` of the mail's confirmation link (the token hash).
fn link_token(text: &str) -> String {
    let i = text.find("token=").expect("a link with token= in the mail");
    let rest = &text[i + 6..];
    let end = rest.find(['&', '"', '\r', '\n', ' ']).unwrap_or(rest.len());
    rest[..end].to_string()
}

async fn auth_v1(api: &Proc, path: &str, body: &Value) -> Reply {
    Reply::send(
        tests::no_redirects()
            .post(api.url(&format!("/auth/v1{path}")))
            .header("x-forwarded-for", tests::random_ip())
            .json(body),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn built_in_signup_link_confirms_into_a_cookie_session() {
    let stack = Stack::new().await;
    let (api, _worker, sink) = built_in(&stack).await;
    let r = auth_v1(
        &api,
        "/signup",
        &json!({"email": "dee@example.com", "password": "correct horse battery"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let user: Uuid = r.json["id"].as_str().unwrap().parse().unwrap();
    let hash = link_token(&mail(&sink, 1).await);

    let link = format!("/auth/confirm?token_hash={hash}&type=signup&next=/dashboard");
    let r = get(&api, &link, None).await;
    assert_eq!(location(&r).as_str(), "https://app.example.com/dashboard");
    let cookies = set_cookies(&r);
    let access = cookie(&cookies, "sb-access-token").unwrap_or_else(|| panic!("{cookies:?}"));
    let refresh = cookie(&cookies, "sb-refresh-token").unwrap_or_else(|| panic!("{cookies:?}"));
    for c in [access, refresh] {
        for attr in ["Path=/", "HttpOnly", "SameSite=Lax", "Secure"] {
            assert!(c.split("; ").any(|a| a == attr), "{attr} missing in {c}");
        }
    }
    assert!(access.contains("Max-Age=3600"), "{access}");
    let access = cookie_value(access).to_string();
    assert_eq!(access.split('.').count(), 3, "{access}");

    // The cookie is a session of the new user on logged-in routes and /auth/v1/user.
    let saved = save_profile(&api, &format!("sb-access-token={access}"), Some(APP), "Dee").await;
    assert_eq!(saved.status.as_u16(), 200, "{}", saved.text);
    let me = Reply::send(
        tests::no_redirects()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(&access),
    )
    .await;
    assert_eq!(me.json["id"], user.to_string(), "{}", me.text);
    assert!(me.json["email_confirmed_at"].is_string(), "{}", me.text);
    let pool = stack.db.pool().await;
    let (name,): (Option<String>,) =
        sea_orm::sqlx::query_as("SELECT full_name FROM profiles WHERE user_id = $1")
            .bind(user)
            .fetch_one(&pool)
            .await
            .expect("profile row");
    assert_eq!(name.as_deref(), Some("Dee"));

    // The link is single use.
    let r = get(&api, &link, None).await;
    let (error, code) = assert_error_page(&r);
    assert_eq!(code, "otp_expired", "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn built_in_pkce_magic_link_confirms_with_the_verifier_cookie() {
    use sha2::Digest as _;
    let stack = Stack::new().await;
    let (api, _worker, sink) = built_in(&stack).await;
    let r = auth_v1(
        &api,
        "/signup",
        &json!({"email": "eli@example.com", "password": "correct horse battery"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let hash = link_token(&mail(&sink, 1).await);
    let r = auth_v1(
        &api,
        "/verify",
        &json!({"type": "signup", "token_hash": hash}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);

    // The browser client (flowType pkce) keeps the verifier in its cookie
    // and asks for a magic link back to /auth/confirm.
    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(VERIFIER.as_bytes()));
    let r = auth_v1(
        &api,
        "/otp?redirect_to=https%3A%2F%2Fapp.example.com%2Fauth%2Fconfirm%3Fnext%3D%2Fsettings",
        &json!({"email": "eli@example.com", "create_user": false, "code_challenge": challenge, "code_challenge_method": "s256"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let token = link_token(&mail(&sink, 2).await);
    let r = Reply::send(tests::no_redirects().get(api.url(&format!(
        "/auth/v1/verify?token={token}&type=magiclink&redirect_to=https%3A%2F%2Fapp.example.com%2Fauth%2Fconfirm%3Fnext%3D%2Fsettings"
    ))))
    .await;
    let back = location(&r);
    assert_eq!(back.path(), "/auth/confirm", "{back}");
    let q: std::collections::HashMap<_, _> = back.query_pairs().into_owned().collect();
    let code = q.get("code").unwrap_or_else(|| panic!("no code in {back}"));

    // Without the verifier cookie: the error page, and the code still works after.
    let confirm = format!("/auth/confirm?code={code}&next=/settings");
    let r = get(&api, &confirm, None).await;
    assert_eq!(assert_error_page(&r).1, "code_verifier_missing");

    // The storage key of an auth client pointed at APP_URL: `sb-app-auth-token`.
    let jar = format!(
        "sb-app-auth-token-code-verifier=base64-{}",
        URL_SAFE_NO_PAD.encode(format!("\"{VERIFIER}\""))
    );
    let r = get(&api, &confirm, Some(&jar)).await;
    assert_eq!(location(&r).as_str(), "https://app.example.com/settings");
    let cookies = set_cookies(&r);
    let access = cookie(&cookies, "sb-access-token").unwrap_or_else(|| panic!("{cookies:?}"));
    let me = Reply::send(
        tests::no_redirects()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(cookie_value(access)),
    )
    .await;
    assert_eq!(me.json["email"], "eli@example.com", "{}", me.text);
    let expired = cookie(&cookies, "sb-app-auth-token-code-verifier")
        .unwrap_or_else(|| panic!("{cookies:?}"));
    assert!(expired.contains("Max-Age=0"), "{expired}");

    // The code is single use.
    let r = get(&api, &confirm, Some(&jar)).await;
    assert_eq!(assert_error_page(&r).1, "flow_state_not_found");
}
