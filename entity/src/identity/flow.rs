//! PKCE flow states (RFC 7636): started with a code challenge, completed by
//! an auth code that is exchanged once with the matching code verifier.
//!
//! Expiry: an auth code is exchangeable for [`FLOW_STATE_EXPIRY_SECS`] after
//! it was issued, judged by the database's clock. Single use: the exchange
//! deletes the row with a conditional DELETE; of two concurrent exchanges
//! exactly one gets the session.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set,
};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::{tokens, IdentityError};
use crate::entities::auth_flow_states as fs;

/// How long an issued auth code stays exchangeable (the platform's 5 minutes).
pub const FLOW_STATE_EXPIRY_SECS: i64 = 300;

/// The PKCE challenge method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeMethod {
    /// `code_challenge = BASE64URL(SHA256(verifier))`.
    S256,
    /// `code_challenge = verifier`.
    Plain,
}

impl ChallengeMethod {
    /// Parses `s256` / `plain` (any case).
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        match s.to_ascii_lowercase().as_str() {
            "s256" => Ok(Self::S256),
            "plain" => Ok(Self::Plain),
            _ => Err(IdentityError::Validation(
                "code_challenge_method: expected s256 or plain".into(),
            )),
        }
    }

    /// `s256` or `plain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::S256 => "s256",
            Self::Plain => "plain",
        }
    }
}

/// What a flow starts with.
#[derive(Debug, Clone)]
pub struct FlowStart {
    /// `email`, `github`, `google`.
    pub provider: String,
    /// The client's code challenge (43–128 characters).
    pub code_challenge: String,
    /// `s256` or `plain` (any case).
    pub code_challenge_method: String,
    /// What the flow authenticates: `signup`, `magiclink`, `recovery`,
    /// `email_change`, `oauth`, …
    pub authentication_method: String,
    /// The user when already known (email flows), `None` for OAuth until the callback.
    pub user_id: Option<Uuid>,
    /// The password of the sign-up that starts this flow, installed by its
    /// exchange ([`Exchanged::password_hash`]).
    pub password_hash: Option<String>,
}

/// The PKCE parameters of a request: both or neither (`null` counts as absent).
///
/// # Errors
/// [`IdentityError::Validation`] when only one is given, or either is malformed.
pub fn pkce_params(
    challenge: Option<&str>,
    method: Option<&str>,
) -> Result<Option<(String, ChallengeMethod)>, IdentityError> {
    let challenge = challenge.map(str::trim).filter(|c| !c.is_empty());
    let method = method.map(str::trim).filter(|c| !c.is_empty());
    match (challenge, method) {
        (None, None) => Ok(None),
        (Some(c), Some(m)) => {
            let m = ChallengeMethod::parse(m)?;
            if !(43..=128).contains(&c.len())
                || !c
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
            {
                return Err(IdentityError::Validation(
                    "code_challenge: 43 to 128 characters of [A-Za-z0-9-._~]".into(),
                ));
            }
            Ok(Some((c.to_string(), m)))
        }
        _ => Err(IdentityError::Validation(
            "PKCE flow requires code_challenge_method and code_challenge".into(),
        )),
    }
}

/// Whether `verifier` matches `challenge` under `method` (constant time).
pub fn verify_pkce(challenge: &str, method: ChallengeMethod, verifier: &str) -> bool {
    let computed = match method {
        ChallengeMethod::S256 => URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())),
        ChallengeMethod::Plain => verifier.to_string(),
    };
    computed.as_bytes().ct_eq(challenge.as_bytes()).into()
}

/// Stores a new flow state and returns its id.
///
/// # Errors
/// [`IdentityError::Validation`] for a bad challenge or method; database errors.
pub async fn create_flow_state<C: ConnectionTrait>(
    db: &C,
    start: FlowStart,
) -> Result<Uuid, IdentityError> {
    let Some((challenge, method)) = pkce_params(
        Some(&start.code_challenge),
        Some(&start.code_challenge_method),
    )?
    else {
        return Err(IdentityError::Validation(
            "code_challenge is required".into(),
        ));
    };
    let now = crate::base::db::now(db).await?;
    let id = Uuid::new_v4();
    fs::ActiveModel {
        id: Set(id),
        user_id: Set(start.user_id),
        provider: Set(start.provider),
        code_challenge: Set(challenge),
        code_challenge_method: Set(method.as_str().to_string()),
        authentication_method: Set(start.authentication_method),
        auth_code_digest: Set(None),
        auth_code_issued_at: Set(None),
        password_hash: Set(start.password_hash),
        created_at: Set(now),
    }
    .insert(db)
    .await?;
    Ok(id)
}

