//! The admin's read of the audit log (`GET /api/admin/audit-logs`): rows
//! newest first, pages of [`crate::base::page`].

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::{
    base::page::{Cursor, Page},
    entities::audit_logs,
};

/// Audit-log rows, newest first, optionally of one `actor` and one `action`.
pub async fn audit_logs<C: ConnectionTrait>(
    db: &C,
    actor: Option<Uuid>,
    action: Option<&str>,
    cursor: Option<Cursor>,
    limit: u64,
) -> Result<Page<audit_logs::Model>, DbErr> {
    let mut q = audit_logs::Entity::find();
    if let Some(a) = actor {
        q = q.filter(audit_logs::Column::ActorId.eq(a));
    }
    if let Some(a) = action {
        q = q.filter(audit_logs::Column::Action.eq(a));
    }
    if let Some(c) = cursor {
        q = q.filter(c.after(audit_logs::Column::CreatedAt, audit_logs::Column::Id));
    }
    let rows = q
        .order_by_desc(audit_logs::Column::CreatedAt)
        .order_by_desc(audit_logs::Column::Id)
        .limit(limit + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(rows, limit, |a| Cursor {
        at: a.created_at,
        id: a.id,
    }))
}
