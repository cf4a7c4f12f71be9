//! Provider events recorded before they are applied (record-then-enqueue, as
//! Lago's inbound webhooks are created, then processed): a verified notice is
//! stored once under its dedupe key, its settlement queued; the settlement
//! ([`crate::billing::settlement`]) applies it later, exactly once.

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QuerySelect, Set,
};
use uuid::Uuid;

use crate::entities::{payments, webhook_events};

/// Why a verified notification was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No payment of this provider has the order id (HTTP 404).
    #[error("no {provider} payment has order id {order_id}")]
    UnknownOrder {
        /// The provider that sent it.
        provider: &'static str,
        /// The order id it names.
        order_id: String,
    },
    /// The notified amount is not the stored one (HTTP 400 `amount_mismatch`);
    /// nothing is recorded.
    #[error("notified amount {notified:?} differs from the stored {stored}")]
    AmountMismatch {
        /// The stored amount.
        stored: i64,
        /// The notified amount (`None`: it had a non-zero fraction).
        notified: Option<i64>,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// The outcome of [`record_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A first delivery: the event is stored under this id, unsettled; its
    /// settlement is to be queued.
    New(Uuid),
    /// The dedupe key is known: a repeat delivery. Nothing was written.
    Duplicate {
        /// The event recorded by the first delivery.
        event_id: Uuid,
        /// Whether it has been settled yet.
        settled: bool,
    },
}

/// Records a verified notification (record-then-enqueue): the payment must
/// exist for this provider ([`RecordError::UnknownOrder`]) and the notified
/// amount must equal the stored one ([`RecordError::AmountMismatch`]); then
/// the event is inserted under its dedupe key (unique index), or recognised as
/// a repeat ([`Recorded::Duplicate`]) — also under concurrent deliveries. A
/// provider_a notice whose key is held by an event not confirmed (yet) and
/// whose body differs is recorded as its own event (key plus body hash), at
/// most [`MAX_ALTERNATES`] of them, none once one of them is confirmed.
pub async fn record_event<C: ConnectionTrait>(
    db: &C,
    n: &crate::billing::webhook::Notification,
) -> Result<Recorded, RecordError> {
    let recorded = record_once(db, n).await?;
    let Recorded::Duplicate { .. } = recorded else {
        return Ok(recorded);
    };
    // A provider_a notice is only a hint until the status API confirms it,
    // and its signature does not cover most of its body: an event of the
    // same key that is not (yet) confirmed must not swallow a notice with
    // another body (the genuine one behind an edited copy). Such a notice is
    // recorded under its key plus a hash of its body; the same body again is
    // a repeat.
    if n.provider != payments::PROVIDER_A {
        return Ok(recorded);
    }
    // The key's family: the first event and the bodies recorded beside it.
    let alternate = format!("{}#", n.dedupe_key);
    let family: Vec<webhook_events::Model> = webhook_events::Entity::find()
        .filter(webhook_events::Column::OrderId.eq(n.order_id.as_str()))
        .all(db)
        .await?
        .into_iter()
        .filter(|e| e.dedupe_key == n.dedupe_key || e.dedupe_key.starts_with(&alternate))
        .collect();
    let trusted = |e: &webhook_events::Model| {
        e.settled_at.is_some()
            && !e
                .settlement_error
                .as_deref()
                .is_some_and(|err| err.starts_with(UNCONFIRMED))
    };
    // A confirmed member makes every later body a repeat; so does a body
    // seen before; and at most [`MAX_ALTERNATES`] bodies are recorded beside
    // the first, so edited copies cannot buy unbounded status-API questions.
    if family.iter().any(trusted)
        || family.iter().any(|e| e.payload == n.payload)
        || family.len() > MAX_ALTERNATES
    {
        return Ok(recorded);
    }
    let mut other = n.clone();
    other.dedupe_key = format!("{}#{}", n.dedupe_key, body_hash(&n.payload));
    record_once(db, &other).await
}

/// Bodies recorded beside the first event of a provider_a dedupe key while
/// none of them is confirmed (see [`record_event`]).
const MAX_ALTERNATES: usize = 3;

/// Prefix of `webhook_events.settlement_error` for an event the provider's
/// status API did not confirm.
pub(crate) const UNCONFIRMED: &str = "unconfirmed: ";