/// Issues the auth code of flow `flow_id` for `user_id` (once: a second call
/// for the same flow is [`IdentityError::FlowStateNotFound`]). The code is
/// returned once and stored as its SHA-256.
pub async fn issue_auth_code<C: ConnectionTrait>(
    db: &C,
    flow_id: Uuid,
    user_id: Uuid,
) -> Result<String, IdentityError> {
    let code = Uuid::new_v4().to_string();
    let now = crate::base::db::now(db).await?;
    let res = fs::Entity::update_many()
        .col_expr(
            fs::Column::AuthCodeDigest,
            Expr::value(tokens::sha256_hex(&code)),
        )
        .col_expr(fs::Column::AuthCodeIssuedAt, Expr::value(now))
        .col_expr(fs::Column::UserId, Expr::value(user_id))
        .filter(fs::Column::Id.eq(flow_id))
        .filter(fs::Column::AuthCodeDigest.is_null())
        .exec(db)
        .await?;
    if res.rows_affected != 1 {
        return Err(IdentityError::FlowStateNotFound);
    }
    Ok(code)
}

/// A completed PKCE exchange.
#[derive(Debug, Clone)]
pub struct Exchanged {
    /// The user.
    pub user_id: Uuid,
    /// `email`, `github`, `google`.
    pub provider: String,
    /// What the flow authenticated (`magiclink`, `recovery`, `oauth`, …).
    pub authentication_method: String,
    /// The password of the sign-up that started the flow, to install now
    /// (the verifier proves that sign-up's browser, the auth code the mailbox).
    pub password_hash: Option<String>,
}

/// Exchanges `auth_code` with `verifier`: unknown or used →
/// [`IdentityError::FlowStateNotFound`], issued more than
/// [`FLOW_STATE_EXPIRY_SECS`] ago → [`IdentityError::FlowStateExpired`],
/// wrong verifier → [`IdentityError::BadCodeVerifier`] (the flow stays usable
/// until it expires). Success consumes the flow (conditional DELETE).
pub async fn exchange<C: ConnectionTrait>(
    db: &C,
    auth_code: &str,
    verifier: &str,
) -> Result<Exchanged, IdentityError> {
    let auth_code = auth_code.trim();
    if auth_code.is_empty() {
        return Err(IdentityError::Validation("auth_code is required".into()));
    }
    if !(43..=128).contains(&verifier.len()) {
        return Err(IdentityError::Validation(
            "code_verifier: 43 to 128 characters".into(),
        ));
    }
    let Some(row) = fs::Entity::find()
        .filter(fs::Column::AuthCodeDigest.eq(tokens::sha256_hex(auth_code)))
        .one(db)
        .await?
    else {
        return Err(IdentityError::FlowStateNotFound);
    };
    let (Some(user_id), Some(issued)) = (row.user_id, row.auth_code_issued_at) else {
        return Err(IdentityError::FlowStateNotFound);
    };
    let now = crate::base::db::now(db).await?;
    if (now - issued).num_milliseconds() > FLOW_STATE_EXPIRY_SECS * 1000 {
        return Err(IdentityError::FlowStateExpired);
    }
    let method = ChallengeMethod::parse(&row.code_challenge_method)?;
    if !verify_pkce(&row.code_challenge, method, verifier) {
        return Err(IdentityError::BadCodeVerifier);
    }
    let res = fs::Entity::delete_many()
        .filter(fs::Column::Id.eq(row.id))
        .exec(db)
        .await?;
    if res.rows_affected != 1 {
        return Err(IdentityError::FlowStateNotFound);
    }
    Ok(Exchanged {
        user_id,
        provider: row.provider,
        authentication_method: row.authentication_method,
        password_hash: row.password_hash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7636 appendix B.
    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    #[test]
    fn s256_matches_the_rfc_example() {
        assert!(verify_pkce(CHALLENGE, ChallengeMethod::S256, VERIFIER));
        assert!(!verify_pkce(CHALLENGE, ChallengeMethod::S256, "x"));
        assert!(verify_pkce(VERIFIER, ChallengeMethod::Plain, VERIFIER));
        assert!(!verify_pkce(CHALLENGE, ChallengeMethod::Plain, VERIFIER));
    }

    #[test]
    fn pkce_params_need_both_or_neither() {
        assert!(pkce_params(None, None).unwrap().is_none());
        assert!(pkce_params(Some(""), Some("")).unwrap().is_none());
        assert!(pkce_params(Some(CHALLENGE), None).is_err());
        assert!(pkce_params(None, Some("s256")).is_err());
        assert!(pkce_params(Some(CHALLENGE), Some("md5")).is_err());
        assert!(pkce_params(Some("short"), Some("s256")).is_err());
        let (c, m) = pkce_params(Some(CHALLENGE), Some("S256")).unwrap().unwrap();
        assert_eq!((c.as_str(), m), (CHALLENGE, ChallengeMethod::S256));
    }
}
