//! `delete_avatar`: deletes an avatar object that a profile save left
//! unreferenced (the avatar was removed, or a legacy key was replaced by
//! `<user>/avatar`).

use entity::accounts::avatar::{self, Cleanup};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::jobs::context::{JobContext, JobError};

/// Payload of the `delete_avatar` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteAvatar {
    /// The owner of the object.
    pub user_id: Uuid,
    /// The unreferenced `avatar_path` (`<user_id>/…`, inside the `avatars` bucket).
    pub path: String,
    /// The profile's `avatar_generation` when the save dropped the reference
    /// (0 for jobs queued before generations existed: any upload since then
    /// keeps the object).
    #[serde(default)]
    pub generation: i64,
    /// Request id of the profile save, for log correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Deletes the object unless the profile references it again or an upload
/// completed since it lost its reference ([`avatar::cleanup_decision`]).
///
/// In one write transaction: lock the profile row, decide, delete the object
/// while the lock is held, commit. An upload puts its object in place under
/// the same lock ([`avatar::begin_upload`]), so no interleaving of upload and
/// cleanup deletes an upload that completed after the removal, and no clock
/// is read. Idempotent: an object already gone is success. A path outside the
/// user's own `<user_id>/` prefix is refused permanently (dead-lettered).
/// Database and store failures are retried.
pub async fn handle(
    job: DeleteAvatar,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    if !avatar::is_own_path(job.user_id, &job.path) {
        return Err(JobError::Permanent(format!(
            "refusing to delete {:?}: not an object of user {}",
            job.path, job.user_id
        )));
    }
    let db_error = |e: sea_orm::DbErr| JobError::Retry(format!("locking the profile: {e}"));
    let (txn, profile) = avatar::begin_cleanup(&ctx.db, job.user_id)
        .await
        .map_err(db_error)?;
    let current = profile
        .as_ref()
        .map(|p| (p.avatar_path.as_deref(), p.avatar_generation));
    let decision = avatar::cleanup_decision(&job.path, job.generation, current);
    let key = avatar::object_key_of_path(&job.path);
    if decision == Cleanup::Delete {
        // Missing object = success (`Storage::delete`). On failure the
        // transaction rolls back when dropped and the job is retried.
        ctx.storage
            .delete(&key)
            .await
            .map_err(|e| JobError::Retry(format!("object store delete {key}: {e}")))?;
    }
    txn.commit().await.map_err(db_error)?;
    tracing::info!(
        task_id,
        attempt,
        request_id = job.request_id.as_deref(),
        key,
        generation = job.generation,
        current_generation = current.map(|c| c.1),
        ?decision,
        "avatar cleanup"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_queued_before_generations_read_as_generation_zero() {
        let user = Uuid::now_v7();
        let old = serde_json::json!({
            "user_id": user,
            "path": format!("{user}/avatar"),
            "unreferenced_at": "2026-11-22T10:00:00Z",
        });
        let job: DeleteAvatar = serde_json::from_value(old).unwrap();
        assert_eq!(job.generation, 0);
        assert_eq!(job.path, format!("{user}/avatar"));
    }
}
