//! The `ai_usage` record the worker writes when an AI request ends, settling
//! its reservation in the database's month counter.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set, TransactionSession, TransactionTrait};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::entities::ai_usage;

/// One finished (or aborted) AI request, as the usage job carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Row id, chosen when the request ended: the job's idempotency key.
    pub id: Uuid,
    /// Calling user.
    pub user_id: Uuid,
    /// Provider wire name.
    pub provider: String,
    /// Model sent upstream.
    pub model: String,
    /// `chat` or `generate`.
    pub route: String,
    /// Input tokens (provider's count, else estimated).
    pub input_tokens: i32,
    /// Output tokens (provider's count, else estimated).
    pub output_tokens: i32,
    /// The answer did not end normally.
    pub aborted: bool,
    /// A count is our estimate.
    pub estimated: bool,
    /// When the request ended (UTC).
    pub at: DateTime<Utc>,
    /// Its reservation in the month counter (`None`: a plan without quota);
    /// one held in the database is settled with this record
    /// ([`crate::ai::quota::settle_in_db`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<crate::ai::quota::Reservation>,
}

/// Writes `record` into `ai_usage` once and, in the same transaction,
/// settles its tokens in the database's month counter
/// ([`crate::ai::quota::settle_in_db`]): a second delivery of the same job
/// (same `id`) changes nothing. Returns whether a row was inserted.
pub async fn record_usage<C>(db: &C, record: &UsageRecord) -> Result<bool, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let row = ai_usage::ActiveModel {
        id: Set(record.id),
        user_id: Set(record.user_id),
        provider: Set(record.provider.clone()),
        model: Set(record.model.clone()),
        route: Set(record.route.clone()),
        input_tokens: Set(record.input_tokens.max(0)),
        output_tokens: Set(record.output_tokens.max(0)),
        aborted: Set(record.aborted),
        estimated: Set(record.estimated),
        created_at: Set(record.at),
    };
    let txn = crate::base::db::begin_write(db).await?;
    let r = ai_usage::Entity::insert(row)
        .on_conflict_do_nothing_on([ai_usage::Column::Id])
        .exec_without_returning(&txn)
        .await?;
    let inserted = matches!(r, sea_orm::TryInsertResult::Inserted(n) if n == 1);
    if inserted {
        let tokens = i64::from(record.input_tokens.max(0)) + i64::from(record.output_tokens.max(0));
        crate::ai::quota::settle_in_db(&txn, record.user_id, record.reservation, tokens, record.at)
            .await?;
    }
    txn.commit().await?;
    Ok(inserted)
}
