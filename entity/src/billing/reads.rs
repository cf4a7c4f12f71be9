//! The read API's queries of payments: the caller's payments, newest first
//! (pages of [`crate::base::page`]), and one of them by order id, each with
//! its receipt once it was paid.

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::{
    base::page::{Cursor, Page},
    entities::{billing_receipts, payments},
};

/// A payment and its receipt (`None` until it is paid).
pub type WithReceipt = (payments::Model, Option<billing_receipts::Model>);

/// `rows` with their receipts (one query).
async fn with_receipts<C: ConnectionTrait>(
    db: &C,
    rows: Vec<payments::Model>,
) -> Result<Vec<WithReceipt>, DbErr> {
    let ids: Vec<Uuid> = rows.iter().map(|p| p.id).collect();
    let mut receipts = if ids.is_empty() {
        Vec::new()
    } else {
        billing_receipts::Entity::find()
            .filter(billing_receipts::Column::PaymentId.is_in(ids))
            .all(db)
            .await?
    };
    Ok(rows
        .into_iter()
        .map(|p| {
            let r = receipts
                .iter()
                .position(|r| r.payment_id == p.id)
                .map(|i| receipts.swap_remove(i));
            (p, r)
        })
        .collect())
}

fn payment_key(p: &payments::Model) -> Cursor {
    Cursor {
        at: p.created_at,
        id: p.id,
    }
}

/// The payments of `user_id` with their receipts, newest first, `limit`
/// after `cursor`.
pub async fn payments_of<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    cursor: Option<Cursor>,
    limit: u64,
) -> Result<Page<WithReceipt>, DbErr> {
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
    let page = Page::from_rows(rows, limit, payment_key);
    Ok(Page {
        items: with_receipts(db, page.items).await?,
        next: page.next,
    })
}

/// The payment `order_id` with its receipt if `user_id` made it; another
/// user's is `None`, as an unknown one.
pub async fn payment_of<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    order_id: &str,
) -> Result<Option<WithReceipt>, DbErr> {
    let p = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(order_id))
        .filter(payments::Column::UserId.eq(user_id))
        .one(db)
        .await?;
    Ok(with_receipts(db, p.into_iter().collect()).await?.pop())
}
