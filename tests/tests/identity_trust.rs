//! The built-in identity provider against an attacker: pre-registration
//! takeover, admin by email without a mailbox proof, guessed codes, and
//! sessions that outlive a password change or their lifetime. The real api
//! and worker on PostgreSQL + Redis, mails read from the SMTP sink.

use std::time::Duration;

use serde_json::json;
use tests::{
    assert_error, code, no_redirects as client, session_id, token_hash, wrong, Idp, Reply, Stack,
    ATTACKER_PASSWORD, PASSWORD,
};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn two_sign_ups_with_different_passwords_keep_neither_after_the_confirmation() {
    // No mail interval: the victim's later sign-up is mailed at once (with
    // the default 60 s it would be held back; see identity_accounts.rs).
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")]).await;
    let victim = "vera@example.com";
    // The attacker registers the victim's email with a password of their own.
    let first = idp.signup(victim, ATTACKER_PASSWORD).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let (_, attacker_mail) = idp.mail(1).await;
    // The victim signs up seconds later: their own confirmation is mailed,
    // and the answer looks like a fresh one.
    let second = idp.signup(victim, PASSWORD).await;
    assert_eq!(second.status, 200, "{}", second.text);
    assert!(
        second.json["email_confirmed_at"].is_null(),
        "{}",
        second.text
    );
    assert_eq!(second.json["email"], victim);
    let (to, victim_mail) = idp.mail(2).await;
    assert!(to.contains(victim), "{to}");
    assert_ne!(token_hash(&victim_mail), token_hash(&attacker_mail));
    // The later mail voided the earlier code (one live code per address).
    let r = idp
        .verify_code("signup", victim, &code(&attacker_mail))
        .await;
    assert_error(&r, 403, "otp_expired");

    // The victim opens the newest mail: signed in as themselves. Two
    // sign-ups chose passwords before the mailbox was proven, so neither
    // survives; the owner is mailed a link to choose one, and the
    // attacker's link is void once the email is confirmed.
    let r = idp.verify_hash("signup", &victim_mail).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    for pw in [PASSWORD, ATTACKER_PASSWORD] {
        assert_error(&idp.sign_in(victim, pw).await, 400, "invalid_credentials");
    }
    let r = idp.verify_hash("signup", &attacker_mail).await;
    assert_error(&r, 403, "otp_expired");
    let (_, notice) = idp.mail(3).await;
    let r = idp.verify_hash("recovery", &notice).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp
        .put_auth(
            "/user",
            r.json["access_token"].as_str().unwrap(),
            &json!({"password": PASSWORD}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.sign_in(victim, PASSWORD).await.status, 200);

    // A repeated sign-up of the confirmed account changes nothing.
    let r = idp.signup(victim, ATTACKER_PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.sign_in(victim, ATTACKER_PASSWORD).await;
    assert_error(&r, 400, "invalid_credentials");
    let r = idp.sign_in(victim, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn unconfirmed_accounts_are_deleted_after_the_setting() {
    let idp = Idp::start(&[
        ("AUTH_UNCONFIRMED_TTL_SECS", "3600"),
        ("SCHEDULER_TICK_SECS", "1"),
    ])
    .await;
    let r = idp.signup("stale@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let stale = r.json["id"].as_str().unwrap().to_string();
    let r = idp.signup("fresh@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let fresh = r.json["id"].as_str().unwrap().to_string();
    idp.mail(2).await;
    // Two hours old by the database's clock.
    let n = idp
        .sql(
            "UPDATE auth_accounts SET updated_at = now() - interval '2 hours', \
             confirmation_sent_at = now() - interval '2 hours' WHERE user_id::text = $1",
            &stale,
        )
        .await;
    assert_eq!(n, 1);
    let count = |id: String| {
        let pool = idp.pool().clone();
        async move {
            sea_orm::sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users WHERE id::text = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while count(stale.clone()).await == 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stale unconfirmed account was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(count(fresh).await, 1, "the recent one stays");
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_emails_need_a_mailbox_proof() {
    // Autoconfirm: nothing proves the mailbox, so no admin.
    let idp = Idp::start(&[
        ("AUTH_AUTOCONFIRM", "true"),
        ("ADMIN_EMAILS", "boss@example.com"),
    ])
    .await;
    let r = idp.signup("boss@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let user = r.json["user"]["id"].as_str().unwrap().to_string();
    assert_eq!(idp.role_of(&user).await, "member");
    assert_eq!(idp.grants_audited(&user).await, 0);

    // Confirmed by its mail: admin, with an audit row.
    let idp = Idp::start(&[("ADMIN_EMAILS", "boss@example.com")]).await;
    let r = idp.signup("boss@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let user = r.json["id"].as_str().unwrap().to_string();
    assert_eq!(idp.role_of(&user).await, "member", "not before the proof");
    let (_, text) = idp.mail(1).await;
    let r = idp
        .verify_code("signup", "boss@example.com", &code(&text))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.role_of(&user).await, "admin");
    assert_eq!(idp.grants_audited(&user).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_hs256_email_claim_grants_admin_only_when_trusted() {
    const SECRET: &str = "jwt-secret-for-the-trust-test-0123456789abcdef";
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let base = stack
        .session_env(SECRET, "service-role-test-key-0123456789abcdef")
        .with("ADMIN_EMAILS", "boss@example.com");
    let profile = |api: &tests::Proc, user: Uuid| {
        let url = api.url("/api/profile");
        async move {
            let token = tests::hs256_token(
                SECRET.as_bytes(),
                &tests::session_claims(&user.to_string(), Some("boss@example.com")),
            );
            Reply::send(
                client()
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({"full_name": "Boss"})),
            )
            .await
        }
    };
    let role = |user: Uuid| {
        let pool = pool.clone();
        async move {
            sea_orm::sqlx::query_scalar::<_, String>(
                "SELECT role FROM user_roles WHERE user_id::text = $1",
            )
            .bind(user.to_string())
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let untrusted = Uuid::new_v4();
    {
        let api = stack.api(&base).await;
        let r = profile(&api, untrusted).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(role(untrusted).await, "member");
    let trusted = Uuid::new_v4();
    let api = stack
        .api(&base.clone().with("AUTH_TRUST_EMAIL_CLAIM", "true"))
        .await;
    let r = profile(&api, trusted).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role(trusted).await, "admin");
    let audited: i64 = sea_orm::sqlx::query_scalar(
        "SELECT COUNT(*) FROM audit_logs WHERE action = 'role.grant' AND target_id = $1",
    )
    .bind(trusted.to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    // Admins already granted stay admins.
    let r = profile(&stack.api(&base).await, trusted).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role(trusted).await, "admin");
}

#[tokio::test(flavor = "multi_thread")]
async fn codes_are_void_after_five_wrong_tries_from_any_ip() {
    let idp = Idp::start(&[]).await;
    let email = "gus@example.com";
    let r = idp.signup(email, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, text) = idp.mail(1).await;
    let right = code(&text);
    // Five wrong codes, each from another IP.
    for k in 1..=5 {
        let r = idp.verify_code("signup", email, &wrong(&right, k)).await;
        assert_error(&r, 403, "otp_expired");
    }
    // The right code is void now; the link of the same mail is not (wrong
    // codes never lock the mailbox's owner out).
    let r = idp.verify_code("signup", email, &right).await;
    assert_error(&r, 403, "otp_expired");
    let r = idp.verify_hash("signup", &text).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], email);
    let r = idp.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_change_or_reset_ends_every_other_session() {
    let idp = Idp::start(&[]).await;
    let email = "hana@example.com";
    let mine = idp.confirmed_user(email, 1).await;
    // The attacker holds a stolen refresh token of another session.
    let stolen = idp.sign_in(email, PASSWORD).await;
    assert_eq!(stolen.status, 200, "{}", stolen.text);
    let r = idp
        .put_auth(
            "/user",
            mine["access_token"].as_str().unwrap(),
            &json!({"password": "a brand new password"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.refresh(&stolen.json["refresh_token"]).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = idp
        .get_auth("/user", stolen.json["access_token"].as_str().unwrap())
        .await;
    assert_error(&r, 403, "session_not_found");
    // The session that changed it goes on.
    let r = idp.refresh(&mine["refresh_token"]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let mine = r.json;

    // A reset (recovery link, then the new password) ends the others too.
    let r = idp.post("/recover", &json!({"email": email})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, text) = idp.mail(2).await;
    let recovery = idp.verify_hash("recovery", &text).await;
    assert_eq!(recovery.status, 200, "{}", recovery.text);
    let r = idp
        .put_auth(
            "/user",
            recovery.json["access_token"].as_str().unwrap(),
            &json!({"password": "the password after the reset"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.refresh(&mine["refresh_token"]).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = idp.sign_in(email, "the password after the reset").await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn session_timebox_and_inactivity_end_refresh() {
    let idp = Idp::start(&[
        ("AUTH_SESSIONS_TIMEBOX_SECS", "7200"),
        ("AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS", "3600"),
    ])
    .await;
    let email = "ida@example.com";
    let s = idp.confirmed_user(email, 1).await;
    let r = idp.refresh(&s["refresh_token"]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let s = r.json;
    // Signed in three hours ago (refreshed just now): past the timebox.
    let n = idp
        .sql(
            "UPDATE auth_sessions SET created_at = now() - interval '3 hours' WHERE id::text = $1",
            &session_id(&s),
        )
        .await;
    assert_eq!(n, 1);
    let r = idp.refresh(&s["refresh_token"]).await;
    assert_error(&r, 400, "session_expired");

    // Another session, idle for two hours: past the inactivity timeout.
    let s = idp.sign_in(email, PASSWORD).await.json;
    let n = idp
        .sql(
            "UPDATE auth_sessions SET refreshed_at = now() - interval '2 hours' WHERE id::text = $1",
            &session_id(&s),
        )
        .await;
    assert_eq!(n, 1);
    let r = idp.refresh(&s["refresh_token"]).await;
    assert_error(&r, 400, "session_expired");
    // A fresh session refreshes.
    let s = idp.sign_in(email, PASSWORD).await.json;
    let r = idp.refresh(&s["refresh_token"]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_change_from_an_old_session_needs_the_nonce() {
    let idp = Idp::start(&[]).await;
    let email = "jon@example.com";
    let s = idp.confirmed_user(email, 1).await;
    let access = s["access_token"].as_str().unwrap();
    // Signed in 25 hours ago.
    let n = idp
        .sql(
            "UPDATE auth_sessions SET created_at = now() - interval '25 hours' WHERE id::text = $1",
            &session_id(&s),
        )
        .await;
    assert_eq!(n, 1);
    let new = json!({"password": "another good password"});
    let r = idp.put_auth("/user", access, &new).await;
    assert_error(&r, 400, "reauthentication_needed");
    let r = idp.get_auth("/reauthenticate", access).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (to, text) = idp.mail(2).await;
    assert!(to.contains(email), "{to}");
    let nonce = code(&text);
    let r = idp
        .put_auth(
            "/user",
            access,
            &json!({"password": "another good password", "nonce": wrong(&nonce, 1)}),
        )
        .await;
    assert_error(&r, 422, "reauthentication_not_valid");
    let r = idp
        .put_auth(
            "/user",
            access,
            &json!({"password": "another good password", "nonce": nonce}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.sign_in(email, "another good password").await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A recent session needs no nonce.
    let r = idp
        .put_auth(
            "/user",
            r.json["access_token"].as_str().unwrap(),
            &json!({"password": "a third good password"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_email_change_is_confirmed_by_both_addresses() {
    let idp = Idp::start(&[]).await;
    let old = "kai@example.com";
    let new = "kai@example.org";
    let s = idp.confirmed_user(old, 1).await;
    let access = s["access_token"].as_str().unwrap();
    let r = idp.put_auth("/user", access, &json!({"email": new})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["new_email"], new, "{}", r.text);
    let mails = idp.sink.wait_for(3, Duration::from_secs(30)).await;
    let text_to = |addr: &str| {
        let m = mails[1..]
            .iter()
            .find(|m| m.envelope_to.iter().any(|t| t.contains(addr)))
            .unwrap_or_else(|| panic!("a mail to {addr}"));
        m.searchable()
    };
    let (to_new, to_old) = (text_to(new), text_to(old));
    // Each mail names the account and where it moves, so the owner of the
    // new address knows whose account a click would bring to them (red
    // team: an unsolicited "confirm your new email" adopted an attacker's
    // account with its password).
    for text in [&to_new, &to_old] {
        assert!(
            text.contains(&format!("The account {old} on"))
                && text.contains(&format!("change its email address to {new}"))
                && text.contains("moves that account, with its password and sign-ins"),
            "{text}"
        );
    }
    // The new address alone does not change it.
    let r = idp.verify_hash("email_change", &to_new).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.get_auth("/user", access).await;
    assert_eq!(r.json["email"], old, "{}", r.text);
    // The current address confirms too: changed.
    let r = idp.verify_hash("email_change", &to_old).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.sign_in(new, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], new);
}
