//! The read API's queries of payments: the caller's payments, newest first
//! (pages of [`crate::base::page`]), and one of them by order id.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::{
    base::page::{Cursor, Page},
    entities::payments,
};

fn payment_key(p: &payments::Model) -> Cursor {
    Cursor {
        at: p.created_at,
        id: p.id,
    }
}

/// The payments of `user_id`, newest first, `limit` after `cursor`.
pub async fn payments_of<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    cursor: Option<Cursor>,
    limit: u64,
) -> Result<Page<payments::Model>, DbErr> {
    let mut q = payments::Entity::find().filter(payments::Column::UserId.eq(user_id));
    if let Some(c) = cursor {
        q = q.filter(c.after(payments::Column::CreatedAt, payments::Column::Id));
    }
    let rows = q
        .order_by_desc(payments::Column::CreatedAt)
        .order_by_desc(payments::Column::Id)
        .limit(limit + 1)
        .all(db)
        .await?;
    Ok(Page::from_rows(rows, limit, payment_key))
}

/// The payment `order_id` if `user_id` made it; another user's is `None`,
/// as an unknown one.
pub async fn payment_of<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    order_id: &str,
) -> Result<Option<payments::Model>, DbErr> {
    payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .filter(payments::Column::UserId.eq(user_id))
        .one(db)
        .await
}
