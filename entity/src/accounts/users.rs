//! Users seen through a verified session: the default rows every account gets
//! on first sight (profile, FREE subscription, role) and the per-request
//! [`UserContext`] the routes authorise with.
//!
//! Works the same on PostgreSQL and SQLite: the first-sight rows are written
//! with `INSERT … ON CONFLICT DO NOTHING` inside one transaction, so two first
//! requests racing each other end with exactly one row per table.

use chrono::Utc;
use sea_orm::{
    sea_query::{Expr, Query},
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, JoinType, PaginatorTrait,
    QueryFilter, QuerySelect, RelationTrait, Set, TransactionSession, TransactionTrait,
};
use uuid::Uuid;

use crate::base::audit;
use crate::base::db::begin_write;
use crate::{
    base::plans,
    entities::{
        auth_sessions, profiles,
        subscriptions::{self, SubscriptionStatus},
        user_roles::{self, Role},
        users,
    },
};

/// Who a verified session says the caller is: the JWT `sub` and, when the
/// token carries one, its `email` claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The session subject (`sub`), the account id.
    pub user_id: Uuid,
    /// The `email` claim, if present.
    pub email: Option<String>,
}

/// The caller of an authenticated request, as stored: id, email and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserContext {
    /// The account id (`users.id`, the JWT `sub`).
    pub user_id: Uuid,
    /// The token's email when it carried one, else the stored email.
    pub email: Option<String>,
    /// The role from `user_roles`.
    pub role: Role,
}

impl UserContext {
    /// Whether the caller holds the `admin` role.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// Who is granted `admin` at first sight (never later: an existing member is
/// not promoted by a configuration change).
#[derive(Debug, Clone, Copy, Default)]
pub struct AdminGrant<'a> {
    /// `ADMIN_USER_IDS`: account ids granted admin.
    pub user_ids: &'a [Uuid],
    /// `ADMIN_EMAILS`: emails granted admin, compared with ASCII-only case
    /// folding. The caller passes them only when the session's email is
    /// confirmed by its issuer (see the api's `AUTH_TRUST_EMAIL_CLAIM`).
    pub emails: &'a [String],
}

impl AdminGrant<'_> {
    /// Whether `id` is granted admin: its user id is listed, or its email is.
    pub fn grants(&self, id: &Identity) -> bool {
        self.grant_reason(id).is_some()
    }

    /// Why `id` is granted admin: `admin_user_ids` (its user id is listed) or
    /// `admin_emails` (its email is); `None` when it is not.
    pub fn grant_reason(&self, id: &Identity) -> Option<&'static str> {
        if self.user_ids.contains(&id.user_id) {
            Some("admin_user_ids")
        } else if is_admin_email(id.email.as_deref(), self.emails) {
            Some("admin_emails")
        } else {
            None
        }
    }
}

/// Writes the `role.grant` audit row of a configured admin grant: actor the
/// system (`None`), target `user`/`<id>`, `old_value {"role": old}`,
/// `new_value {"role": "admin", "by": <reason>, "email": <email>}`.
pub async fn audit_admin_grant<C: ConnectionTrait>(
    db: &C,
    id: &Identity,
    by: &str,
    old_role: Option<&str>,
) -> Result<(), DbErr> {
    crate::entities::audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(audit::ACTION_ROLE_GRANT.to_string()),
        target_type: Set(audit::TARGET_TYPE_USER.to_string()),
        target_id: Set(id.user_id.to_string()),
        old_value: Set(Some(serde_json::json!({ "role": old_role }))),
        new_value: Set(Some(
            serde_json::json!({ "role": Role::Admin.as_str(), "by": by, "email": id.email }),
        )),
        request_id: Set(None),
        client_request_id: Set(None),
        created_at: Set(Utc::now()),
    }
    .insert(db)
    .await
    .map(|_| ())
}

/// [`ensure_user_granting`] with only `admin_emails` granting admin.
pub async fn ensure_user<C>(
    db: &C,
    id: &Identity,
    admin_emails: &[String],
) -> Result<UserContext, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let grant = AdminGrant {
        user_ids: &[],
        emails: admin_emails,
    };
    ensure_user_granting(db, id, &grant).await
}

