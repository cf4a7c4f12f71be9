//! The identity invariant against an attacker: when the owner of
//! a mailbox first proves it, the account is theirs alone. Email changes
//! bound to their request and address, contested code sign-ups, unverified
//! OAuth identities, metadata that locks an account out, and the mails a
//! credential change voids. The real api and worker on PostgreSQL + Redis,
//! mails read from the SMTP sink, GitHub faked over HTTP.

use std::{collections::HashMap, time::Duration};

use serde_json::{json, Value};
use tests::{
    access, assert_error, challenge, code, no_redirects as client, token_hash, Idp, Reply,
    SmtpSink, APP, ATTACKER_PASSWORD, PASSWORD,
};
use wiremock::MockServer;

/// Attack 1: `PUT {email: V}`, `PUT {email: A2}`, `PUT {email: V}` refused
/// by V's mail interval. The refused request must change nothing, and
/// verifying both halves of A2's mails must apply A2, never V.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_email_change_changes_nothing_and_a_change_applies_its_own_address() {
    // `/api/me` below writes through the server-side key.
    let idp = Idp::start_with(&[(
        "BACKEND_SERVICE_ROLE_KEY",
        "identity-proof-service-role-key-0123456789".into(),
    )])
    .await;
    let (a, v, a2) = ("ann@example.com", "victim@example.net", "ann2@example.org");
    let s = idp.confirmed_user(a, 1).await;
    let user = s["user"]["id"].as_str().unwrap().to_string();
    let r = idp
        .put_auth("/user", access(&s), &json!({"email": v}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mails(3).await;
    // The current address's interval over (it is the attacker's own).
    idp.sql(
        "UPDATE auth_mail_slots SET last_sent_at = now() - interval '2 hours' \
         WHERE email_norm = $1",
        a,
    )
    .await;
    let r = idp
        .put_auth("/user", access(&s), &json!({"email": a2}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["new_email"], a2, "{}", r.text);
    idp.mails(5).await;
    // V again, within V's interval: refused, and nothing changes.
    let r = idp
        .put_auth("/user", access(&s), &json!({"email": v}))
        .await;
    assert_error(&r, 429, "over_email_send_rate_limit");
    let pending = idp
        .text(
            "SELECT email_change FROM auth_accounts WHERE user_id::text = $1",
            &user,
        )
        .await;
    assert_eq!(pending.as_deref(), Some(a2), "the refused request wrote");
    let r = idp.get_auth("/user", access(&s)).await;
    assert_eq!(r.json["new_email"], a2, "{}", r.text);

    // Both halves of the A2 request: A2 applies, never V. The first half
    // answers `{msg}` and signs no one in (GoTrue's secure email change).
    let to_a2 = idp.last_mail_to(5, a2).await;
    let to_a = idp.last_mail_to(5, a).await;
    let r = idp.verify_hash("email_change", &to_a2).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json["msg"].is_string(), "{}", r.text);
    assert!(r.json.get("access_token").is_none(), "{}", r.text);
    let r = idp.verify_hash("email_change", &to_a).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json["access_token"].is_string(), "{}", r.text);
    let email = idp
        .text(
            "SELECT email FROM auth_accounts WHERE user_id::text = $1",
            &user,
        )
        .await;
    assert_eq!(email.as_deref(), Some(a2));
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_accounts WHERE email_norm = $1",
            v
        )
        .await,
        0,
        "nobody holds the victim's address"
    );
    assert_error(&idp.sign_in(v, PASSWORD).await, 400, "invalid_credentials");
    assert_eq!(idp.sign_in(a2, PASSWORD).await.status, 200);

    // An access token from before the change, still unexpired, does not
    // write the old address back (receipts and reminders go to
    // `users.email`).
    let r = Reply::send(client().get(idp.api.url("/api/me")).bearer_auth(access(&s))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let stored = idp
        .text("SELECT email FROM users WHERE id::text = $1", &user)
        .await;
    assert_eq!(
        stored.as_deref(),
        Some(a2),
        "an old token wrote its address back"
    );
}

