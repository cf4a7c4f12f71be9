//! The world a generated history runs in: the billing terms and prices,
//! the renewal loop's settings, and the fixtures that act on one customer
//! through the model (a checkout, time passing) or read it back.

use chrono::{DateTime, Duration, Utc};
use chrono_tz::Asia::Jakarta;
use entity::{
    base::plans::Catalogue,
    billing::{payment::PaymentStatus, renewal, Terms},
    entities::{payments, renewals, subscriptions},
};
use proptest::test_runner::TestCaseError;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, QueryFilter,
    QueryOrder, Set,
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
    let now = Utc::now();
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

pub(super) fn earlier(t: Option<DateTime<Utc>>, by: Duration) -> Option<DateTime<Utc>> {
    t.map(|t| t - by)
}

/// Moves every stored time of `user` back by `by`: as if `by` had passed.
/// The billing anchor is dropped (a subscription without one is anchored on
/// its current end).
pub(super) async fn time_passes(db: &DatabaseConnection, user: Uuid, by: Duration) {
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let mut am = s.clone().into_active_model();
    am.current_period_start = Set(earlier(s.current_period_start, by));
    am.current_period_end = Set(earlier(s.current_period_end, by));
    am.canceled_at = Set(earlier(s.canceled_at, by));
    am.past_due_at = Set(earlier(s.past_due_at, by));
    am.grace_ends_at = Set(earlier(s.grace_ends_at, by));
    am.price_notice_at = Set(earlier(s.price_notice_at, by));
    am.billing_anchor_day = Set(None);
    am.billing_anchor_time = Set(None);
    am.update(db).await.unwrap();
    for r in renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
    {
        let mut am = r.clone().into_active_model();
        am.period_end = Set(r.period_end - by);
        am.next_reminder_at = Set(earlier(r.next_reminder_at, by));
        am.created_at = Set(r.created_at - by);
        am.update(db).await.unwrap();
    }
    for p in payments_of(db, user).await {
        let mut am = p.clone().into_active_model();
        am.created_at = Set(p.created_at - by);
        am.updated_at = Set(p.updated_at - by);
        am.paid_at = Set(earlier(p.paid_at, by));
        am.reconciled_at = Set(earlier(p.reconciled_at, by));
        am.grant_start = Set(earlier(p.grant_start, by));
        am.grant_end = Set(earlier(p.grant_end, by));
        am.grant_from_end = Set(earlier(p.grant_from_end, by));
        am.update(db).await.unwrap();
    }
}

/// What went wrong, with the history so far.
pub(super) fn broken(what: String, history: &[String]) -> TestCaseError {
    TestCaseError::fail(format!("{what}\nhistory:\n  {}", history.join("\n  ")))
}
