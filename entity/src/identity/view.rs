//! A user as the provider shows it ([`UserView`]): the user row, the built-in
//! account, the linked identities, read in one query; what `GET /user`, the
//! token answers and the access token's claims are made of.

use sea_orm::{
    sea_query::Expr, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
};
use uuid::Uuid;

use super::IdentityError;
use crate::entities::{auth_accounts as acc, auth_identities as ident, users};

/// A user as the provider shows it: the account (absent for users that
/// never had a built-in account, e.g. seen only through an external token),
/// the user row, the role and the linked identities.
#[derive(Debug, Clone)]
pub struct UserView {
    /// The `users` row.
    pub user: users::Model,
    /// The built-in account, if any.
    pub account: Option<acc::Model>,
    /// Linked identities, oldest first.
    pub identities: Vec<ident::Model>,
}

impl UserView {
    /// `user_metadata` as JSON (`{}` when absent or unreadable).
    pub fn user_metadata(&self) -> serde_json::Value {
        self.account
            .as_ref()
            .and_then(|a| serde_json::from_str(&a.user_metadata).ok())
            .unwrap_or_else(|| serde_json::json!({}))
    }

    /// The providers of the linked identities, first one first (`["email"]`).
    pub fn providers(&self) -> Vec<String> {
        let mut p: Vec<String> = Vec::new();
        for i in &self.identities {
            if !p.contains(&i.provider) {
                p.push(i.provider.clone());
            }
        }
        if p.is_empty() {
            p.push("email".into());
        }
        p
    }
}

/// Loads the view of `user_id`, in one query.
///
/// # Errors
/// [`IdentityError::UserNotFound`] when there is no such user.
pub async fn load<C: ConnectionTrait>(db: &C, user_id: Uuid) -> Result<UserView, IdentityError> {
    let rows = view_query(user_id).all(db).await?;
    view_of(rows).ok_or(IdentityError::UserNotFound)
}

/// Loads the view of `user_id` for an access token of session `session_id`,
/// in one query (the view's, under `EXISTS` the session): what `GET /user`
/// answers.
///
/// # Errors
/// [`IdentityError::SessionNotFound`] when the session no longer exists (signed
/// out, revoked) or is not `user_id`'s; [`IdentityError::Db`] otherwise.
pub async fn load_for_session<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    session_id: Uuid,
) -> Result<UserView, IdentityError> {
    use crate::entities::auth_sessions as sess;
    use sea_orm::sea_query::Query;
    let session_alive = Query::select()
        .expr(Expr::val(1))
        .from(sess::Entity)
        .and_where(sess::Column::Id.eq(session_id))
        .and_where(sess::Column::UserId.eq(user_id))
        .to_owned();
    let rows = view_query(user_id)
        .filter(Expr::exists(session_alive))
        .all(db)
        .await?;
    view_of(rows).ok_or(IdentityError::SessionNotFound)
}

/// One row of [`view_query`] (or of a statement selecting the same join).
pub(crate) type ViewRow = (users::Model, Option<acc::Model>, Option<ident::Model>);

/// `users ⟕ auth_accounts ⟕ auth_identities` for one user: one row per
/// identity (one row with no identity when there is none), oldest first.
fn view_query(
    user_id: Uuid,
) -> sea_orm::SelectThree<users::Entity, acc::Entity, ident::Entity, sea_orm::TopologyStar> {
    users::Entity::find_by_id(user_id)
        .find_also_related(acc::Entity)
        .find_also(users::Entity, ident::Entity)
        .order_by_asc(ident::Column::CreatedAt)
}

pub(crate) fn view_of(rows: Vec<ViewRow>) -> Option<UserView> {
    let mut rows = rows.into_iter();
    let (user, account, first) = rows.next()?;
    let identities = first
        .into_iter()
        .chain(rows.filter_map(|(_, _, i)| i))
        .collect();
    Some(UserView {
        user,
        account,
        identities,
    })
}
