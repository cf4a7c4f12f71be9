//! Sessions and their rotating refresh tokens.
//!
//! A refresh token is opaque: the string is HMAC-SHA256(server secret, row
//! id) ([`tokens::refresh_token_for`]) and only its SHA-256 is stored.
//! Refreshing with token T:
//! 1. T active: revoke T with a conditional UPDATE (`… WHERE token_hash = H
//!    AND revoked = false`), touch the session and insert T's child, atomically
//!    (one statement on PostgreSQL, one transaction on SQLite); exactly one of
//!    several concurrent refreshes wins.
//! 2. T already revoked (or the race above lost): when T was revoked less than
//!    the reuse interval ago (database clock) and its child is still active,
//!    the child is returned again (the platform's reuse interval, for clients
//!    that refresh twice at once).
//! 3. Anything else is reuse of an old token: the whole session is deleted
//!    (with all its tokens) and the answer is
//!    [`IdentityError::RefreshTokenAlreadyUsed`].

use std::sync::OnceLock;

use sea_orm::entity::prelude::IdenStatic;

use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait,
    FromQueryResult, Iterable, QueryFilter, QueryResult, Set, Statement, TransactionSession,
    TransactionTrait, TryGetError,
};
use uuid::Uuid;

use super::{tokens, IdentityError};
use crate::entities::{
    auth_accounts as acc, auth_identities as ident, auth_refresh_tokens as rt,
    auth_sessions as sess, users,
};

/// A session with the refresh token to hand to the client.
#[derive(Debug, Clone)]
pub struct IssuedSession {
    /// The session row.
    pub session: sess::Model,
    /// The refresh token string (sent once, stored hashed).
    pub refresh_token: String,
    /// The session user's view, when the statement that issued the session
    /// read it too (a rotation on PostgreSQL); `None`: load it with
    /// [`super::view::load`].
    pub view: Option<super::view::UserView>,
}

/// Creates a session for `user_id` established by `amr_method` (`password`,
/// `otp`, `magiclink`, `oauth`, …) and its first refresh token.
pub async fn create<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    secret: &[u8],
    user_id: Uuid,
    amr_method: &str,
) -> Result<IssuedSession, IdentityError> {
    let txn = crate::base::db::begin_write(db).await?;
    let now = crate::base::db::now(&txn).await?;
    let session = sess::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user_id),
        aal: Set("aal1".into()),
        amr_method: Set(amr_method.to_string()),
        created_at: Set(now),
        refreshed_at: Set(now),
    }
    .insert(&txn)
    .await?;
    let refresh_token = insert_token(&txn, secret, session.id, user_id, None, now).await?;
    txn.commit().await?;
    Ok(IssuedSession {
        session,
        refresh_token,
        view: None,
    })
}

