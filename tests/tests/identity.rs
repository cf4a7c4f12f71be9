//! The built-in identity provider (`/auth/v1`) end to end: the real
//! api and worker on PostgreSQL + Redis, mails read from the SMTP sink.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{
    assert_error, code, no_redirects as client, random_ip, token_hash, Idp, Reply, APP, PASSWORD,
};

fn assert_session(s: &Value) {
    assert!(
        s["access_token"]
            .as_str()
            .is_some_and(|t| t.split('.').count() == 3),
        "{s}"
    );
    assert_eq!(s["token_type"], "bearer");
    assert_eq!(s["expires_in"], 3600);
    assert!(s["expires_at"].as_i64().unwrap() > 1_700_000_000);
    assert!(
        s["refresh_token"].as_str().is_some_and(|t| t.len() >= 20),
        "{s}"
    );
    assert!(s["user"]["id"].is_string());
    assert_eq!(s["user"]["aud"], "authenticated");
}

#[tokio::test(flavor = "multi_thread")]
async fn signup_confirm_sign_in_user_refresh_and_logout() {
    // A reuse interval no loaded machine outlasts between two requests; the
    // test then moves the rotation past it on the database's clock.
    let idp = Idp::start(&[("AUTH_REFRESH_REUSE_INTERVAL_SECS", "60")])
        .await
        .from_one_ip();
    let r = idp.signup_as_auth_js("Ann@Example.com").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["email"], "Ann@Example.com");
    assert!(r.json["email_confirmed_at"].is_null(), "{}", r.text);
    assert!(r.json.get("access_token").is_none());
    assert_eq!(r.json["identities"][0]["provider"], "email");
    assert_eq!(r.json["user_metadata"]["name"], "Ann");

    // Unconfirmed: 400 email_not_confirmed.
    let r = idp.sign_in("ann@example.com", PASSWORD).await;
    assert_error(&r, 400, "email_not_confirmed");

    let (to, text) = idp.mail(1).await;
    assert_eq!(to, "Ann@Example.com");
    assert!(text.contains("/auth/v1/verify?token="), "{text}");
    let hash = token_hash(&text);
    let r = idp
        .post("/verify", &json!({"type": "signup", "token_hash": hash}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_session(&r.json);
    assert!(r.json["user"]["email_confirmed_at"].is_string());
    // Single use.
    let r = idp
        .post("/verify", &json!({"type": "signup", "token_hash": hash}))
        .await;
    assert_error(&r, 403, "otp_expired");

    // Password sign-in, case-insensitive email.
    let r = idp
        .post(
            "/token?grant_type=password",
            &json!({"email": "ANN@example.COM", "password": PASSWORD, "gotrue_meta_security": {}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_session(&r.json);
    for h in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(r.header(h).is_some(), "{h}");
    }
    let s1 = r.json.clone();
    let access = s1["access_token"].as_str().unwrap();

    // The token's claims, verified with the published JWKS.
    let jwks = tests::get(&idp.url("/.well-known/jwks.json")).await;
    assert_eq!(jwks.status, 200);
    let key = &jwks.json["keys"][0];
    assert!(key.get("d").is_none(), "no private material: {key}");
    let header = jsonwebtoken::decode_header(access).unwrap();
    assert_eq!(header.alg, jsonwebtoken::Algorithm::ES256);
    assert_eq!(header.kid.as_deref(), key["kid"].as_str());
    let dk = jsonwebtoken::DecodingKey::from_ec_components(
        key["x"].as_str().unwrap(),
        key["y"].as_str().unwrap(),
    )
    .unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    v.set_audience(&["authenticated"]);
    let claims = jsonwebtoken::decode::<Value>(access, &dk, &v)
        .unwrap()
        .claims;
    for c in [
        "sub",
        "aud",
        "exp",
        "iat",
        "iss",
        "email",
        "phone",
        "app_metadata",
        "user_metadata",
        "role",
        "aal",
        "amr",
        "session_id",
        "is_anonymous",
    ] {
        assert!(claims.get(c).is_some(), "claim {c}: {claims}");
    }
    assert_eq!(claims["iss"], format!("{APP}/auth/v1"));
    assert_eq!(claims["amr"][0]["method"], "password");
    assert_eq!(claims["app_metadata"]["provider"], "email");

    let r = idp.get_auth("/user", access).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["id"], s1["user"]["id"]);
    assert_eq!(r.json["app_metadata"]["providers"], json!(["email"]));
    // A field without a value is absent, as on the platform (the schema says
    // string): never a JSON null.
    assert!(r.json.get("new_email").is_none(), "{}", r.text);
    assert!(r.json.get("recovery_sent_at").is_none(), "{}", r.text);
    let nulls = |v: &Value| v.as_object().unwrap().values().any(Value::is_null);
    assert!(!nulls(&r.json), "{}", r.text);
    assert!(!nulls(&r.json["identities"][0]), "{}", r.text);
    let user = r.json.clone();

    // Refresh rotates; the parent within the reuse interval yields the active one.
    let rt1 = s1["refresh_token"].as_str().unwrap();
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": rt1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["user"], user,
        "a refresh answers the user GET /user shows"
    );
    let rt2 = r.json["refresh_token"].as_str().unwrap().to_string();
    assert_ne!(rt2, rt1);
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": rt1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["refresh_token"],
        rt2.as_str(),
        "the active token again"
    );
    // After the interval, reusing the parent revokes the session.
    idp.execute(
        "UPDATE auth_refresh_tokens SET revoked_at = revoked_at - interval '1 hour' \
         WHERE revoked_at IS NOT NULL",
    )
    .await;
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": rt1}),
        )
        .await;
    assert_error(&r, 400, "refresh_token_already_used");
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": rt2}),
        )
        .await;
    assert_eq!(
        r.status, 400,
        "the active token died with its session: {}",
        r.text
    );
    let r = idp.get_auth("/user", access).await;
    assert_error(&r, 403, "session_not_found");

    // A new session; logout (global) ends it.
    let r = idp.sign_in("ann@example.com", PASSWORD).await;
    let s2 = r.json.clone();
    let access2 = s2["access_token"].as_str().unwrap();
    let r = Reply::send(
        client()
            .post(idp.url("/logout?scope=global"))
            .bearer_auth(access2)
            .header("content-type", "application/json;charset=UTF-8"),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = idp.get_auth("/user", access2).await;
    assert_error(&r, 403, "session_not_found");
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": s2["refresh_token"]}),
        )
        .await;
    assert_error(&r, 400, "refresh_token_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_use_the_platform_codes_in_both_formats() {
    let idp = Idp::start(&[]).await.from_one_ip();
    let s = idp.confirmed_user("bob@example.com", 1).await;
    let access = s["access_token"].as_str().unwrap();

    // Wrong password and unknown email look alike.
    let wrong = idp
        .post(
            "/token?grant_type=password",
            &json!({"email": "bob@example.com", "password": "not the password"}),
        )
        .await;
    assert_error(&wrong, 400, "invalid_credentials");
    let unknown = idp
        .post(
            "/token?grant_type=password",
            &json!({"email": "nobody@example.com", "password": "not the password"}),
        )
        .await;
    assert_error(&unknown, 400, "invalid_credentials");
    assert_eq!(wrong.json, unknown.json);

    // Legacy format without the header.
    let r = idp
        .post_legacy(
            "/token?grant_type=password",
            &json!({"email": "bob@example.com", "password": "nope nope"}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["code"], 400, "{}", r.text);
    assert_eq!(r.json["error_code"], "invalid_credentials");
    assert!(r.json["msg"].is_string());
    assert!(r.header("x-supabase-api-version").is_none());

    // Weak password, with reasons.
    let r = idp
        .post(
            "/signup",
            &json!({"email": "carl@example.com", "password": "short"}),
        )
        .await;
    assert_error(&r, 422, "weak_password");
    assert_eq!(r.json["weak_password"]["reasons"], json!(["length"]));
    let r = idp
        .post_legacy(
            "/signup",
            &json!({"email": "carl@example.com", "password": "short"}),
        )
        .await;
    assert_eq!(r.json["error_code"], "weak_password");
    assert_eq!(r.json["weak_password"]["reasons"], json!(["length"]));

    // Same password; a new one works.
    let r = idp
        .put_auth("/user", access, &json!({"password": PASSWORD}))
        .await;
    assert_error(&r, 422, "same_password");
    let r = idp
        .put_auth("/user", access, &json!({"password": "x"}))
        .await;
    assert_error(&r, 422, "weak_password");
    let r = idp
        .put_auth("/user", access, &json!({"password": "a brand new secret", "data": {"plan": "pro"}, "code_challenge": null}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user_metadata"]["plan"], "pro");
    let r = idp
        .post(
            "/token?grant_type=password",
            &json!({"email": "bob@example.com", "password": "a brand new secret"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Malformed body / missing fields: validation_failed, never a 500.
    let r = idp
        .post("/signup", &json!({"email": "x@example.com"}))
        .await;
    assert_error(&r, 400, "validation_failed");
    let r = idp.post("/token?grant_type=magic", &json!({})).await;
    assert_error(&r, 400, "validation_failed");
    let r = idp.post("/verify", &json!({"type": "signup"})).await;
    assert_error(&r, 400, "validation_failed");
    // JSON types are checked (as on the platform): a number is not a
    // password, even one of 8 digits; `null` is an absent optional field, and
    // fields the platform's clients add are ignored.
    let r = idp
        .post(
            "/token?grant_type=password",
            &json!({"email": "bob@example.com", "password": 12345678}),
        )
        .await;
    assert_error(&r, 400, "validation_failed");
    assert!(r.text.contains("password"), "{}", r.text);
    let r = idp
        .post(
            "/recover",
            &json!({"email": "bob@example.com", "code_challenge": null, "gotrue_meta_security": {}}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json.clone()),
        (200, json!({})),
        "{}",
        r.text
    );
    let r = idp.get_auth("/user", "not-a-jwt").await;
    assert_error(&r, 403, "bad_jwt");
    let r = Reply::send(client().get(idp.url("/user"))).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(r.json["error_code"], "no_authorization");
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_sign_up_does_not_reveal_the_account() {
    let idp = Idp::start(&[]).await.from_one_ip();
    let fresh = idp.signup_as_auth_js("dora@example.com").await;
    assert_eq!(fresh.status, 200, "{}", fresh.text);
    // Confirm, then sign up again with the same (and a differently cased) email.
    let (_, text) = idp.mail(1).await;
    let r = idp
        .post(
            "/verify",
            &json!({"type": "signup", "token_hash": token_hash(&text)}),
        )
        .await;
    assert_eq!(r.status, 200);
    let again = idp.signup_as_auth_js("DORA@example.com").await;
    assert_eq!(again.status, fresh.status, "{}", again.text);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&again.json), keys(&fresh.json));
    assert!(again.json["email_confirmed_at"].is_null());
    assert_ne!(
        again.json["id"], fresh.json["id"],
        "a look-alike, not the account"
    );
    assert_eq!(again.json["identities"].as_array().unwrap().len(), 1);
    // The real password still works; the new one does not.
    let r = idp.sign_in("dora@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // With autoconfirm the platform says so: 422 user_already_exists.
    let idp = Idp::start(&[("AUTH_AUTOCONFIRM", "true")])
        .await
        .from_one_ip();
    let r = idp.signup_as_auth_js("erin@example.com").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_session(&r.json);
    let r = idp.signup_as_auth_js("erin@example.com").await;
    assert_error(&r, 422, "user_already_exists");
}

#[tokio::test(flavor = "multi_thread")]
async fn otp_codes_expire_and_are_single_use() {
    // No mail interval: two magic links in a row below.
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
        .await
        .from_one_ip();
    let r = idp
        .post("/otp", &json!({"email": "finn@example.com", "create_user": true, "data": {}, "gotrue_meta_security": {}, "code_challenge": null, "code_challenge_method": null}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({}));
    let (_, text) = idp.mail(1).await;
    let c = code(&text);
    // Wrong code, then the right one, then the right one again.
    let r = idp
        .post(
            "/verify",
            &json!({"type": "email", "email": "finn@example.com", "token": "000000x"}),
        )
        .await;
    assert_error(&r, 403, "otp_expired");
    let r = idp
        .post(
            "/verify",
            &json!({"type": "email", "email": "finn@example.com", "token": c}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_session(&r.json);
    assert_eq!(r.json["user"]["email"], "finn@example.com");
    let r = idp
        .post(
            "/verify",
            &json!({"type": "email", "email": "finn@example.com", "token": c}),
        )
        .await;
    assert_error(&r, 403, "otp_expired");

    // Magic links for the now confirmed user, used after they expired: each
    // mail is read first, then its token is aged past AUTH_OTP_EXPIRY_SECS
    // (3600 s by default) on the database's clock; the first is tried by
    // its code, the second by its link's `token_hash`.
    let pool = idp.pool().clone();
    let magic_link_aged = |n: usize| {
        let (idp, pool) = (&idp, &pool);
        async move {
            let r = idp
                .post("/otp", &json!({"email": "finn@example.com"}))
                .await;
            assert_eq!(r.status, 200, "{}", r.text);
            let (_, text) = idp.mail(n).await;
            assert!(text.contains("type=magiclink"), "{text}");
            let aged = sea_orm::sqlx::query(
                "UPDATE auth_one_time_tokens SET created_at = now() - interval '3601 seconds' \
                 WHERE kind = 'magiclink' AND relates_to = 'finn@example.com'",
            )
            .execute(pool)
            .await
            .expect("age the token")
            .rows_affected();
            assert_eq!(aged, 1);
            text
        }
    };
    let text = magic_link_aged(2).await;
    let r = idp
        .post(
            "/verify",
            &json!({"type": "email", "email": "finn@example.com", "token": code(&text)}),
        )
        .await;
    assert_error(&r, 403, "otp_expired");
    let text = magic_link_aged(3).await;
    let r = idp
        .post(
            "/verify",
            &json!({"type": "magiclink", "token_hash": token_hash(&text)}),
        )
        .await;
    assert_error(&r, 403, "otp_expired");

    // create_user=false for an unknown email.
    let r = idp
        .post(
            "/otp",
            &json!({"email": "ghost@example.com", "create_user": false}),
        )
        .await;
    assert_error(&r, 422, "otp_disabled");
}

#[tokio::test(flavor = "multi_thread")]
async fn pkce_magic_link_redirects_with_a_code_exchanged_once() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let idp = Idp::start(&[]).await.from_one_ip();
    idp.confirmed_user("gus@example.com", 1).await;
    let verifier = "0123456789abcdef".repeat(7);
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    let r = idp
        .post(
            "/otp?redirect_to=https%3A%2F%2Fapp.example.com%2Fwelcome",
            &json!({"email": "gus@example.com", "create_user": true, "code_challenge": challenge, "code_challenge_method": "s256"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, text) = idp.mail(2).await;
    let link_token = token_hash(&text);
    assert!(link_token.starts_with("pkce_"), "{link_token}");
    let r = Reply::send(client().get(format!(
        "{}?token={link_token}&type=magiclink&redirect_to=https%3A%2F%2Fapp.example.com%2Fwelcome",
        idp.url("/verify")
    )))
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    let loc = r.header("location").unwrap().to_string();
    assert!(
        loc.starts_with("https://app.example.com/welcome?code="),
        "{loc}"
    );
    let auth_code = loc.split("code=").nth(1).unwrap().to_string();

    let r = idp
        .post(
            "/token?grant_type=pkce",
            &json!({"auth_code": auth_code, "code_verifier": "f".repeat(64)}),
        )
        .await;
    assert_error(&r, 400, "bad_code_verifier");
    let r = idp
        .post(
            "/token?grant_type=pkce",
            &json!({"auth_code": auth_code, "code_verifier": verifier}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_session(&r.json);
    assert_eq!(r.json["user"]["email"], "gus@example.com");
    let r = idp
        .post(
            "/token?grant_type=pkce",
            &json!({"auth_code": auth_code, "code_verifier": verifier}),
        )
        .await;
    assert_error(&r, 404, "flow_state_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_links_redirect_only_to_the_app() {
    let idp = Idp::start(&[("AUTH_REDIRECT_ALLOW_LIST", "https://*.partner.example/**")])
        .await
        .from_one_ip();
    // Implicit flow: the session in the fragment.
    idp.signup_as_auth_js("hana@example.com").await;
    let (_, text) = idp.mail(1).await;
    let r = Reply::send(client().get(format!(
        "{}?token={}&type=signup&redirect_to=https%3A%2F%2Fapp.example.com%2Fdone",
        idp.url("/verify"),
        token_hash(&text)
    )))
    .await;
    assert_eq!(r.status, 303);
    let loc = r.header("location").unwrap();
    assert!(
        loc.starts_with("https://app.example.com/done#access_token="),
        "{loc}"
    );
    for part in [
        "refresh_token=",
        "expires_in=3600",
        "expires_at=",
        "token_type=bearer",
        "type=signup",
    ] {
        assert!(loc.contains(part), "{part} in {loc}");
    }
    // Reused link: error fragment, still on the app.
    let r = Reply::send(client().get(format!(
        "{}?token={}&type=signup&redirect_to=https%3A%2F%2Fapp.example.com%2Fdone",
        idp.url("/verify"),
        token_hash(&text)
    )))
    .await;
    let loc = r.header("location").unwrap();
    assert!(
        loc.starts_with("https://app.example.com/done#error="),
        "{loc}"
    );
    assert!(
        loc.contains("error_code=otp_expired") && loc.contains("error_description="),
        "{loc}"
    );

    // Open-redirect attempts land on APP_URL; an allow-listed origin is kept.
    for evil in [
        "https://evil.example/x",
        "//evil.example",
        "/\\evil.example",
        "javascript:alert(1)",
        "https://app.example.com.evil.example/",
    ] {
        let url = reqwest::Url::parse_with_params(
            &idp.url("/verify"),
            &[("token", "nope"), ("type", "signup"), ("redirect_to", evil)],
        )
        .unwrap();
        let r = Reply::send(client().get(url)).await;
        assert_eq!(r.status, 303);
        let loc = r.header("location").unwrap();
        assert!(loc.starts_with("https://app.example.com"), "{evil} → {loc}");
        assert!(
            !loc.contains("evil.example/") || loc.starts_with(APP),
            "{evil} → {loc}"
        );
    }
    let url = reqwest::Url::parse_with_params(
        &idp.url("/verify"),
        &[
            ("token", "nope"),
            ("type", "signup"),
            ("redirect_to", "https://shop.partner.example/back"),
        ],
    )
    .unwrap();
    let r = Reply::send(client().get(url)).await;
    assert!(r
        .header("location")
        .unwrap()
        .starts_with("https://shop.partner.example/back#error="));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mail_interval_is_a_setting() {
    // 120 s: a second recovery mail at once is refused with the seconds
    // left, and goes once they are over (the last mail moved back past them
    // on the database's clock: no sleep races a loaded machine).
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "120")])
        .await
        .from_one_ip();
    idp.confirmed_user("una@example.com", 1).await;
    let body = json!({"email": "una@example.com"});
    let recover = || idp.post("/recover", &body);
    assert_eq!(recover().await.status, 200);
    let r = recover().await;
    assert_error(&r, 429, "over_email_send_rate_limit");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    // More than the 60 s default: the setting, not the default, decides.
    assert!((61..=120).contains(&wait), "{wait}");
    idp.execute(
        "UPDATE auth_mail_slots SET last_sent_at = last_sent_at - interval '121 seconds' \
         WHERE email_norm = 'una@example.com' AND kind = 'recovery'",
    )
    .await;
    assert_eq!(recover().await.status, 200);
    idp.mail(3).await;

    // 0: no interval; every request mails (the per-IP limits still bound them).
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
        .await
        .from_one_ip();
    let session = idp.confirmed_user("una@example.com", 1).await;
    let token = session["access_token"].as_str().unwrap();
    for _ in 0..3 {
        let r = idp.get_auth("/reauthenticate", token).await;
        assert_eq!(
            (r.status.as_u16(), r.json.clone()),
            (200, json!({})),
            "{}",
            r.text
        );
    }
    idp.mail(4).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_mail_per_kind_per_60_s_and_per_ip_limits_under_concurrency() {
    let idp = Idp::start(&[]).await.from_one_ip();
    idp.confirmed_user("ivy@example.com", 1).await;
    // 20 concurrent recovery requests from 20 IPs: one mail, 19 × 429.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = idp.url("/recover");
        tasks.push(tokio::spawn(async move {
            Reply::send(
                client()
                    .post(url)
                    .header("x-forwarded-for", random_ip())
                    .header("x-supabase-api-version", "2024-01-01")
                    .json(&json!({"email": "ivy@example.com"})),
            )
            .await
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.status.as_u16() {
            200 => ok += 1,
            429 => {
                assert_eq!(r.json["code"], "over_email_send_rate_limit", "{}", r.text);
                assert!(r.header("retry-after").is_some());
                limited += 1
            }
            s => panic!("unexpected {s}: {}", r.text),
        }
    }
    assert_eq!((ok, limited), (1, 19));
    idp.mail(2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(idp.sink.count(), 2, "exactly one recovery mail");
    // An unknown email: `{}` all the same.
    let r = idp
        .post("/recover", &json!({"email": "who@example.com"}))
        .await;
    assert_eq!((r.status.as_u16(), r.json.clone()), (200, json!({})));

    // Per-IP limit: 20 concurrent sign-ins from one IP with a limit of 5.
    let idp = Idp::start(&[("AUTH_RATE_LIMIT_PER_5MIN", "5")])
        .await
        .from_one_ip();
    let ip = random_ip();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = idp.url("/token?grant_type=password");
        let ip = ip.clone();
        tasks.push(tokio::spawn(async move {
            Reply::send(
                client()
                    .post(url)
                    .header("x-forwarded-for", ip)
                    .header("x-supabase-api-version", "2024-01-01")
                    .json(&json!({"email": "nobody@example.com", "password": "whatever1"})),
            )
            .await
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        codes.push(r.json["code"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(
        codes.iter().filter(|c| *c == "invalid_credentials").count(),
        5,
        "{codes:?}"
    );
    assert_eq!(
        codes
            .iter()
            .filter(|c| *c == "over_request_rate_limit")
            .count(),
        15,
        "{codes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn our_tokens_work_on_logged_in_routes_and_health_names_the_provider() {
    let idp = Idp::start(&[
        (
            "BACKEND_SERVICE_ROLE_KEY",
            "service-role-dummy-0123456789abcdef0123",
        ),
        ("ADMIN_EMAILS", "boss@example.com"),
    ])
    .await
    .from_one_ip();
    let h = tests::get(&idp.api.url("/api/health")).await;
    assert_eq!(h.json["auth_provider"], "builtin", "{}", h.text);
    assert_eq!(h.json["features"]["auth"]["enabled"], true, "{}", h.text);
    assert_eq!(
        h.json["features"]["auth"]["missing_env"],
        json!([]),
        "{}",
        h.text
    );
    let h = tests::get(&idp.url("/health")).await;
    assert_eq!(h.json["provider"], "builtin", "{}", h.text);
    let st = tests::get(&idp.url("/settings")).await;
    assert_eq!(st.json["external"]["email"], true, "{}", st.text);

    let s = idp.confirmed_user("boss@example.com", 1).await;
    let access = s["access_token"].as_str().unwrap();
    let r = Reply::send(
        client()
            .post(idp.api.url("/api/profile"))
            .bearer_auth(access)
            .json(&json!({"full_name": "The Boss"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // ADMIN_EMAILS applies once the email is confirmed; the default rows exist.
    let pool = idp.pool().clone();
    let uid: uuid::Uuid = s["user"]["id"].as_str().unwrap().parse().unwrap();
    let (role,): (String,) =
        sea_orm::sqlx::query_as("SELECT role FROM user_roles WHERE user_id = $1")
            .bind(uid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(role, "admin");
    let (plan,): (String,) =
        sea_orm::sqlx::query_as("SELECT plan FROM subscriptions WHERE user_id = $1")
            .bind(uid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(plan, "FREE");
    // A forged token (signed by another key) is refused.
    let r = Reply::send(
        client()
            .post(idp.api.url("/api/profile"))
            .bearer_auth(format!("{}x", &access[..access.len() - 1]))
            .json(&json!({"full_name": "X"})),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_default_runs_the_provider_on_sqlite() {
    let idp = Idp::embedded().await.from_one_ip();
    let h = tests::get(&idp.api.url("/api/health")).await;
    assert_eq!(h.json["auth_provider"], "builtin", "{}", h.text);
    assert_eq!(h.json["features"]["auth"]["enabled"], true, "{}", h.text);
    let s = idp.confirmed_user("kim@example.com", 1).await;
    assert_session(&s);
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": s["refresh_token"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let access = r.json["access_token"].as_str().unwrap().to_string();
    let r = idp.get_auth("/user", &access).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["email"], "kim@example.com");
    // The 60-s rule on SQLite under 20 concurrent requests.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = idp.url("/recover");
        tasks.push(tokio::spawn(async move {
            Reply::send(
                client()
                    .post(url)
                    .header("x-supabase-api-version", "2024-01-01")
                    .json(&json!({"email": "kim@example.com"})),
            )
            .await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status.as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        19,
        "{statuses:?}"
    );
    let (_, text) = idp.mail(2).await;
    let r = idp
        .post(
            "/verify",
            &json!({"type": "recovery", "token_hash": token_hash(&text)}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// Twenty clients refreshing with the same token at once (as tabs of one
/// browser do): exactly one rotation happens; every answer is 200 and carries
/// the same new refresh token (the others get it through the reuse interval),
/// and that token rotates once more.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_refreshes_of_one_token_rotate_it_once() {
    let idp = Idp::start(&[("AUTH_AUTOCONFIRM", "true")])
        .await
        .from_one_ip();
    let r = idp.signup_as_auth_js("tabs@example.com").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let first = r.json["refresh_token"].as_str().unwrap().to_string();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (url, ip, token) = (
            idp.url("/token?grant_type=refresh_token"),
            idp.ip(),
            first.clone(),
        );
        tasks.push(tokio::spawn(async move {
            Reply::send(
                client()
                    .post(url)
                    .header("x-forwarded-for", ip)
                    .header("x-supabase-api-version", "2024-01-01")
                    .json(&json!({ "refresh_token": token })),
            )
            .await
        }));
    }
    let mut children = std::collections::BTreeSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text);
        children.insert(r.json["refresh_token"].as_str().unwrap().to_string());
    }
    assert_eq!(children.len(), 1, "one rotation, one child: {children:?}");
    let child = children.into_iter().next().unwrap();
    assert_ne!(child, first);
    let r = idp
        .post(
            "/token?grant_type=refresh_token",
            &json!({ "refresh_token": child }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_ne!(r.json["refresh_token"], child.as_str());
}

/// `GET /user` answers are kept per process and dropped when PostgreSQL
/// notifies a change of the user's rows: whatever changes the user through
/// one api process (profile data, a sign-in, a sign-out, a revoked session),
/// and whatever changes the rows without going through an api (an operator's
/// SQL, the worker's clean-ups), shows on another api process that had the
/// user cached, as soon as the notification arrives (here: within 30 s; it
/// takes well under a millisecond), and at once on the process that made it.
#[tokio::test(flavor = "multi_thread")]
async fn user_answers_follow_changes_made_through_another_api_process() {
    let idp = Idp::start(&[
        ("AUTH_AUTOCONFIRM", "true"),
        ("AUTH_REFRESH_REUSE_INTERVAL_SECS", "1"),
    ])
    .await
    .from_one_ip();
    let b = idp.another_api().await;
    let user_on_b = |token: String| {
        let url = b.url("/auth/v1/user");
        async move {
            Reply::send(
                client()
                    .get(url)
                    .header("x-supabase-api-version", "2024-01-01")
                    .bearer_auth(token),
            )
            .await
        }
    };
    let r = idp.signup_as_auth_js("cache@example.com").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let s1 = r.json.clone();
    let access1 = s1["access_token"].as_str().unwrap().to_string();
    for _ in 0..3 {
        let r = user_on_b(access1.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["user_metadata"]["name"], "Ann", "{}", r.text);
    }

    // Profile data changed through A: B shows it on the next request.
    let r = idp
        .put_auth("/user", &access1, &json!({"data": {"name": "Bob"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.get_auth("/user", &access1).await;
    assert_eq!(
        r.json["user_metadata"]["name"], "Bob",
        "at once on A: {}",
        r.text
    );
    let r = on_b_until(&user_on_b, &access1, |r| {
        r.json["user_metadata"]["name"] == "Bob"
    })
    .await;
    assert_eq!(r.json, idp.get_auth("/user", &access1).await.json);

    // A second session (password sign-in through A) moves last_sign_in_at.
    let before = r.json["last_sign_in_at"].clone();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = idp.sign_in("cache@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let s2 = r.json.clone();
    let access2 = s2["access_token"].as_str().unwrap().to_string();
    let r = on_b_until(&user_on_b, &access1, |r| {
        r.status == 200 && r.json["last_sign_in_at"] != before
    })
    .await;
    assert_eq!(r.json["last_sign_in_at"], s2["user"]["last_sign_in_at"]);
    assert_eq!(user_on_b(access2.clone()).await.status, 200);

    // Session 1 signed out through A: refused on B at once; session 2 lives.
    let r = Reply::send(
        client()
            .post(idp.url("/logout?scope=local"))
            .bearer_auth(&access1)
            .header("content-type", "application/json;charset=UTF-8"),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = on_b_until(&user_on_b, &access1, |r| r.status == 403).await;
    assert_error(&r, 403, "session_not_found");
    assert_eq!(user_on_b(access2.clone()).await.status, 200);

    // Session 2 revoked by a reused refresh token (through A): refused on B.
    let rt1 = s2["refresh_token"].as_str().unwrap();
    let refresh = |rt: String| {
        let idp = &idp;
        async move {
            idp.post(
                "/token?grant_type=refresh_token",
                &json!({"refresh_token": rt}),
            )
            .await
        }
    };
    let r = refresh(rt1.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(user_on_b(access2.clone()).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_error(
        &refresh(rt1.to_string()).await,
        400,
        "refresh_token_already_used",
    );
    let r = on_b_until(&user_on_b, &access2, |r| r.status == 403).await;
    assert_error(&r, 403, "session_not_found");

    // Writers that are not an api: an operator's SQL on the account, and the
    // deletion of a session (as the worker's clean-ups do).
    let r = idp.sign_in("cache@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let access3 = r.json["access_token"].as_str().unwrap().to_string();
    let user_id: uuid::Uuid = r.json["user"]["id"].as_str().unwrap().parse().unwrap();
    let r = user_on_b(access3.clone()).await;
    assert_eq!(r.json["user_metadata"]["name"], "Bob", "{}", r.text);
    let pool = idp.pool().clone();
    sea_orm::sqlx::query(
        "UPDATE auth_accounts SET user_metadata = '{\"name\": \"Cy\"}' WHERE user_id = $1",
    )
    .bind(user_id)
    .execute(&pool)
    .await
    .expect("update the account");
    on_b_until(&user_on_b, &access3, |r| {
        r.json["user_metadata"]["name"] == "Cy"
    })
    .await;
    sea_orm::sqlx::query("DELETE FROM auth_sessions WHERE user_id = $1")
        .bind(user_id)
        .execute(&pool)
        .await
        .expect("delete the sessions");
    let r = on_b_until(&user_on_b, &access3, |r| r.status == 403).await;
    assert_error(&r, 403, "session_not_found");
}

/// Asks `get` with `token` until `done` holds for its answer (at most 30 s:
/// a notification takes well under a millisecond, a loaded machine longer);
/// the last answer, which must satisfy it.
async fn on_b_until<F, Fut>(get: &F, token: &str, done: impl Fn(&Reply) -> bool) -> Reply
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    let r = tests::poll_until(Duration::from_secs(30), || get(token.to_string()), &done).await;
    assert!(
        done(&r),
        "the other api process still answers {} {} after 30 s",
        r.status,
        r.text
    );
    r
}
