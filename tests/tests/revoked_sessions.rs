//! A session of the built-in provider that has ended stops working on the
//! logged-in `/api` routes at once, not when its access token expires: after
//! a password change (the other sessions) or a sign-out, its token gets 401
//! `session_not_found` on `GET /api/me`, `POST /api/profile` and
//! `POST /api/profile/avatar`, and the upload grants it was given are refused
//! at upload. The session that changed the password goes on; a session
//! signed in through another api process is accepted at once; a revocation
//! through one api reaches the other's cache; tokens of another issuer
//! (HS256 `BACKEND_JWT_SECRET`) carry no session of ours and are not checked.
//! The real api on PostgreSQL + Redis.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{
    client, hs256_token, random_ip, session_claims, wait_until, EnvMap, Proc, Reply, SmtpSink,
    Stack,
};
use uuid::Uuid;

const PASSWORD: &str = "correct horse battery";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const SECRET: &str = "sessions-test-secret-0123456789abcdef0123456789";
const APP: &str = "https://app.example.com";

/// The built-in provider with autoconfirm (a sign-up is a session), server
/// writes armed, generous `/auth/v1` limits.
fn idp_env(stack: &Stack, sink: &SmtpSink) -> EnvMap {
    stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("APP_URL", APP)
        .with("AUTH_PROVIDER", "builtin")
        .with("AUTH_AUTOCONFIRM", "true")
        .with("BACKEND_SERVICE_ROLE_KEY", SERVICE_KEY)
        .with("AUTH_RATE_LIMIT_PER_5MIN", "100000")
        .with("AUTH_RATE_LIMIT_REFRESH_PER_5MIN", "100000")
}

/// `POST /auth/v1{path}` from a fresh client IP.
async fn auth_post(api: &Proc, path: &str, token: Option<&str>, body: &Value) -> Reply {
    let req = client()
        .post(api.url(&format!("/auth/v1{path}")))
        .header("x-forwarded-for", random_ip())
        .header("x-supabase-api-version", "2024-01-01")
        .json(body);
    let req = match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    };
    Reply::send(req).await
}

