//! Checkout rules of `POST /api/payments`, free of HTTP: creating the
//! `PENDING` payment (with the `Idempotency-Key` rules), recording the
//! provider's token or URL, and marking a checkout the provider refused as
//! `FAILED` with an audit row.
//!
//! Idempotency: a key the same user sent within
//! [`KEY_LIFETIME`] (measured from the first row's `created_at`, which the api
//! stamps with the same clock it ages keys by) answers that row again when the plan is the same, and is
//! refused ([`CheckoutError::KeyReused`]) for another plan. An older key is
//! released (set to NULL on its row) and a new payment is created. Between
//! concurrent requests with the same key the unique index
//! `payments_user_idempotency_key_uidx` decides: the loser re-reads the
//! winner's row.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait,
    IntoActiveModel, QueryFilter, Set, SqlErr, TransactionSession, TransactionTrait,
};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::{
    base::db::begin_write,
    billing::payment::{self, Transition},
    entities::{
        audit_logs,
        payments::{self, PaymentStatus},
    },
};

/// How long an `Idempotency-Key` stays bound to its first payment (24 h).
pub const KEY_LIFETIME: Duration = Duration::hours(24);

/// A checkout to begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCheckout {
    /// The buyer.
    pub user_id: Uuid,
    /// The plan id (already checked purchasable).
    pub plan: String,
    /// The plan's price in whole units of `currency`.
    pub amount: i64,
    /// ISO 4217 currency (`IDR`).
    pub currency: String,
    /// `provider_a` or `provider_b`.
    pub provider: String,
    /// `ORDER_ID_PREFIX`.
    pub order_prefix: String,
    /// The request's `Idempotency-Key`, if it sent one (already validated).
    pub idempotency_key: Option<String>,
}

/// What [`begin`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Begun {
    /// A new `PENDING` payment: call the provider.
    New(payments::Model),
    /// The key was used by this user within 24 h for the same plan: the first
    /// request's payment (answer it again, do not call the provider).
    Replay(payments::Model),
}

/// Why [`begin`] created nothing.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// The key was used within 24 h for another plan (HTTP 422).
    #[error("this Idempotency-Key was used for another plan within 24 hours")]
    KeyReused,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// What an earlier payment carrying the same key means for a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// Within the key's lifetime, same plan: answer that payment again.
    Replay,
    /// Within the key's lifetime, another plan: refuse (422).
    Reused,
    /// Older than [`KEY_LIFETIME`]: release the key and start afresh.
    Expired,
}

/// Decides what an earlier payment (`earlier_plan`, created at
/// `earlier_created`) with the same key means for a request for `plan` at
/// `now` (both times from the database's clock).
pub fn key_use(
    earlier_plan: &str,
    earlier_created: DateTime<Utc>,
    plan: &str,
    now: DateTime<Utc>,
) -> KeyUse {
    if now - earlier_created >= KEY_LIFETIME {
        KeyUse::Expired
    } else if earlier_plan == plan {
        KeyUse::Replay
    } else {
        KeyUse::Reused
    }
}

async fn by_key<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    key: &str,
) -> Result<Option<payments::Model>, DbErr> {
    payments::Entity::find()
        .filter(payments::Column::UserId.eq(user_id))
        .filter(payments::Column::IdempotencyKey.eq(key))
        .one(db)
        .await
}

