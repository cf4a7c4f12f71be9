//! OAuth sign-in (GitHub, Google) rules: the provider names, the client's PKCE
//! parameters of `GET /auth/v1/authorize`, and the server-side record of a
//! started authorization (`auth_oauth_states`).
//!
//! A started authorization is kept under the SHA-256 of its `state` (an
//! unguessable random value sent to the provider and echoed back to
//! `GET /auth/v1/callback`), with what the callback needs: the provider, the
//! upstream PKCE verifier (RFC 7636; it never leaves the server), the already
//! checked `redirect_to`, and the client's own PKCE challenge when the client
//! asked for the PKCE flow. The callback takes the record with one conditional
//! `DELETE … RETURNING` (single use, even under concurrent callbacks) and
//! refuses it when it is older than [`STATE_TTL`] by the database's clock.

use std::time::Duration;

use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Set};
use sha2::{Digest, Sha256};

/// How long a started authorization may wait for its callback (10 minutes).
pub const STATE_TTL: Duration = Duration::from_secs(600);

/// Longest `scopes` value accepted from the client, in bytes.
pub const MAX_SCOPES_LEN: usize = 1024;

/// An OAuth provider users may sign in with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OAuthProvider {
    /// GitHub (OAuth app; REST API for the profile).
    Github,
    /// Google (OpenID Connect; the userinfo endpoint for the profile).
    Google,
}

impl OAuthProvider {
    /// Every provider, in the order `/settings` lists them.
    pub const ALL: [OAuthProvider; 2] = [OAuthProvider::Github, OAuthProvider::Google];

    /// The wire name: `github` or `google`.
    pub fn as_str(self) -> &'static str {
        match self {
            OAuthProvider::Github => "github",
            OAuthProvider::Google => "google",
        }
    }

    /// The provider named `name` (`github` / `google`, any case), if any.
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name))
    }

    /// The scopes always requested: GitHub `read:user user:email`, Google
    /// `openid email profile`.
    pub fn default_scopes(self) -> &'static [&'static str] {
        match self {
            OAuthProvider::Github => &["read:user", "user:email"],
            OAuthProvider::Google => &["openid", "email", "profile"],
        }
    }
}

/// A bad parameter of `GET /auth/v1/authorize` (names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct OAuthInputError {
    /// The query parameter at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> OAuthInputError {
    OAuthInputError {
        field,
        message: message.into(),
    }
}

pub use crate::identity::flow::ChallengeMethod;

/// The client's PKCE challenge: present means the PKCE flow (the callback
/// redirects with `?code=`), absent the implicit flow (`#access_token=…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPkce {
    /// `code_challenge`, 43–128 characters of `[A-Za-z0-9-._~]`.
    pub challenge: String,
    /// `code_challenge_method`.
    pub method: ChallengeMethod,
}

/// Checks the client's `code_challenge` / `code_challenge_method` with the
/// identity provider's rule ([`crate::identity::flow::pkce_params`]): both
/// absent → `None` (implicit flow); both present and valid → the PKCE flow;
/// one without the other, a challenge outside RFC 7636's 43–128 unreserved
/// characters, or a method other than `s256`/`plain` → an error naming the field.
pub fn client_pkce(
    challenge: Option<&str>,
    method: Option<&str>,
) -> Result<Option<ClientPkce>, OAuthInputError> {
    let has = |v: Option<&str>| v.is_some_and(|v| !v.trim().is_empty());
    match crate::identity::flow::pkce_params(challenge, method) {
        Ok(p) => Ok(p.map(|(challenge, method)| ClientPkce { challenge, method })),
        Err(e) => {
            let method_at_fault = (has(challenge) && !has(method))
                || (has(method)
                    && method
                        .and_then(|m| ChallengeMethod::parse(m.trim()).ok())
                        .is_none());
            let field = if method_at_fault {
                "code_challenge_method"
            } else {
                "code_challenge"
            };
            Err(bad(field, e.to_string()))
        }
    }
}

/// The extra scopes a client asked for (`scopes`, separated by spaces or
/// commas), added to the provider's defaults without duplicates. Each scope is
/// printable ASCII without quotes or backslashes; the whole value at most
/// [`MAX_SCOPES_LEN`] bytes.
pub fn scopes(
    provider: OAuthProvider,
    extra: Option<&str>,
) -> Result<Vec<String>, OAuthInputError> {
    let mut out: Vec<String> = provider
        .default_scopes()
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let Some(extra) = extra else {
        return Ok(out);
    };
    if extra.len() > MAX_SCOPES_LEN {
        return Err(bad("scopes", format!("at most {MAX_SCOPES_LEN} bytes")));
    }
    for scope in extra.split([' ', ',']).filter(|s| !s.is_empty()) {
        let ok = scope
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\'));
        if !ok {
            return Err(bad("scopes", format!("invalid scope {scope:?}")));
        }
        if !out.iter().any(|s| s == scope) {
            out.push(scope.to_owned());
        }
    }
    Ok(out)
}

