//! The job outbox's rules ([`entity::base::outbox`]) on SQLite and PostgreSQL:
//! what is due, the lease that hides a claimed row, releasing and deleting,
//! the follow-up kept in the profile save's own transaction, and two
//! concurrent claims never taking the same row.

use std::time::Duration;

use crate::common::{on_concurrent_backends, on_each_backend};
use entity::{
    accounts::profile::{self, ProfileInput},
    accounts::users::{ensure_user, Identity},
    base::outbox::{self, NewJob},
    entities::profiles,
};
use sea_orm::{DatabaseConnection, EntityTrait, TransactionTrait};
use uuid::Uuid;

fn job(n: usize) -> NewJob {
    NewJob {
        kind: "record_ai_usage".into(),
        job: format!("{{\"type\":\"record_ai_usage\",\"n\":{n}}}"),
    }
}

#[tokio::test]
async fn due_rows_are_claimed_leased_released_and_deleted() {
    on_each_backend(|db| async move {
        let due = outbox::insert(&db, &job(1), Duration::ZERO).await.unwrap();
        let held = outbox::insert(&db, &job(2), Duration::from_secs(150))
            .await
            .unwrap();
        assert_eq!(outbox::waiting(&db).await.unwrap(), 2);

        // Only the due row, once: its lease hides it from the next claim.
        let claimed = outbox::claim(&db, 10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{claimed:?}");
        assert_eq!(claimed[0].id, due);
        assert_eq!(claimed[0].job, job(1).job);
        assert_eq!(claimed[0].kind, "record_ai_usage");
        assert_eq!(claimed[0].attempts, 1);
        assert!(outbox::claim(&db, 10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());

        // Released (a failed push): due again, the attempt counted.
        outbox::retry_later(&db, due, Duration::ZERO, "redis: refused")
            .await
            .unwrap();
        let again = outbox::claim(&db, 10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].id, again[0].attempts), (due, 2));

        // A lease that ran out (a relay that died) makes the row due again.
        outbox::retry_later(&db, due, Duration::ZERO, "x")
            .await
            .unwrap();
        let short = outbox::claim(&db, 10, Duration::from_millis(1))
            .await
            .unwrap();
        assert_eq!(short.len(), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            outbox::claim(&db, 10, Duration::from_secs(60))
                .await
                .unwrap()
                .len(),
            1
        );

        assert!(outbox::delete(&db, due).await.unwrap());
        assert!(!outbox::delete(&db, due).await.unwrap());
        assert_eq!(outbox::waiting(&db).await.unwrap(), 1);
        assert!(outbox::delete(&db, held).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_claim_takes_at_most_its_batch() {
    on_each_backend(|db| async move {
        for n in 0..7 {
            outbox::insert(&db, &job(n), Duration::ZERO).await.unwrap();
        }
        let first = outbox::claim(&db, 5, Duration::from_secs(60))
            .await
            .unwrap();
        let second = outbox::claim(&db, 5, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!((first.len(), second.len()), (5, 2));
    })
    .await;
}

#[tokio::test]
async fn concurrent_claims_never_take_the_same_row() {
    on_concurrent_backends(|db| async move {
        for n in 0..40 {
            outbox::insert(&db, &job(n), Duration::ZERO).await.unwrap();
        }
        let claims = (0..4).map(|_| {
            let db = db.clone();
            tokio::spawn(async move { outbox::claim(&db, 15, Duration::from_secs(60)).await })
        });
        let mut ids = Vec::new();
        for c in claims {
            ids.extend(c.await.unwrap().unwrap().into_iter().map(|r| r.id));
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "a row was claimed twice");
        assert_eq!(n, 40, "every due row was claimed once");
    })
    .await;
}

async fn user(db: &DatabaseConnection) -> Uuid {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    id.user_id
}

#[tokio::test]
async fn the_avatar_cleanup_is_kept_in_the_saves_transaction() {
    on_each_backend(|db| async move {
        let uid = user(&db).await;
        let path = format!("{uid}/avatar");
        let followup = |saved: &profile::SavedProfile, old: &str| NewJob {
            kind: "delete_avatar".into(),
            job: format!("{}|{old}", saved.profile.avatar_generation),
        };
        // Setting the avatar leaves nothing unreferenced: no row.
        let input = ProfileInput::new(uid, None, Some(&path), None).unwrap();
        let (saved, row) = profile::save_with_followup(&db, uid, input, followup)
            .await
            .unwrap();
        assert_eq!((saved.replaced_object, row), (None, None));
        // A save that keeps the avatar: no row either.
        let input = ProfileInput::new(uid, Some("Ann"), None, None).unwrap();
        let (_, row) = profile::save_with_followup(&db, uid, input, followup)
            .await
            .unwrap();
        assert_eq!(row, None);
        assert_eq!(outbox::waiting(&db).await.unwrap(), 0);

        // Removal: the row is there, held (not due before the writer's push).
        let input = ProfileInput::new(uid, None, Some(""), None).unwrap();
        let (saved, row) = profile::save_with_followup(&db, uid, input, followup)
            .await
            .unwrap();
        assert_eq!(saved.replaced_object.as_deref(), Some(path.as_str()));
        let row = row.expect("an outbox row");
        assert_eq!(outbox::waiting(&db).await.unwrap(), 1);
        assert!(outbox::claim(&db, 10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        // The writer's push failed: due at once.
        outbox::retry_later(&db, row, Duration::ZERO, "redis down")
            .await
            .unwrap();
        let claimed = outbox::claim(&db, 10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].job, format!("0|{path}"));
        assert!(outbox::delete(&db, row).await.unwrap());

        // Inside a transaction that rolls back, neither the save nor the row stays.
        let input = ProfileInput::new(uid, None, Some(&path), None).unwrap();
        profile::save(&db, uid, input).await.unwrap();
        let txn = db.begin().await.unwrap();
        let input = ProfileInput::new(uid, None, Some(""), None).unwrap();
        let (_, row) = profile::save_with_followup(&txn, uid, input, followup)
            .await
            .unwrap();
        assert!(row.is_some());
        txn.rollback().await.unwrap();
        assert_eq!(outbox::waiting(&db).await.unwrap(), 0);
        let stored = profiles::Entity::find_by_id(uid)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.avatar_path.as_deref(), Some(path.as_str()));
    })
    .await;
}
