//! The email change's rule on the schema the migrations make, on SQLite and
//! PostgreSQL: the change applies only when both halves of its request were
//! verified. A half voided meanwhile (a password change voids the account's
//! email-change tokens) is not a verified half: verifying the current
//! address's half, with the new address's half voided between the token's
//! consumption and the apply (the race a red team won against the release
//! binaries), changes nothing; verifying both applies.

use crate::common::on_each_backend;
use entity::{
    accounts::users::AdminGrant,
    entities::{auth_accounts, auth_one_time_tokens},
    identity::{
        account::{self, Created, NewAccount},
        otp::{self, Issue, MailKind, Proof, VOIDED_BY_CREDENTIAL_CHANGE},
    },
};
use sea_orm::{DatabaseConnection, EntityTrait};
use serde_json::json;
use uuid::Uuid;

/// A confirmed account on `current` with a pending change to `new`: both
/// halves issued for one request, as `PUT /user {email}` issues them;
/// answers the account and the halves' link secrets (new, current).
async fn pending_change(
    db: &DatabaseConnection,
    current: &str,
    new: &str,
) -> (Uuid, String, String) {
    let Created::New(acc) = account::create(
        db,
        NewAccount {
            email: current,
            email_norm: current,
            password_hash: Some("hash".into()),
            user_metadata: json!({}),
            confirmed: true,
            signup_id: None,
        },
        &AdminGrant::default(),
    )
    .await
    .unwrap() else {
        panic!("a new account")
    };
    account::request_email_change(db, acc.user_id, new, new)
        .await
        .unwrap();
    let change = Uuid::new_v4();
    let to_new = otp::issue(
        db,
        Issue {
            user_id: acc.user_id,
            kind: MailKind::EmailChange,
            email_norm: new,
            flow_state_id: None,
            signup_id: Some(change),
        },
    )
    .await
    .unwrap();
    let to_current = otp::issue_another(
        db,
        Issue {
            user_id: acc.user_id,
            kind: MailKind::EmailChange,
            email_norm: current,
            flow_state_id: None,
            signup_id: Some(change),
        },
    )
    .await
    .unwrap();
    (acc.user_id, to_new.token_hash, to_current.token_hash)
}

async fn consume(db: &DatabaseConnection, token_hash: &str) -> auth_one_time_tokens::Model {
    otp::consume(
        db,
        &[MailKind::EmailChange],
        Proof::TokenHash(token_hash),
        3600,
        10,
    )
    .await
    .expect("a live half")
}

async fn email_of(db: &DatabaseConnection, user: Uuid) -> String {
    auth_accounts::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("the account")
        .email
}

#[tokio::test]
async fn a_half_voided_by_a_password_change_is_not_a_verified_half() {
    on_each_backend(|db| async move {
        let attacker = format!("a-{}@example.com", Uuid::new_v4());
        let victim = format!("v-{}@example.com", Uuid::new_v4());
        let (user, _to_victim, to_attacker) = pending_change(&db, &attacker, &victim).await;
        // The attacker verifies their own half; a password change voids the
        // victim's half before the apply runs.
        let row = consume(&db, &to_attacker).await;
        otp::void_kinds(&db, user, &VOIDED_BY_CREDENTIAL_CHANGE)
            .await
            .unwrap();
        let applied = account::apply_email_change(&db, &row).await;
        assert!(
            matches!(applied, Ok(false)),
            "the first half only: {applied:?}"
        );
        assert_eq!(
            email_of(&db, user).await,
            attacker,
            "nobody proved {victim}"
        );
    })
    .await;
}

#[tokio::test]
async fn both_halves_verified_apply_the_change_in_either_order() {
    on_each_backend(|db| async move {
        for new_first in [true, false] {
            let current = format!("c-{}@example.com", Uuid::new_v4());
            let new = format!("n-{}@example.com", Uuid::new_v4());
            let (user, to_new, to_current) = pending_change(&db, &current, &new).await;
            let (first, second) = if new_first {
                (to_new, to_current)
            } else {
                (to_current, to_new)
            };
            let row = consume(&db, &first).await;
            assert!(!account::apply_email_change(&db, &row).await.unwrap());
            assert_eq!(email_of(&db, user).await, current);
            let row = consume(&db, &second).await;
            assert!(account::apply_email_change(&db, &row).await.unwrap());
            assert_eq!(email_of(&db, user).await, new);
        }
    })
    .await;
}