/// Sign-up (autoconfirmed): the first session's access token.
async fn sign_up(api: &Proc, email: &str) -> String {
    let r = auth_post(
        api,
        "/signup",
        None,
        &json!({"email": email, "password": PASSWORD}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    access_token(&r)
}

/// Password sign-in: a new session's access token.
async fn sign_in(api: &Proc, email: &str, password: &str) -> String {
    let r = auth_post(
        api,
        "/token?grant_type=password",
        None,
        &json!({"email": email, "password": password}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    access_token(&r)
}

fn access_token(r: &Reply) -> String {
    r.json["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {}", r.text))
        .to_string()
}

/// `PUT /auth/v1/user {password}` as `token`.
async fn change_password(api: &Proc, token: &str, password: &str) {
    let r = Reply::send(
        client()
            .put(api.url("/auth/v1/user"))
            .header("x-supabase-api-version", "2024-01-01")
            .bearer_auth(token)
            .json(&json!({"password": password})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn me(api: &Proc, token: &str) -> Reply {
    Reply::send(client().get(api.url("/api/me")).bearer_auth(token)).await
}

async fn save_profile(api: &Proc, token: &str, name: &str) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/profile"))
            .bearer_auth(token)
            .json(&json!({"full_name": name})),
    )
    .await
}

/// A small valid PNG.
fn png() -> Vec<u8> {
    let mut v =
        b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89"
            .to_vec();
    v.extend_from_slice(
        b"\0\0\0\x0aIDATx\x9cc\0\x01\0\0\x05\0\x01\x0d\x0a\x2d\xb4\0\0\0\0IEND\xaeB`\x82",
    );
    v
}

/// `POST /api/profile/avatar` for [`png`] as `token`.
async fn request_grant(api: &Proc, token: &str) -> Reply {
    Reply::send(
        client()
            .post(api.url("/api/profile/avatar"))
            .bearer_auth(token)
            .json(&json!({"fileSize": png().len(), "fileType": "image/png"})),
    )
    .await
}

/// An upload URL on `api` for the grant `r` answered (its user's path).
fn upload_url(api: &Proc, r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.text);
    format!(
        "{}?token={}",
        api.url(&format!(
            "/storage/v1/object/upload/sign/avatars/{}",
            r.json["path"].as_str().expect("path")
        )),
        r.json["token"].as_str().expect("token")
    )
}

async fn upload(url: &str) -> Reply {
    Reply::send(
        client()
            .put(url)
            .header("content-type", "image/png")
            .body(png()),
    )
    .await
}

fn assert_ended(r: &Reply, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.text);
    assert_eq!(r.json["code"], "session_not_found", "{what}: {}", r.text);
}

/// Every logged-in route tried with `token` answers 401
/// `session_not_found`, and so does the upload with `grant_url` (a grant the
/// session got while it lived).
async fn assert_session_ended(api: &Proc, token: &str, grant_url: &str) {
    assert_ended(&me(api, token).await, "GET /api/me");
    assert_ended(
        &save_profile(api, token, "Mallory").await,
        "POST /api/profile",
    );
    assert_ended(&request_grant(api, token).await, "POST /api/profile/avatar");
    assert_ended(&upload(grant_url).await, "the upload with an earlier grant");
}

/// The routes work for `token`: `GET /api/me`, a profile save, a grant and
/// its upload.
async fn assert_session_works(api: &Proc, token: &str, name: &str) {
    let r = me(api, token).await;
    assert_eq!(r.status, 200, "GET /api/me: {}", r.text);
    let r = save_profile(api, token, name).await;
    assert_eq!(r.status, 200, "POST /api/profile: {}", r.text);
    let url = upload_url(api, &request_grant(api, token).await);
    let r = upload(&url).await;
    assert_eq!(r.status, 200, "upload: {}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_change_ends_the_other_sessions_on_every_api_route() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = stack.api(&idp_env(&stack, &sink)).await;
    let email = "pia@example.com";
    let mine = sign_up(&api, email).await;
    // The attacker's session (a stolen token), used while it is valid: the
    // account is kept in the api's cache and it holds an upload grant.
    let stolen = sign_in(&api, email, PASSWORD).await;
    assert_session_works(&api, &stolen, "Pia").await;
    let stolen_grant = upload_url(&api, &request_grant(&api, &stolen).await);
    assert_session_works(&api, &mine, "Pia").await;

    change_password(&api, &mine, "a brand new password").await;

    assert_session_ended(&api, &stolen, &stolen_grant).await;
    // The session that changed the password goes on.
    assert_session_works(&api, &mine, "Pia P.").await;
    let r = me(&api, &mine).await;
    assert_eq!(r.json["profile"]["full_name"], "Pia P.", "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_global_sign_out_ends_every_session_on_every_api_route() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = stack.api(&idp_env(&stack, &sink)).await;
    let email = "olga@example.com";
    let first = sign_up(&api, email).await;
    let second = sign_in(&api, email, PASSWORD).await;
    assert_session_works(&api, &first, "Olga").await;
    assert_session_works(&api, &second, "Olga").await;
    let first_grant = upload_url(&api, &request_grant(&api, &first).await);
    let second_grant = upload_url(&api, &request_grant(&api, &second).await);

    let r = auth_post(&api, "/logout?scope=global", Some(&second), &json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text);

    assert_session_ended(&api, &first, &first_grant).await;
    assert_session_ended(&api, &second, &second_grant).await;
    // A new sign-in works at once.
    let again = sign_in(&api, email, PASSWORD).await;
    assert_session_works(&api, &again, "Olga").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_apis_accept_a_new_session_at_once_and_share_a_revocation() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let env = idp_env(&stack, &sink);
    // One database, one DATA_DIR: the signing key generated by the first.
    let a = stack.api(&env).await;
    let b = stack.api(&env).await;
    let email = "remy@example.com";
    let first = sign_up(&a, email).await;
    // B keeps the account in its cache for the first session.
    for _ in 0..3 {
        let r = me(&b, &first).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // A session signed in through A is accepted by B at once, on the cached
    // route and on the others.
    let second = sign_in(&a, email, PASSWORD).await;
    let r = me(&b, &second).await;
    assert_eq!(r.status, 200, "a new session on the other api: {}", r.text);
    assert_session_works(&b, &second, "Remy").await;
    let second_grant = upload_url(&b, &request_grant(&b, &second).await);

    // The second session signs out through A; B, which served it from its
    // cache, refuses it as soon as PostgreSQL's notification arrives.
    let r = auth_post(&a, "/logout?scope=local", Some(&second), &json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text);
    let refused = wait_until(Duration::from_secs(10), || async {
        me(&b, &second).await.status == 401
    })
    .await;
    assert!(
        refused,
        "B still serves the signed-out session from its cache"
    );
    assert_session_ended(&b, &second, &second_grant).await;
    // The first session is untouched, on both.
    for api in [&a, &b] {
        let r = me(api, &first).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_of_another_issuer_is_not_checked_for_a_session() {
    let stack = Stack::new().await;
    let sink = SmtpSink::start().await;
    let api = stack
        .api(&idp_env(&stack, &sink).with("BACKEND_JWT_SECRET", SECRET))
        .await;
    // An HS256 token of the platform, even one naming a session id that is
    // not ours, is verified as before and not looked up.
    let user = Uuid::new_v4();
    let mut claims = session_claims(&user.to_string(), Some("hal@example.com"));
    claims["session_id"] = json!(Uuid::new_v4().to_string());
    let token = hs256_token(SECRET.as_bytes(), &claims);
    assert_session_works(&api, &token, "Hal").await;
    let r = me(&api, &token).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["profile"]["full_name"], "Hal", "{}", r.text);
}
