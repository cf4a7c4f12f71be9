//! The session check of the logged-in routes on the schema the migrations
//! make, on SQLite and PostgreSQL: the account loads
//! ([`users::ensure_session_user`], [`users::ensure_user_with_plan`]) answer
//! `None` for a session of the built-in provider that no longer exists (and
//! then create nothing), the account for one that does or when no session is
//! named; an avatar grant bound to a session is refused once it has ended.

use crate::common::on_each_backend;
use entity::{
    accounts::avatar::{self, UploadGrant, UploadRequest},
    accounts::users::{self, AdminGrant, Identity},
    entities::users as user_rows,
    identity::sessions::{self, LogoutScope},
};
use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait};
use uuid::Uuid;

const SECRET: &[u8] = b"refresh-secret-of-the-session-rules-test";

async fn has_session(db: &DatabaseConnection, id: &Identity, session: Option<Uuid>) -> bool {
    let grant = AdminGrant::default();
    let user = users::ensure_session_user(db, id, session, &grant)
        .await
        .expect("ensure_session_user");
    let with_plan = users::ensure_user_with_plan(db, id, session, &grant)
        .await
        .expect("ensure_user_with_plan");
    assert_eq!(user.is_some(), with_plan.is_some(), "both loads agree");
    let found = user.is_some();
    if let (Some(user), Some((with, plan))) = (user, with_plan) {
        assert_eq!(user, with);
        assert_eq!(plan, "FREE");
    }
    found
}

#[tokio::test]
async fn a_session_that_ended_is_refused_and_another_issuer_is_not_checked() {
    on_each_backend(|db| async move {
        let id = Identity {
            user_id: Uuid::new_v4(),
            email: Some("sam@example.com".into()),
        };
        users::ensure_user(&db, &id, &[]).await.unwrap();
        let kept = sessions::create(&db, SECRET, id.user_id, "password")
            .await
            .unwrap()
            .session
            .id;
        let ended = sessions::create(&db, SECRET, id.user_id, "password")
            .await
            .unwrap()
            .session
            .id;
        assert!(has_session(&db, &id, Some(kept)).await);
        assert!(has_session(&db, &id, Some(ended)).await);
        assert!(has_session(&db, &id, None).await, "no session named");
        assert!(
            !has_session(&db, &id, Some(Uuid::new_v4())).await,
            "an unknown session"
        );
        // Another user's session is not this user's.
        let other = Identity {
            user_id: Uuid::new_v4(),
            email: None,
        };
        users::ensure_user(&db, &other, &[]).await.unwrap();
        assert!(!has_session(&db, &other, Some(kept)).await);

        let request = UploadRequest::new(1024, "image/png").unwrap();
        let grant = UploadGrant::new(id.user_id, request, chrono::Utc::now());
        let bound = grant.clone().for_session(Some(ended));
        assert!(avatar::grant_session_alive(&db, &bound).await.unwrap());
        assert!(avatar::grant_session_alive(&db, &grant).await.unwrap());

        sessions::logout(&db, id.user_id, ended, LogoutScope::Local)
            .await
            .unwrap();
        assert!(!has_session(&db, &id, Some(ended)).await, "signed out");
        assert!(has_session(&db, &id, Some(kept)).await, "the other goes on");
        assert!(!avatar::grant_session_alive(&db, &bound).await.unwrap());
        assert!(
            avatar::grant_session_alive(&db, &grant).await.unwrap(),
            "a grant bound to no session"
        );
    })
    .await;
}

#[tokio::test]
async fn an_unknown_user_with_an_ended_session_is_not_created() {
    on_each_backend(|db| async move {
        let id = Identity {
            user_id: Uuid::new_v4(),
            email: None,
        };
        assert!(!has_session(&db, &id, Some(Uuid::new_v4())).await);
        let rows = user_rows::Entity::find_by_id(id.user_id)
            .count(&db)
            .await
            .unwrap();
        assert_eq!(rows, 0, "a deleted account is not brought back");
        // Without a session (another issuer) it is created on first sight.
        assert!(has_session(&db, &id, None).await);
    })
    .await;
}