async fn insert_token<C: ConnectionTrait>(
    db: &C,
    secret: &[u8],
    session_id: Uuid,
    user_id: Uuid,
    parent: Option<Uuid>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<String, IdentityError> {
    let id = Uuid::new_v4();
    let token = tokens::refresh_token_for(secret, id);
    rt::ActiveModel {
        id: Set(id),
        token_hash: Set(tokens::sha256_hex(&token)),
        session_id: Set(session_id),
        user_id: Set(user_id),
        parent_id: Set(parent),
        revoked: Set(false),
        revoked_at: Set(None),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(token)
}

/// Step 1 of the module docs, when the token with SHA-256 `hash` is still
/// active: revokes it (the conditional UPDATE decides a race), touches its
/// session and inserts the child, all at the database's clock. `None` when no
/// active token has that hash (revoked, unknown, or a concurrent refresh won).
///
/// On PostgreSQL this is one statement (data-modifying CTEs, one round trip
/// and one commit); on SQLite, which has no UPDATE inside WITH, one
/// transaction of three statements.
async fn rotate_active<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    secret: &[u8],
    hash: &str,
) -> Result<Option<IssuedSession>, IdentityError> {
    if db.get_database_backend() == DbBackend::Postgres {
        let child = Uuid::new_v4();
        let refresh_token = tokens::refresh_token_for(secret, child);
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                rotate_sql(),
                [
                    hash.into(),
                    child.into(),
                    tokens::sha256_hex(&refresh_token).into(),
                ],
            ))
            .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let session = sess::Model::from_query_result(first, "S_")?;
        let mut view_rows = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(user) = optional::<users::Model>(row, "A_")? else {
                return Err(IdentityError::UserNotFound);
            };
            view_rows.push((
                user,
                optional::<acc::Model>(row, "B_")?,
                optional::<ident::Model>(row, "C_")?,
            ));
        }
        return Ok(Some(IssuedSession {
            session,
            refresh_token,
            view: super::view::view_of(view_rows),
        }));
    }
    let txn = crate::base::db::begin_write(db).await?;
    let now = crate::base::db::now(&txn).await?;
    let revoked = rt::Entity::update_many()
        .col_expr(rt::Column::Revoked, Expr::value(true))
        .col_expr(rt::Column::RevokedAt, Expr::value(now))
        .filter(rt::Column::TokenHash.eq(hash))
        .filter(rt::Column::Revoked.eq(false))
        .exec_with_returning(&txn)
        .await?;
    let Some(row) = revoked.into_iter().next() else {
        txn.rollback().await?;
        return Ok(None);
    };
    let session = sess::Entity::update_many()
        .col_expr(sess::Column::RefreshedAt, Expr::value(now))
        .filter(sess::Column::Id.eq(row.session_id))
        .exec_with_returning(&txn)
        .await?
        .into_iter()
        .next()
        .ok_or(IdentityError::SessionNotFound)?;
    let refresh_token =
        insert_token(&txn, secret, row.session_id, row.user_id, Some(row.id), now).await?;
    txn.commit().await?;
    Ok(Some(IssuedSession {
        session,
        refresh_token,
        view: None,
    }))
}

/// A model read from the columns prefixed `pre`, `None` when they are NULL
/// (the outer side of a LEFT JOIN that matched nothing).
fn optional<M: FromQueryResult>(row: &QueryResult, pre: &str) -> Result<Option<M>, DbErr> {
    match M::from_query_result_nullable(row, pre) {
        Ok(m) => Ok(Some(m)),
        Err(TryGetError::Null(_)) => Ok(None),
        Err(TryGetError::DbErr(e)) => Err(e),
    }
}

/// `"{table}"."{col}" AS "{pre}{col}"` for every column of entity `E`.
fn prefixed<E: EntityTrait>(table: &str, pre: &str) -> String {
    E::Column::iter()
        .map(|c| format!(r#"{table}."{c}" AS "{pre}{c}""#, c = c.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`rotate_active`] on PostgreSQL. `$1`: the presented token's hash; `$2`,
/// `$3`: the child's id and hash. Answers, when `$1` was an active token, the
/// touched session (columns `S_*`) joined with the user's view as
/// [`super::view::load`] reads it (`A_*` users ⟕ `B_*` auth_accounts ⟕
/// `C_*` auth_identities, one row per identity, oldest first), so a refresh
/// makes one round trip to the database; no row otherwise. The view is read
/// from the statement's snapshot, which the CTEs (tokens and sessions only)
/// do not touch. `clock_timestamp()` as in [`crate::base::db::now`].
fn rotate_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            r#"
WITH r AS (
    UPDATE auth_refresh_tokens SET revoked = TRUE, revoked_at = clock_timestamp()
    WHERE token_hash = $1 AND revoked = FALSE
    RETURNING id, session_id, revoked_at
), s AS (
    UPDATE auth_sessions SET refreshed_at = r.revoked_at FROM r
    WHERE auth_sessions.id = r.session_id
    RETURNING auth_sessions.*, r.id AS parent_id
), i AS (
    INSERT INTO auth_refresh_tokens
        (id, token_hash, session_id, user_id, parent_id, revoked, revoked_at, created_at)
    SELECT $2, $3, s.id, s.user_id, s.parent_id, FALSE, NULL, s.refreshed_at FROM s
    RETURNING id
)
SELECT {s}, {u}, {a}, {d}
FROM s
LEFT JOIN users u ON u.id = s.user_id
LEFT JOIN auth_accounts a ON a.user_id = u.id
LEFT JOIN auth_identities d ON d.user_id = u.id
WHERE EXISTS (SELECT 1 FROM i)
ORDER BY d.created_at ASC
"#,
            s = prefixed::<sess::Entity>("s", "S_"),
            u = prefixed::<users::Entity>("u", "A_"),
            a = prefixed::<acc::Entity>("a", "B_"),
            d = prefixed::<ident::Entity>("d", "C_"),
        )
    })
}

