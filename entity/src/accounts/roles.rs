//! Role changes by an admin (`POST /api/admin/users/role`), each written to
//! `audit_logs` in the same transaction as the change.

use chrono::Utc;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QueryOrder, QuerySelect, Set, TransactionSession, TransactionTrait,
};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::{
    accounts::users::UserContext,
    base::db::begin_write,
    entities::{
        audit_logs,
        user_roles::{self, Role},
        users,
    },
};

/// Why a role change was refused.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The actor is not (or no longer) an admin (HTTP 403).
    #[error("admin role required")]
    Forbidden,
    /// No user has the target id (HTTP 404).
    #[error("unknown user")]
    UnknownUser,
    /// An admin tried to demote their own account (HTTP 400).
    #[error("an admin cannot demote their own account")]
    SelfDemotion,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// The outcome of [`set_role`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleChange {
    /// The target user.
    pub user_id: Uuid,
    /// The role before the call; `None` if the user had no role row.
    pub old_role: Option<Role>,
    /// The role now (the one requested).
    pub role: Role,
    /// Whether anything was written. `false` when the user already had `role`:
    /// then no row changes and no audit row is written (the audit trail records
    /// changes, not requests).
    pub changed: bool,
}

/// Sets the role of `target` to `role` on behalf of `actor`.
///
/// Checks, in order: `actor` must be an admin ([`RoleError::Forbidden`]); an
/// admin may not set their own role to `member` ([`RoleError::SelfDemotion`]);
/// `target` must be an existing user ([`RoleError::UnknownUser`]).
///
/// Then, in one transaction: the `user_roles` rows of actor and target are
/// locked (`FOR UPDATE` in id order on PostgreSQL; `BEGIN IMMEDIATE` on
/// SQLite) and the actor's admin role is checked again against the database
/// (so two admins demoting each other at once cannot both succeed and leave no
/// admin: the second gets [`RoleError::Forbidden`]); the target's role row is
/// updated (or created if missing) and exactly one `audit_logs` row is
/// inserted: `actor_id`, action `role.change`, target `user`/`<target id>`,
/// `old_value {"role": <old or null>}`, `new_value {"role": <new>}`,
/// `request_id` (the server's), `client_request_id` (the client's), `created_at`. Setting the role a user already has succeeds
/// with `changed: false` and writes nothing.
pub async fn set_role<C>(
    db: &C,
    actor: &UserContext,
    target: Uuid,
    role: Role,
    request_id: Option<String>,
    client_request_id: Option<String>,
) -> Result<RoleChange, RoleError>
where
    C: ConnectionTrait + TransactionTrait,
{
    if !actor.is_admin() {
        return Err(RoleError::Forbidden);
    }
    if target == actor.user_id && role != Role::Admin {
        return Err(RoleError::SelfDemotion);
    }

    let txn = begin_write(db).await?;
    let mut select = user_roles::Entity::find()
        .filter(user_roles::Column::UserId.is_in([actor.user_id, target]))
        .order_by_asc(user_roles::Column::UserId);
    if txn.get_database_backend() == DbBackend::Postgres {
        select = select.lock_exclusive();
    }
    let rows = select.all(&txn).await?;
    let actor_role = rows.iter().find(|r| r.user_id == actor.user_id);
    if actor_role.map(|r| r.role) != Some(Role::Admin) {
        return Err(RoleError::Forbidden);
    }
    let old = rows.into_iter().find(|r| r.user_id == target);
    if old.is_none() && users::Entity::find_by_id(target).one(&txn).await?.is_none() {
        return Err(RoleError::UnknownUser);
    }
    let old_role = old.as_ref().map(|r| r.role);
    if old_role == Some(role) {
        txn.commit().await?;
        return Ok(RoleChange {
            user_id: target,
            old_role,
            role,
            changed: false,
        });
    }

    let now = Utc::now();
    match old {
        Some(row) => {
            let mut am = row.into_active_model();
            am.role = Set(role);
            am.updated_at = Set(now);
            am.update(&txn).await?;
        }
        None => {
            user_roles::ActiveModel {
                user_id: Set(target),
                role: Set(role),
                created_at: Set(now),
                updated_at: Set(now),
            }
            .insert(&txn)
            .await?;
        }
    }
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(Some(actor.user_id)),
        action: Set(audit::ACTION_ROLE_CHANGE.to_string()),
        target_type: Set(audit::TARGET_TYPE_USER.to_string()),
        target_id: Set(target.to_string()),
        old_value: Set(Some(json!({ "role": old_role.map(Role::as_str) }))),
        new_value: Set(Some(json!({ "role": role.as_str() }))),
        request_id: Set(request_id),
        client_request_id: Set(client_request_id),
        created_at: Set(now),
    }
    .insert(&txn)
    .await?;
    txn.commit().await?;
    Ok(RoleChange {
        user_id: target,
        old_role,
        role,
        changed: true,
    })
}
