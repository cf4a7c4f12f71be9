//! Accounts of the built-in provider: creation (with the default rows every
//! user gets, in the same transaction), lookup by email, confirmation,
//! password and metadata changes and email change (OAuth sign-ins are in
//! [`super::external`]).
//!
//! Emails are unique among built-in accounts case-insensitively: the
//! `email_norm` column (trimmed, ASCII-lowercased) carries a unique index.
//!
//! Why this file is long: every write to a pending account (create, a later
//! sign-up, the first proof in [`confirm_email`], OAuth sign-ins, email and
//! password changes) is conditional on what the others write, and the first
//! proof must see them all; they stay side by side until the identity pass
//! splits them by flow around that one function (the read of an account is
//! already apart, in [`super::view`]).

use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set,
    TransactionSession, TransactionTrait,
};
use uuid::Uuid;

use super::{is_unique_violation, IdentityError};
use crate::{
    accounts::users::{AdminGrant, Identity},
    entities::{
        auth_accounts as acc, auth_identities as ident,
        user_roles::{self, Role},
        users,
    },
};

/// Trims and validates `raw` as an email address; returns `(email, email_norm)`.
///
/// # Errors
/// [`IdentityError::Validation`] naming `email`.
pub fn normalize_email(raw: &str) -> Result<(String, String), IdentityError> {
    let email = crate::base::validate::email("email", raw)
        .map_err(|e| IdentityError::Validation(e.message.clone()))?;
    let norm = email.to_ascii_lowercase();
    Ok((email, norm))
}

/// The most `user_metadata` an account stores: 4 KiB of JSON. A larger one
/// would make every access token of the account too large for the routes
/// that read it (the metadata rides in the token).
pub const MAX_USER_METADATA_BYTES: usize = 4096;

/// Refuses `user_metadata` larger than [`MAX_USER_METADATA_BYTES`]: checked
/// before anything depends on whether the address has an account (sign-up,
/// code sign-up, OAuth profile), so the answer is the same either way.
///
/// # Errors
/// [`IdentityError::MetadataTooLarge`] (422, naming `data`).
pub fn check_metadata(meta: &serde_json::Value) -> Result<(), IdentityError> {
    if meta.to_string().len() > MAX_USER_METADATA_BYTES {
        return Err(IdentityError::MetadataTooLarge);
    }
    Ok(())
}

/// The account with this normalised email.
pub async fn find_by_email<C: ConnectionTrait>(
    db: &C,
    email_norm: &str,
) -> Result<Option<acc::Model>, IdentityError> {
    Ok(acc::Entity::find()
        .filter(acc::Column::EmailNorm.eq(email_norm))
        .one(db)
        .await?)
}

/// What [`create`] did.
#[derive(Debug, Clone)]
pub enum Created {
    /// A new account.
    New(acc::Model),
    /// The email belonged to an account already (returned unchanged).
    Existing(acc::Model),
}

/// What a new built-in account starts with.
#[derive(Debug, Clone)]
pub struct NewAccount<'a> {
    /// The email as given.
    pub email: &'a str,
    /// Its normalised form.
    pub email_norm: &'a str,
    /// argon2id hash, or `None` (magic link / OTP sign-up).
    pub password_hash: Option<String>,
    /// `user_metadata`.
    pub user_metadata: serde_json::Value,
    /// Confirmed at creation (`AUTH_AUTOCONFIRM`).
    pub confirmed: bool,
    /// The sign-up that chose `password_hash` (see [`confirm_email`]).
    pub signup_id: Option<Uuid>,
}