/// How long a session may be refreshed: `timebox_secs` after it was signed
/// in (`AUTH_SESSIONS_TIMEBOX_SECS`), `inactivity_secs` after its last
/// refresh (`AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS`); `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifetime {
    /// Seconds after sign-in.
    pub timebox_secs: Option<i64>,
    /// Seconds after the last refresh.
    pub inactivity_secs: Option<i64>,
}

impl Lifetime {
    /// Whether a session signed in at `created` and last refreshed at
    /// `refreshed` is past a limit at `now` (all database clock).
    pub fn expired(
        &self,
        created: chrono::DateTime<chrono::Utc>,
        refreshed: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> bool {
        let past = |at: chrono::DateTime<chrono::Utc>, secs: Option<i64>| {
            secs.is_some_and(|s| (now - at).num_milliseconds() >= s.saturating_mul(1000))
        };
        past(created, self.timebox_secs) || past(refreshed, self.inactivity_secs)
    }
}

/// Rotates `token` (see the module docs). `reuse_interval_ms`: how long a
/// rotated token still yields its active child. With a [`Lifetime`] limit,
/// the token's session is checked first (database clock): past it, the
/// answer is [`IdentityError::SessionExpired`] and nothing rotates.
pub async fn refresh<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    secret: &[u8],
    token: &str,
    reuse_interval_ms: i64,
    lifetime: Lifetime,
) -> Result<IssuedSession, IdentityError> {
    let token = token.trim();
    if token.is_empty() || token.len() > 256 {
        return Err(IdentityError::RefreshTokenNotFound);
    }
    let hash = tokens::sha256_hex(token);
    if lifetime != Lifetime::default() {
        let row = rt::Entity::find()
            .filter(rt::Column::TokenHash.eq(hash.as_str()))
            .one(db)
            .await?;
        let session = match row {
            Some(r) => sess::Entity::find_by_id(r.session_id).one(db).await?,
            None => None,
        };
        if let Some(s) = session {
            let now = crate::base::db::now(db).await?;
            if lifetime.expired(s.created_at, s.refreshed_at, now) {
                return Err(IdentityError::SessionExpired);
            }
        }
    }
    if let Some(issued) = rotate_active(db, secret, &hash).await? {
        return Ok(issued);
    }
    let Some(row) = rt::Entity::find()
        .filter(rt::Column::TokenHash.eq(hash))
        .one(db)
        .await?
    else {
        return Err(IdentityError::RefreshTokenNotFound);
    };
    // Revoked (or a concurrent refresh won): within the reuse interval the
    // active child is handed out again; anything else revokes the session.
    let now = crate::base::db::now(db).await?;
    let recent = row
        .revoked_at
        .is_some_and(|at| (now - at).num_milliseconds() <= reuse_interval_ms);
    if recent {
        let child = rt::Entity::find()
            .filter(rt::Column::ParentId.eq(row.id))
            .filter(rt::Column::Revoked.eq(false))
            .one(db)
            .await?;
        if let Some(child) = child {
            let session = sess::Entity::find_by_id(row.session_id)
                .one(db)
                .await?
                .ok_or(IdentityError::SessionNotFound)?;
            return Ok(IssuedSession {
                session,
                refresh_token: tokens::refresh_token_for(secret, child.id),
                view: None,
            });
        }
    }
    tracing::warn!(session_id = %row.session_id, "refresh token reused: session revoked");
    sess::Entity::delete_many()
        .filter(sess::Column::Id.eq(row.session_id))
        .exec(db)
        .await?;
    Err(IdentityError::RefreshTokenAlreadyUsed {
        user_id: row.user_id,
    })
}

