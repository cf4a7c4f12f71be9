//! The read API's queries of accounts: the caller's account (`GET /api/me`)
//! and the admin's list of users. Lists are pages of
//! [`crate::base::page`] (newest first, one cursor mechanism).

use std::collections::HashMap;

use sea_orm::{
    sea_query::{Expr, ExprTrait as _, Func, LikeExpr},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::{
    base::page::{Cursor, Page},
    base::plans,
    entities::{profiles, renewals, subscriptions, user_roles, users},
};

/// The rows `GET /api/me` shows beside the session's account, plan and AI
/// usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Details {
    /// The profile row, if one was ever saved.
    pub profile: Option<profiles::Model>,
    /// The subscription row, if any.
    pub subscription: Option<subscriptions::Model>,
    /// The open renewal of the subscription's current period, if any
    /// ([`crate::billing::renewal::open_of`]).
    pub renewal: Option<renewals::Model>,
}

/// The profile and subscription rows of `user_id` (two reads by key) and
/// the subscription's open renewal (a read on `renewals_open_uidx`).
pub async fn details<C: ConnectionTrait>(db: &C, user_id: Uuid) -> Result<Details, DbErr> {
    let profile = profiles::Entity::find_by_id(user_id).one(db).await?;
    let subscription = subscriptions::Entity::find_by_id(user_id).one(db).await?;
    let renewal = match &subscription {
        Some(s) => crate::billing::renewal::open_of(db, s).await?,
        None => None,
    };
    Ok(Details {
        profile,
        subscription,
        renewal,
    })
}

/// One user of the admin list.
#[derive(Debug, Clone, PartialEq)]
pub struct UserRow {
    /// The account.
    pub user: users::Model,
    /// Its role (`member` when no role row exists yet).
    pub role: user_roles::Role,
    /// The subscription row, if any.
    pub subscription: Option<subscriptions::Model>,
    /// The plan in force ([`plans::plan_in_force`]).
    pub plan: String,
}

/// Escapes `%`, `_` and `\` of `text` for a `LIKE … ESCAPE '\'` pattern.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Users, newest first, whose email contains `query` (ignoring case; `None`
/// = every user), with their role and plan.
pub async fn users<C: ConnectionTrait>(
    db: &C,
    query: Option<&str>,
    cursor: Option<Cursor>,
    limit: u64,
) -> Result<Page<UserRow>, DbErr> {
    let mut q = users::Entity::find();
    if let Some(text) = query.map(str::trim).filter(|t| !t.is_empty()) {
        let pattern = format!("%{}%", like_escaped(&text.to_lowercase()));
        q = q.filter(
            Expr::expr(Func::lower(Expr::col((
                users::Entity,
                users::Column::Email,
            ))))
            .like(LikeExpr::new(pattern).escape('\\')),
        );
    }
    if let Some(c) = cursor {
        q = q.filter(c.after(users::Column::CreatedAt, users::Column::Id));
    }
    let rows = q
        .order_by_desc(users::Column::CreatedAt)
        .order_by_desc(users::Column::Id)
        .limit(limit + 1)
        .all(db)
        .await?;
    let page = Page::from_rows(rows, limit, |u| Cursor {
        at: u.created_at,
        id: u.id,
    });
    let ids: Vec<Uuid> = page.items.iter().map(|u| u.id).collect();
    let mut roles: HashMap<Uuid, user_roles::Role> = user_roles::Entity::find()
        .filter(user_roles::Column::UserId.is_in(ids.clone()))
        .all(db)
        .await?
        .into_iter()
        .map(|r| (r.user_id, r.role))
        .collect();
    let mut subs: HashMap<Uuid, subscriptions::Model> = subscriptions::Entity::find()
        .filter(subscriptions::Column::UserId.is_in(ids))
        .all(db)
        .await?
        .into_iter()
        .map(|s| (s.user_id, s))
        .collect();
    Ok(page.map(|user| {
        let subscription = subs.remove(&user.id);
        let plan = plans::plan_in_force(subscription.as_ref().map(|s| (s.plan.clone(), s.status)));
        UserRow {
            role: roles.remove(&user.id).unwrap_or(user_roles::Role::Member),
            user,
            subscription,
            plan,
        }
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn like_patterns_are_escaped() {
        assert_eq!(super::like_escaped(r"a_b%c\d"), r"a\_b\%c\\d");
    }
}
