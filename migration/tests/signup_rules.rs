//! The pending account's sign-up rules on the schema the migrations make, on
//! SQLite and PostgreSQL: once two requests contested a pending account, a
//! sign-up that read the account before it was contested (two sign-ups
//! racing: the owner's and a second one of the attacker's password) cannot
//! write its stale sign-up id back, so no pre-proof password survives the
//! owner's confirmation.

mod common;

use common::on_each_backend;
use entity::{
    accounts::users::AdminGrant,
    entities::auth_accounts,
    identity::account::{self, Created, NewAccount, CONTESTED},
};
use sea_orm::{DatabaseConnection, EntityTrait};
use serde_json::json;
use uuid::Uuid;

async fn signup_id_of(db: &DatabaseConnection, user_id: Uuid) -> Option<Uuid> {
    auth_accounts::Entity::find_by_id(user_id)
        .one(db)
        .await
        .unwrap()
        .expect("the account")
        .signup_id
}

#[tokio::test]
async fn a_stale_sign_up_does_not_undo_a_contest() {
    on_each_backend(|db| async move {
        let email = format!("{}@example.com", Uuid::new_v4());
        let attackers = Uuid::new_v4();
        let created = account::create(
            &db,
            NewAccount {
                email: &email,
                email_norm: &email,
                password_hash: Some("attacker's hash".into()),
                user_metadata: json!({}),
                confirmed: false,
                signup_id: Some(attackers),
            },
            &AdminGrant::default(),
        )
        .await
        .unwrap();
        let Created::New(acc) = created else {
            panic!("a new account")
        };
        // The owner's sign-up (another password) contests the account ...
        assert!(account::retake_pending(
            &db,
            acc.user_id,
            Some("owner's hash".into()),
            json!({}),
            Some(CONTESTED),
        )
        .await
        .unwrap());
        assert_eq!(signup_id_of(&db, acc.user_id).await, Some(CONTESTED));
        // ... and the attacker's second sign-up, which read the account
        // before (same password: it would keep the attacker's sign-up id),
        // lands after it: the account stays contested.
        assert!(account::retake_pending(
            &db,
            acc.user_id,
            Some("attacker's hash".into()),
            json!({}),
            Some(attackers),
        )
        .await
        .unwrap());
        assert_eq!(
            signup_id_of(&db, acc.user_id).await,
            Some(CONTESTED),
            "a stale sign-up wrote its id over the contest"
        );
    })
    .await;
}
