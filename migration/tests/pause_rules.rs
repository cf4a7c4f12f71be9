//! The renewal loop's pauses on the schema the migrations make, on SQLite
//! and PostgreSQL: a pause is opened once however many paused ticks note
//! it; ending it moves every grace still running when it began later by
//! exactly its length, once, and nothing else (an ended grace, an active
//! subscription).

use crate::common::on_each_backend;
use chrono::{DateTime, Duration, Utc};
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::renewal::pause::{self, Noted},
    entities::subscriptions::{self, SubscriptionStatus},
};
use sea_orm::{sea_query::Expr, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use uuid::Uuid;

/// A PRO subscriber in `status` whose grace ends at `grace_end`.
async fn subscriber(
    db: &DatabaseConnection,
    status: SubscriptionStatus,
    grace_end: Option<DateTime<Utc>>,
) -> Uuid {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    subscriptions::Entity::update_many()
        .col_expr(subscriptions::Column::Plan, Expr::value("PRO"))
        .col_expr(subscriptions::Column::Status, Expr::value(status))
        .col_expr(subscriptions::Column::GraceEndsAt, Expr::value(grace_end))
        .filter(subscriptions::Column::UserId.eq(id.user_id))
        .exec(db)
        .await
        .unwrap();
    id.user_id
}

async fn grace_end(db: &DatabaseConnection, user: Uuid) -> Option<DateTime<Utc>> {
    subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap()
        .grace_ends_at
}

#[tokio::test]
async fn a_pause_extends_only_the_graces_running_when_it_began_once() {
    on_each_backend(|db| async move {
        let t0: DateTime<Utc> = "2027-03-01T10:00:00.250Z".parse().unwrap();
        let running_end = t0 + Duration::hours(5);
        let running = subscriber(&db, SubscriptionStatus::PastDue, Some(running_end)).await;
        let ended = subscriber(&db, SubscriptionStatus::PastDue, Some(t0)).await;
        let active = subscriber(&db, SubscriptionStatus::Active, None).await;

        assert_eq!(pause::note(&db, false, t0).await.unwrap(), Noted::Unchanged);
        assert_eq!(pause::note(&db, true, t0).await.unwrap(), Noted::Opened);
        let later = t0 + Duration::seconds(1);
        assert_eq!(
            pause::note(&db, true, later).await.unwrap(),
            Noted::Unchanged
        );

        let t1 = t0 + Duration::hours(2) + Duration::microseconds(7);
        assert_eq!(
            pause::note(&db, false, t1).await.unwrap(),
            Noted::Closed {
                lasted: t1 - t0,
                extended: 1
            }
        );
        assert_eq!(grace_end(&db, running).await, Some(running_end + (t1 - t0)));
        assert_eq!(
            grace_end(&db, ended).await,
            Some(t0),
            "ended before the pause"
        );
        assert_eq!(grace_end(&db, active).await, None);
        // Ending it again changes nothing.
        let t2 = t1 + Duration::minutes(1);
        assert_eq!(pause::note(&db, false, t2).await.unwrap(), Noted::Unchanged);
        assert_eq!(grace_end(&db, running).await, Some(running_end + (t1 - t0)));

        // A second pause is a new one, and extends again by its own length.
        assert_eq!(pause::note(&db, true, t2).await.unwrap(), Noted::Opened);
        let t3 = t2 + Duration::minutes(30);
        assert_eq!(
            pause::note(&db, false, t3).await.unwrap(),
            Noted::Closed {
                lasted: t3 - t2,
                extended: 1
            }
        );
        assert_eq!(
            grace_end(&db, running).await,
            Some(running_end + (t1 - t0) + (t3 - t2))
        );
    })
    .await;
}
