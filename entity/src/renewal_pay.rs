//! The renewal's pay link (`GET /api/payments/pay/{token}`), free of HTTP:
//! what a click on the link leads to ([`resolve`]) and the payment row of a
//! new checkout ([`begin`]).
//!
//! The link outlives a provider checkout (a day by default) because it
//! creates checkouts itself: the first click creates the payment row (a new
//! order id in the usual format, `renewal_id` set) and the api starts the
//! provider's checkout; later clicks get the same checkout while it lives;
//! only once its provider expiry has passed and the provider says it is
//! unpaid (then it is `EXPIRED`) does a click create a new one. The link is
//! valid while the renewal is open and its subscription still runs the
//! period it renews, until that period's grace ends.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionSession, TransactionTrait,
};
use uuid::Uuid;

use crate::{
    entities::{
        payments::{self, PaymentStatus},
        renewals::{self, RenewalStatus},
        subscriptions,
    },
    payment,
    users::begin_write,
};

/// How long a payment row may wait for its provider checkout (token or URL)
/// before a click treats it as stale rather than being started.
pub const START_BUDGET: Duration = Duration::seconds(60);

/// Why the link no longer leads to a checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The renewal was paid (`paid`).
    Paid,
    /// The renewal was voided: cancelled, replaced, or the plan lapsed (`void`).
    Void,
    /// The subscription's plan or period end no longer match it (`changed`).
    Changed,
}

impl Closed {
    /// The `renewal` query value of the redirect to `APP_URL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Paid => "paid",
            Closed::Void => "void",
            Closed::Changed => "changed",
        }
    }
}

/// What a click on the link leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum Link {
    /// No renewal has this id.
    Unknown,
    /// The link is closed (answer a redirect saying why).
    Closed(Closed),
    /// The renewal is open but its grace has ended.
    Outlived,
    /// The live checkout's page.
    Live(String),
    /// A checkout was created moments ago and is waiting for the provider.
    Starting(payments::Model),
    /// The last checkout is past its provider expiry (or never got its page)
    /// and still `PENDING`: ask the provider before making another.
    Stale(payments::Model),
    /// No usable checkout: start one for this renewal.
    Start(renewals::Model),
}

/// The page a started checkout is paid on (provider_b's payment URL, or
/// provider_a's hosted Snap page, both kept in `payment_url`).
fn page(p: &payments::Model) -> Option<&str> {
    p.payment_url.as_deref().filter(|u| !u.is_empty())
}

/// The latest payment made through renewal `renewal_id`.
async fn latest_payment<C: ConnectionTrait>(
    db: &C,
    renewal_id: Uuid,
) -> Result<Option<payments::Model>, DbErr> {
    payments::Entity::find()
        .filter(payments::Column::RenewalId.eq(renewal_id))
        .order_by_desc(payments::Column::CreatedAt)
        .order_by_desc(payments::Column::Id)
        .one(db)
        .await
}

/// What a click at `now` (the database's clock) on the link of renewal
/// `renewal_id` leads to, with `grace` (`RENEWAL_GRACE_SECS`) and a
/// checkout's provider lifetime `expire_after` (`PAYMENT_EXPIRE_AFTER_SECS`).
pub async fn resolve<C: ConnectionTrait>(
    db: &C,
    renewal_id: Uuid,
    now: DateTime<Utc>,
    grace: Duration,
    expire_after: Duration,
) -> Result<Link, DbErr> {
    let Some(r) = renewals::Entity::find_by_id(renewal_id).one(db).await? else {
        return Ok(Link::Unknown);
    };
    match r.status {
        RenewalStatus::Paid => return Ok(Link::Closed(Closed::Paid)),
        RenewalStatus::Void => return Ok(Link::Closed(Closed::Void)),
        RenewalStatus::Open => {}
    }
    let sub = subscriptions::Entity::find_by_id(r.user_id).one(db).await?;
    // The rule settlement applies: a payment now would renew the period.
    if crate::renewal_settle::fit(Some(&r), sub.as_ref()) != crate::renewal_settle::Fit::Renews {
        return Ok(Link::Closed(Closed::Changed));
    }
    if now > r.period_end + grace {
        return Ok(Link::Outlived);
    }
    Ok(match latest_payment(db, r.id).await? {
        Some(p) if p.status == PaymentStatus::Paid => Link::Closed(Closed::Paid),
        Some(p) if p.status == PaymentStatus::Pending => match page(&p) {
            Some(url) if p.created_at + expire_after > now => Link::Live(url.to_string()),
            None if p.created_at + START_BUDGET > now => Link::Starting(p),
            _ => Link::Stale(p),
        },
        _ => Link::Start(r),
    })
}

/// What [`begin`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Begun {
    /// A new `PENDING` payment of the renewal: start its provider checkout.
    New(payments::Model),
    /// Another click created one first (still `PENDING`): use that one.
    Existing(payments::Model),
    /// The renewal is no longer open.
    Closed,
}

/// Creates the `PENDING` payment of renewal `r` with `provider` and order id
/// prefix `order_prefix`: plan, amount and currency are the renewal's. Under
/// the renewal's row lock (`FOR UPDATE` on PostgreSQL; SQLite serialises
/// writers), so concurrent clicks create one payment: the others get
/// [`Begun::Existing`].
pub async fn begin<C>(
    db: &C,
    r: &renewals::Model,
    provider: &str,
    order_prefix: &str,
) -> Result<Begun, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut find = renewals::Entity::find_by_id(r.id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let Some(locked) = find.one(&txn).await? else {
        return Ok(Begun::Closed);
    };
    if locked.status != RenewalStatus::Open {
        return Ok(Begun::Closed);
    }
    if let Some(p) = latest_payment(&txn, r.id).await? {
        if p.status == PaymentStatus::Pending {
            return Ok(Begun::Existing(p));
        }
    }
    // `Entity::insert` (no save hook): `created_at` is the database's default,
    // the clock a checkout's lifetime is measured by.
    let row = payments::Entity::insert(payments::ActiveModel {
        id: Set(Uuid::now_v7()),
        order_id: Set(payment::new_order_id(order_prefix, Utc::now())),
        user_id: Set(r.user_id),
        plan: Set(r.plan.clone()),
        amount: Set(r.amount),
        currency: Set(r.currency.clone()),
        provider: Set(provider.to_string()),
        status: Set(PaymentStatus::Pending),
        renewal_id: Set(Some(r.id)),
        ..Default::default()
    })
    .exec_with_returning(&txn)
    .await?;
    txn.commit().await?;
    Ok(Begun::New(row))
}

/// The payment `id` as stored now.
pub async fn payment<C: ConnectionTrait>(
    db: &C,
    id: Uuid,
) -> Result<Option<payments::Model>, DbErr> {
    payments::Entity::find_by_id(id).one(db).await
}
