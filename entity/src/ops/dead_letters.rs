//! The audit rule of the dead-letter queue: an admin's redrive is recorded
//! (one `audit_logs` row per redrive, written before the jobs move, so no
//! redrive happens without its row).

use sea_orm::{ActiveModelTrait, ActiveValue::Set, ConnectionTrait, DbErr};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::{accounts::users::UserContext, entities::audit_logs};

/// What an admin asked to redrive on one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These dead letters (ids).
    Ids(Vec<String>),
    /// Every dead letter of the queue.
    All,
}

/// Writes the audit row of a redrive of `selection` on `queue` by `actor`
/// (`new_value`: `{"ids": [...]}` or `{"all": true}`).
///
/// Errors: the database failed (nothing may be redriven then).
pub async fn record_redrive(
    db: &impl ConnectionTrait,
    actor: &UserContext,
    queue: &str,
    selection: &Selection,
    request_id: Option<String>,
    client_request_id: Option<String>,
) -> Result<(), DbErr> {
    let new_value = match selection {
        Selection::Ids(ids) => json!({ "ids": ids }),
        Selection::All => json!({ "all": true }),
    };
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(Some(actor.user_id)),
        action: Set(audit::ACTION_DEAD_LETTER_REDRIVE.to_string()),
        target_type: Set(audit::TARGET_TYPE_QUEUE.to_string()),
        target_id: Set(queue.to_string()),
        old_value: Set(None),
        new_value: Set(Some(new_value)),
        request_id: Set(request_id),
        client_request_id: Set(client_request_id),
        created_at: Set(chrono::Utc::now()),
    }
    .insert(db)
    .await?;
    Ok(())
}
