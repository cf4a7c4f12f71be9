//! OAuth sign-ins (GoTrue's `external.go`): which user a provider's profile
//! signs in, and whether the sign-in may have a session.
//!
//! The rule, as for every other sign-in: a session (or a PKCE auth code) is
//! issued only for an account whose address is proven, or for an identity
//! that the owner's proof kept. A provider that verified the address proves
//! it ([`super::account::confirm_email`] with the identity as proof). An
//! unverified address gets no session: the sign-in makes (or keeps) the
//! pending account and its confirmation mail is issued for that sign-in
//! (GoTrue's `provider_email_needs_verification`); an unverified address
//! that another account holds is refused, nothing made.
//!
//! The grant itself ([`grant_session`], [`grant_flow`]) holds the identity's
//! row while it re-checks and issues, and the first proof runs in one
//! transaction that deletes the identities it does not keep before it
//! deletes sessions and flows: whichever comes first, a sign-in racing the
//! owner's first proof never keeps a session the proof did not keep.

use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
    QuerySelect, Set, TransactionSession, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{
    account::{self, confirm_email, find_by_email, normalize_email, Proof, CONTESTED},
    flow, is_unique_violation, sessions, IdentityError,
};
use crate::{
    accounts::users::{AdminGrant, Identity},
    entities::{auth_accounts as acc, auth_identities as ident},
};

/// A profile from an OAuth provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OAuthProfile {
    /// `github`, `google`.
    pub provider: String,
    /// The provider's account id.
    pub provider_id: String,
    /// The provider's primary email, if any.
    pub email: Option<String>,
    /// Whether the provider says that email is verified.
    pub email_verified: bool,
    /// Name, avatar, … (becomes `user_metadata` of a new account and the identity's data).
    pub user_metadata: serde_json::Value,
}

/// What an OAuth sign-in may do ([`sign_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum External {
    /// Sign in: issue a session ([`grant_session`]) or a PKCE auth code
    /// ([`grant_flow`]) for this identity.
    SignedIn {
        /// The user.
        user_id: Uuid,
        /// The identity of `(provider, provider_id)`.
        identity_id: Uuid,
    },
    /// The address is not proven: no session; mail a confirmation to it,
    /// issued for `request_id` (the sign-in that made the pending account;
    /// `None` once another request touched it).
    NeedsConfirmation {
        /// The pending account's user.
        user_id: Uuid,
        /// The address as stored.
        email: String,
        /// The address normalised.
        email_norm: String,
        /// The request the mail is issued for.
        request_id: Option<Uuid>,
    },
    /// An unverified address that another account holds (or none at all):
    /// refused, nothing made.
    Refused,
}

/// The user of an OAuth sign-in and what it may do: the user already
/// linked to `(provider, provider_id)`; else the built-in account with the
/// same email when the provider says the email is verified (linked now, and
/// confirmed by that proof when pending); else a new account (confirmed when
/// the email is verified, else pending with this sign-in as its sole
/// request) with the default rows.
///
/// Errors: `validation_failed` for an empty provider or id, or
/// `user_metadata` over 4 KiB as JSON; database errors.
pub async fn sign_in<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    profile: &OAuthProfile,
    grant: &AdminGrant<'_>,
) -> Result<External, IdentityError> {
    if profile.provider.trim().is_empty() || profile.provider_id.trim().is_empty() {
        return Err(IdentityError::Validation(
            "provider and provider_id are required".into(),
        ));
    }
    account::check_metadata(&profile.user_metadata)?;
    let now = crate::base::db::now(db).await?;
    if let Some(i) = linked(db, profile).await? {
        ident::Entity::update_many()
            .col_expr(ident::Column::LastSignInAt, Expr::value(now))
            .col_expr(
                ident::Column::IdentityData,
                Expr::value(profile.user_metadata.to_string()),
            )
            .filter(ident::Column::Id.eq(i.id))
            .exec(db)
            .await?;
        return decide(db, &i, profile, grant).await;
    }
    let Some((email, norm)) = profile.email.as_deref().map(normalize_email).transpose()? else {
        return Ok(External::Refused);
    };
    let verified = profile.email_verified;
    if let Some(a) = find_by_email(db, &norm).await? {
        if !verified {
            return Ok(External::Refused);
        }
        let res = account::insert_identity(
            db,
            a.user_id,
            &profile.provider,
            &profile.provider_id,
            Some(&a.email),
            profile.user_metadata.clone(),
            now,
        )
        .await;
        return match res {
            Ok(identity_id) => {
                if a.email_confirmed_at.is_none() {
                    // The provider's proof of the address is its first proof.
                    confirm_email(
                        db,
                        a.user_id,
                        grant,
                        Proof {
                            identity_id: Some(identity_id),
                            ..Proof::default()
                        },
                    )
                    .await?;
                }
                Ok(External::SignedIn {
                    user_id: a.user_id,
                    identity_id,
                })
            }
            // A concurrent callback linked it first.
            Err(e) if is_unique_violation(&e) => relinked(db, profile, grant).await,
            Err(e) => Err(e.into()),
        };
    }
    // A new account: confirmed by a verified address, else pending with this
    // sign-in as its sole request.
    let (user_id, request_id) = (Uuid::new_v4(), Uuid::new_v4());
    let txn = crate::base::db::begin_write(db).await?;
    let result = async {
        let no_grant = AdminGrant::default();
        crate::accounts::users::ensure_user_granting(
            &txn,
            &Identity {
                user_id,
                email: Some(email.clone()),
            },
            if verified { grant } else { &no_grant },
        )
        .await?;
        acc::ActiveModel {
            user_id: Set(user_id),
            email: Set(email.clone()),
            email_norm: Set(norm.clone()),
            password_hash: Set(None),
            email_confirmed_at: Set(verified.then_some(now)),
            signup_id: Set((!verified).then_some(request_id)),
            email_change: Set(None),
            email_change_verified: Set(None),
            confirmation_sent_at: Set(None),
            recovery_sent_at: Set(None),
            magiclink_sent_at: Set(None),
            email_change_sent_at: Set(None),
            reauthentication_sent_at: Set(None),
            last_sign_in_at: Set(None),
            user_metadata: Set(profile.user_metadata.to_string()),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(&txn)
        .await?;
        account::insert_identity(
            &txn,
            user_id,
            &profile.provider,
            &profile.provider_id,
            Some(email.as_str()),
            profile.user_metadata.clone(),
            now,
        )
        .await
    }
    .await;
    match result {
        Ok(identity_id) => {
            txn.commit().await?;
            Ok(if verified {
                External::SignedIn {
                    user_id,
                    identity_id,
                }
            } else {
                External::NeedsConfirmation {
                    user_id,
                    email,
                    email_norm: norm,
                    request_id: Some(request_id),
                }
            })
        }
        // A concurrent callback made the identity, or a sign-up the address.
        Err(e) if is_unique_violation(&e) => {
            txn.rollback().await?;
            relinked(db, profile, grant).await
        }
        Err(e) => Err(e.into()),
    }
}

/// What a linked identity may do: sign in when its account's address is
/// confirmed (or it has no account of its own and the provider verified its
/// address); a pending account is confirmed when the provider verified its
/// very address, else it waits for the mail.
async fn decide<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    i: &ident::Model,
    profile: &OAuthProfile,
    grant: &AdminGrant<'_>,
) -> Result<External, IdentityError> {
    let signed_in = External::SignedIn {
        user_id: i.user_id,
        identity_id: i.id,
    };
    let Some(a) = acc::Entity::find_by_id(i.user_id).one(db).await? else {
        return Ok(if profile.email_verified {
            signed_in
        } else {
            External::Refused
        });
    };
    if a.email_confirmed_at.is_some() {
        return Ok(signed_in);
    }
    let proves_it = profile.email_verified
        && profile
            .email
            .as_deref()
            .and_then(|e| normalize_email(e).ok())
            .is_some_and(|(_, norm)| norm == a.email_norm);
    if proves_it {
        confirm_email(
            db,
            a.user_id,
            grant,
            Proof {
                identity_id: Some(i.id),
                ..Proof::default()
            },
        )
        .await?;
        return Ok(signed_in);
    }
    Ok(External::NeedsConfirmation {
        user_id: a.user_id,
        email: a.email,
        email_norm: a.email_norm,
        request_id: a.signup_id.filter(|s| *s != CONTESTED),
    })
}