/// The SHA-256 of a `state`, lowercase hex: the key the record is stored under.
pub fn state_hash(state: &str) -> String {
    let digest = Sha256::digest(state.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The S256 challenge of a PKCE verifier (RFC 7636 §4.2):
/// `BASE64URL-NOPAD(SHA256(ASCII(verifier)))`.
pub fn s256_challenge(verifier: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// `auth_oauth_states`: started authorizations waiting for their callback.
pub mod state_row {
    use sea_orm::entity::prelude::*;

    /// One started authorization.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "auth_oauth_states")]
    pub struct Model {
        /// SHA-256 (hex) of the `state` sent to the provider.
        #[sea_orm(primary_key, auto_increment = false, column_type = "Text")]
        pub state_hash: String,
        /// `github` / `google`.
        #[sea_orm(column_type = "Text")]
        pub provider: String,
        /// The upstream PKCE verifier (sent only to the provider's token endpoint).
        #[sea_orm(column_type = "Text")]
        pub pkce_verifier: String,
        /// Where the browser goes after the callback (already checked).
        #[sea_orm(column_type = "Text")]
        pub redirect_to: String,
        /// The client's `code_challenge` (PKCE flow), `None` for the implicit flow.
        #[sea_orm(column_type = "Text", nullable)]
        pub code_challenge: Option<String>,
        /// `s256` / `plain` with `code_challenge`.
        #[sea_orm(column_type = "Text", nullable)]
        pub code_challenge_method: Option<String>,
        /// When the authorization started, by the database's clock.
        pub created_at: DateTimeUtc,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// What `GET /auth/v1/authorize` keeps for the callback.
#[derive(Debug, Clone)]
pub struct NewState<'a> {
    /// The random `state` sent to the provider (stored only hashed).
    pub state: &'a str,
    /// The provider.
    pub provider: OAuthProvider,
    /// The upstream PKCE verifier.
    pub pkce_verifier: &'a str,
    /// The checked `redirect_to`.
    pub redirect_to: &'a str,
    /// The client's PKCE challenge, when it asked for the PKCE flow.
    pub client_pkce: Option<&'a ClientPkce>,
}

/// Stores a started authorization, stamped with the database's clock, and
/// removes records older than [`STATE_TTL`] (so abandoned ones do not pile up).
///
/// # Errors
/// Database errors.
pub async fn save_state<C: ConnectionTrait>(db: &C, new: &NewState<'_>) -> Result<(), DbErr> {
    let now = crate::base::db::now(db).await?;
    let cutoff = now - chrono::Duration::from_std(STATE_TTL).unwrap_or_default();
    state_row::Entity::delete_many()
        .filter(state_row::Column::CreatedAt.lt(cutoff))
        .exec(db)
        .await?;
    state_row::Entity::insert(state_row::ActiveModel {
        state_hash: Set(state_hash(new.state)),
        provider: Set(new.provider.as_str().to_owned()),
        pkce_verifier: Set(new.pkce_verifier.to_owned()),
        redirect_to: Set(new.redirect_to.to_owned()),
        code_challenge: Set(new.client_pkce.map(|p| p.challenge.clone())),
        code_challenge_method: Set(new.client_pkce.map(|p| p.method.as_str().to_owned())),
        created_at: Set(now),
    })
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Deletes the started authorizations older than [`STATE_TTL`] (database
/// clock): the scheduler's purge, so abandoned ones do not pile up while no
/// new authorization comes. Returns how many.
///
/// # Errors
/// Database errors.
pub async fn delete_expired_states<C: ConnectionTrait>(db: &C) -> Result<u64, DbErr> {
    let now = crate::base::db::now(db).await?;
    let cutoff = now - chrono::Duration::from_std(STATE_TTL).unwrap_or_default();
    Ok(state_row::Entity::delete_many()
        .filter(state_row::Column::CreatedAt.lt(cutoff))
        .exec(db)
        .await?
        .rows_affected)
}

/// The outcome of [`take_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakenState {
    /// The record, now deleted: this callback is the only one to get it.
    Found(Box<TakenRecord>),
    /// No such state (never issued, or already used).
    NotFound,
    /// The state existed but is older than [`STATE_TTL`] (now deleted).
    Expired,
}

/// A started authorization taken by its callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenRecord {
    /// The provider the authorization was started with.
    pub provider: OAuthProvider,
    /// The upstream PKCE verifier.
    pub pkce_verifier: String,
    /// The checked `redirect_to`.
    pub redirect_to: String,
    /// The client's PKCE challenge (PKCE flow) or `None` (implicit flow).
    pub client_pkce: Option<ClientPkce>,
}

/// Takes the record of `state` with one `DELETE … RETURNING` (single use) and
/// checks its age against the database's clock.
///
/// # Errors
/// Database errors.
pub async fn take_state<C: ConnectionTrait>(db: &C, state: &str) -> Result<TakenState, DbErr> {
    let mut rows = state_row::Entity::delete_many()
        .filter(state_row::Column::StateHash.eq(state_hash(state)))
        .exec_with_returning(db)
        .await?;
    let Some(row) = rows.pop() else {
        return Ok(TakenState::NotFound);
    };
    let now = crate::base::db::now(db).await?;
    let age = now.signed_duration_since(row.created_at);
    if age > chrono::Duration::from_std(STATE_TTL).unwrap_or_default() {
        return Ok(TakenState::Expired);
    }
    let Some(provider) = OAuthProvider::parse(&row.provider) else {
        return Ok(TakenState::NotFound);
    };
    let client_pkce = match (row.code_challenge, row.code_challenge_method.as_deref()) {
        (Some(challenge), Some(m)) => ChallengeMethod::parse(m)
            .ok()
            .map(|method| ClientPkce { challenge, method }),
        _ => None,
    };
    Ok(TakenState::Found(Box::new(TakenRecord {
        provider,
        pkce_verifier: row.pkce_verifier,
        redirect_to: row.redirect_to,
        client_pkce,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    #[test]
    fn providers_parse_by_wire_name() {
        assert_eq!(OAuthProvider::parse("github"), Some(OAuthProvider::Github));
        assert_eq!(OAuthProvider::parse("Google"), Some(OAuthProvider::Google));
        assert_eq!(OAuthProvider::parse("gitlab"), None);
        assert_eq!(OAuthProvider::parse(""), None);
        assert_eq!(OAuthProvider::Github.as_str(), "github");
    }

    #[test]
    fn no_challenge_is_the_implicit_flow() {
        assert_eq!(client_pkce(None, None), Ok(None));
        assert_eq!(client_pkce(Some(" "), Some("")), Ok(None));
    }

    #[test]
    fn a_valid_challenge_is_the_pkce_flow() {
        let p = client_pkce(Some(CHALLENGE), Some("s256")).unwrap().unwrap();
        assert_eq!(p.method, ChallengeMethod::S256);
        assert_eq!(p.challenge, CHALLENGE);
        let p = client_pkce(Some(CHALLENGE), Some("PLAIN"))
            .unwrap()
            .unwrap();
        assert_eq!(p.method, ChallengeMethod::Plain);
    }

    #[test]
    fn half_or_malformed_pkce_names_the_field() {
        assert_eq!(
            client_pkce(Some(CHALLENGE), None).unwrap_err().field,
            "code_challenge_method"
        );
        assert_eq!(
            client_pkce(None, Some("s256")).unwrap_err().field,
            "code_challenge"
        );
        assert_eq!(
            client_pkce(Some(CHALLENGE), Some("md5")).unwrap_err().field,
            "code_challenge_method"
        );
        assert_eq!(
            client_pkce(Some("short"), Some("s256")).unwrap_err().field,
            "code_challenge"
        );
        let bad_chars = format!("{}+/", &CHALLENGE[..41]);
        assert_eq!(
            client_pkce(Some(&bad_chars), Some("s256"))
                .unwrap_err()
                .field,
            "code_challenge"
        );
        let long = "a".repeat(129);
        assert!(client_pkce(Some(&long), Some("plain")).is_err());
    }

    #[test]
    fn scopes_add_to_the_defaults_once() {
        assert_eq!(
            scopes(OAuthProvider::Github, None).unwrap(),
            vec!["read:user", "user:email"]
        );
        assert_eq!(
            scopes(OAuthProvider::Google, Some("email repo,https://x.test/a")).unwrap(),
            vec!["openid", "email", "profile", "repo", "https://x.test/a"]
        );
        assert_eq!(
            scopes(OAuthProvider::Github, Some("a\"b"))
                .unwrap_err()
                .field,
            "scopes"
        );
        assert!(scopes(OAuthProvider::Github, Some(&"a".repeat(2000))).is_err());
    }

    #[test]
    fn s256_matches_rfc_7636_appendix_b() {
        assert_eq!(
            s256_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            CHALLENGE
        );
    }

    #[test]
    fn the_state_is_stored_hashed() {
        let h = state_hash("abc");
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(state_hash("abd"), h);
    }
}