/// Returns the stored context of `id`, creating the account on first sight.
///
/// - Fast path (every authenticated request): one `SELECT users LEFT JOIN
///   user_roles`; when both rows exist nothing is written, except that
///   `users.email` is updated when the token carries an email different from
///   the stored one.
/// - First sight (no user row or no role row): one transaction inserts, each
///   with `ON CONFLICT DO NOTHING` on the primary key, the `users` row, an empty
///   `profiles` row, a `FREE` subscription (status `active`, not cancelling,
///   no period) and a `user_roles` row. The role is `admin` when `grant`
///   grants it ([`AdminGrant::grants`]), else `member`. The grant applies
///   only here, at first sight: an existing member is never promoted by a
///   later configuration change.
///
/// Idempotent and race-safe: concurrent first requests of the same user end
/// with exactly one row in each table (on PostgreSQL the second insert waits
/// for the first transaction and then does nothing; on SQLite the transaction
/// is `BEGIN IMMEDIATE`, so writers queue behind the busy timeout). Rows that
/// are missing for another reason (e.g. a user row created elsewhere) are
/// filled in the same way. The role returned is the one read back from the
/// database, never the one merely computed.
///
/// Errors: only [`DbErr`] (connection, constraint or a role row still missing
/// after the insert, reported as [`DbErr::RecordNotFound`]).
pub async fn ensure_user_granting<C>(
    db: &C,
    id: &Identity,
    grant: &AdminGrant<'_>,
) -> Result<UserContext, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    ensure_session_user(db, id, None, grant)
        .await?
        .ok_or_else(|| DbErr::Custom("no session was asked for".into()))
}

/// [`ensure_user_granting`] for a request of session `session` (the
/// `session_id` claim of the built-in provider's access tokens; `None` for a
/// token of another issuer, which is not checked): `Ok(None)` when that
/// session no longer exists (signed out, ended by a password change, or its
/// account deleted). The check is an `EXISTS` on `auth_sessions` folded
/// into the same `SELECT` (one round trip, as without it); a user seen for
/// the first time is created only once its session is found.
///
/// Errors: as [`ensure_user_granting`].
pub async fn ensure_session_user<C>(
    db: &C,
    id: &Identity,
    session: Option<Uuid>,
    grant: &AdminGrant<'_>,
) -> Result<Option<UserContext>, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    type Row = (
        Uuid,
        Option<String>,
        chrono::DateTime<Utc>,
        Option<Role>,
        bool,
    );
    let found: Option<Row> = users::Entity::find_by_id(id.user_id)
        .select_only()
        .columns([
            users::Column::Id,
            users::Column::Email,
            users::Column::CreatedAt,
        ])
        .column(user_roles::Column::Role)
        .expr(session_alive(id.user_id, session))
        .join(JoinType::LeftJoin, users::Relation::Role.def())
        .into_tuple()
        .one(db)
        .await?;
    if let Some((user_id, email, created_at, Some(role), alive)) = found {
        if !alive {
            return Ok(None);
        }
        let user = users::Model {
            id: user_id,
            email,
            created_at,
        };
        let email = sync_email(db, &user, id.email.as_deref()).await?;
        return Ok(Some(UserContext {
            user_id,
            email,
            role,
        }));
    }
    if !session_exists(db, id.user_id, session).await? {
        return Ok(None);
    }
    create_defaults(db, id, grant).await.map(Some)
}

/// A boolean column: whether session `session` of `user_id` exists
/// (`true` when no session is to be checked).
fn session_alive(user_id: Uuid, session: Option<Uuid>) -> Expr {
    match session {
        None => Expr::value(true),
        Some(sid) => Expr::exists(
            Query::select()
                .expr(Expr::value(1))
                .from(auth_sessions::Entity)
                .and_where(auth_sessions::Column::Id.eq(sid))
                .and_where(auth_sessions::Column::UserId.eq(user_id))
                .to_owned(),
        ),
    }
}

