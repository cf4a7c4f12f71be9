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
use hmac::{Hmac, KeyInit, Mac};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionSession, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::{
    base::db::begin_write,
    billing::payment,
    entities::{
        payments::{self, PaymentStatus},
        renewals::{self, RenewalStatus},
        subscriptions,
    },
};

/// How long a payment row may wait for its provider checkout (token or URL)
/// before a click treats it as stale rather than being started: at least
/// 60 s, and always longer than a start can take with `provider_timeout`
/// (`PROVIDER_TIMEOUT_MS`; a start is retried once when no connection could
/// be made, so two calls and a margin), so a checkout still starting is
/// never taken for stale and doubled.
pub fn start_budget(provider_timeout: std::time::Duration) -> Duration {
    let start = Duration::from_std(provider_timeout * 2).unwrap_or(Duration::MAX);
    Ord::max(Duration::seconds(60), start + Duration::seconds(10))
}

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
/// `renewal_id` leads to, with `grace` (`RENEWAL_GRACE_SECS`), a
/// checkout's provider lifetime `expire_after` (`PAYMENT_EXPIRE_AFTER_SECS`)
/// and the time a checkout may take to start ([`start_budget`]).
pub async fn resolve<C: ConnectionTrait>(
    db: &C,
    renewal_id: Uuid,
    now: DateTime<Utc>,
    grace: Duration,
    expire_after: Duration,
    start_budget: Duration,
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
    if crate::billing::renewal::settle::fit(Some(&r), sub.as_ref())
        != crate::billing::renewal::settle::Fit::Renews
    {
        return Ok(Link::Closed(Closed::Changed));
    }
    // Payable until the grace ends (which starts with the past-due notice,
    // [`crate::billing::grace::grace_end`]).
    if sub
        .as_ref()
        .and_then(|s| crate::billing::grace::grace_end(s, grace))
        .is_some_and(|g| now > g)
    {
        return Ok(Link::Outlived);
    }
    Ok(match latest_payment(db, r.id).await? {
        Some(p) if p.status == PaymentStatus::Paid => Link::Closed(Closed::Paid),
        Some(p) if p.status == PaymentStatus::Pending => {
            pending_link(p, now, expire_after, start_budget)
        }
        _ => Link::Start(r),
    })
}

/// What the link leads to when its latest payment `p` is `PENDING`: its
/// live checkout; still starting (within `start_budget` of its creation);
/// else stale.
fn pending_link(
    p: payments::Model,
    now: DateTime<Utc>,
    expire_after: Duration,
    start_budget: Duration,
) -> Link {
    match page(&p) {
        Some(url) if p.created_at + expire_after > now => Link::Live(url.to_string()),
        None if p.created_at + start_budget > now => Link::Starting(p),
        _ => Link::Stale(p),
    }
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
    // `created_at` is the application's clock, the one a checkout's lifetime
    // is measured by.
    let now = crate::base::db::now(&txn).await?;
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
        created_at: Set(now),
        updated_at: Set(now),
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

/// The job type (`type` tag) of [`ExpireCheckout`] on the settlement queue.
pub const EXPIRE_JOB_TYPE: &str = "expire_checkout";

/// The `expire_checkout` job: a voided renewal's checkout, still `PENDING`,
/// to be ended at its provider where the provider's API allows (the
/// worker's `Job::ExpireCheckout`), so the customer cannot pay a renewal
/// that no longer renews. Written into the job outbox by [`expire_checkouts`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireCheckout {
    /// `payments.order_id` of the checkout.
    pub order_id: String,
}

/// Writes an `expire_checkout` job into the job outbox, due at once, in the
/// caller's transaction, for each `PENDING` provider_a checkout of the
/// renewals `renewal_ids` (just voided). provider_b (DOKU Checkout) has no
/// API that ends a checkout: its checkouts expire there after
/// `PAYMENT_EXPIRE_AFTER_SECS`. A checkout paid anyway is honoured as time
/// ([`crate::billing::renewal::settle`]). Answers how many jobs were written.
pub async fn expire_checkouts<C: ConnectionTrait>(
    db: &C,
    renewal_ids: &[Uuid],
) -> Result<usize, DbErr> {
    if renewal_ids.is_empty() {
        return Ok(0);
    }
    let orders: Vec<String> = payments::Entity::find()
        .select_only()
        .column(payments::Column::OrderId)
        .filter(payments::Column::RenewalId.is_in(renewal_ids.iter().copied()))
        .filter(payments::Column::Status.eq(PaymentStatus::Pending))
        .filter(payments::Column::Provider.eq(payments::PROVIDER_A))
        .into_tuple()
        .all(db)
        .await?;
    for order_id in &orders {
        let job = ExpireCheckout {
            order_id: order_id.clone(),
        };
        crate::base::outbox::insert(
            db,
            &crate::base::outbox::NewJob::tagged(EXPIRE_JOB_TYPE, &job),
            std::time::Duration::ZERO,
        )
        .await?;
    }
    Ok(orders.len())
}

