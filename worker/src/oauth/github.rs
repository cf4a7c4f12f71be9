//! GitHub's profile (REST API, version `2022-11-28`): `GET {api}/user` for the
//! account (`id`, `login`, `name`, `avatar_url`, `email`) and
//! `GET {api}/user/emails` (scope `user:email`) for the addresses
//! (`[{email, primary, verified, visibility}]`): the primary verified address
//! is taken, else the first verified one, else the primary one (reported
//! unverified).

use serde::Deserialize;
use serde_json::json;

use super::{get_json, OAuthError, OAuthProfile};
use entity::identity::oauth::OAuthProvider;

/// The `iss` GitHub identities carry in `user_metadata` (as the platform writes it).
pub const ISSUER: &str = "https://api.github.com";

/// The fields of `GET /user` we read.
#[derive(Debug, Deserialize)]
pub struct GithubUser {
    /// Numeric account id (stable).
    pub id: u64,
    /// The handle.
    pub login: String,
    /// Display name, when set.
    #[serde(default)]
    pub name: Option<String>,
    /// Avatar image URL.
    #[serde(default)]
    pub avatar_url: Option<String>,
    /// The public email, when set.
    #[serde(default)]
    pub email: Option<String>,
}

/// One entry of `GET /user/emails`.
#[derive(Debug, Clone, Deserialize)]
pub struct GithubEmail {
    /// The address.
    pub email: String,
    /// Whether it is the primary address.
    #[serde(default)]
    pub primary: bool,
    /// Whether GitHub verified it.
    #[serde(default)]
    pub verified: bool,
}

/// The address to sign in with and whether it is verified (see the module docs);
/// `None` when the list holds no address and the account shows none.
pub fn pick_email(emails: &[GithubEmail], public: Option<&str>) -> Option<(String, bool)> {
    emails
        .iter()
        .find(|e| e.primary && e.verified)
        .or_else(|| emails.iter().find(|e| e.verified))
        .map(|e| (e.email.clone(), true))
        .or_else(|| {
            emails
                .iter()
                .find(|e| e.primary)
                .map(|e| (e.email.clone(), false))
        })
        .or_else(|| {
            public
                .filter(|e| !e.is_empty())
                .map(|e| (e.to_owned(), false))
        })
}

/// The profile from the two documented answers.
///
/// # Errors
/// [`OAuthError::NoEmail`] when no address is known.
pub fn to_profile(user: &GithubUser, emails: &[GithubEmail]) -> Result<OAuthProfile, OAuthError> {
    let (email, email_verified) =
        pick_email(emails, user.email.as_deref()).ok_or(OAuthError::NoEmail)?;
    let id = user.id.to_string();
    let name = user.name.clone().unwrap_or_else(|| user.login.clone());
    Ok(OAuthProfile {
        provider: OAuthProvider::Github,
        provider_id: id.clone(),
        email: email.clone(),
        email_verified,
        user_metadata: json!({
            "iss": ISSUER,
            "sub": id,
            "provider_id": id,
            "email": email,
            "email_verified": email_verified,
            "phone_verified": false,
            "name": name,
            "full_name": user.name,
            "user_name": user.login,
            "preferred_username": user.login,
            "avatar_url": user.avatar_url,
        }),
    })
}

/// Reads the user and their addresses from GitHub's REST API at `api`.
///
/// # Errors
/// [`OAuthError::Unavailable`], [`OAuthError::Undocumented`],
/// [`OAuthError::NoEmail`].
pub async fn profile(
    http: &reqwest::Client,
    api: &str,
    access_token: &str,
) -> Result<OAuthProfile, OAuthError> {
    let get = |path: &str| {
        http.get(format!("{}{path}", api.trim_end_matches('/')))
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
    };
    let (user, emails) = tokio::try_join!(
        get_json(get("/user"), access_token),
        get_json(get("/user/emails"), access_token)
    )?;
    let user: GithubUser = serde_json::from_value(user)
        .map_err(|e| OAuthError::Undocumented(format!("GET /user: {e}")))?;
    let emails: Vec<GithubEmail> = serde_json::from_value(emails)
        .map_err(|e| OAuthError::Undocumented(format!("GET /user/emails: {e}")))?;
    to_profile(&user, &emails)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn email(e: &str, primary: bool, verified: bool) -> GithubEmail {
        GithubEmail {
            email: e.into(),
            primary,
            verified,
        }
    }

    #[test]
    fn the_primary_verified_address_wins() {
        let list = [
            email("old@example.com", false, true),
            email("main@example.com", true, true),
        ];
        assert_eq!(
            pick_email(&list, None),
            Some(("main@example.com".into(), true))
        );
    }

    #[test]
    fn an_unverified_primary_is_reported_unverified() {
        let list = [email("main@example.com", true, false)];
        assert_eq!(
            pick_email(&list, None),
            Some(("main@example.com".into(), false))
        );
        let list = [
            email("main@example.com", true, false),
            email("other@example.com", false, true),
        ];
        assert_eq!(
            pick_email(&list, None),
            Some(("other@example.com".into(), true))
        );
        assert_eq!(pick_email(&[], None), None);
        assert_eq!(
            pick_email(&[], Some("pub@example.com")),
            Some(("pub@example.com".into(), false))
        );
    }

    #[test]
    fn the_documented_payloads_make_a_profile() {
        // GitHub REST docs, "Get the authenticated user" and "List email
        // addresses for the authenticated user" (abridged).
        let user: GithubUser = serde_json::from_value(json!({
            "login": "octocat", "id": 1, "node_id": "MDQ6VXNlcjE=",
            "avatar_url": "https://github.com/images/error/octocat_happy.gif",
            "type": "User", "site_admin": false, "name": "monalisa octocat",
            "company": "GitHub", "email": "octocat@github.com", "bio": null
        }))
        .unwrap();
        let emails: Vec<GithubEmail> = serde_json::from_value(json!([
            {"email": "octocat@github.com", "verified": true, "primary": true, "visibility": "public"}
        ]))
        .unwrap();
        let p = to_profile(&user, &emails).unwrap();
        assert_eq!(p.provider_id, "1");
        assert_eq!(p.email, "octocat@github.com");
        assert!(p.email_verified);
        assert_eq!(p.user_metadata["user_name"], "octocat");
        assert_eq!(p.user_metadata["full_name"], "monalisa octocat");
        assert_eq!(
            p.user_metadata["avatar_url"],
            "https://github.com/images/error/octocat_happy.gif"
        );
        assert_eq!(p.user_metadata["iss"], ISSUER);
    }
}
