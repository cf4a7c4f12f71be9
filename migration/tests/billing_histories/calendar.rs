//! Histories on the calendar: the application's clock
//! (`entity::base::db::now`) is set to a month's last day and moved on, so
//! renewals cross real month ends, a leap day among them.

use chrono::{DateTime, Duration, TimeZone, Utc};
use chrono_tz::Asia::Jakarta;
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::{payment::PaymentStatus, renewal, settlement},
    entities::renewals::{self, RenewalStatus},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::{named::on_both, named::run_pass, world::*};

fn jakarta(y: i32, m: u32, d: u32, h: u32) -> DateTime<Utc> {
    Jakarta
        .with_ymd_and_hms(y, m, d, h, 0, 0)
        .single()
        .expect("a Jakarta time")
        .with_timezone(&Utc)
}

/// `t` in Jakarta to the minute.
fn minute(t: DateTime<Utc>) -> String {
    t.with_timezone(&Jakarta)
        .format("%Y-%m-%d %H:%M")
        .to_string()
}

/// Pays the open renewal of `user` through its pay link.
async fn pay_open_renewal(db: &DatabaseConnection, user: Uuid) {
    let r = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .filter(renewals::Column::Status.eq(RenewalStatus::Open))
        .one(db)
        .await
        .unwrap()
        .expect("a renewal offered");
    let order = renewal_checkout(db, user, &r).await;
    settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
        .await
        .unwrap();
}

/// Bought on 31 January 2028 at 10:00 in Jakarta, PRO renews on the
/// anchor: 29 February (a leap day), 31 March, 30 April, 31 May, each
/// renewal offered by the loop at the application's clock two days before
/// the end and paid there. The day is never lost to the short month.
#[test]
fn renewals_from_the_31st_of_january_2028_keep_their_day_across_real_month_ends() {
    on_both(|db| async move {
        let start = jakarta(2028, 1, 31, 10);
        begin_at(&db, Some(start)).await;
        let now = entity::base::db::now(&db).await.unwrap();
        assert!(
            (now - start).abs() < Duration::seconds(30),
            "the clock reads {now}, set to {start}"
        );
        let id = Identity {
            user_id: Uuid::new_v4(),
            email: None,
        };
        ensure_user(&db, &id, &[]).await.unwrap();
        let user = id.user_id;
        let order = checkout(&db, user, "PRO").await;
        settlement::settle_status_check(&db, &order, PaymentStatus::Paid, TERMS, None)
            .await
            .unwrap();
        // The checkout starts at the clock's now (moments after 10:00); the
        // renewals that follow keep its day and time.
        let first = subscription(&db, user).await.current_period_end.unwrap();
        assert_eq!(minute(first), "2028-02-29 10:00");
        let mut ends = Vec::new();
        for _ in 0..3 {
            let end = subscription(&db, user).await.current_period_end.unwrap();
            let now = entity::base::db::now(&db).await.unwrap();
            time_passes(&db, end - now - Duration::days(2)).await;
            run_pass(&db, user, renewal::Step::Create).await;
            pay_open_renewal(&db, user).await;
            let s = subscription(&db, user).await;
            assert_eq!(s.plan, "PRO");
            ends.push(minute(s.current_period_end.unwrap()));
        }
        assert_eq!(
            ends,
            ["2028-03-31 10:00", "2028-04-30 10:00", "2028-05-31 10:00"]
        );
        // Unpaid past the end and its grace, the loop warns, then lapses.
        let end = subscription(&db, user).await.current_period_end.unwrap();
        let now = entity::base::db::now(&db).await.unwrap();
        time_passes(&db, end - now + Duration::hours(1)).await;
        run_pass(&db, user, renewal::Step::PastDue).await;
        let s = subscription(&db, user).await;
        assert!(s.past_due_at.is_some(), "told past due");
        run_pass(&db, user, renewal::Step::Lapse).await;
        assert_eq!(subscription(&db, user).await.plan, "PRO", "in its grace");
        time_passes(&db, TERMS.grace).await;
        run_pass(&db, user, renewal::Step::Lapse).await;
        assert_eq!(subscription(&db, user).await.plan, "FREE");
    });
}