/// Creates a built-in account with its `email` identity and the default rows
/// (profile, FREE subscription, role; admin per `grant` only when the email
/// is confirmed at creation) in one transaction. An email that exists
/// already (also when a concurrent sign-up won the race) is
/// [`Created::Existing`].
pub async fn create<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    new: NewAccount<'_>,
    grant: &AdminGrant<'_>,
) -> Result<Created, IdentityError> {
    if let Some(a) = find_by_email(db, new.email_norm).await? {
        return Ok(Created::Existing(a));
    }
    let user_id = Uuid::new_v4();
    let txn = crate::base::db::begin_write(db).await?;
    let result = async {
        let now = crate::base::db::now(&txn).await?;
        let no_grant = AdminGrant::default();
        crate::accounts::users::ensure_user_granting(
            &txn,
            &Identity {
                user_id,
                email: Some(new.email.to_string()),
            },
            if new.confirmed { grant } else { &no_grant },
        )
        .await?;
        let account = acc::ActiveModel {
            user_id: Set(user_id),
            email: Set(new.email.to_string()),
            email_norm: Set(new.email_norm.to_string()),
            password_hash: Set(new.password_hash.clone()),
            email_confirmed_at: Set(new.confirmed.then_some(now)),
            signup_id: Set(if new.confirmed { None } else { new.signup_id }),
            email_change: Set(None),
            email_change_verified: Set(None),
            confirmation_sent_at: Set(None),
            recovery_sent_at: Set(None),
            magiclink_sent_at: Set(None),
            email_change_sent_at: Set(None),
            reauthentication_sent_at: Set(None),
            last_sign_in_at: Set(None),
            user_metadata: Set(new.user_metadata.to_string()),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(&txn)
        .await?;
        insert_identity(
            &txn,
            user_id,
            "email",
            &user_id.to_string(),
            Some(new.email),
            serde_json::json!({
                "sub": user_id.to_string(),
                "email": new.email,
                "email_verified": new.confirmed,
            }),
            now,
        )
        .await?;
        Ok::<_, sea_orm::DbErr>(account)
    }
    .await;
    match result {
        Ok(account) => {
            txn.commit().await?;
            Ok(Created::New(account))
        }
        Err(e) if is_unique_violation(&e) => {
            txn.rollback().await?;
            find_by_email(db, new.email_norm)
                .await?
                .map(Created::Existing)
                .ok_or(IdentityError::Db(e))
        }
        Err(e) => Err(IdentityError::Db(e)),
    }
}

pub(super) async fn insert_identity<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    provider: &str,
    provider_id: &str,
    email: Option<&str>,
    data: serde_json::Value,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Uuid, sea_orm::DbErr> {
    let id = Uuid::new_v4();
    ident::ActiveModel {
        id: Set(id),
        user_id: Set(user_id),
        provider: Set(provider.into()),
        provider_id: Set(provider_id.into()),
        email: Set(email.map(str::to_string)),
        identity_data: Set(data.to_string()),
        last_sign_in_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(db)
    .await
    .map(|_| id)
}

/// The `signup_id` of an account whose pending password is contested: two
/// sign-ups chose different passwords, or a code sign-up followed one, before
/// the mailbox was proven. It is never a mail's sign-up id, so no
/// confirmation of such an account keeps a pre-proof password
/// ([`confirm_email`]); it stays until the first confirmation.
pub const CONTESTED: Uuid = Uuid::nil();

/// What [`confirm_email`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// This was the account's first confirmation.
    pub first: bool,
    /// A password chosen before the mailbox was proven was dropped: no
    /// password is active now.
    pub password_dropped: bool,
}

/// What proved the mailbox at a first confirmation ([`confirm_email`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Proof {
    /// The request the consumed mail was issued for (a confirmation mail's
    /// sign-up or code sign-up; `None` for other mails).
    pub request_id: Option<Uuid>,
    /// The consumed mail's PKCE flow: kept (its auth code is issued next).
    pub flow_state_id: Option<Uuid>,
    /// The identity of an OAuth sign-in whose provider verified the address:
    /// kept.
    pub identity_id: Option<Uuid>,
}

