//! Named histories: cases a red team or the generator found, kept as plain
//! tests on SQLite and PostgreSQL.

use chrono::Duration;
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::{payment::PaymentStatus, renewal, settlement},
    entities::{payments, renewals, subscriptions},
};
use sea_orm::{sea_query::Expr, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::world::*;
use crate::common::{sqlite_memory, Scratch};

/// A named history from a red team against the release binaries: an
/// outdated BASIC renewal payment was priced from a refunded ULTIMATE plan
/// change whose carried time had been given back (its grant still spanned
/// the carried days, so ULTIMATE looked 36 % cheaper): 49,000 bought 6.9
/// days of ULTIMATE where its price buys 5.1. It must buy at most
/// 49,000 / 299,000 of an ULTIMATE month.
#[test]
fn an_outdated_renewal_is_priced_at_the_month_its_plan_was_sold_at() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = sqlite_memory().await;
        run_priced(&db).await;
        let scratch = Scratch::create().await;
        let outcome = tokio::spawn({
            let db = scratch.db.clone();
            async move { run_priced(&db).await }
        })
        .await;
        scratch.remove().await;
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}

async fn run_priced(db: &DatabaseConnection) {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    let user = id.user_id;
    let settle = |order: String| async move {
        settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
            .await
            .unwrap()
    };
    settle(checkout(db, user, "BASIC").await).await;
    time_passes(db, user, Duration::days(25)).await;
    let now = entity::base::db::now(db).await.unwrap();
    renewal::run_batch(
        db,
        renewal::Step::Create,
        &policy(),
        catalogue(),
        now,
        &[user],
    )
    .await
    .unwrap();
    let offered = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .one(db)
        .await
        .unwrap()
        .expect("a renewal offered");
    // A checkout through its pay link, left pending.
    let stale = checkout(db, user, "BASIC").await;
    payments::Entity::update_many()
        .col_expr(payments::Column::RenewalId, Expr::value(Some(offered.id)))
        .filter(payments::Column::OrderId.eq(&stale))
        .exec(db)
        .await
        .unwrap();
    settle(checkout(db, user, "PRO").await).await;
    let u1 = checkout(db, user, "ULTIMATE").await;
    settle(u1.clone()).await;
    settlement::settle_status_check(db, &u1, PaymentStatus::Refunded, TERMS, None)
        .await
        .unwrap();
    settle(checkout(db, user, "ULTIMATE").await).await;
    let before = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before.plan, "ULTIMATE");
    settle(stale).await;
    let after = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    let added =
        (after.current_period_end.unwrap() - before.current_period_end.unwrap()).num_seconds();
    let most = 49_000 * 31 * 86_400 / 299_000 + 1;
    assert!(
        (1..=most).contains(&added),
        "49,000 bought {added} s of ULTIMATE; at its price at most {most} s"
    );
}

/// A named history the generator found: a partial refund of a plan change
/// lowered the value of the time carried into it as well as its own month
/// (BASIC, then PRO carrying it, a third of PRO refunded, then BASIC again:
/// 16,170 of the carried BASIC value was lost). A partial refund lowers a
/// grant's value by what went back, never the value carried into it.
#[test]
fn a_partial_refund_of_a_plan_change_keeps_the_value_carried_into_it() {
    use super::Step::{PartialRefund, Pay};
    let steps = [Pay(0), Pay(1), PartialRefund(1, 33), Pay(0)];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = sqlite_memory().await;
        super::history(&db, &steps).await.expect("SQLite");
        let scratch = Scratch::create().await;
        let outcome = super::history(&scratch.db, &steps).await;
        scratch.remove().await;
        outcome.expect("PostgreSQL");
    });
}