/// Whether session `session` of `user_id` exists (`true` for `None`); the
/// first-sight path's own check.
async fn session_exists<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    session: Option<Uuid>,
) -> Result<bool, DbErr> {
    let Some(sid) = session else {
        return Ok(true);
    };
    let n = auth_sessions::Entity::find_by_id(sid)
        .filter(auth_sessions::Column::UserId.eq(user_id))
        .count(db)
        .await?;
    Ok(n > 0)
}

/// [`ensure_user_granting`] and the caller's plan in force
/// ([`crate::base::plans::plan_of`]'s rule) together: for a known user one
/// `SELECT` joining `users`, `user_roles` and `subscriptions` (one round trip
/// where the two functions took two); for a new one the first-sight
/// transaction, then its subscription's plan (FREE, which that transaction
/// creates, unless a subscription row already existed). `session` is checked
/// as [`ensure_session_user`] checks it, in the same `SELECT`: `Ok(None)`
/// when that session no longer exists.
///
/// Errors: as [`ensure_user_granting`].
pub async fn ensure_user_with_plan<C>(
    db: &C,
    id: &Identity,
    session: Option<Uuid>,
    grant: &AdminGrant<'_>,
) -> Result<Option<(UserContext, String)>, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    type Row = (
        Uuid,
        Option<String>,
        chrono::DateTime<Utc>,
        Option<Role>,
        Option<String>,
        Option<SubscriptionStatus>,
        bool,
    );
    let found: Option<Row> = users::Entity::find_by_id(id.user_id)
        .select_only()
        .columns([
            users::Column::Id,
            users::Column::Email,
            users::Column::CreatedAt,
        ])
        .column(user_roles::Column::Role)
        .column(subscriptions::Column::Plan)
        .column(subscriptions::Column::Status)
        .expr(session_alive(id.user_id, session))
        .join(JoinType::LeftJoin, users::Relation::Role.def())
        .join(JoinType::LeftJoin, users::Relation::Subscription.def())
        .into_tuple()
        .one(db)
        .await?;
    if let Some((user_id, email, created_at, Some(role), plan, status, alive)) = found {
        if !alive {
            return Ok(None);
        }
        let user = users::Model {
            id: user_id,
            email,
            created_at,
        };
        let email = sync_email(db, &user, id.email.as_deref()).await?;
        let plan = crate::base::plans::plan_in_force(plan.zip(status));
        return Ok(Some((
            UserContext {
                user_id,
                email,
                role,
            },
            plan,
        )));
    }
    if !session_exists(db, id.user_id, session).await? {
        return Ok(None);
    }
    let user = create_defaults(db, id, grant).await?;
    // Rows that were missing besides the role (the subscription among them)
    // were created by the same transaction; an existing subscription was kept.
    let plan = crate::base::plans::plan_of(db, id.user_id).await?;
    Ok(Some((user, plan)))
}

/// Whether `email` is in `admin_emails`, both trimmed and compared with
/// ASCII-only case folding (so U+212A KELVIN SIGN does not match `k`).
pub fn is_admin_email(email: Option<&str>, admin_emails: &[String]) -> bool {
    let Some(email) = email.map(str::trim) else {
        return false;
    };
    !email.is_empty()
        && admin_emails
            .iter()
            .any(|a| a.trim().eq_ignore_ascii_case(email))
}

