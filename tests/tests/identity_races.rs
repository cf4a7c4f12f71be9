//! The identity invariant under requests that race, as two api processes
//! on one database serve them in production: when the owner of a mailbox
//! first proves it, the account is theirs alone. A race is made certain,
//! not hoped for: the test holds the racing write in an open transaction of
//! its own, so the request under test reads before it and writes after it.

use std::time::Duration;

use serde_json::json;
use tests::{no_redirects, random_ip, wait_until, Idp, Reply};
use uuid::Uuid;

/// A racing request's pending account at `email` (its password hash, if
/// any, and a sign-up id of its own), inserted in a transaction left open:
/// the request under test reads before it and its own insert waits on it.
async fn pending_account_held(
    idp: &Idp,
    email: &str,
    password_hash: Option<&str>,
) -> sea_orm::sqlx::Transaction<'static, sea_orm::sqlx::Postgres> {
    let (user, request) = (Uuid::new_v4(), Uuid::new_v4());
    let mut racing = idp.pool().begin().await.expect("begin");
    for sql in [
        "INSERT INTO users (id, email) VALUES ($1, $3)",
        "INSERT INTO auth_accounts (user_id, email, email_norm, password_hash, signup_id, \
         user_metadata, created_at, updated_at) \
         VALUES ($1, $3, $3, $4, $2, '{}', now(), now())",
    ] {
        sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql))
            .bind(user)
            .bind(request)
            .bind(email)
            .bind(password_hash)
            .execute(&mut *racing)
            .await
            .expect(sql);
    }
    racing
}

/// Whether an insert into `auth_accounts` comes to wait on a lock (30 s).
async fn insert_waits(idp: &Idp) -> bool {
    wait_until(Duration::from_secs(30), || async {
        idp.count(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query ILIKE $1",
            "%auth_accounts%",
        )
        .await
            >= 1
    })
    .await
}

/// A code sign-up (`/otp`) whose lookup found no account while an
/// attacker's password sign-up created it: the code sign-up is another
/// request touching the pending account, so it is contested (its
/// `signup_id` the nil "contested" id, no password) and no later
/// confirmation keeps the attacker's password. Red team, release binaries:
/// 3 hits in 20 tries; the attacker signed in with the password after the
/// owner followed the mail of the attacker's `/resend`.
///
/// The attacker's sign-up is the test's own transaction, inserting the
/// pending account with a password and its sign-up id, left open while the
/// `/otp` runs: the `/otp` finds no account, its insert waits on the
/// address's unique index, and the commit makes it find the attacker's.
#[tokio::test(flavor = "multi_thread")]
async fn a_code_sign_up_whose_lookup_missed_a_racing_sign_up_contests_the_account() {
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")]).await;
    let email = "race@example.com";
    let racing = pending_account_held(&idp, email, Some("attacker-phc")).await;
    let otp = tokio::spawn(Reply::send(
        no_redirects()
            .post(idp.url("/otp"))
            .header("x-forwarded-for", random_ip())
            .json(&json!({"email": email, "create_user": true})),
    ));
    // The code sign-up's own insert waits on the address.
    let waiting = insert_waits(&idp).await;
    assert!(waiting, "the /otp's insert waits on the racing sign-up");
    racing.commit().await.expect("commit the racing sign-up");
    let r = otp.await.expect("the /otp request");
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_accounts WHERE email_norm = $1 \
             AND signup_id = '00000000-0000-0000-0000-000000000000' \
             AND password_hash IS NULL",
            email,
        )
        .await,
        1,
        "the account is contested and keeps no password"
    );
}

/// The other order: a password sign-up whose lookup found no account while
/// a racing code sign-up (no password, its own request id) created it. The
/// sign-up is a second request touching the pending account: contested, so
/// no confirmation keeps the sign-up's password either, whichever of the two
/// mails proves the mailbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_password_sign_up_whose_lookup_missed_a_racing_code_sign_up_contests_the_account() {
    let idp = Idp::start(&[("AUTH_MAIL_INTERVAL_SECS", "0")]).await;
    let email = "race-otp@example.com";
    let racing = pending_account_held(&idp, email, None).await;
    let signup = tokio::spawn(Reply::send(
        no_redirects()
            .post(idp.url("/signup"))
            .header("x-forwarded-for", random_ip())
            .json(&json!({"email": email, "password": tests::ATTACKER_PASSWORD})),
    ));
    let waiting = insert_waits(&idp).await;
    assert!(
        waiting,
        "the sign-up's insert waits on the racing code sign-up"
    );
    racing
        .commit()
        .await
        .expect("commit the racing code sign-up");
    let r = signup.await.expect("the sign-up request");
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        idp.count(
            "SELECT COUNT(*) FROM auth_accounts WHERE email_norm = $1 \
             AND signup_id = '00000000-0000-0000-0000-000000000000'",
            email,
        )
        .await,
        1,
        "the account is contested"
    );
}
