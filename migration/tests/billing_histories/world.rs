//! The world a generated history runs in: the billing terms and prices,
//! the renewal loop's settings, and the fixtures that act on one customer
//! through the model (a checkout, time passing) or read it back.

use chrono::{DateTime, Duration, TimeZone, Utc};
use chrono_tz::Asia::Jakarta;
use entity::{
    base::plans::Catalogue,
    billing::{payment::PaymentStatus, renewal, Terms},
    entities::{payments, subscriptions},
};
use proptest::test_runner::TestCaseError;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, Set,
};
use uuid::Uuid;

/// `BILLING_TIME_ZONE` and `RENEWAL_GRACE_SECS` (three days).
pub(super) const TERMS: Terms = Terms {
    zone: Jakarta,
    grace: Duration::days(3),
};

/// The paid plans of `config/plans.toml` and their prices (IDR).
pub(super) const PLANS: [(&str, i64); 3] =
    [("BASIC", 49_000), ("PRO", 99_000), ("ULTIMATE", 299_000)];

pub(super) fn price(plan: &str) -> i64 {
    PLANS
        .iter()
        .find(|(p, _)| *p == plan)
        .map_or(0, |(_, price)| *price)
}

/// The renewal loop's settings: the grace of [`TERMS`], reminders 7, 3
/// and 1 days before the end (a renewal is offered 7 days ahead).
pub(super) fn policy() -> renewal::Policy {
    renewal::Policy {
        grace: TERMS.grace,
        reminder_days: vec![7, 3, 1],
        pay_secret: None,
        api_url: String::new(),
        paused: false,
        price_notice: Duration::days(30),
        zone: TERMS.zone,
    }
}

pub(super) fn catalogue() -> &'static Catalogue {
    static PLANS_FILE: std::sync::OnceLock<Catalogue> = std::sync::OnceLock::new();
    PLANS_FILE.get_or_init(|| {
        Catalogue::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/plans.toml"),
        )
        .expect("config/plans.toml")
    })
}

pub(super) fn cases() -> u32 {
    std::env::var("BILLING_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The subscription of `user` as stored now.
pub(super) async fn subscription(db: &DatabaseConnection, user: Uuid) -> subscriptions::Model {
    subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription")
}

/// Paid seconds still to come and the plan in force.
pub(super) async fn running(db: &DatabaseConnection, user: Uuid) -> (String, i64) {
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let now = entity::base::db::now(db).await.unwrap();
    let left = match s.current_period_end {
        Some(end) if s.plan != "FREE" => (end - now).num_seconds().max(0),
        _ => 0,
    };
    (s.plan, left)
}

pub(super) async fn payments_of(db: &DatabaseConnection, user: Uuid) -> Vec<payments::Model> {
    payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .order_by_asc(payments::Column::CreatedAt)
        .order_by_asc(payments::Column::OrderId)
        .all(db)
        .await
        .unwrap()
}

/// A checkout of `plan` at its price, `PENDING`, created now.
pub(super) async fn checkout(db: &DatabaseConnection, user: Uuid, plan: &str) -> String {
    let now = entity::base::db::now(db).await.expect("the clock");
    let order_id = entity::billing::payment::new_order_id("ORD", now);
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set(plan.into()),
        amount: Set(price(plan)),
        currency: Set("IDR".into()),
        provider: Set("provider_b".into()),
        status: Set(PaymentStatus::Pending),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    }
    .insert(db)
    .await
    .expect("insert payment");
    order_id
}

/// A checkout made through renewal `r`'s pay link: `r`'s plan at its
/// stored amount, `PENDING`, created now.
pub(super) async fn renewal_checkout(
    db: &DatabaseConnection,
    user: Uuid,
    r: &entity::entities::renewals::Model,
) -> String {
    let order = checkout(db, user, &r.plan).await;
    payments::Entity::update_many()
        .col_expr(
            payments::Column::RenewalId,
            sea_orm::sea_query::Expr::value(Some(r.id)),
        )
        .col_expr(
            payments::Column::Amount,
            sea_orm::sea_query::Expr::value(r.amount),
        )
        .filter(payments::Column::OrderId.eq(&order))
        .exec(db)
        .await
        .unwrap();
    order
}

/// An operator gives `user` `plan` until `until` (reason `reason`), then the
/// customer resumes (a grant does not renew by itself).
pub(super) async fn given_and_resumed(
    db: &DatabaseConnection,
    user: Uuid,
    plan: &str,
    until: DateTime<Utc>,
    reason: &str,
) {
    let grant = entity::billing::operator::OperatorGrant {
        user_id: user,
        plan: plan.into(),
        until,
        reason: reason.into(),
    };
    entity::billing::operator::give(db, Uuid::new_v4(), &grant, TERMS.zone, None, None)
        .await
        .unwrap();
    entity::billing::subscription::change(
        db,
        user,
        entity::billing::subscription::SubscriptionAction::Resume,
        Default::default(),
    )
    .await
    .unwrap();
}

/// `by` passes: the application's clock ([`entity::base::db::now`]) moves
/// on, for the whole database; no stored time is touched.
pub(super) async fn time_passes(db: &DatabaseConnection, by: Duration) {
    entity::base::db::advance_clock(db, by)
        .await
        .expect("move the clock");
}

/// Where a history begins on the application's clock: now, or an instant
/// chosen for its calendar (a month's last day, a leap day, a year's end,
/// in `BILLING_TIME_ZONE`).
pub(super) fn starts() -> impl proptest::strategy::Strategy<Value = Option<DateTime<Utc>>> {
    use proptest::prelude::*;
    let at = |y, m, d, h, min| {
        Some(
            Jakarta
                .with_ymd_and_hms(y, m, d, h, min, 0)
                .single()
                .expect("a Jakarta time")
                .with_timezone(&Utc),
        )
    };
    prop_oneof![
        3 => Just(None),
        1 => Just(at(2028, 1, 31, 10, 0)),
        1 => Just(at(2028, 1, 30, 23, 30)),
        1 => Just(at(2028, 2, 28, 12, 0)),
        1 => Just(at(2028, 2, 29, 0, 0)),
        1 => Just(at(2029, 1, 31, 23, 59)),
        1 => Just(at(2027, 12, 31, 18, 0)),
        1 => Just(at(2028, 3, 31, 7, 15)),
    ]
}

/// Sets the application's clock to `start` (`None`: the database's own).
pub(super) async fn begin_at(db: &DatabaseConnection, start: Option<DateTime<Utc>>) {
    match start {
        Some(at) => entity::base::db::set_clock(db, at).await,
        None => {
            entity::base::db::advance_clock(
                db,
                -entity::base::db::clock_offset(db)
                    .await
                    .expect("the offset"),
            )
            .await
        }
    }
    .expect("set the clock");
}

/// What went wrong, with the history so far.
pub(super) fn broken(what: String, history: &[String]) -> TestCaseError {
    TestCaseError::fail(format!("{what}\nhistory:\n  {}", history.join("\n  ")))
}