/// The one function that decides, once, what an account keeps when the
/// owner of its mailbox first proves it (a link or code of `/verify`, or an
/// OAuth provider that verified the address): from then on the account is
/// theirs alone. Later calls (the address is confirmed) change nothing.
///
/// A credential chosen before the proof (password, `user_metadata`)
/// survives only when the consumed mail was issued for the request that
/// created it and no other request touched the pending account since
/// (`proof.request_id` equals the account's `signup_id`, which every other
/// sign-up, code sign-up or OAuth sign-in turns into [`CONTESTED`]); as in
/// GoTrue, whoever consumes the mail of a sole request adopts its
/// credentials. For an `ADMIN_EMAILS` address none survives. Every identity
/// but `email` (and the proving OAuth identity) is removed (GoTrue's
/// `RemoveUnconfirmedIdentities`), unless the proof is the mail of the sole
/// request that made the account (an unverified OAuth sign-in's own
/// confirmation keeps its identity); the account's other mail tokens, PKCE flow
/// states (but the consumed mail's) and sessions are voided, so the acting
/// session, made after this, is the only one. One conditional UPDATE
/// confirms, on the credentials as read, so a concurrent sign-up cannot slip
/// a credential in (it is retried, then everything pre-proof is dropped).
/// `admin` is granted when the email is in `grant` (`ADMIN_EMAILS`), with a
/// `role.grant` audit row; admins stay admins.
///
/// All of it is one transaction, so no sign-in sees the account confirmed
/// with what the proof voids still in place: an OAuth sign-in holds its
/// identity's row while it issues ([`super::external::grant_session`]), and
/// the voids here wait for it, then delete what it issued.
pub async fn confirm_email<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    user_id: Uuid,
    grant: &AdminGrant<'_>,
    proof: Proof,
) -> Result<Confirmed, IdentityError> {
    let txn = crate::base::db::begin_write(db).await?;
    let outcome = confirm_in(&txn, user_id, grant, proof).await?;
    txn.commit().await?;
    Ok(outcome)
}

async fn confirm_in<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    grant: &AdminGrant<'_>,
    proof: Proof,
) -> Result<Confirmed, IdentityError> {
    let now = crate::base::db::now(db).await?;
    let confirm = || {
        acc::Entity::update_many()
            .col_expr(acc::Column::EmailConfirmedAt, Expr::value(now))
            .col_expr(acc::Column::UpdatedAt, Expr::value(now))
            .col_expr(acc::Column::SignupId, Expr::value(Option::<Uuid>::None))
            .filter(acc::Column::UserId.eq(user_id))
            .filter(acc::Column::EmailConfirmedAt.is_null())
    };
    let drop_all = |q: sea_orm::UpdateMany<acc::Entity>| {
        q.col_expr(
            acc::Column::PasswordHash,
            Expr::value(Option::<String>::None),
        )
        .col_expr(acc::Column::UserMetadata, Expr::value("{}"))
    };
    let mut outcome = Confirmed::default();
    // The proof was the mail of the sole request that made the pending
    // account: what that request made (an OAuth identity) stays too.
    let mut sole_request = false;
    for _ in 0..3 {
        let Some(a) = acc::Entity::find_by_id(user_id).one(db).await? else {
            return Ok(outcome);
        };
        if a.email_confirmed_at.is_some() {
            return Ok(outcome);
        }
        let admin_address = crate::accounts::users::is_admin_email(Some(&a.email), grant.emails);
        let covered = !admin_address
            && matches!(
                (proof.request_id, a.signup_id),
                (Some(mail), Some(pending)) if mail == pending && pending != CONTESTED
            );
        let mut q = confirm()
            .filter(match a.signup_id {
                Some(s) => acc::Column::SignupId.eq(s),
                None => acc::Column::SignupId.is_null(),
            })
            .filter(match &a.password_hash {
                Some(h) => acc::Column::PasswordHash.eq(h.as_str()),
                None => acc::Column::PasswordHash.is_null(),
            })
            .filter(acc::Column::UserMetadata.eq(a.user_metadata.as_str()));
        if !covered {
            q = drop_all(q);
        }
        if q.exec(db).await?.rows_affected == 1 {
            outcome.first = true;
            outcome.password_dropped = !covered && a.password_hash.is_some();
            sole_request = covered;
            break;
        }
    }
    if !outcome.first {
        // Still changing under us: nothing pre-proof survives.
        outcome.first = drop_all(confirm()).exec(db).await?.rows_affected == 1;
        outcome.password_dropped = outcome.first;
    }
    if outcome.first {
        first_proof_voids(db, user_id, proof, sole_request).await?;
        let account = acc::Entity::find_by_id(user_id).one(db).await?;
        if let Some(a) = &account {
            // The mailbox is proven: its owner may ask for a magic link at
            // once (the slot it shares with confirmations is released).
            super::otp::release_confirmation_slot(db, &a.email_norm).await?;
        }
        let email = account.map(|a| a.email);
        let id = Identity { user_id, email };
        if let Some(by) = grant.grant_reason(&id) {
            let promoted = user_roles::Entity::update_many()
                .col_expr(user_roles::Column::Role, Expr::value(Role::Admin.as_str()))
                .col_expr(user_roles::Column::UpdatedAt, Expr::value(now))
                .filter(user_roles::Column::UserId.eq(user_id))
                .filter(user_roles::Column::Role.ne(Role::Admin.as_str()))
                .exec(db)
                .await?
                .rows_affected;
            if promoted == 1 {
                crate::accounts::users::audit_admin_grant(db, &id, by, Some("member")).await?;
            }
        }
    }
    Ok(outcome)
}