/// The first-sight transaction of [`ensure_user`].
async fn create_defaults<C>(
    db: &C,
    id: &Identity,
    grant: &AdminGrant<'_>,
) -> Result<UserContext, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let now = Utc::now();
    let uid = id.user_id;
    let reason = grant.grant_reason(id);
    let role = if reason.is_some() {
        Role::Admin
    } else {
        Role::Member
    };

    let txn = begin_write(db).await?;
    insert_if_absent(
        &txn,
        users::ActiveModel {
            id: Set(uid),
            email: Set(id.email.clone()),
            created_at: Set(now),
        },
    )
    .await?;
    insert_if_absent(
        &txn,
        profiles::ActiveModel {
            user_id: Set(uid),
            full_name: Set(None),
            avatar_path: Set(None),
            avatar_url: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            avatar_generation: Set(0),
        },
    )
    .await?;
    insert_if_absent(
        &txn,
        subscriptions::ActiveModel {
            user_id: Set(uid),
            plan: Set(plans::FREE.to_string()),
            status: Set(SubscriptionStatus::Active),
            cancel_at_period_end: Set(false),
            current_period_start: Set(None),
            current_period_end: Set(None),
            canceled_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            renewal_plan: Set(None),
            renewal_plan_price: Set(None),
            billing_anchor_day: Set(None),
            billing_anchor_time: Set(None),
            past_due_at: Set(None),
            grace_ends_at: Set(None),
            price_notice_plan: Set(None),
            price_notice_amount: Set(None),
            price_notice_at: Set(None),
            scheduled_plan: Set(None),
            scheduled_payment_id: Set(None),
        },
    )
    .await?;
    let role_inserted = insert_if_absent(
        &txn,
        user_roles::ActiveModel {
            user_id: Set(uid),
            role: Set(role),
            created_at: Set(now),
            updated_at: Set(now),
        },
    )
    .await?;
    if let (true, Some(by)) = (role_inserted, reason) {
        audit_admin_grant(&txn, id, by, None).await?;
    }

    // Read back: a concurrent request (or an earlier partial state) may have
    // written the rows this transaction skipped.
    let (user, role) = users::Entity::find_by_id(uid)
        .find_also_related(user_roles::Entity)
        .one(&txn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("user {uid} after insert")))?;
    let role = role.ok_or_else(|| DbErr::RecordNotFound(format!("role of {uid} after insert")))?;
    let email = sync_email(&txn, &user, id.email.as_deref()).await?;
    txn.commit().await?;
    Ok(UserContext {
        user_id: uid,
        email,
        role: role.role,
    })
}

/// Updates `users.email` when the token's email differs from the stored one;
/// returns the email to report (the token's, else the stored one).
async fn sync_email<C: ConnectionTrait>(
    db: &C,
    user: &users::Model,
    token_email: Option<&str>,
) -> Result<Option<String>, DbErr> {
    match token_email {
        Some(e) if user.email.as_deref() != Some(e) => {
            users::Entity::update_many()
                .col_expr(users::Column::Email, Expr::value(e))
                .filter(users::Column::Id.eq(user.id))
                .exec(db)
                .await?;
            Ok(Some(e.to_string()))
        }
        Some(e) => Ok(Some(e.to_string())),
        None => Ok(user.email.clone()),
    }
}

/// `INSERT … ON CONFLICT (primary key) DO NOTHING`: first-sight rows that a
/// concurrent request may have written already. Whether the row was inserted.
async fn insert_if_absent<C, A>(db: &C, row: A) -> Result<bool, DbErr>
where
    C: ConnectionTrait,
    A: ActiveModelTrait + Send,
{
    <A::Entity as EntityTrait>::insert(row)
        .on_conflict_do_nothing()
        .exec_without_returning(db)
        .await
        .map(|r| matches!(r, sea_orm::TryInsertResult::Inserted(n) if n > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_emails_compare_lowercased() {
        let admins = vec!["boss@example.com".to_string(), " Ops@Example.com ".into()];
        assert!(is_admin_email(Some("Boss@Example.COM"), &admins));
        assert!(is_admin_email(Some("ops@example.com"), &admins));
        assert!(!is_admin_email(Some("other@example.com"), &admins));
        assert!(!is_admin_email(None, &admins));
        assert!(!is_admin_email(Some(""), &["".to_string()]));
    }

    #[test]
    fn admin_emails_fold_ascii_only() {
        let admins = vec!["kim@example.com".to_string()];
        // U+212A KELVIN SIGN lowercases to `k` under Unicode rules.
        assert!(!is_admin_email(Some("\u{212A}im@example.com"), &admins));
        assert!(is_admin_email(Some("KIM@example.com"), &admins));
    }

    #[test]
    fn admin_user_ids_grant_without_email() {
        let boss = Uuid::new_v4();
        let ids = [boss];
        let grant = AdminGrant {
            user_ids: &ids,
            emails: &[],
        };
        let who = |user_id, email: Option<&str>| Identity {
            user_id,
            email: email.map(str::to_string),
        };
        assert!(grant.grants(&who(boss, None)));
        assert!(!grant.grants(&who(Uuid::new_v4(), Some("boss@example.com"))));
    }
}