/// The pay link's token for renewal `renewal_id`:
/// `<renewal id, 32 hex digits>.<HMAC-SHA256 of "renewal-pay:<id>" with
/// `secret`, unpadded base64url>`. It carries no expiry: the link is valid
/// while the renewal is payable (until its grace ends), which the database
/// decides when it is used.
pub fn pay_token(secret: &str, renewal_id: Uuid) -> String {
    use base64::Engine as _;
    let id = renewal_id.simple().to_string();
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sign(secret, &id));
    format!("{id}.{sig}")
}

/// The renewal id a token of [`pay_token`] names, when its signature is
/// right (compared in constant time); `None` for anything else.
pub fn verify_pay_token(secret: &str, token: &str) -> Option<Uuid> {
    use base64::Engine as _;
    let (id, sig) = token.split_once('.')?;
    if id.len() != 32 {
        return None;
    }
    let uuid = Uuid::try_parse(id).ok()?;
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(sig)
        .ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).ok()?;
    mac.update(format!("renewal-pay:{id}").as_bytes());
    mac.verify_slice(&sig).ok()?;
    Some(uuid)
}

fn sign(secret: &str, id: &str) -> Vec<u8> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(format!("renewal-pay:{id}").as_bytes());
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(created_at: DateTime<Utc>) -> payments::Model {
        payments::Model {
            id: Uuid::nil(),
            order_id: "ORD-1".into(),
            user_id: Uuid::nil(),
            plan: "PRO".into(),
            amount: 99_000,
            currency: "IDR".into(),
            provider: "provider_b".into(),
            status: PaymentStatus::Pending,
            checkout_token: None,
            payment_url: None,
            provider_reference: None,
            paid_at: None,
            idempotency_key: None,
            reconciled_at: None,
            created_at,
            updated_at: created_at,
            grant_plan: None,
            grant_start: None,
            grant_end: None,
            grant_from_plan: None,
            grant_from_end: None,
            carried_seconds: None,
            carried_value: None,
            carried_into: None,
            refunded_amount: 0,
            carried_out_value: None,
            renewal_id: None,
        }
    }

    #[test]
    fn a_checkout_still_starting_within_the_provider_timeout_is_not_stale() {
        let budget = |ms: u64| start_budget(std::time::Duration::from_millis(ms));
        assert_eq!(budget(10_000), Duration::seconds(60), "the floor");
        assert_eq!(
            budget(90_000),
            Duration::seconds(190),
            "two calls and a margin"
        );
        // 61 s into a start with a 90 s provider timeout: still starting,
        // not stale (a second live checkout would be made).
        let now = Utc::now();
        let started = now - Duration::seconds(61);
        let link = pending_link(pending(started), now, Duration::days(1), budget(90_000));
        assert!(matches!(link, Link::Starting(_)), "{link:?}");
        let link = pending_link(pending(started), now, Duration::days(1), budget(10_000));
        assert!(matches!(link, Link::Stale(_)), "{link:?}");
    }

    #[test]
    fn pay_tokens_verify_only_when_signed_with_the_secret() {
        let id = Uuid::now_v7();
        let t = pay_token("secret-one", id);
        assert_eq!(verify_pay_token("secret-one", &t), Some(id));
        assert_eq!(verify_pay_token("secret-two", &t), None);
        let other = pay_token("secret-one", Uuid::now_v7());
        let forged = format!("{}.{}", id.simple(), other.split_once('.').unwrap().1);
        assert_eq!(verify_pay_token("secret-one", &forged), None);
        for bad in ["", ".", "abc", "x.y", &format!("{}.", id.simple())] {
            assert_eq!(verify_pay_token("secret-one", bad), None);
        }
    }
}