/// What the first proof voids ([`confirm_email`]): identities but `email`
/// and the proving one (all kept when the proof was the mail of the sole
/// request that made the account), every other mail token, PKCE flow state (but the
/// consumed mail's) and session of the account.
async fn first_proof_voids<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    proof: Proof,
    keep_identities: bool,
) -> Result<(), IdentityError> {
    use crate::entities::auth_flow_states as fs;
    if !keep_identities {
        remove_identities(db, user_id, proof).await?;
    }
    super::otp::void_all(db, user_id).await?;
    let mut flows = fs::Entity::delete_many().filter(fs::Column::UserId.eq(user_id));
    if let Some(keep) = proof.flow_state_id {
        flows = flows.filter(fs::Column::Id.ne(keep));
    }
    flows.exec(db).await?;
    super::sessions::revoke_others(db, user_id, None).await
}

async fn remove_identities<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    proof: Proof,
) -> Result<(), IdentityError> {
    let mut identities = ident::Entity::delete_many()
        .filter(ident::Column::UserId.eq(user_id))
        .filter(ident::Column::Provider.ne("email"));
    if let Some(keep) = proof.identity_id {
        identities = identities.filter(ident::Column::Id.ne(keep));
    }
    identities.exec(db).await?;
    Ok(())
}

/// A later sign-up (or code sign-up) of an account whose email is not
/// confirmed yet: in one transaction its credentials replace the pending
/// ones (`password_hash` `None` for a magic-link / code sign-up; `signup_id`
/// the sign-up they belong to, see [`confirm_email`]), and every session and
/// non-`email` identity of the account is removed (an unverified OAuth
/// sign-in that created it keeps nothing). Mailed tokens are left alone: the
/// new mail, if one is sent, voids the earlier codes, and no sign-up voids a
/// link. Returns `false`, changing nothing, when the email was confirmed
/// meanwhile.
pub async fn retake_pending<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    user_id: Uuid,
    password_hash: Option<String>,
    user_metadata: serde_json::Value,
    signup_id: Option<Uuid>,
) -> Result<bool, IdentityError> {
    use crate::entities::auth_sessions as sess;
    let txn = crate::base::db::begin_write(db).await?;
    let now = crate::base::db::now(&txn).await?;
    // Once contested, an account stays contested until it is confirmed: a
    // sign-up that read the account before another request contested it
    // (two sign-ups racing) must not write its stale sign-up id back.
    let keep_contested = Expr::case(acc::Column::SignupId.eq(CONTESTED), Expr::value(CONTESTED))
        .finally(Expr::value(signup_id));
    let taken = acc::Entity::update_many()
        .col_expr(acc::Column::PasswordHash, Expr::value(password_hash))
        .col_expr(acc::Column::SignupId, keep_contested.into())
        .col_expr(
            acc::Column::UserMetadata,
            Expr::value(user_metadata.to_string()),
        )
        .col_expr(acc::Column::UpdatedAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .filter(acc::Column::EmailConfirmedAt.is_null())
        .exec(&txn)
        .await?
        .rows_affected
        == 1;
    if !taken {
        txn.rollback().await?;
        return Ok(false);
    }
    sess::Entity::delete_many()
        .filter(sess::Column::UserId.eq(user_id))
        .exec(&txn)
        .await?;
    ident::Entity::delete_many()
        .filter(ident::Column::UserId.eq(user_id))
        .filter(ident::Column::Provider.ne("email"))
        .exec(&txn)
        .await?;
    txn.commit().await?;
    Ok(true)
}

/// Installs the password parked on a PKCE flow (the sign-up that started it)
/// once that flow's exchange presented its verifier; only on a confirmed
/// account whose password is still the one the first proof left (none): a
/// password the owner set since (a reset, `PUT /user`) is never replaced.
pub async fn install_parked_password<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    hash: &str,
) -> Result<(), IdentityError> {
    let now = crate::base::db::now(db).await?;
    acc::Entity::update_many()
        .col_expr(acc::Column::PasswordHash, Expr::value(hash))
        .col_expr(acc::Column::UpdatedAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .filter(acc::Column::EmailConfirmedAt.is_not_null())
        .filter(acc::Column::PasswordHash.is_null())
        .exec(db)
        .await?;
    Ok(())
}

/// Deletes (with everything that hangs off them) at most `limit` users whose
/// built-in account's email is still unconfirmed and whose last sign-up and
/// confirmation mail are both older than `cutoff` (database clock), that have
/// no identity but `email` and no payment. Returns how many.
pub async fn delete_unconfirmed<C: ConnectionTrait>(
    db: &C,
    cutoff: chrono::DateTime<chrono::Utc>,
    limit: u64,
) -> Result<u64, IdentityError> {
    use crate::entities::payments;
    use sea_orm::sea_query::{Condition, ExprTrait, Query};
    let other_identity = Query::select()
        .expr(Expr::val(1))
        .from(ident::Entity)
        .and_where(
            Expr::col((ident::Entity, ident::Column::UserId))
                .equals((acc::Entity, acc::Column::UserId)),
        )
        .and_where(Expr::col((ident::Entity, ident::Column::Provider)).ne("email"))
        .to_owned();
    let paid = Query::select()
        .expr(Expr::val(1))
        .from(payments::Entity)
        .and_where(
            Expr::col((payments::Entity, payments::Column::UserId))
                .equals((acc::Entity, acc::Column::UserId)),
        )
        .to_owned();
    let stale = Query::select()
        .column((acc::Entity, acc::Column::UserId))
        .from(acc::Entity)
        .and_where(Expr::col((acc::Entity, acc::Column::EmailConfirmedAt)).is_null())
        .and_where(Expr::col((acc::Entity, acc::Column::UpdatedAt)).lt(cutoff))
        .cond_where(
            Condition::any()
                .add(Expr::col((acc::Entity, acc::Column::ConfirmationSentAt)).is_null())
                .add(Expr::col((acc::Entity, acc::Column::ConfirmationSentAt)).lt(cutoff)),
        )
        .and_where(Expr::exists(other_identity).not())
        .and_where(Expr::exists(paid).not())
        .limit(limit)
        .to_owned();
    let res = users::Entity::delete_many()
        .filter(users::Column::Id.in_subquery(stale))
        .exec(db)
        .await?;
    Ok(res.rows_affected)
}

/// Records a successful sign-in (database clock).
pub async fn record_sign_in<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
) -> Result<(), IdentityError> {
    let now = crate::base::db::now(db).await?;
    acc::Entity::update_many()
        .col_expr(acc::Column::LastSignInAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Replaces the password hash.
pub async fn set_password<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    hash: &str,
) -> Result<(), IdentityError> {
    let now = crate::base::db::now(db).await?;
    acc::Entity::update_many()
        .col_expr(acc::Column::PasswordHash, Expr::value(hash))
        .col_expr(acc::Column::UpdatedAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Merges `data` into `user_metadata` (top-level keys; `null` removes a key).
/// Refused ([`IdentityError::MetadataTooLarge`]) only when the result is
/// larger than [`MAX_USER_METADATA_BYTES`] and larger than before, so an
/// account already over the cap can always shrink it.
pub async fn merge_metadata<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    data: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), IdentityError> {
    let Some(a) = acc::Entity::find_by_id(user_id).one(db).await? else {
        return Err(IdentityError::UserNotFound);
    };
    let mut meta: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&a.user_metadata).unwrap_or_default();
    for (k, v) in data {
        if v.is_null() {
            meta.remove(k);
        } else {
            meta.insert(k.clone(), v.clone());
        }
    }
    let merged = serde_json::Value::Object(meta).to_string();
    if merged.len() > MAX_USER_METADATA_BYTES && merged.len() > a.user_metadata.len() {
        return Err(IdentityError::MetadataTooLarge);
    }
    let now = crate::base::db::now(db).await?;
    acc::Entity::update_many()
        .col_expr(acc::Column::UserMetadata, Expr::value(merged))
        .col_expr(acc::Column::UpdatedAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Records `new_email` as the pending email of `user_id`.
///
/// # Errors
/// [`IdentityError::EmailExists`] when another account uses it.
pub async fn request_email_change<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    new_email: &str,
    new_norm: &str,
) -> Result<(), IdentityError> {
    if let Some(other) = find_by_email(db, new_norm).await? {
        if other.user_id != user_id {
            return Err(IdentityError::EmailExists);
        }
    }
    acc::Entity::update_many()
        .col_expr(acc::Column::EmailChange, Expr::value(new_email))
        .col_expr(
            acc::Column::EmailChangeVerified,
            Expr::value(Option::<String>::None),
        )
        .filter(acc::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(())
}

/// A write transaction (SQLite: `BEGIN IMMEDIATE`), for the email change
/// that claims its mail slots and writes its tokens together.
pub async fn begin<C: TransactionTrait>(db: &C) -> Result<C::Transaction, IdentityError> {
    Ok(crate::base::db::begin_write(db).await?)
}

/// After the email-change token `consumed` was consumed: applies the change
/// once both halves of its request are verified (returns `true`), else
/// records this half as verified (`false`, the first half). Proof is
/// recorded, never inferred: the first half verified is stored on the
/// account (`email_change_verified`: its request and the address it was
/// mailed to), and only the other address's half of the same request
/// applies the change, in one conditional UPDATE on that record, the
/// pending address and no email-change token of the account outstanding (a
/// later request's would be). A half voided by a password change, expired
/// or replaced is never taken for verified. Only the address that request
/// named is applied (`email_change`, written in the transaction that issued
/// both halves). Applying voids the account's outstanding recovery,
/// magic-link and email-change tokens (mailed to the old address).
///
/// # Errors
/// [`IdentityError::OtpExpired`] when the token does not belong to the
/// pending change; [`IdentityError::EmailExists`] when the address was taken
/// meanwhile.
pub async fn apply_email_change<C: ConnectionTrait>(
    db: &C,
    consumed: &crate::entities::auth_one_time_tokens::Model,
) -> Result<bool, IdentityError> {
    use crate::entities::auth_one_time_tokens as ott;
    use sea_orm::sea_query::{ExprTrait, Query};
    let user_id = consumed.user_id;
    let Some(a) = acc::Entity::find_by_id(user_id).one(db).await? else {
        return Err(IdentityError::UserNotFound);
    };
    let Some(new_email) = a.email_change.clone() else {
        return Err(IdentityError::OtpExpired);
    };
    let norm = new_email.to_ascii_lowercase();
    // Each half was mailed either to the current or to the pending address.
    match consumed.relates_to.as_deref() {
        Some(to) if to == norm || to == a.email_norm => {}
        _ => return Err(IdentityError::OtpExpired),
    }
    let request = consumed
        .signup_id
        .map(|r| r.to_string())
        .unwrap_or_default();
    let this_half = format!("{request} {}", consumed.relates_to.as_deref().unwrap_or(""));
    let other_half_verified = a.email_change_verified.as_deref().filter(|v| {
        v.split_once(' ')
            .is_some_and(|(r, to)| r == request && Some(to) != consumed.relates_to.as_deref())
    });
    let Some(other_half) = other_half_verified.map(str::to_string) else {
        // The first half: recorded, on the same pending change.
        let res = acc::Entity::update_many()
            .col_expr(acc::Column::EmailChangeVerified, Expr::value(this_half))
            .filter(acc::Column::UserId.eq(user_id))
            .filter(acc::Column::EmailChange.eq(new_email.as_str()))
            .exec(db)
            .await?;
        if res.rows_affected != 1 {
            return Err(IdentityError::OtpExpired);
        }
        return Ok(false);
    };
    let outstanding = Query::select()
        .expr(Expr::val(1))
        .from(ott::Entity)
        .and_where(Expr::col((ott::Entity, ott::Column::UserId)).eq(user_id))
        .and_where(
            Expr::col((ott::Entity, ott::Column::Kind))
                .eq(super::otp::MailKind::EmailChange.as_str()),
        )
        .to_owned();
    let now = crate::base::db::now(db).await?;
    let res = acc::Entity::update_many()
        .col_expr(acc::Column::Email, Expr::value(new_email.clone()))
        .col_expr(acc::Column::EmailNorm, Expr::value(norm))
        .col_expr(
            acc::Column::EmailChange,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            acc::Column::EmailChangeVerified,
            Expr::value(Option::<String>::None),
        )
        .col_expr(acc::Column::UpdatedAt, Expr::value(now))
        .filter(acc::Column::UserId.eq(user_id))
        .filter(acc::Column::EmailChange.eq(new_email.as_str()))
        .filter(acc::Column::EmailChangeVerified.eq(other_half))
        .filter(Expr::exists(outstanding).not())
        .exec(db)
        .await;
    match res {
        Ok(r) if r.rows_affected == 1 => {}
        Ok(_) => return Err(IdentityError::OtpExpired),
        Err(e) if is_unique_violation(&e) => return Err(IdentityError::EmailExists),
        Err(e) => return Err(e.into()),
    }
    users::Entity::update_many()
        .col_expr(users::Column::Email, Expr::value(new_email.clone()))
        .filter(users::Column::Id.eq(user_id))
        .exec(db)
        .await?;
    ident::Entity::update_many()
        .col_expr(ident::Column::Email, Expr::value(new_email))
        .filter(ident::Column::UserId.eq(user_id))
        .filter(ident::Column::Provider.eq("email"))
        .exec(db)
        .await?;
    super::otp::void_kinds(db, user_id, &super::otp::VOIDED_BY_CREDENTIAL_CHANGE).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_normalise_to_lowercase() {
        let (e, n) = normalize_email("  Ann@Example.COM ").unwrap();
        assert_eq!(e, "Ann@Example.COM");
        assert_eq!(n, "ann@example.com");
        assert!(normalize_email("not-an-email").is_err());
        assert!(normalize_email("").is_err());
    }
}
