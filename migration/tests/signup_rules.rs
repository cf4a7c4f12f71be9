//! The pending account's sign-up rules on the schema the migrations make, on
//! SQLite and PostgreSQL: once two requests contested a pending account, a
//! sign-up that read the account before it was contested (two sign-ups
//! racing: the owner's and a second one of the attacker's password) cannot
//! write its stale sign-up id back, so no pre-proof password survives the
//! owner's confirmation. An OAuth sign-in of an unverified address gets
//! no session, and its grant re-checks the identity it holds.

use crate::common::on_each_backend;
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

/// An OAuth sign-in with an address the provider did not verify makes a
/// pending account with itself as sole request and gets no session; the
/// grant re-checks the identity it holds: none while the account is
/// pending, none once the owner's proof by another mail removed the
/// identity (and the next sign-in is refused); the proof by the sign-in's
/// own mail keeps the identity, which then signs in.
#[tokio::test]
async fn an_oauth_grant_rechecks_the_identity_it_holds() {
    use entity::{
        entities::auth_identities,
        identity::external::{self, External, OAuthProfile},
    };
    use sea_orm::{ColumnTrait, QueryFilter};
    on_each_backend(|db| async move {
        let secret = [7u8; 32];
        let grant = AdminGrant::default();
        let profile = |id: &str, email: &str| OAuthProfile {
            provider: "github".into(),
            provider_id: id.into(),
            email: Some(email.into()),
            email_verified: false,
            user_metadata: json!({"name": "Mallory"}),
        };
        let identity_of = |user_id: Uuid| {
            let db = db.clone();
            async move {
                auth_identities::Entity::find()
                    .filter(auth_identities::Column::UserId.eq(user_id))
                    .filter(auth_identities::Column::Provider.eq("github"))
                    .one(&db)
                    .await
                    .unwrap()
                    .map(|i| i.id)
            }
        };
        // Proven by another mail: the identity is removed.
        let victim = format!("{}@example.com", Uuid::new_v4());
        let out = external::sign_in(&db, &profile("1", &victim), &grant)
            .await
            .unwrap();
        let External::NeedsConfirmation {
            user_id,
            request_id: Some(_),
            ..
        } = out
        else {
            panic!("no session for an unverified address: {out:?}")
        };
        let identity = identity_of(user_id).await.expect("the identity");
        assert!(
            external::grant_session(&db, &secret, user_id, identity)
                .await
                .unwrap()
                .is_none(),
            "no session while the account is pending"
        );
        account::confirm_email(&db, user_id, &grant, account::Proof::default())
            .await
            .unwrap();
        assert_eq!(identity_of(user_id).await, None);
        assert!(
            external::grant_session(&db, &secret, user_id, identity)
                .await
                .unwrap()
                .is_none(),
            "no session for an identity the proof removed"
        );
        assert_eq!(
            external::sign_in(&db, &profile("1", &victim), &grant)
                .await
                .unwrap(),
            External::Refused
        );
        // Proven by the sign-in's own mail: the identity stays and signs in.
        let own = format!("{}@example.com", Uuid::new_v4());
        let out = external::sign_in(&db, &profile("2", &own), &grant)
            .await
            .unwrap();
        let External::NeedsConfirmation {
            user_id,
            request_id,
            ..
        } = out
        else {
            panic!("no session for an unverified address: {out:?}")
        };
        account::confirm_email(
            &db,
            user_id,
            &grant,
            account::Proof {
                request_id,
                ..account::Proof::default()
            },
        )
        .await
        .unwrap();
        let identity = identity_of(user_id).await.expect("kept by its own mail");
        assert!(external::grant_session(&db, &secret, user_id, identity)
            .await
            .unwrap()
            .is_some());
        assert_eq!(
            external::sign_in(&db, &profile("2", &own), &grant)
                .await
                .unwrap(),
            External::SignedIn {
                user_id,
                identity_id: identity
            }
        );
    })
    .await;
}