/// The earlier request's mails are void once a later one went out: its two
/// halves apply nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_earlier_email_change_request_applies_nothing() {
    let idp = Idp::start_with(&[("AUTH_MAIL_INTERVAL_SECS", "0".into())]).await;
    let (a, first, second) = ("bea@example.com", "bea@example.net", "bea@example.org");
    let s = idp.confirmed_user(a, 1).await;
    let r = idp
        .put_auth("/user", access(&s), &json!({"email": first}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let to_first = idp.last_mail_to(3, first).await;
    let to_a_first = idp.last_mail_to(3, a).await;
    let r = idp
        .put_auth("/user", access(&s), &json!({"email": second}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mails(5).await;
    for text in [&to_first, &to_a_first] {
        let r = idp.verify_hash("email_change", text).await;
        assert_error(&r, 403, "otp_expired");
    }
    let r = idp.get_auth("/user", access(&s)).await;
    assert_eq!(r.json["email"], a, "{}", r.text);
    assert_eq!(r.json["new_email"], second, "{}", r.text);
}

/// `void_all` was never called: a password change (or reset) left the
/// account's recovery and magic links usable.
#[tokio::test(flavor = "multi_thread")]
async fn a_password_change_voids_outstanding_recovery_and_magic_links() {
    let idp = Idp::start_with(&[]).await;
    let email = "cal@example.com";
    let s = idp.confirmed_user(email, 1).await;
    let r = idp.post("/recover", &json!({"email": email})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, recovery) = idp.mail(2).await;
    let r = idp.post("/otp", &json!({"email": email})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, magic) = idp.mail(3).await;
    let r = idp
        .put_auth(
            "/user",
            access(&s),
            &json!({"password": "a brand new password"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_error(
        &idp.verify_hash("recovery", &recovery).await,
        403,
        "otp_expired",
    );
    assert_error(
        &idp.verify_hash("magiclink", &magic).await,
        403,
        "otp_expired",
    );
}

/// Attack 2: the victim's code sign-up, then the attacker's password
/// sign-up (and its `/resend`); the victim enters the newest code. The
/// attacker's password must not sign in, on an `ADMIN_EMAILS` address least
/// of all.
#[tokio::test(flavor = "multi_thread")]
async fn a_code_sign_up_then_a_password_sign_up_keeps_no_password() {
    let victim = "root@example.com";
    let idp = Idp::start_with(&[
        ("AUTH_MAIL_INTERVAL_SECS", "0".into()),
        ("ADMIN_EMAILS", victim.into()),
    ])
    .await;
    let r = idp.post("/otp", &json!({"email": victim})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(1).await;
    let r = idp.signup(victim, ATTACKER_PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(2).await;
    let r = idp
        .post("/resend", &json!({"type": "signup", "email": victim}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, newest) = idp.mail(3).await;
    let r = idp.verify_code("email", victim, &code(&newest)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let user = r.json["user"]["id"].as_str().unwrap().to_string();
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    // The owner proved the mailbox: admin is theirs, and only theirs.
    assert_eq!(idp.role_of(&user).await, "admin");
}

/// The same on an address that is not an admin's: contested, no password.
#[tokio::test(flavor = "multi_thread")]
async fn a_password_sign_up_after_a_code_sign_up_contests_the_account() {
    let idp = Idp::start_with(&[("AUTH_MAIL_INTERVAL_SECS", "0".into())]).await;
    let victim = "dora@example.com";
    let r = idp.post("/otp", &json!({"email": victim})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(1).await;
    let r = idp.signup(victim, ATTACKER_PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, attackers) = idp.mail(2).await;
    // Whichever mail the owner opens, the attacker's password is gone.
    let r = idp.verify_hash("signup", &attackers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_error(
        &idp.sign_in(victim, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
}

/// For an `ADMIN_EMAILS` address no pre-proof password survives, not even
/// the one of a sole sign-up: the owner, signed in by the link, sets one.
#[tokio::test(flavor = "multi_thread")]
async fn an_admin_address_keeps_no_pre_proof_password() {
    let boss = "boss@example.com";
    let idp = Idp::start_with(&[("ADMIN_EMAILS", boss.into())]).await;
    let r = idp.signup(boss, ATTACKER_PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, text) = idp.mail(1).await;
    let r = idp.verify_hash("signup", &text).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let user = r.json["user"]["id"].as_str().unwrap().to_string();
    assert_eq!(idp.role_of(&user).await, "admin");
    assert_error(
        &idp.sign_in(boss, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    // The owner is told, with a set-password link.
    let (to, _) = idp.mail(2).await;
    assert!(to.contains(boss), "{to}");
}

/// The first proof voids every other mail of the pending account (a
/// recovery link someone asked for before it, too).
#[tokio::test(flavor = "multi_thread")]
async fn the_first_proof_voids_the_other_mails_of_the_account() {
    let idp = Idp::start_with(&[]).await;
    let email = "eli@example.com";
    let r = idp.signup(email, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, confirmation) = idp.mail(1).await;
    let r = idp.post("/recover", &json!({"email": email})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, recovery) = idp.mail(2).await;
    let r = idp.verify_hash("signup", &confirmation).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_error(
        &idp.verify_hash("recovery", &recovery).await,
        403,
        "otp_expired",
    );
    // The sole sign-up's own mail: its password is the owner's (GoTrue).
    assert_eq!(idp.sign_in(email, PASSWORD).await.status, 200);
}

/// Attack 4: 60 KB of `data` on a pending address made the owner's tokens
/// too large for every route. At most 4 KiB is stored; 422 naming `data`,
/// alike for a new and a known address; `PUT /user` refuses only growth.
#[tokio::test(flavor = "multi_thread")]
async fn user_metadata_is_capped_and_refused_alike() {
    let idp = Idp::start_with(&[("AUTH_MAIL_INTERVAL_SECS", "0".into())]).await;
    let big = json!({"bio": "x".repeat(5000)});
    let known = "fay@example.com";
    let r = idp.signup(known, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for email in [known, "nobody@example.com"] {
        let r = idp
            .post(
                "/signup",
                &json!({"email": email, "password": ATTACKER_PASSWORD, "data": big}),
            )
            .await;
        assert_error(&r, 422, "validation_failed");
        assert!(
            r.json["message"].as_str().unwrap().contains("data"),
            "{}",
            r.text
        );
        let r = idp
            .post("/otp", &json!({"email": email, "data": big}))
            .await;
        assert_error(&r, 422, "validation_failed");
        assert!(
            r.json["message"].as_str().unwrap().contains("data"),
            "{}",
            r.text
        );
    }
    let (_, text) = idp.mail(1).await;
    let s = idp.verify_hash("signup", &text).await;
    assert_eq!(s.status, 200, "{}", s.text);
    let s = s.json;
    let user = s["user"]["id"].as_str().unwrap().to_string();
    let r = idp
        .put_auth("/user", access(&s), &json!({"data": big}))
        .await;
    assert_error(&r, 422, "validation_failed");
    let r = idp
        .put_auth("/user", access(&s), &json!({"data": {"name": "Fay"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // An account over the cap (stored before it) can always shrink.
    idp.sql(
        &format!(
            "UPDATE auth_accounts SET user_metadata = '{{\"bio\": \"{}\"}}' \
             WHERE user_id::text = $1",
            "y".repeat(6000)
        ),
        &user,
    )
    .await;
    let r = idp
        .put_auth("/user", access(&s), &json!({"data": {"bio": null}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A fake GitHub whose account reports `email` as its primary address,
/// verified or not.
async fn fake_github(email: &str, verified: bool) -> MockServer {
    tests::fake_github_with(
        tests::GithubUser {
            login: "mallory",
            id: 666,
            name: "Mallory",
        },
        email,
        verified,
    )
    .await
}

fn query_of(url: &str) -> HashMap<String, String> {
    let u = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url:?}: {e}"));
    u.query_pairs().into_owned().collect()
}

/// A GitHub sign-in through the api: the callback's redirect.
async fn github_sign_in(idp: &Idp, n: usize) -> String {
    let r = Reply::send(client().get(idp.url("/authorize?provider=github"))).await;
    assert_eq!(r.status, 302, "{}", r.text);
    let state = query_of(r.header("location").unwrap())["state"].clone();
    let url = reqwest::Url::parse_with_params(
        &idp.url("/callback"),
        &[("code", format!("gh-code-{n}")), ("state", state)],
    )
    .unwrap();
    let r = Reply::send(client().get(url)).await;
    assert_eq!(r.status, 302, "{}", r.text);
    r.header("location").unwrap().to_string()
}

fn fragment_of(url: &str) -> HashMap<String, String> {
    let frag = reqwest::Url::parse(url)
        .unwrap()
        .fragment()
        .unwrap_or_default()
        .to_owned();
    query_of(&format!("http://x/?{frag}"))
}

/// Attack 3: the attacker's GitHub account reports V unverified; V proves
/// the mailbox; the attacker's next GitHub sign-in must not land in V's
/// account (GoTrue's `RemoveUnconfirmedIdentities` at the first proof).
#[tokio::test(flavor = "multi_thread")]
async fn an_unverified_oauth_identity_does_not_survive_the_first_proof() {
    let victim = "gil@example.com";
    let github = fake_github(victim, false).await;
    let idp = Idp::start_with(&github_env(&github)).await;
    // No session for an address GitHub did not verify: only the
    // confirmation mail, which goes to the address's owner.
    let back = github_sign_in(&idp, 1).await;
    assert_needs_verification(&back);
    idp.mail(1).await;
    let user = idp
        .text(
            "SELECT user_id::text FROM auth_accounts WHERE email_norm = $1",
            victim,
        )
        .await;
    // The owner proves the mailbox (a recovery mail of the pending account)
    // and sets a password.
    let r = idp.post("/recover", &json!({"email": victim})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, text) = idp.mail(2).await;
    let s = idp.verify_hash("recovery", &text).await;
    assert_eq!(s.status, 200, "{}", s.text);
    let owner = s.json["user"]["id"].as_str().unwrap().to_string();
    if let Some(u) = &user {
        assert_eq!(u, &owner);
    }
    let r = idp
        .put_auth("/user", access(&s.json), &json!({"password": PASSWORD}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_identities WHERE user_id::text = $1 \
             AND provider <> 'email'",
            &owner
        )
        .await,
        0,
        "the unverified identity was dropped"
    );
    // The attacker signs in with GitHub again: refused, nothing made.
    let back = github_sign_in(&idp, 2).await;
    assert_needs_verification(&back);
    assert_eq!(
        idp.count("SELECT COUNT(*) FROM users WHERE email = $1", victim)
            .await,
        1,
        "no second user for the address"
    );
}

/// The callback refused the sign-in with GoTrue's
/// `provider_email_needs_verification` (OAuth error `access_denied`, as
/// GoTrue's `external.go` answers it), and issued no session.
fn assert_needs_verification(back: &str) {
    let f = fragment_of(back);
    assert!(!f.contains_key("access_token"), "{back}");
    assert_eq!(
        f.get("error_code").map(String::as_str),
        Some("provider_email_needs_verification"),
        "{back}"
    );
    assert_eq!(
        f.get("error").map(String::as_str),
        Some("access_denied"),
        "{back}"
    );
}

fn github_env(github: &MockServer) -> Vec<(&'static str, String)> {
    vec![
        ("OAUTH_GITHUB_CLIENT_ID", "Iv1.gh-client-id".into()),
        (
            "OAUTH_GITHUB_CLIENT_SECRET",
            "gh-client-secret-0123456789".into(),
        ),
        ("OAUTH_GITHUB_BASE_URL", github.uri()),
        ("OAUTH_GITHUB_API_URL", github.uri()),
        ("OAUTH_TIMEOUT_MS", "2000".into()),
    ]
}

/// GoTrue's `external.go`: an address GitHub did not verify gets no
/// session, only a confirmation mail issued for that sign-in; its link
/// signs in to the account the sign-in made and keeps the identity, so the
/// next GitHub sign-in has a session in the same account.
#[tokio::test(flavor = "multi_thread")]
async fn an_unverified_oauth_sign_in_has_a_session_only_after_its_mail_is_followed() {
    let email = "ida@example.com";
    let github = fake_github(email, false).await;
    let idp = Idp::start_with(&github_env(&github)).await;
    let back = github_sign_in(&idp, 1).await;
    assert_needs_verification(&back);
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_sessions s JOIN auth_accounts a USING (user_id) \
             WHERE a.email_norm = $1",
            email
        )
        .await,
        0,
        "no session before the proof"
    );
    // Again inside the mail interval: refused alike.
    assert_needs_verification(&github_sign_in(&idp, 2).await);
    let (to, text) = idp.mail(1).await;
    assert_eq!(to, email);
    let s = idp.verify_hash("signup", &text).await;
    assert_eq!(s.status, 200, "{}", s.text);
    let user = s.json["user"]["id"].as_str().unwrap().to_string();
    assert!(
        s.json["user"]["email_confirmed_at"].is_string(),
        "{}",
        s.text
    );
    let back = github_sign_in(&idp, 3).await;
    let f = fragment_of(&back);
    let token = f
        .get("access_token")
        .unwrap_or_else(|| panic!("a session once confirmed: {back}"));
    let r = idp.get_auth("/user", token).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["id"], user.as_str(), "{}", r.text);
}

/// Finding B of the red team: GitHub sign-ins (an identity the owner's
/// proof does not keep) racing the owner's first proof of the address.
/// Whatever the interleaving, after the proof the account has the owner's
/// session only and no GitHub identity, and no sign-in got a session.
#[tokio::test(flavor = "multi_thread")]
async fn oauth_sign_ins_racing_the_first_proof_keep_no_session() {
    let victim = "jon@example.com";
    let github = fake_github(victim, false).await;
    let idp = Idp::start_with(&github_env(&github)).await;
    assert_needs_verification(&github_sign_in(&idp, 1).await);
    idp.mail(1).await;
    // The owner proves the mailbox by a recovery mail (not the sign-in's).
    let r = idp.post("/recover", &json!({"email": victim})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, recovery) = idp.mail(2).await;
    let racers = futures::future::join_all((0..12).map(|n| github_sign_in(&idp, 10 + n)));
    let (backs, s) = tokio::join!(racers, idp.verify_hash("recovery", &recovery));
    assert_eq!(s.status, 200, "{}", s.text);
    let owner = s.json["user"]["id"].as_str().unwrap().to_string();
    for back in backs {
        assert!(!fragment_of(&back).contains_key("access_token"), "{back}");
    }
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_sessions WHERE user_id::text = $1",
            &owner
        )
        .await,
        1,
        "the owner's session only"
    );
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_identities WHERE user_id::text = $1 \
             AND provider <> 'email'",
            &owner
        )
        .await,
        0
    );
}

/// Attack 7: `/resend {type: signup}` then `/signup` answered without
/// `confirmation_sent_at` for an unknown address and with it for a known
/// one. The answers must be alike.
#[tokio::test(flavor = "multi_thread")]
async fn resend_then_sign_up_answers_alike_for_known_and_unknown_addresses() {
    let idp = Idp::start_with(&[]).await;
    let known = "hal@example.com";
    let r = idp.signup(known, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(1).await;
    // Its mail is long past (the interval over).
    idp.sql(
        "UPDATE auth_mail_slots SET last_sent_at = now() - interval '2 hours' \
         WHERE email_norm = $1",
        known,
    )
    .await;
    let mut answers = Vec::new();
    for email in [known, "ivy@example.com"] {
        let r = idp
            .post("/resend", &json!({"type": "signup", "email": email}))
            .await;
        answers.push((r.status, r.json["code"].clone()));
        let r = idp.signup(email, ATTACKER_PASSWORD).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(
            r.json["confirmation_sent_at"].is_string(),
            "{email}: {}",
            r.text
        );
        let mut keys: Vec<String> = r.json.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        answers.push((r.status, json!(keys)));
    }
    assert_eq!(answers[0], answers[2]);
    assert_eq!(answers[1], answers[3]);
}

/// Attack 8: `/authorize` was unlimited and its states piled up. It is
/// limited per client, and expired states are purged by the scheduler.
#[tokio::test(flavor = "multi_thread")]
async fn authorize_is_limited_per_client_and_expired_states_are_purged() {
    let github = fake_github("jo@example.com", true).await;
    let idp = Idp::start_with(&[
        ("OAUTH_GITHUB_CLIENT_ID", "Iv1.gh-client-id".into()),
        (
            "OAUTH_GITHUB_CLIENT_SECRET",
            "gh-client-secret-0123456789".into(),
        ),
        ("OAUTH_GITHUB_BASE_URL", github.uri()),
        ("OAUTH_GITHUB_API_URL", github.uri()),
        ("AUTH_RATE_LIMIT_PER_5MIN", "5".into()),
        ("SCHEDULER_TICK_SECS", "1".into()),
    ])
    .await;
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let r = Reply::send(client().get(idp.url("/authorize?provider=github"))).await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(&statuses[..5], &[302; 5], "{statuses:?}");
    assert_eq!(statuses[6], 429, "{statuses:?}");
    idp.sql(
        "INSERT INTO auth_oauth_states (state_hash, provider, pkce_verifier, redirect_to, \
         created_at) VALUES ($1, 'github', 'v', 'https://app.example.com', \
         now() - interval '1 hour')",
        "stale-state-hash",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while idp
        .count(
            "SELECT COUNT(*) FROM auth_oauth_states WHERE state_hash = $1",
            "stale-state-hash",
        )
        .await
        > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the expired state was not purged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A PKCE flow's parked password is installed only while no password was
/// set since: the owner who proved the mailbox and chose a password before
/// the exchange keeps theirs.
#[tokio::test(flavor = "multi_thread")]
async fn a_parked_pkce_password_never_replaces_one_set_after_the_proof() {
    let idp = Idp::start_with(&[("AUTH_MAIL_INTERVAL_SECS", "0".into())]).await;
    let email = "kit@example.com";
    let (verifier, other) = ("v".repeat(64), "a".repeat(64));
    // Each sign-up's mail is awaited before the next request, so the first
    // mail is the owner's whatever order a busy worker would send two in.
    let mut own = None;
    for (n, (password, v)) in [(PASSWORD, &verifier), (ATTACKER_PASSWORD, &other)]
        .into_iter()
        .enumerate()
    {
        let r = idp
            .post(
                "/signup",
                &json!({"email": email, "password": password,
                        "code_challenge": challenge(v), "code_challenge_method": "s256"}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let (_, mail) = idp.mail(n + 1).await;
        own.get_or_insert(mail);
    }
    let own = own.expect("the owner's mail");
    // The owner's link: an auth code, the contested passwords dropped.
    let r = Reply::send(client().get(format!(
        "{}?token={}&type=signup&redirect_to=https%3A%2F%2Fapp.example.com%2Fwelcome",
        idp.url("/verify"),
        token_hash(&own)
    )))
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    let location = r.header("location").unwrap().to_string();
    let auth_code = location.split("code=").nth(1).expect("?code=").to_string();
    // The set-password notice: the owner chooses a password now.
    let (_, notice) = idp.mail(3).await;
    let s = idp.verify_hash("recovery", &notice).await;
    assert_eq!(s.status, 200, "{}", s.text);
    let later = "the owner's later password";
    let r = idp
        .put_auth("/user", access(&s.json), &json!({"password": later}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The exchange still signs in, and leaves that password alone.
    let r = idp
        .post(
            "/token?grant_type=pkce",
            &json!({"auth_code": auth_code, "code_verifier": verifier}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.sign_in(email, later).await.status, 200);
}

/// A GitHub sign-in whose provider verified a pending address is that
/// address's first proof: it links to the pending account (no second user)
/// and drops what was chosen before it (GoTrue's
/// `RemoveUnconfirmedIdentities`).
#[tokio::test(flavor = "multi_thread")]
async fn a_verified_oauth_sign_in_confirms_the_pending_account_and_drops_its_password() {
    let owner = "lou@example.com";
    let github = fake_github(owner, true).await;
    let idp = Idp::start_with(&github_env(&github)).await;
    let r = idp.signup(owner, ATTACKER_PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    idp.mail(1).await;
    let pending = idp
        .text(
            "SELECT user_id::text FROM auth_accounts WHERE email_norm = $1",
            owner,
        )
        .await
        .expect("the pending account");
    let back = github_sign_in(&idp, 1).await;
    let f = fragment_of(&back);
    let r = idp.get_auth("/user", &f["access_token"]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["id"], pending.as_str(), "{}", r.text);
    assert!(r.json["email_confirmed_at"].is_string(), "{}", r.text);
    assert_error(
        &idp.sign_in(owner, ATTACKER_PASSWORD).await,
        400,
        "invalid_credentials",
    );
    assert_eq!(
        idp.count("SELECT COUNT(*) FROM users WHERE email = $1", owner)
            .await,
        1,
        "one user for the address"
    );
}

/// The email change's one transaction (slots, pending address, tokens) on
/// the embedded default (SQLite, in-process queue): applied through both
/// halves; a request refused by the interval changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_email_change_on_sqlite_applies_and_a_refused_one_changes_nothing() {
    let dir = tests::TempDir::new();
    let sink = SmtpSink::start().await;
    let env = tests::EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", tests::plans_file().display().to_string())
        .with("AUTH_AUTOCONFIRM", "true")
        .with("EMAIL_FROM", tests::EMAIL_FROM)
        .with("SMTP_URL", sink.url())
        .with("APP_URL", APP);
    let api = tests::Proc::api(&env, &["--with-worker"], dir.path()).await;
    let post = |path: &str, token: Option<&str>, body: Value| {
        let mut rb = client()
            .post(api.url(&format!("/auth/v1{path}")))
            .header("x-supabase-api-version", "2024-01-01")
            .json(&body);
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        Reply::send(rb)
    };
    let r = post(
        "/signup",
        None,
        json!({"email": "max@example.com", "password": PASSWORD}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let token = r.json["access_token"].as_str().unwrap().to_string();
    let put = |body: Value| {
        Reply::send(
            client()
                .put(api.url("/auth/v1/user"))
                .header("x-supabase-api-version", "2024-01-01")
                .bearer_auth(&token)
                .json(&body),
        )
    };
    let r = put(json!({"email": "max@example.org"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["new_email"], "max@example.org", "{}", r.text);
    let r = put(json!({"email": "max@example.net"})).await;
    assert_error(&r, 429, "over_email_send_rate_limit");
    let mails = sink.wait_for(2, Duration::from_secs(30)).await;
    let texts: Vec<String> = mails.iter().map(|m| m.searchable()).collect();
    for text in &texts {
        let r = post(
            "/verify",
            None,
            json!({"type": "email_change", "token_hash": token_hash(text)}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = post(
        "/token?grant_type=password",
        None,
        json!({"email": "max@example.org", "password": PASSWORD}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["user"]["email"], "max@example.org", "{}", r.text);
}

/// Red-team finding D: only a mail that goes out spends the address's
/// daily budget of confirmation mails. Anonymous resends for an address
/// without an account send nothing and spend nothing, so its owner's
/// sign-up is still mailed; once the budget is spent a mail is held back
/// quietly, and `/resend` answers that address as it answers one without
/// an account.
#[tokio::test(flavor = "multi_thread")]
async fn resends_that_send_nothing_leave_the_owner_the_days_confirmation_mails() {
    let idp = Idp::start_with(&[
        ("AUTH_MAIL_INTERVAL_SECS", "0".into()),
        ("AUTH_CONFIRMATION_MAILS_PER_DAY", "2".into()),
    ])
    .await;
    let (owner, nobody) = ("kim@example.com", "lee@example.com");
    for _ in 0..5 {
        let r = resend_signup(&idp, owner).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let day_count = || async {
        idp.count(
            "SELECT COALESCE(MAX(day_count), 0)::bigint FROM auth_mail_slots \
             WHERE email_norm = $1 AND kind = 'confirmation'",
            owner,
        )
        .await
    };
    assert_eq!(
        day_count().await,
        0,
        "resends that sent nothing spent nothing"
    );
    let r = idp.signup(owner, PASSWORD).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.mail(1).await.0, owner, "the owner's sign-up is mailed");
    let r = resend_signup(&idp, owner).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(idp.mail(2).await.0, owner);
    assert_eq!(day_count().await, 2);
    // Spent: held back quietly, answered as for an address without an
    // account.
    for _ in 0..2 {
        resend_signup(&idp, nobody).await;
    }
    let (held, none) = (
        resend_signup(&idp, owner).await,
        resend_signup(&idp, nobody).await,
    );
    assert_eq!((held.status, &held.text), (none.status, &none.text));
    assert_eq!(held.status, 200, "{}", held.text);
    assert_eq!(day_count().await, 2, "no third mail in the day");
}

async fn resend_signup(idp: &Idp, email: &str) -> Reply {
    idp.post("/resend", &json!({"type": "signup", "email": email}))
        .await
}
