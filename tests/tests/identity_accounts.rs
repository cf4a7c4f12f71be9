//! The built-in identity provider's per-address rules against an attacker:
//! guessing codes across many sign-ups and IPv6 /64s, one live code per
//! address, contested confirmations (who ends up with a password), what the
//! answers give away about who has an account, and the limit on password and
//! email changes. The real api and worker on PostgreSQL + Redis, mails read
//! from the SMTP sink.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{
    assert_error, auth_code, code, random_ip, wrong, Idp, Reply, ATTACKER_PASSWORD, PASSWORD,
};

#[tokio::test(flavor = "multi_thread")]
async fn wrong_codes_are_counted_per_address_and_never_block_the_link() {
    // An interval no run outlasts: the repeated sign-ups below are held back
    // by it however slowly they are hashed.
    let idp = Idp::start(&[
        ("ADMIN_EMAILS", "vic@example.com"),
        ("AUTH_MAIL_INTERVAL_SECS", "3600"),
    ])
    .await
    .from_fresh_v6();
    let victim = "vic@example.com";
    let r = idp.signup(victim, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let user = r.json["id"].as_str().unwrap().to_string();
    let (_, mail) = idp.mail(1).await;
    let right = code(&mail);
    // Another address with its own mail.
    let r = idp.signup("other@example.com", PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (to, other_mail) = idp.mail(2).await;
    assert!(to.contains("other@example.com"), "{to}");

    // The attack: a sign-up (for a fresh code) and a wrong code, each from
    // another /64, twenty times over.
    let mut answers = Vec::new();
    for k in 1..=20 {
        let r = idp.signup(victim, ATTACKER_PASSWORD).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let r = idp.verify_code("signup", victim, &wrong(&right, k)).await;
        if r.status == 429 {
            let wait = r.header_u64("retry-after");
            assert!((1..=3600).contains(&wait), "{wait}");
        }
        answers.push((
            r.status.as_u16(),
            r.json["code"].as_str().unwrap_or("").to_string(),
        ));
    }
    let expired = answers
        .iter()
        .filter(|a| a.1 == "otp_expired" && a.0 == 403)
        .count();
    let limited = answers
        .iter()
        .filter(|a| a.1 == "over_request_rate_limit" && a.0 == 429)
        .count();
    assert_eq!((expired, limited), (10, 10), "{answers:?}");
    // The repeated sign-ups were held to the interval: no new code was mailed.
    assert_eq!(
        idp.live_codes(victim).await,
        0,
        "five wrong codes void the code"
    );
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_one_time_tokens WHERE relates_to = $1",
            victim
        )
        .await,
        1,
        "one mail, one token"
    );
    // Once the window is spent, the right code is refused too.
    let r = idp.verify_code("signup", victim, &right).await;
    assert_error(&r, 429, "over_request_rate_limit");
    // An unknown address is counted and answered the same way.
    for k in 1..=10 {
        let r = idp
            .verify_code("signup", "nobody@example.com", &wrong(&right, k))
            .await;
        assert_error(&r, 403, "otp_expired");
    }
    let r = idp
        .verify_code("signup", "nobody@example.com", &right)
        .await;
    assert_error(&r, 429, "over_request_rate_limit");
    assert!(r.header("retry-after").is_some());
    // Another address is not affected.
    let r = idp
        .verify_code("signup", "other@example.com", &code(&other_mail))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // The same mail's link still works: the owner is signed in. The sign-ups
    // that came later used another password, so no password is active, the
    // owner is mailed a set-password notice, and the attacker's password
    // never signs in.
    let r = idp.verify_hash("signup", &mail).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    assert_eq!(idp.role_of(&user).await, "admin");
    let (to, notice) = idp.mail(3).await;
    assert!(to.contains(victim), "{to}");
    assert!(notice.contains("choose a password"), "{notice}");
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    assert_error(
        &idp.sign_in(victim, PASSWORD).await,
        400,
        "invalid_credentials",
    );
    // The link cleared the window: codes of the address are checked again.
    let r = idp.verify_code("recovery", victim, &code(&notice)).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn four_wrong_codes_then_the_right_one_is_accepted() {
    let idp = Idp::start(&[]).await.from_fresh_v6();
    let email = "quinn@example.com";
    let r = idp.signup(email, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, mail) = idp.mail(1).await;
    let right = code(&mail);
    for k in 1..=4 {
        let r = idp.verify_code("signup", email, &wrong(&right, k)).await;
        assert_error(&r, 403, "otp_expired");
    }
    let r = idp.verify_code("signup", email, &right).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], email);
    // Nobody else signed up: the password chosen at the sign-up is kept.
    let r = idp.sign_in(email, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_live_code_per_address_whatever_sent_it() {
    // No interval here, so every request mails and the rule itself is tested.
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
        .await
        .from_fresh_v6();
    let target = "target@example.com";
    for n in 0..3 {
        let r = idp
            .signup(&format!("changer{n}@example.com"), PASSWORD)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // Confirm the three accounts.
    let mails = idp.sink.wait_for(3, Duration::from_secs(30)).await;
    let mut sessions = Vec::new();
    for m in &mails[..3] {
        let text = m.searchable();
        let r = idp.verify_hash("signup", &text).await;
        assert_eq!(r.status, 200, "{}", r.text);
        sessions.push(r.json["access_token"].as_str().unwrap().to_string());
    }
    // Each asks to change its email to the same address.
    for s in &sessions {
        let r = idp
            .put_user(s, &json!({"email": target}), &random_ip())
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // Two mails per change (new and current address): 3 + 6.
    let mails = idp.sink.wait_for(9, Duration::from_secs(30)).await;
    assert_eq!(
        idp.live_codes(target).await,
        1,
        "one live code for the address"
    );
    // A sign-up to that address now leaves one live code too (its own).
    let r = idp.signup(target, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.sink.wait_for(10, Duration::from_secs(30)).await;
    assert_eq!(idp.live_codes(target).await, 1);
    // The earlier codes to the address are refused.
    for m in mails[3..]
        .iter()
        .filter(|m| m.envelope_to.iter().any(|t| t.contains(target)))
    {
        let text = m.searchable();
        let r = idp.verify_code("email_change", target, &code(&text)).await;
        assert_error(&r, 403, "otp_expired");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn contested_confirmations_in_the_implicit_flow() {
    // An interval no run outlasts (the held-back sign-ups below).
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "3600")])
        .await
        .from_fresh_v6();

    // Attacker first: the victim's own sign-up is held back by the interval,
    // so the only mail in the inbox is the one issued for the attacker's.
    let victim = "amy@example.com";
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    let (_, attackers) = idp.mail(1).await;
    let r = idp.signup(victim, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp.verify_hash("signup", &attackers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    let (to, notice) = idp.mail(2).await;
    assert!(
        to.contains(victim) && notice.contains("choose a password"),
        "{notice}"
    );
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    assert_error(
        &idp.sign_in(victim, PASSWORD).await,
        400,
        "invalid_credentials",
    );
    // The notice's link signs the owner in; they choose their password.
    let r = idp.verify_hash("recovery", &notice).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = idp
        .put_user(
            r.json["access_token"].as_str().unwrap(),
            &json!({"password": PASSWORD}),
            &random_ip(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.sign_in(victim, PASSWORD).await.status, 200);
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );

    // Victim first: the attacker's later sign-up is held back but counts.
    let victim = "bea@example.com";
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    let (_, own) = idp.mail(3).await;
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    let r = idp.verify_hash("signup", &own).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    let (to, notice) = idp.mail(4).await;
    assert!(
        to.contains(victim) && notice.contains("choose a password"),
        "{notice}"
    );
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_later_sent_sign_up_voids_earlier_codes_not_links() {
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
        .await
        .from_fresh_v6();
    // Attacker first, then the victim's sign-up is mailed: the account is
    // contested (two passwords before the mailbox was proven), so even the
    // victim's own mail keeps no password: it signs the owner in, and the
    // notice lets them choose one. (The owner cannot tell which of two
    // identical mails is theirs: the rule must not depend on it.)
    let victim = "cal@example.com";
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    let (_, attackers) = idp.mail(1).await;
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    let (_, own) = idp.mail(2).await;
    let r = idp.verify_code("signup", victim, &code(&attackers)).await;
    assert_error(&r, 403, "otp_expired");
    let r = idp.verify_code("signup", victim, &code(&own)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    for pw in [PASSWORD, ATTACKER_PASSWORD] {
        assert_error(&idp.sign_in(victim, pw).await, 400, "invalid_credentials");
    }
    let (_, notice) = idp.mail(3).await;
    assert!(notice.contains("choose a password"), "{notice}");
    // The other links are void once the email is confirmed.
    assert_error(
        &idp.verify_hash("signup", &attackers).await,
        403,
        "otp_expired",
    );

    // Victim first, then the attacker's sign-up is mailed: the victim's code
    // is void, the victim's link is not, and it drops the pre-proof password.
    let victim = "dan@example.com";
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    let (_, own) = idp.mail(4).await;
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    idp.mail(5).await;
    let r = idp.verify_code("signup", victim, &code(&own)).await;
    assert_error(&r, 403, "otp_expired");
    let r = idp.verify_hash("signup", &own).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    let (_, notice) = idp.mail(6).await;
    assert!(notice.contains("choose a password"), "{notice}");
}

/// The owner opens the NEWEST mail in the inbox, which a later sign-up of the
/// attacker's issued (mailed, re-sent by `/resend`, or after a code sign-up
/// that emptied the pending password): the attacker's password still never
/// signs in, and `ADMIN_EMAILS` makes no one with a password of the
/// attacker's an admin.
#[tokio::test(flavor = "multi_thread")]
async fn the_newest_mail_of_a_contested_sign_up_keeps_no_password() {
    let idp = Idp::start(&[
        ("AUTH_MAIL_INTERVAL_SECS", "0"),
        ("ADMIN_EMAILS", "gil@example.com"),
    ])
    .await
    .from_fresh_v6();
    let refused = |r: Reply| assert_error(&r, 400, "invalid_credentials");

    // Victim first, the attacker's sign-up mailed after it; the owner opens
    // the newest mail (the attacker's).
    let victim = "gil@example.com";
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    idp.mail(1).await;
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    let (_, newest) = idp.mail(2).await;
    let r = idp.verify_hash("signup", &newest).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    refused(idp.sign_in(victim, ATTACKER_PASSWORD).await);
    refused(idp.sign_in(victim, PASSWORD).await);
    let (_, notice) = idp.mail(3).await;
    assert!(notice.contains("choose a password"), "{notice}");
    // The admin is the owner signed in by the link, with no one's password.
    let user = r.json["user"]["id"].as_str().unwrap().to_string();
    assert_eq!(idp.role_of(&user).await, "admin");

    // A code sign-up in between (it empties the pending password) does not
    // make the attacker's next sign-up the account's only one.
    let victim = "hal@example.com";
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    idp.mail(4).await;
    let r = idp.post("/otp", &json!({"email": victim})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(5).await;
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    let (_, newest) = idp.mail(6).await;
    let r = idp.verify_hash("signup", &newest).await;
    assert_eq!(r.status, 200, "{}", r.text);
    refused(idp.sign_in(victim, ATTACKER_PASSWORD).await);
    idp.mail(7).await; // the notice

    // The attacker's sign-up held back by the interval, then the mail sent
    // again by `/resend` (the owner's own "resend" button).
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "60")])
        .await
        .from_fresh_v6();
    let victim = "ida@example.com";
    assert_eq!(idp.signup(victim, PASSWORD).await.status, 200);
    idp.mail(1).await;
    assert_eq!(idp.signup(victim, ATTACKER_PASSWORD).await.status, 200);
    idp.count(
        "WITH moved AS (UPDATE auth_mail_slots SET last_sent_at = last_sent_at - interval '61 seconds' \
         WHERE email_norm = $1 RETURNING 1) SELECT COUNT(*) FROM moved",
        victim,
    )
    .await;
    let r = idp
        .post("/resend", &json!({"type": "signup", "email": victim}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, resent) = idp.mail(2).await;
    let r = idp.verify_hash("signup", &resent).await;
    assert_eq!(r.status, 200, "{}", r.text);
    refused(idp.sign_in(victim, ATTACKER_PASSWORD).await);
    refused(idp.sign_in(victim, PASSWORD).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn contested_confirmations_in_the_pkce_flow() {
    let idp = Idp::start(&[]).await.from_fresh_v6();
    let victims_verifier = "v".repeat(64);
    let attackers_verifier = "a".repeat(64);

    // Victim first: the victim's link gives an auth code; no password is
    // active until the exchange with the victim's verifier installs theirs.
    let victim = "eve@example.com";
    let r = idp.signup_pkce(victim, PASSWORD, &victims_verifier).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, own) = idp.mail(1).await;
    let r = idp
        .signup_pkce(victim, ATTACKER_PASSWORD, &attackers_verifier)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let code = auth_code(&idp.follow_link(&own, "signup").await);
    assert_error(
        &idp.sign_in(victim, PASSWORD).await,
        400,
        "invalid_credentials",
    );
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    let r = idp.exchange(&code, &attackers_verifier).await;
    assert_error(&r, 400, "bad_code_verifier");
    let r = idp.exchange(&code, &victims_verifier).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    assert_eq!(idp.sign_in(victim, PASSWORD).await.status, 200);
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    idp.mail(2).await; // the notice

    // Attacker first: the only link in the inbox is the attacker's flow. The
    // victim's browser cannot exchange it (its verifier is the victim's), the
    // attacker never sees the code; the notice's link signs the owner in.
    let victim = "fay@example.com";
    let r = idp
        .signup_pkce(victim, ATTACKER_PASSWORD, &attackers_verifier)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, attackers) = idp.mail(3).await;
    let r = idp.signup_pkce(victim, PASSWORD, &victims_verifier).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let code = auth_code(&idp.follow_link(&attackers, "signup").await);
    let r = idp.exchange(&code, &victims_verifier).await;
    assert_error(&r, 400, "bad_code_verifier");
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    let (to, notice) = idp.mail(4).await;
    assert!(
        to.contains(victim) && notice.contains("choose a password"),
        "{notice}"
    );
    let r = idp.verify_hash("recovery", &notice).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], victim);
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
}

/// The fields of a sign-up answer that could tell a new account from a
/// look-alike: each field's presence and type, and how the times relate.
fn shape(v: &Value) -> Value {
    fn kind(v: &Value) -> Value {
        match v {
            Value::Null => json!("null"),
            Value::Bool(_) => json!("bool"),
            Value::Number(_) => json!("number"),
            Value::String(_) => json!("string"),
            Value::Array(a) => Value::Array(a.iter().map(kind).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), kind(v))).collect())
            }
        }
    }
    let t = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(v[k].as_str().unwrap_or_else(|| panic!("{k} in {v}")))
            .unwrap()
    };
    let i = &v["identities"][0];
    json!({
        "kinds": kind(v),
        "created_is_updated": v["created_at"] == v["updated_at"],
        "sent_after_created": t("confirmation_sent_at") > t("created_at"),
        "identity_times_are_created": i["created_at"] == v["created_at"] && i["updated_at"] == v["created_at"],
        "identity_data": [i["identity_data"]["email"] == v["email"], i["identity_data"]["email_verified"].clone()],
        "ids": [i["user_id"] == v["id"], i["id"] == v["id"], i["identity_data"]["sub"] == v["id"]],
        "email": v["email"].clone(),
        "metadata": v["user_metadata"].clone(),
        "app_metadata": v["app_metadata"].clone(),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_do_not_tell_registered_addresses_from_unknown_ones() {
    let idp = Idp::start(&[]).await.from_fresh_v6();
    let body = |email: &str| json!({"email": email, "password": PASSWORD, "data": {"name": "N"}});
    // A registered (unconfirmed) address, signed up again, against a new one.
    let first = idp.post("/signup", &body("gil@example.com")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let again = idp.post("/signup", &body("gil@example.com")).await;
    let fresh = idp.post("/signup", &body("hal@example.com")).await;
    assert_eq!((again.status, fresh.status), (first.status, first.status));
    assert_eq!(shape(&again.json), {
        let mut s = shape(&fresh.json);
        s["email"] = json!("gil@example.com");
        s
    });
    assert_ne!(
        again.json["id"], first.json["id"],
        "a look-alike, not the account"
    );
    // A confirmed one, against a new one.
    let (_, text) = idp.mail(1).await;
    assert_eq!(idp.verify_hash("signup", &text).await.status, 200);
    let confirmed = idp.post("/signup", &body("gil@example.com")).await;
    let fresh = idp.post("/signup", &body("ian@example.com")).await;
    assert_eq!(confirmed.status, fresh.status);
    assert_eq!(shape(&confirmed.json), {
        let mut s = shape(&fresh.json);
        s["email"] = json!("gil@example.com");
        s
    });

    // `/recover` twice: the same answers for a registered and an unknown address.
    let idp = &idp;
    let recover = |email: &'static str| {
        let body = json!({"email": email});
        async move { idp.post("/recover", &body).await }
    };
    let answers = |r: &Reply| {
        (
            r.status.as_u16(),
            r.json["code"].clone(),
            r.header("retry-after").is_some(),
        )
    };
    let registered = [
        answers(&recover("gil@example.com").await),
        answers(&recover("gil@example.com").await),
    ];
    let unknown = [
        answers(&recover("who@example.com").await),
        answers(&recover("who@example.com").await),
    ];
    assert_eq!(registered, unknown);
    assert_eq!(registered[1].0, 429, "{registered:?}");

    // A sign-up then `/resend` at once: a confirmed address answers as an
    // unknown one does (the sign-up claimed the address's mail slot in both).
    let resend = |email: &'static str| {
        let body = json!({"type": "signup", "email": email});
        async move { idp.post("/resend", &body).await }
    };
    let confirmed = idp.post("/signup", &body("gil@example.com")).await;
    let unknown = idp.post("/signup", &body("joy@example.com")).await;
    assert_eq!(confirmed.status, unknown.status);
    assert_eq!(
        answers(&resend("gil@example.com").await),
        answers(&resend("joy@example.com").await)
    );
    // Nor does `/otp` (a magic link for the one, a confirmation for the
    // other: one slot for both).
    let otp = |email: &'static str| {
        let body = json!({"email": email});
        async move { idp.post("/otp", &body).await }
    };
    let (a, b) = (otp("gil@example.com").await, otp("joy@example.com").await);
    assert_eq!(answers(&a), answers(&b), "{} / {}", a.text, b.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn password_and_email_changes_are_rate_limited_per_user() {
    let idp = Idp::start(&[("AUTH_RATE_LIMIT_PER_5MIN", "5")])
        .await
        .from_fresh_v6();
    let email = "kim@example.com";
    assert_eq!(idp.signup(email, PASSWORD).await.status, 200);
    let (_, text) = idp.mail(1).await;
    let s = idp.verify_hash("signup", &text).await;
    assert_eq!(s.status, 200, "{}", s.text);
    let token = s.json["access_token"].as_str().unwrap().to_string();
    // Profile data is free: more updates than the limit, each from its own IP.
    for n in 0..8 {
        let r = idp
            .put_user(&token, &json!({"data": {"n": n}}), &random_ip())
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // Password changes from many IPs: the user's limit stops them.
    let mut statuses = Vec::new();
    for n in 0..8 {
        let r = idp
            .put_user(
                &token,
                &json!({"password": format!("new password {n}")}),
                &random_ip(),
            )
            .await;
        if r.status == 429 {
            assert_eq!(r.json["code"], "over_request_rate_limit", "{}", r.text);
            assert!(r.header_u64("retry-after") >= 1);
        }
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    // An email change counts against the same limit.
    let r = idp
        .put_user(&token, &json!({"email": "kim@example.org"}), &random_ip())
        .await;
    assert_error(&r, 429, "over_request_rate_limit");
    // Data-only updates still pass.
    let r = idp
        .put_user(&token, &json!({"data": {"after": true}}), &random_ip())
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// Anyone may ask for another recovery or magic-link mail to an address;
/// that must not void the link the owner is about to open. Each new mail
/// voids the earlier codes only; the first link used voids the others.
#[tokio::test(flavor = "multi_thread")]
async fn asking_again_never_voids_the_owners_recovery_or_magic_link() {
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")])
        .await
        .from_fresh_v6();
    let owner = "kay@example.com";
    assert_eq!(idp.signup(owner, PASSWORD).await.status, 200);
    let (_, confirmation) = idp.mail(1).await;
    assert_eq!(idp.verify_hash("signup", &confirmation).await.status, 200);

    let mut n = 1;
    for (path, kind) in [("/recover", "recovery"), ("/otp", "magiclink")] {
        let body = json!({"email": owner});
        assert_eq!(idp.post(path, &body).await.status, 200);
        let (_, owners) = idp.mail(n + 1).await;
        // Someone else asks again for the same address.
        assert_eq!(idp.post(path, &body).await.status, 200);
        let (_, later) = idp.mail(n + 2).await;
        n += 2;
        let r = idp.verify_code(kind, owner, &code(&owners)).await;
        assert_error(&r, 403, "otp_expired");
        let r = idp.verify_hash(kind, &owners).await;
        assert_eq!(r.status, 200, "{kind}: {}", r.text);
        assert_eq!(r.json["user"]["email"], owner);
        let r = idp.verify_hash(kind, &later).await;
        assert_error(&r, 403, "otp_expired");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resend_then_otp_answers_alike_for_a_confirmed_address_and_an_unknown_one() {
    let idp = Idp::start(&[]).await.from_fresh_v6();
    // A confirmed account whose last mail is long past (its slot cleared).
    assert_eq!(idp.signup("kim@example.com", PASSWORD).await.status, 200);
    let (_, text) = idp.mail(1).await;
    assert_eq!(idp.verify_hash("signup", &text).await.status, 200);
    let cleared = idp
        .count(
            "WITH d AS (DELETE FROM auth_mail_slots WHERE email_norm = $1 RETURNING 1) \
             SELECT COUNT(*) FROM d",
            "kim@example.com",
        )
        .await;
    assert!(cleared >= 1);
    let answers = |r: &Reply| {
        (
            r.status.as_u16(),
            r.json["code"].clone(),
            r.header("retry-after").is_some(),
        )
    };
    // `/resend` (a confirmation: none is sent to a confirmed address, the
    // slot is claimed either way), then `/otp` (a magic link for the one, a
    // code sign-up's confirmation for the other): the same answers.
    let mut seen = Vec::new();
    for email in ["kim@example.com", "lee@example.com"] {
        let resend = idp
            .post("/resend", &json!({"type": "signup", "email": email}))
            .await;
        let otp = idp.post("/otp", &json!({"email": email})).await;
        seen.push((answers(&resend), answers(&otp)));
    }
    assert_eq!(seen[0], seen[1], "{seen:?}");
    assert_eq!(
        seen[0].1 .0, 429,
        "the second mail within the interval: {seen:?}"
    );
}
