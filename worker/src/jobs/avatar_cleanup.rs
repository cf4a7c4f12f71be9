//! `delete_avatar`: deletes an avatar object that a profile save left
//! unreferenced (the avatar was removed, or a legacy key was replaced by
//! `<user>/avatar`).

use chrono::{DateTime, Utc};
use entity::{
    avatar::{self, Cleanup},
    entities::profiles,
};
use sea_orm::EntityTrait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{JobContext, JobError};

/// Payload of the `delete_avatar` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteAvatar {
    /// The owner of the object.
    pub user_id: Uuid,
    /// The unreferenced `avatar_path` (`<user_id>/…`, inside the `avatars` bucket).
    pub path: String,
    /// When the profile save dropped the reference.
    pub unreferenced_at: DateTime<Utc>,
    /// Request id of the profile save, for log correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Deletes the object unless the profile references it again or it was
/// rewritten since it lost its reference ([`avatar::cleanup_decision`]).
/// Idempotent: an object already gone is success. A path outside the user's
/// own `<user_id>/` prefix is refused permanently (dead-lettered). Database
/// and store failures are retried.
pub async fn handle(
    job: DeleteAvatar,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let own = format!("{}/", job.user_id);
    if !job.path.starts_with(&own) || job.path.contains("..") || job.path.len() <= own.len() {
        return Err(JobError::Permanent(format!(
            "refusing to delete {:?}: not an object of user {}",
            job.path, job.user_id
        )));
    }
    let storage = &ctx.storage;
    let current = profiles::Entity::find_by_id(job.user_id)
        .one(&ctx.db)
        .await
        .map_err(|e| JobError::Retry(format!("loading the profile: {e}")))?
        .and_then(|p| p.avatar_path);
    let key = avatar::object_key_of_path(&job.path);
    let meta = storage
        .head(&key)
        .await
        .map_err(|e| JobError::Retry(format!("object store head {key}: {e}")))?;
    let decision = avatar::cleanup_decision(
        &job.path,
        current.as_deref(),
        meta.map(|m| m.last_modified),
        job.unreferenced_at,
    );
    if decision == Cleanup::Delete {
        storage
            .delete(&key)
            .await
            .map_err(|e| JobError::Retry(format!("object store delete {key}: {e}")))?;
    }
    tracing::info!(
        task_id,
        attempt,
        request_id = job.request_id.as_deref(),
        key,
        ?decision,
        "avatar cleanup"
    );
    Ok(())
}