/// Whether session `id` was signed in more than `secs` seconds ago by the
/// database's clock (`true` also when it no longer exists).
pub async fn signed_in_before<C: ConnectionTrait>(
    db: &C,
    id: Uuid,
    secs: i64,
) -> Result<bool, IdentityError> {
    let Some(s) = sess::Entity::find_by_id(id).one(db).await? else {
        return Ok(true);
    };
    let now = crate::base::db::now(db).await?;
    Ok((now - s.created_at).num_milliseconds() > secs.saturating_mul(1000))
}

/// Whether session `id` still exists.
pub async fn exists<C: ConnectionTrait>(db: &C, id: Uuid) -> Result<bool, IdentityError> {
    Ok(sess::Entity::find_by_id(id).one(db).await?.is_some())
}

/// Which sessions a sign-out ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogoutScope {
    /// Every session of the user.
    Global,
    /// Only the current session.
    Local,
    /// Every session but the current one.
    Others,
}

impl LogoutScope {
    /// Parses `global` (default when absent), `local`, `others`.
    pub fn parse(s: Option<&str>) -> Result<Self, IdentityError> {
        match s.map(str::trim).unwrap_or("global") {
            "" | "global" => Ok(Self::Global),
            "local" => Ok(Self::Local),
            "others" => Ok(Self::Others),
            _ => Err(IdentityError::Validation(
                "scope: expected global, local or others".into(),
            )),
        }
    }
}

/// Ends sessions of `user_id` per `scope`, `current` being the caller's session.
pub async fn logout<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    current: Uuid,
    scope: LogoutScope,
) -> Result<(), IdentityError> {
    let q = sess::Entity::delete_many().filter(sess::Column::UserId.eq(user_id));
    let q = match scope {
        LogoutScope::Global => q,
        LogoutScope::Local => q.filter(sess::Column::Id.eq(current)),
        LogoutScope::Others => q.filter(sess::Column::Id.ne(current)),
    };
    q.exec(db).await?;
    Ok(())
}

/// Ends every session of `user_id` except `keep` (after a password change).
pub async fn revoke_others<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    keep: Option<Uuid>,
) -> Result<(), IdentityError> {
    let mut q = sess::Entity::delete_many().filter(sess::Column::UserId.eq(user_id));
    if let Some(k) = keep {
        q = q.filter(sess::Column::Id.ne(k));
    }
    q.exec(db).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_limits_are_inclusive_and_off_by_default() {
        let now = chrono::Utc::now();
        let ago = |s: i64| now - chrono::Duration::seconds(s);
        assert!(!Lifetime::default().expired(ago(10_000_000), ago(10_000_000), now));
        let timebox = Lifetime {
            timebox_secs: Some(3600),
            inactivity_secs: None,
        };
        assert!(!timebox.expired(ago(3599), ago(0), now));
        assert!(timebox.expired(ago(3600), ago(0), now));
        let idle = Lifetime {
            timebox_secs: None,
            inactivity_secs: Some(600),
        };
        assert!(!idle.expired(ago(100_000), ago(599), now));
        assert!(idle.expired(ago(700), ago(600), now));
    }

    #[test]
    fn logout_scopes_parse() {
        assert_eq!(LogoutScope::parse(None).unwrap(), LogoutScope::Global);
        assert_eq!(
            LogoutScope::parse(Some("local")).unwrap(),
            LogoutScope::Local
        );
        assert_eq!(
            LogoutScope::parse(Some("others")).unwrap(),
            LogoutScope::Others
        );
        assert!(LogoutScope::parse(Some("all")).is_err());
    }
}