/// The first 32 hex digits of the SHA-256 of `payload`'s JSON text.
fn body_hash(payload: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(payload.to_string().as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// [`record_event`] under `n.dedupe_key` exactly.
async fn record_once<C: ConnectionTrait>(
    db: &C,
    n: &crate::billing::webhook::Notification,
) -> Result<Recorded, RecordError> {
    if db.get_database_backend() == DbBackend::Postgres {
        return record_event_postgres(db, n).await;
    }
    let pay = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(n.order_id.as_str()))
        .filter(payments::Column::Provider.eq(n.provider))
        .one(db)
        .await?
        .ok_or_else(|| RecordError::UnknownOrder {
            provider: n.provider,
            order_id: n.order_id.clone(),
        })?;
    if n.amount != Some(pay.amount) {
        return Err(RecordError::AmountMismatch {
            stored: pay.amount,
            notified: n.amount,
        });
    }
    let id = Uuid::now_v7();
    let inserted = webhook_events::Entity::insert(webhook_events::ActiveModel {
        id: Set(id),
        provider: Set(n.provider.to_string()),
        dedupe_key: Set(n.dedupe_key.clone()),
        order_id: Set(n.order_id.clone()),
        provider_status: Set(n.provider_status.clone()),
        payload: Set(n.payload.clone()),
        // The database's default (its clock), which the sweep's cut-off uses.
        received_at: sea_orm::NotSet,
        settled_at: Set(None),
        settlement_error: Set(None),
    })
    .on_conflict_do_nothing_on([webhook_events::Column::DedupeKey])
    .exec_without_returning(db)
    .await?;
    if matches!(inserted, sea_orm::TryInsertResult::Inserted(n) if n == 1) {
        return Ok(Recorded::New(id));
    }
    let first = webhook_events::Entity::find()
        .filter(webhook_events::Column::DedupeKey.eq(n.dedupe_key.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the conflicting webhook event".into()))?;
    Ok(Recorded::Duplicate {
        event_id: first.id,
        settled: first.settled_at.is_some(),
    })
}

/// [`record_event`] on PostgreSQL in one statement (one round trip on the
/// hot path of webhook ingestion): the payment lookup, the amount check and
/// the insert under the dedupe key, answering the stored amount (NULL: no
/// such payment) and the new event's id (NULL: not inserted: a mismatch or
/// a repeat). Only a repeat reads the first event afterwards.
async fn record_event_postgres<C: ConnectionTrait>(
    db: &C,
    n: &crate::billing::webhook::Notification,
) -> Result<Recorded, RecordError> {
    use sea_orm::{Statement, Value};
    const SQL: &str = r#"
WITH p AS (
    SELECT amount FROM payments WHERE order_id = $1 AND provider = $2
), ins AS (
    INSERT INTO webhook_events
        (id, provider, dedupe_key, order_id, provider_status, payload, settled_at, settlement_error)
    SELECT $3, $2, $4, $1, $5, $6, NULL, NULL FROM p WHERE p.amount = $7
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING id
)
SELECT (SELECT amount FROM p) AS amount, (SELECT id FROM ins) AS inserted"#;
    let id = Uuid::now_v7();
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            SQL,
            [
                Value::from(n.order_id.as_str()),
                Value::from(n.provider),
                Value::from(id),
                Value::from(n.dedupe_key.as_str()),
                Value::from(n.provider_status.as_str()),
                Value::from(n.payload.clone()),
                Value::from(n.amount),
            ],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the recording statement's row".into()))?;
    let stored: Option<i64> = row.try_get("", "amount")?;
    let inserted: Option<Uuid> = row.try_get("", "inserted")?;
    let Some(stored) = stored else {
        return Err(RecordError::UnknownOrder {
            provider: n.provider,
            order_id: n.order_id.clone(),
        });
    };
    if n.amount != Some(stored) {
        return Err(RecordError::AmountMismatch {
            stored,
            notified: n.amount,
        });
    }
    if let Some(id) = inserted {
        return Ok(Recorded::New(id));
    }
    let first = webhook_events::Entity::find()
        .filter(webhook_events::Column::DedupeKey.eq(n.dedupe_key.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the conflicting webhook event".into()))?;
    Ok(Recorded::Duplicate {
        event_id: first.id,
        settled: first.settled_at.is_some(),
    })
}

/// Removes an event that was recorded but whose settlement could not be
/// queued (the webhook then answers 503), so that the provider's retry is a
/// first delivery again. Only an unsettled event is removed.
pub async fn forget_unqueued_event<C: ConnectionTrait>(db: &C, id: Uuid) -> Result<bool, DbErr> {
    let res = webhook_events::Entity::delete_many()
        .filter(webhook_events::Column::Id.eq(id))
        .filter(webhook_events::Column::SettledAt.is_null())
        .exec(db)
        .await?;
    Ok(res.rows_affected == 1)
}

/// Events recorded before `received_before` and still unsettled, oldest
/// first, at most `limit`: what the settlement sweep queues again.
pub async fn unsettled_events<C: ConnectionTrait>(
    db: &C,
    received_before: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<Uuid>, DbErr> {
    use sea_orm::QueryOrder;
    webhook_events::Entity::find()
        .select_only()
        .column(webhook_events::Column::Id)
        .filter(webhook_events::Column::SettledAt.is_null())
        .filter(webhook_events::Column::ReceivedAt.lt(received_before))
        .order_by_asc(webhook_events::Column::ReceivedAt)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}