/// Begins a checkout (see the module docs): a new `PENDING` payment with a
/// new order id ([`payment::new_order_id`]), or the payment an earlier request
/// with the same `Idempotency-Key` created. Rows are stamped and keys are
/// aged by the application's clock ([`crate::base::db::now`], the database's),
/// so api hosts whose clocks disagree still agree on a key's lifetime.
/// Without a key this is a clock read and one `INSERT … RETURNING`.
pub async fn begin<C>(db: &C, new: NewCheckout) -> Result<Begun, CheckoutError>
where
    C: ConnectionTrait + TransactionTrait,
{
    let Some(key) = new.idempotency_key.as_deref() else {
        return Ok(Begun::New(insert_row(db, &new).await?));
    };
    let txn = begin_write(db).await?;
    if let Some(earlier) = by_key(&txn, new.user_id, key).await? {
        let now = crate::base::db::now(&txn).await?;
        match key_use(&earlier.plan, earlier.created_at, &new.plan, now) {
            KeyUse::Replay => return Ok(Begun::Replay(earlier)),
            KeyUse::Reused => return Err(CheckoutError::KeyReused),
            KeyUse::Expired => {
                payments::Entity::update_many()
                    .col_expr(
                        payments::Column::IdempotencyKey,
                        Expr::value(None::<String>),
                    )
                    .filter(payments::Column::Id.eq(earlier.id))
                    .exec(&txn)
                    .await?;
            }
        }
    }
    match insert_row(&txn, &new).await {
        Ok(model) => {
            txn.commit().await?;
            Ok(Begun::New(model))
        }
        Err(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            // A concurrent request with the same key won the unique index
            // (an order id collision is 36^8 to one per millisecond).
            drop(txn);
            let Some(winner) = by_key(db, new.user_id, key).await? else {
                return Err(e.into());
            };
            if winner.plan == new.plan {
                Ok(Begun::Replay(winner))
            } else {
                Err(CheckoutError::KeyReused)
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Inserts the `PENDING` row of `new`; `created_at`/`updated_at` are the
/// application's clock ([`crate::base::db::now`]), the one a key's lifetime
/// and a price of record's order are read by. The order id's milliseconds
/// are this host's: it is an identifier, never compared.
async fn insert_row<C: ConnectionTrait>(
    db: &C,
    new: &NewCheckout,
) -> Result<payments::Model, DbErr> {
    let now = crate::base::db::now(db).await?;
    payments::Entity::insert(payments::ActiveModel {
        id: Set(Uuid::now_v7()),
        order_id: Set(payment::new_order_id(&new.order_prefix, Utc::now())),
        user_id: Set(new.user_id),
        plan: Set(new.plan.clone()),
        amount: Set(new.amount),
        currency: Set(new.currency.clone()),
        provider: Set(new.provider.clone()),
        status: Set(PaymentStatus::Pending),
        checkout_token: Set(None),
        payment_url: Set(None),
        provider_reference: Set(None),
        paid_at: Set(None),
        idempotency_key: Set(new.idempotency_key.clone()),
        reconciled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec_with_returning(db)
    .await
}

/// What the provider gave for a started checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started<'a> {
    /// provider_a's Snap token (stored in `checkout_token`).
    Token(&'a str),
    /// provider_b's payment page (stored in `payment_url`).
    Url(&'a str),
}

/// Stores what the provider answered for payment `payment_id`
/// (`checkout_token` or `payment_url`). Returns whether a row was updated.
pub async fn record_started<C: ConnectionTrait>(
    db: &C,
    payment_id: Uuid,
    started: Started<'_>,
) -> Result<bool, DbErr> {
    let mut update = payments::Entity::update_many()
        .col_expr(payments::Column::UpdatedAt, Expr::value(Utc::now()));
    update = match started {
        Started::Token(t) => update.col_expr(payments::Column::CheckoutToken, Expr::value(t)),
        Started::Url(u) => update.col_expr(payments::Column::PaymentUrl, Expr::value(u)),
    };
    let r = update
        .filter(payments::Column::Id.eq(payment_id))
        .exec(db)
        .await?;
    Ok(r.rows_affected == 1)
}

/// Marks the checkout of `order_id` `FAILED` through the state machine
/// ([`payment::transition`]; only a `PENDING` payment moves) and writes an
/// [`audit::ACTION_CHECKOUT_FAILED`] audit row with `reason` (no provider body).
/// Returns whether the payment moved.
pub async fn record_failed<C>(db: &C, order_id: &str, reason: &str) -> Result<bool, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut find = payments::Entity::find().filter(payments::Column::OrderId.eq(order_id));
    if txn.get_database_backend() == sea_orm::DbBackend::Postgres {
        find = sea_orm::QuerySelect::lock_exclusive(find);
    }
    let Some(p) = find.one(&txn).await? else {
        return Ok(false);
    };
    let Transition::Apply { from, to } = payment::transition(p.status, PaymentStatus::Failed)
    else {
        return Ok(false);
    };
    let now = Utc::now();
    let user_id = p.user_id;
    let plan = p.plan.clone();
    let mut am = p.into_active_model();
    am.status = Set(to);
    am.updated_at = Set(now);
    am.update(&txn).await?;
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(audit::ACTION_CHECKOUT_FAILED.to_string()),
        target_type: Set(audit::TARGET_TYPE_PAYMENT.to_string()),
        target_id: Set(order_id.to_string()),
        old_value: Set(Some(json!({ "status": from.as_str() }))),
        new_value: Set(Some(json!({
            "status": to.as_str(),
            "source": "checkout",
            "reason": reason,
            "user_id": user_id,
            "plan": plan,
        }))),
        request_id: Set(None),
        client_request_id: Set(None),
        created_at: Set(now),
    }
    .insert(&txn)
    .await?;
    txn.commit().await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_replay_refuse_or_expire() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-23T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let soon = t0 + Duration::minutes(5);
        assert_eq!(key_use("PRO", t0, "PRO", soon), KeyUse::Replay);
        assert_eq!(key_use("PRO", t0, "BASIC", soon), KeyUse::Reused);
        let just_before = t0 + KEY_LIFETIME - Duration::seconds(1);
        assert_eq!(key_use("PRO", t0, "BASIC", just_before), KeyUse::Reused);
        assert_eq!(
            key_use("PRO", t0, "PRO", t0 + KEY_LIFETIME),
            KeyUse::Expired
        );
        assert_eq!(
            key_use("PRO", t0, "BASIC", t0 + Duration::days(3)),
            KeyUse::Expired
        );
    }
}