async fn linked<C: ConnectionTrait>(
    db: &C,
    profile: &OAuthProfile,
) -> Result<Option<ident::Model>, IdentityError> {
    Ok(ident::Entity::find()
        .filter(ident::Column::Provider.eq(profile.provider.as_str()))
        .filter(ident::Column::ProviderId.eq(profile.provider_id.as_str()))
        .one(db)
        .await?)
}

/// After a unique violation: the identity a concurrent callback linked, or
/// refused (a sign-up took the address meanwhile).
async fn relinked<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    profile: &OAuthProfile,
    grant: &AdminGrant<'_>,
) -> Result<External, IdentityError> {
    match linked(db, profile).await? {
        Some(i) => decide(db, &i, profile, grant).await,
        None => Ok(External::Refused),
    }
}

/// Holds the identity's row (PostgreSQL `FOR UPDATE`; SQLite's write
/// transaction holds everything) and re-checks that it may sign in: it
/// still exists (the owner's first proof did not remove it) and its
/// account's address is confirmed (or it has no account of its own).
async fn hold<C: ConnectionTrait>(
    txn: &C,
    user_id: Uuid,
    identity_id: Uuid,
) -> Result<bool, IdentityError> {
    let held = ident::Entity::find_by_id(identity_id)
        .filter(ident::Column::UserId.eq(user_id))
        .lock_exclusive()
        .one(txn)
        .await?;
    if held.is_none() {
        return Ok(false);
    }
    Ok(acc::Entity::find_by_id(user_id)
        .one(txn)
        .await?
        .is_none_or(|a| a.email_confirmed_at.is_some()))
}

/// Issues the session of a [`External::SignedIn`] sign-in, holding the
/// identity (see the module docs). `None`: the identity was removed or its
/// account is not confirmed any more by the time of the grant (refused).
pub async fn grant_session<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    secret: &[u8],
    user_id: Uuid,
    identity_id: Uuid,
) -> Result<Option<sessions::IssuedSession>, IdentityError> {
    let txn = crate::base::db::begin_write(db).await?;
    if !hold(&txn, user_id, identity_id).await? {
        txn.rollback().await?;
        return Ok(None);
    }
    let issued = sessions::create(&txn, secret, user_id, "oauth").await?;
    txn.commit().await?;
    Ok(Some(issued))
}

/// Starts the PKCE flow of a [`External::SignedIn`] sign-in and issues its
/// auth code, holding the identity (see the module docs). `None`: refused,
/// as for [`grant_session`].
pub async fn grant_flow<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    user_id: Uuid,
    identity_id: Uuid,
    start: flow::FlowStart,
) -> Result<Option<String>, IdentityError> {
    let txn = crate::base::db::begin_write(db).await?;
    if !hold(&txn, user_id, identity_id).await? {
        txn.rollback().await?;
        return Ok(None);
    }
    let flow_id = flow::create_flow_state(&txn, start).await?;
    let code = flow::issue_auth_code(&txn, flow_id, user_id).await?;
    txn.commit().await?;
    Ok(Some(code))
}
